#!/usr/bin/env bash
# Proves deploy/compose works (Envoy's examples/ pattern: the compose file, the
# configs it mounts, and a script that checks them): starts the topology, checks
# each part through haproxy as a phone would, restarts a gateway under requests,
# and stops everything again (KEEP=1 leaves it running).
# Needs Docker with compose v2, curl (with HTTP/2) and openssl.
#
# NOT RUN on the machines this recipe was written on (no Docker engine there):
# docs/operations.md, "What was checked here, and what was not run".
set -euo pipefail
cd "$(dirname "$0")"

export JWT_SECRET="${JWT_SECRET:-$(openssl rand -hex 32)}"
base=https://localhost:8443
compose () { docker compose -f compose.yaml "$@"; }
fail () { echo "FAIL: $*" >&2; exit 1; }
ok () { echo "ok: $*"; }

compose up --build --detach
trap '[ "${KEEP:-0}" = 1 ] || compose down --volumes' EXIT

# haproxy answers once a gateway is up behind it; the first build can take minutes.
for _ in $(seq 1 120); do
  [ "$(curl -sk -o /dev/null -w '%{http_code}' "$base/ping" || true)" = 200 ] && break
  sleep 2
done

# TLS 1.3 and HTTP/2 end at haproxy (DECISIONS 27).
[ "$(curl -sk --http2 -o /dev/null -w '%{http_version} %{http_code}' "$base/ping")" = "2 200" ] || fail "GET /ping over HTTP/2"
ok "HTTP/2 through haproxy"
if curl -sk --tlsv1.2 --tls-max 1.2 -o /dev/null "$base/ping"; then fail "TLS 1.2 was accepted"; fi
ok "TLS 1.2 refused, 1.3 only"

# A token from the gateway's own command, with the gateways' secret.
token=$(compose exec -T gateway-1 node dist/src/cli/token.js --sub verify-user | tail -n 1)
auth=(-H "authorization: Bearer $token")

# Create once, then update several times: haproxy spreads the updates over the
# gateways and they over both engines, which agree through their shared store.
id=$(curl -sk "${auth[@]}" -F name=Verify -F type=PORTFOLIO -H 'idempotency-key: verify-1' "$base/api/portfolio/create" \
  | sed -n 's/.*"portfolio_id":"\([^"]*\)".*/\1/p')
[ -n "$id" ] || fail "create"
ok "created $id"
for i in $(seq 1 10); do
  code=$(curl -sk -o /dev/null -w '%{http_code}' "${auth[@]}" -H 'content-type: application/json' \
    -d "{\"portfolio_id\":\"$id\",\"target_positions\":[{\"mint\":\"So11111111111111111111111111111111111111112\",\"allocation\":1}]}" \
    "$base/api/portfolio/update")
  [ "$code" = 200 ] || fail "update $i answered $code"
done
ok "10 updates, on whichever engine"
[ "$(curl -sk "${auth[@]}" -H 'idempotency-key: verify-1' -F name=Verify -F type=PORTFOLIO -o /dev/null -w '%{http_code}' "$base/api/portfolio/create")" = 200 ] || fail "replayed create"
ok "keyed create replayed"

# haproxy sees three gateways UP.
up=$(curl -s 'http://127.0.0.1:8404/stats;csv' | grep -c '^gateways,gateway-[123],.*,UP,' || true)
[ "$up" = 3 ] || fail "haproxy has $up gateways UP, not 3"
ok "haproxy: 3 gateways UP"

# The sentinels agree on the primary.
masters=$(for s in sentinel-1 sentinel-2 sentinel-3; do compose exec -T "$s" redis-cli -p 26379 sentinel get-master-addr-by-name gateway | head -n 1; done | sort -u)
[ "$(echo "$masters" | wc -l)" = 1 ] || fail "sentinels disagree: $masters"
ok "sentinels agree on $masters"

# A rolling restart of one gateway under requests: none fails.
failures=0
( for _ in $(seq 1 300); do curl -sk -o /dev/null -w '%{http_code}\n' "$base/ping"; done ) > /tmp/verify-pings.$$ &
pinger=$!
compose restart gateway-2
wait "$pinger"
failures=$(grep -vc '^200$' /tmp/verify-pings.$$ || true)
rm -f /tmp/verify-pings.$$
[ "$failures" = 0 ] || fail "$failures of 300 pings failed while gateway-2 restarted"
ok "gateway-2 restarted under 300 pings, none failed"

# Prometheus scrapes every gateway, and has loaded the rules.
sleep 15
[ "$(curl -s 'http://127.0.0.1:9090/api/v1/query' --data-urlencode 'query=sum(up{job="portfolio-gateway"})' | sed -n 's/.*"value":\[[^,]*,"\([0-9]*\)".*/\1/p')" = 3 ] || fail "Prometheus does not have up=1 for 3 gateways"
curl -s 'http://127.0.0.1:9090/api/v1/rules' | grep -q '"name":"GatewayErrorRate"' || fail "Prometheus has not loaded alerts.yml"
ok "Prometheus: 3 gateways up, rules loaded"
echo "deploy/compose verified"
