#!/usr/bin/env bash
# Instructions per flash reservation in a core, counted by valgrind's callgrind: repeatable on
# a noisy machine where wall time is not (the same binary, inputs and environment give the
# same count whatever else runs). For comparing two builds of the reserve path.
#
#   ./loadtest/callgrind.sh [CORE_BINARY]      (default: the release build, built first)
#   CONNECTIONS=new ./loadtest/callgrind.sh    (each request on a new connection, as the
#                                               counts of reports/callgrind before 2026-12-03)
#
# Starts one core under callgrind against PostgreSQL, Redis and tansu (a database, key prefix
# and topic of its own), with PostgreSQL deciding (the default), reconciliation, expiry, the
# event writers and the consumer monitor off so that only requests run. Creates a flash
# voucher, warms it up (gate load, connections, script cache), then counts two phases of N
# requests each, sent one at a time (so every recorder batch holds one reservation and the
# count does not depend on timing), all of a phase on one kept connection as a client under
# load sends them (CONNECTIONS=kept, the default; `new` opens one per request, which counts
# a connection's set-up, some 16,000 instructions in axum alone, in every request):
#   accepted: N new orders, each a 201;
#   refused:  N new orders after the sell-out, each a 409 OUT_OF_STOCK from the gate.
# Writes the totals per request to OUT/REPORT.md (default reports/callgrind) and keeps the
# callgrind files there for callgrind_annotate.
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

N=${N:-500}
CONNECTIONS=${CONNECTIONS:-kept}
WARM=${WARM:-20}
OUT=${OUT:-reports/callgrind}
PORT=${PORT:-8095}
METRICS_PORT=${METRICS_PORT:-9195}
BROKER_PORT=${BROKER_PORT:-9092}
TOKEN=callgrind-admin-token
BIN=${1:-}

command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
ensure_postgres
ensure_redis
start_broker "$BROKER_PORT"
if [[ -z $BIN ]]; then
  cargo build --release -p voucher-core
  BIN="$TARGET_DIR/release/voucher-core"
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/callgrind.*
run_id="cg$(date +%s)"
db="vt_$run_id"
ensure_database "$db"
# The run's database and its gates in Redis (under its own key prefix) go with it.
cleanup() {
  stop_bg callgrind-core
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
  redis-cli --scan --pattern "$run_id:*" | xargs -r -n 100 redis-cli unlink >/dev/null || true
}
trap cleanup EXIT

log "starting $BIN under callgrind on :$PORT (instrumentation off until the warm-up is done)"
start_bg callgrind-core env \
  VOUCHER__DATABASE__URL="$(local_db_url "$db")" \
  VOUCHER__HTTP__LISTEN="127.0.0.1:$PORT" VOUCHER__HTTP__METRICS_LISTEN="127.0.0.1:$METRICS_PORT" \
  VOUCHER__ADMIN__TOKEN="$TOKEN" \
  VOUCHER__REDIS__URL="redis://127.0.0.1:6379" VOUCHER__REDIS__KEY_PREFIX="$run_id:" \
  VOUCHER__KAFKA__BROKERS="127.0.0.1:$BROKER_PORT" VOUCHER__KAFKA__TOPIC="$run_id-events" \
  VOUCHER__KAFKA__GROUP="$run_id" VOUCHER__KAFKA__CONSUME=false \
  VOUCHER__KAFKA__MONITOR_INTERVAL=1h VOUCHER__KAFKA__REPLICATION_FACTOR=1 \
  VOUCHER__KAFKA__MIN_INSYNC_REPLICAS=1 \
  VOUCHER__FLASH__RECONCILE_ENABLED=false VOUCHER__RESERVATIONS__EXPIRY_ENABLED=false \
  VOUCHER__LOG__ACCESS=false VOUCHER__LOG__FILTER=warn \
  valgrind --tool=callgrind --instr-atstart=no \
  --callgrind-out-file="$OUT/callgrind.%p.out" "$BIN"
wait_for_port 127.0.0.1 "$PORT" 180

api="http://127.0.0.1:$PORT"
code="CG$(date +%s)"
now=$(date -u +%FT%TZ); end=$(date -u -d '+1 day' +%FT%TZ)
curl -fsS -o /dev/null -X POST "$api/vouchers" -H "Authorization: Bearer $TOKEN" \
  -H 'Content-Type: application/json' \
  -d "{\"code\":\"$code\",\"discountAmount\":1000,\"minOrderAmount\":0,\"totalLimit\":$((WARM + N)),\"perUserLimit\":1,\"startsAt\":\"$now\",\"endsAt\":\"$end\",\"mode\":\"flash\"}"

# reserve FIRST LAST EXPECTED: one request at a time; fails on any other status.
reserve() {
  if [[ $CONNECTIONS == kept ]]; then
    reserve_kept "$@"
    return
  fi
  local i status
  for ((i = $1; i <= $2; i++)); do
    status=$(curl -sS -o /dev/null -w '%{http_code}' -X POST "$api/vouchers/$code/reservations" \
      -H 'Content-Type: application/json' \
      -d "{\"customerId\":\"c$i\",\"orderId\":\"$code-o$i\",\"orderAmount\":5000}")
    if [[ $status != "$3" ]]; then
      echo "request $i answered $status, expected $3" >&2
      return 1
    fi
  done
}

# The same, every request through one curl, which keeps its connection between them
# (`next` in its config file).
reserve_kept() {
  local i cfg statuses unexpected
  cfg=$(mktemp) statuses=$(mktemp)
  for ((i = $1; i <= $2; i++)); do
    ((i > $1)) && echo next >>"$cfg"
    printf '%s\n' "url = \"$api/vouchers/$code/reservations\"" 'request = "POST"' \
      'header = "Content-Type: application/json"' \
      "data = \"{\\\"customerId\\\":\\\"c$i\\\",\\\"orderId\\\":\\\"$code-o$i\\\",\\\"orderAmount\\\":5000}\"" \
      'output = "/dev/null"' 'write-out = "%{http_code} %{num_connects}\n"' >>"$cfg"
  done
  curl -sS -K "$cfg" >"$statuses"
  unexpected=$(awk -v want="$3" '$1 != want' "$statuses" | wc -l)
  if [[ $(wc -l <"$statuses") -ne $(($2 - $1 + 1)) || $unexpected -ne 0 ]]; then
    echo "requests $1-$2: $unexpected answers other than $3" >&2
    return 1
  fi
  log "requests $1-$2: connections opened: $(awk '{s += $2} END {print s}' "$statuses")"
  rm -f "$cfg" "$statuses"
}

log "warm-up: $WARM reservations"
reserve 1 "$WARM" 201
sleep 2
log "counting $N accepted reservations"
callgrind_control -i on >/dev/null
reserve $((WARM + 1)) $((WARM + N)) 201
callgrind_control --dump=accepted >/dev/null
log "counting $N refused reservations (sold out)"
reserve $((WARM + N + 1)) $((WARM + 2 * N)) 409
callgrind_control --dump=refused >/dev/null
callgrind_control -i off >/dev/null

# The dumps are numbered in order: .1 accepted, .2 refused.
total() { grep -m1 '^totals:\|^summary:' "$1" | awk '{print $2}'; }
accepted=$(total "$(ls "$OUT"/callgrind.*.out.1)")
refused=$(total "$(ls "$OUT"/callgrind.*.out.2)")
{
  echo "# Instructions per flash reservation in a core (callgrind)"
  echo
  echo "Binary: \`$BIN\` ($(sha256sum "$BIN" | cut -c1-12)), $(date -u +%F), \`N=$N ./loadtest/callgrind.sh\`."
  echo "PostgreSQL deciding, one request at a time (connections: $CONNECTIONS), reconciliation, expiry, writers and monitor off."
  echo
  echo "| phase | requests | instructions | per request |"
  echo "|---|---|---|---|"
  echo "| accepted (201) | $N | $accepted | $((accepted / N)) |"
  echo "| refused (409 OUT_OF_STOCK) | $N | $refused | $((refused / N)) |"
} >"$OUT/REPORT.md"
cat "$OUT/REPORT.md"
