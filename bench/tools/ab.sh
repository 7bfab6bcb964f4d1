#!/usr/bin/env bash
# A/B of gateway builds on one load, interleaved round by round, for "measured
# before and after" (docs/performance-history.md, "What moved the figures").
#
#   bench/tools/ab.sh ROUNDS label:DIST_DIR[:ENV=V ...] ...
#
# The ENV=V settings of a build come last, so they win (e.g. one build
# measured at two log levels: warn:DIR:LOG_LEVEL=warn info:DIR:LOG_LEVEL=info).
# DIST_DIR is a copy of dist/ (e.g. `cp -r dist node_modules/.ab/before`; under
# node_modules/ so its imports resolve). Each build is started in turn against
# one mock engine, warmed for 1 s, loaded for 5 s with autocannon (50
# connections), and its CPU time read from /proc. Prints per build the median
# req/s and CPU microseconds per request over the rounds.
# Environment: URLPATH (default /api/portfolio/ping), EXTRA (more autocannon
# flags, e.g. '-m POST -H content-type=application/json -i body.json'),
# LL (the gateway's LOG_LEVEL, default warn), PIPE=1 (the gateway's stdout is a
# pipe read by `cat > /dev/null`, as a log shipper would read it, instead of
# /dev/null itself, where a write costs next to nothing).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=$1; shift
out=$(mktemp)
node dist/fixtures/mock-upstream.js --port 4811 > /dev/null &
MOCK=$!
trap 'kill $MOCK 2>/dev/null; rm -f "$out"' EXIT
SECRET=$(openssl rand -hex 32)
TOKEN=$(JWT_SECRET=$SECRET node dist/src/cli/token.js --sub bench)
URLPATH=${URLPATH:-/api/portfolio/ping}
EXTRA=${EXTRA:-}
for _ in $(seq "$rounds"); do
  for spec in "$@"; do
    IFS=: read -r label dir envs <<< "$spec"
    # shellcheck disable=SC2086
    if [ "${PIPE:-0}" = 1 ]; then
      env METRICS_PORT=0 RATE_LIMIT_PER_MINUTE=0 SHED_EVENT_LOOP_DELAY_MS=0 JWT_SECRET="$SECRET" UPSTREAM_URL=http://127.0.0.1:4811 PORT=4812 HOST=127.0.0.1 LOG_LEVEL="${LL:-warn}" $envs \
        node "$dir/src/server.js" > >(cat > /dev/null) 2>&1 &
    else
      env METRICS_PORT=0 RATE_LIMIT_PER_MINUTE=0 SHED_EVENT_LOOP_DELAY_MS=0 JWT_SECRET="$SECRET" UPSTREAM_URL=http://127.0.0.1:4811 PORT=4812 HOST=127.0.0.1 LOG_LEVEL="${LL:-warn}" $envs \
        node "$dir/src/server.js" > /dev/null 2>&1 &
    fi
    GW=$!
    sleep 1
    # shellcheck disable=SC2086
    npx autocannon -c 50 -d 1 $EXTRA -H "authorization=Bearer $TOKEN" "http://127.0.0.1:4812$URLPATH" > /dev/null 2>&1
    c0=$(awk '{print $14+$15}' "/proc/$GW/stat")
    # shellcheck disable=SC2086
    json=$(npx autocannon -c 50 -d 5 -j $EXTRA -H "authorization=Bearer $TOKEN" "http://127.0.0.1:4812$URLPATH" 2>/dev/null)
    c1=$(awk '{print $14+$15}' "/proc/$GW/stat")
    ticks=$(getconf CLK_TCK)
    echo "$json" | node -e 'const r=JSON.parse(require("fs").readFileSync(0));const [l,c0,c1,t]=process.argv.slice(1);console.log(l,Math.round(r.requests.average),Math.round((c1-c0)/t*1e6/r.requests.total),r.non2xx+r.errors)' "$label" "$c0" "$c1" "$ticks" | tee -a "$out"
    kill "$GW"; wait "$GW" 2>/dev/null || true
  done
done
node -e '
const rows=require("fs").readFileSync(process.argv[1],"utf8").trim().split("\n").map(l=>l.split(" "));
const by={};for(const[l,r,c,bad]of rows)(by[l]??=[]).push([+r,+c,+bad]);
const med=a=>a.slice().sort((x,y)=>x-y)[Math.floor(a.length/2)];
for(const[l,v]of Object.entries(by))console.log(`${l.padEnd(12)} req/s ${med(v.map(x=>x[0]))}  cpu us/req ${med(v.map(x=>x[1]))}  non-2xx+errors ${v.reduce((s,x)=>s+x[2],0)}  rounds ${v.map(x=>x[0]+"/"+x[1]+"us").join(" ")}`)' "$out"
