#!/usr/bin/env bash
# Instructions per gateway ping, counted by valgrind's callgrind: immune to the
# neighbours that make CPU time on a shared machine move (docs/performance.md,
# "Node 20 against Node 24").
#
#   bench/tools/callgrind-ping.sh LABEL NODE DIST [WARM] [COUNT]
#
# Starts this build's mock engine and DIST's gateway (nothing on: LOG_LEVEL=warn,
# no metrics, limits or shedding) under `valgrind --tool=callgrind
# --instr-atstart=no` with NODE, sends WARM pings (default 15000) uncounted,
# turns counting on, sends COUNT pings (default 5000), and writes
# /tmp/callgrind-LABEL.out.1. Read it with `callgrind_annotate --inclusive=no`;
# instructions per request = its total / COUNT. Under callgrind a ping takes
# tens of milliseconds: expect 10 minutes on a busy machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
LABEL=$1 NODE=$2 DIST=$3 WARM=${4:-15000} COUNT=${5:-5000}
SECRET=$(head -c 30 /dev/urandom | base64 | tr -dc A-Za-z0-9)
MPORT=$(node -e "const s=require('net').createServer().listen(0,()=>{console.log(s.address().port);s.close()})")
GPORT=$(node -e "const s=require('net').createServer().listen(0,()=>{console.log(s.address().port);s.close()})")
node dist/fixtures/mock-upstream.js --port "$MPORT" --host 127.0.0.1 > /dev/null &
MOCK=$!
# valgrind names its control pipe after $HOST; the gateway's HOST must not differ from callgrind_control's.
export HOST=127.0.0.1
NODE_ENV=production PORT=$GPORT UPSTREAM_URL=http://127.0.0.1:$MPORT LOG_LEVEL=warn JWT_SECRET=$SECRET \
  RATE_LIMIT_PER_MINUTE=0 METRICS_PORT=0 SHED_EVENT_LOOP_DELAY_MS=0 \
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="/tmp/callgrind-$LABEL.out" \
  "$NODE" "$DIST/src/server.js" > "/tmp/callgrind-$LABEL.log" 2>&1 &
VG=$!
trap 'kill $VG $MOCK 2>/dev/null || true' EXIT
until curl -fs -o /dev/null "http://127.0.0.1:$GPORT/ping"; do sleep 1; done
load () {
  node --input-type=module -e "
    import autocannon from 'autocannon'
    import { mintToken } from './dist/bench/payloads.js'
    const r = await autocannon({ url: 'http://127.0.0.1:$GPORT/api/portfolio/ping', amount: $1, connections: Math.min(20, $1),
      headers: { authorization: 'Bearer ' + mintToken('$SECRET') } })
    console.log('$LABEL: ' + r.requests.total + ' answered, ' + r.errors + ' errors (timeouts under valgrind)')"
}
load "$WARM"
callgrind_control -i on "$VG" > /dev/null
load "$COUNT"
callgrind_control -i off "$VG" > /dev/null
callgrind_control -d "$VG" > /dev/null
TOTAL=$(grep '^totals:' "/tmp/callgrind-$LABEL.out.1" | cut -d' ' -f2)
echo "$LABEL: /tmp/callgrind-$LABEL.out.1, $TOTAL instructions in all"
