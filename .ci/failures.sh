#!/usr/bin/env bash
# What failed in a tap log, for the end of CI's output (the tail that CI keeps): first the
# diagnostics of each failed assertion (found/wanted, the source line), bounded; then, last, one
# line per failure and tap's per-file timeouts, so the kept tail names every failure even when the
# diagnostics were cut. A subtest's or a file's own `not ok ... # time=` summary carries only its
# arguments and working directory: its line is listed, its block is not printed.
# usage: bash .ci/failures.sh <tap log>
set -uo pipefail
log=$1
echo "failed assertions:"
awk '/^ *not ok / { leaf = ($0 !~ /# time=[0-9.]+m?s$/); if (leaf) print; inblock = 0; want = leaf; next }
  want && /^ *---$/ { inblock = 1; want = 0; print; next }
  inblock { print; if ($0 ~ /^ *\.\.\.$/) inblock = 0; next }
  { want = 0 }' "$log" | head -150
echo "every failure, one line each:"
grep -E '^ *not ok ' "$log" | sed -E 's/^ +//' | head -60
grep -E '^ *expired: ' "$log" | sed -E 's/^ +//' | head -20
exit 0
