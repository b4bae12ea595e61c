#!/usr/bin/env bash
# Brings up the stack on this machine and runs a demo flash sale against it:
# PostgreSQL and Redis (local), tansu (a Kafka-protocol broker), voucher-core (release
# build, migrations applied at start-up, consumer and reconciliation inside), then a flash
# voucher with 100 uses and 1,000 concurrent reservations for it.
# Stop it with ./scripts/down.sh.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

API=${API:-http://127.0.0.1:8081}
METRICS=${METRICS:-http://127.0.0.1:9181}
TOKEN=${VOUCHER__ADMIN__TOKEN:-dev-admin-token}

ensure_postgres
ensure_redis
ensure_database vouchers
start_broker 9092

log "building voucher-core (release)"
cargo build --release -p voucher-core

log "starting voucher-core on $API (metrics on $METRICS/metrics)"
start_bg core env VOUCHER_CONFIG=config/core.toml ./target/release/voucher-core
wait_for_port 127.0.0.1 8081 30

code="DEMO$(date +%s)"
now=$(date -u +%FT%TZ); end=$(date -u -d '+1 day' +%FT%TZ)
log "creating flash voucher $code: 100 uses, 1 per customer"
curl -fsS -X POST "$API/vouchers" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
  -d "{\"code\":\"$code\",\"discountAmount\":100000,\"minOrderAmount\":0,\"totalLimit\":100,\"perUserLimit\":1,\"startsAt\":\"$now\",\"endsAt\":\"$end\",\"mode\":\"flash\"}"
echo

log "demo sale: 1,000 customers reserve at once (50 in flight)"
seq 1 1000 | xargs -P 50 -I{} curl -sS -o /dev/null -w '%{http_code}\n' -X POST "$API/vouchers/$code/reservations" \
  -H 'Content-Type: application/json' -d '{"customerId":"demo-c{}","orderId":"'"$code"'-o{}","orderAmount":250000}' \
  | sort | uniq -c | sed 's/^/   HTTP /'
sleep 1  # the consumer writes the events into PostgreSQL in batches
log "voucher after the sale (usedCount must be exactly 100, gateRemaining 0)"
curl -fsS "$API/vouchers/$code"; echo

cat <<TXT

voucher-core runs on $API (log: run/core.log, metrics: $METRICS/metrics, API doc: $API/openapi.json).
Try:  curl -X POST $API/vouchers/$code/reservations -H 'Content-Type: application/json' \\
        -d '{"customerId":"me","orderId":"my-order-1","orderAmount":250000}'
Stop: ./scripts/down.sh
TXT
