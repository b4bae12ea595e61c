#!/usr/bin/env bash
# Brings up the stack on this machine and runs a demo flash sale through it:
# PostgreSQL and Redis (local), tansu (a Kafka-protocol broker), two voucher-core
# instances (release build; migrations, expiry and reconciliation inside; with the broker
# deciding, the event writers too) and
# the voucher-edge proxy in front of them; then a flash voucher with 100 uses and 1,000
# concurrent reservations for it, sent to the edge.
# Stop it with ./scripts/down.sh.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

API=http://127.0.0.1:8080        # the edge: what clients call
CORE=http://127.0.0.1:8081       # core 1 (admin calls go to a core, never through the edge)

start_stack

code="DEMO$(date +%s)"
demo_voucher "$CORE" "$code"

log "demo sale through the edge: 1,000 customers reserve at once (50 in flight)"
seq 1 1000 | xargs -P 50 -I{} curl -sS -o /dev/null -w '%{http_code}\n' -X POST "$API/vouchers/$code/reservations" \
  -H 'Content-Type: application/json' -d '{"customerId":"demo-c{}","orderId":"'"$code"'-o{}","orderAmount":250000}' \
  | sort | uniq -c | sed 's/^/   HTTP /'
sleep 1  # with PostgreSQL deciding every 201's row is committed already; the gate's last give-backs settle
log "voucher after the sale (usedCount must be exactly 100, gateRemaining 0)"
curl -fsS "$API/vouchers/$code"; echo
log "who answered the refusals: the edge's counters"
curl -fsS http://127.0.0.1:9180/metrics | grep '^edge_requests_total' | sed 's/^/   /'

cat <<TXT

The edge serves $API (logs in run/: edge.log, core.log, core2.log, broker.log).
Metrics: edge http://127.0.0.1:9180/metrics, cores http://127.0.0.1:9181/metrics and :9182.
API document: $CORE/openapi.json. Admin calls (create a voucher) go to a core, e.g. $CORE.
Try:  curl -X POST $API/vouchers/$code/reservations -H 'Content-Type: application/json' \\
        -d '{"customerId":"me","orderId":"my-order-1","orderAmount":250000}'
Stop: ./scripts/down.sh
TXT
