#!/usr/bin/env bash
# A/B of edge builds or settings on the sold-out reject path, with wrk, interleaved: each
# variant is started on :18080 in front of the running stack's cores (./scripts/up.sh or
# loadtest/bench.sh), its flag for a sold-out voucher set, warmed up for 2 s, measured
# for 5 s (wrk -t1 -c64), then stopped; three rounds. Prints requests/s and peak RSS.
#   loadtest/edge-ab.sh "BINARY_A:ENV=VALUE" "BINARY_B:ENV=VALUE" ...
# e.g. loadtest/edge-ab.sh "/tmp/edge-old:EDGE__READ_BUFFER_BYTES=65536" "$HOME/.cache/voucher-gate/target/release/voucher-edge:EDGE__READ_BUFFER_BYTES=4096"
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"
ROUNDS=${ROUNDS:-3}
CODE=AB$(date +%H%M%S)
TOKEN=${ADMIN_TOKEN:-dev-admin-token}
START=$(date -u -d '-1 min' +%FT%TZ); END=$(date -u -d '+1 day' +%FT%TZ)
curl -sf -o /dev/null -X POST localhost:8081/vouchers -H "authorization: Bearer $TOKEN" -H 'content-type: application/json' \
  -d "{\"code\":\"$CODE\",\"discountAmount\":100000,\"minOrderAmount\":0,\"totalLimit\":1,\"perUserLimit\":1,\"startsAt\":\"$START\",\"endsAt\":\"$END\",\"mode\":\"flash\"}"
curl -sf -o /dev/null -X POST localhost:8081/vouchers/$CODE/reservations -H 'content-type: application/json' \
  -d "{\"customerId\":\"a\",\"orderId\":\"$CODE-a\",\"orderAmount\":250000}"
SCRIPT=$(mktemp --suffix=.lua)
trap 'rm -f "$SCRIPT"' EXIT
wrk_reserve_script "$CODE" "$SCRIPT"
start_edge() { # BINARY [ENV=VALUE...]
  local bin=$1; shift
  env EDGE_CONFIG=config/edge.yaml EDGE__LISTEN=127.0.0.1:18080 EDGE__METRICS_LISTEN=127.0.0.1:19180 "$@" "$bin" >/dev/null 2>&1 &
  EDGE_PID=$!
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/18080) 2>/dev/null && break; sleep 0.2; done
  for i in $(seq 100); do  # until the edge answers the 409 itself
    if curl -s -D - -o /dev/null -X POST localhost:18080/vouchers/$CODE/reservations -H 'content-type: application/json' \
      -d "{\"customerId\":\"f$i\",\"orderId\":\"$CODE-f$i\",\"orderAmount\":250000}" | grep -qi x-served-by; then break; fi
    sleep 0.05
  done
  wrk -t1 -c64 -d2s -s "$SCRIPT" http://127.0.0.1:18080 >/dev/null
}
for round in $(seq "$ROUNDS"); do
  for variant in "$@"; do
    IFS=: read -r bin envs <<<"$variant"
    # shellcheck disable=SC2086 # envs is a list of ENV=VALUE words
    start_edge "$bin" $envs
    rate=$(wrk -t1 -c64 -d5s -s "$SCRIPT" http://127.0.0.1:18080 | awk '/Requests\/sec/{print $2}')
    peak=$(awk '/VmHWM/{printf "%.1f", $2/1024}' /proc/$EDGE_PID/status)
    echo "round $round, $variant: $rate requests/s, peak RSS $peak MiB"
    kill "$EDGE_PID"; wait "$EDGE_PID" 2>/dev/null || true
  done
done
