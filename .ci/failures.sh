#!/usr/bin/env bash
# What failed in a tap log, for the end of CI's output (the tail that CI keeps): first the
# diagnostics of each failed assertion (found/wanted or the diff, the source line), bounded; then,
# last, one line per failure, a bail-out and tap's per-file timeouts, so the kept tail names every
# failure even when the diagnostics were cut. A subtest's or a file's own `not ok ... # time=` summary
# is listed, not printed whole (its block is the file's arguments and working directory), with the
# exit code or signal of a file that crashed or was killed. A TODO or SKIP is not a failure.
# usage: bash .ci/failures.sh <tap log>
set -uo pipefail
log=$1
list=$(mktemp)
trap 'rm -f "$list"' EXIT
echo "failed assertions:"
awk '/^ *not ok / { leaf = ($0 !~ /# time=[0-9.]+m?s$/) && ($0 !~ /# (TODO|SKIP)/); if (leaf) print; inblock = 0; want = leaf; next }
  want && /^ *---$/ { inblock = 1; want = 0; print; next }
  inblock { print; if ($0 ~ /^ *\.\.\.$/) inblock = 0; next }
  { want = 0 }' "$log" | head -150
echo "every failure, one line each:"
awk 'function flush () { if (line != "") print line why; line = ""; why = "" }
  /^ *not ok / && !/# (TODO|SKIP)/ { flush(); line = $0; sub(/^ +/, "", line); next }
  line != "" && /^ *exitCode: [1-9]/ { code = $0; sub(/^ *exitCode: /, "", code); why = why " (exit code " code ")"; next }
  line != "" && /^ *signal: [A-Z]/ { sig = $0; sub(/^ *signal: /, "", sig); why = why " (killed by " sig ")"; next }
  line != "" && (/^ *\.\.\.$/ || /^ *(not )?ok / || /^# Subtest/) { flush() }
  /^ *Bail out!/ { flush(); b = $0; sub(/^ +/, "", b); print b }
  /^ *expired: / { flush(); e = $0; sub(/^ +/, "", e); print e }
  END { flush() }' "$log" | head -80 > "$list" || true
if [ -s "$list" ]; then
  cat "$list"
else
  echo "no failed assertion in the log, yet tap failed: its coverage against the thresholds of .taprc:"
  grep -E '^All files' "$log" || echo "(no coverage table either: see tap's own output above)"
fi
exit 0
