#!/usr/bin/env bash
# The CSV export of a million-use voucher, and what it costs a core's memory: a release
# core (standard mode, no Redis or broker needed), a voucher whose million reservations are
# written straight into PostgreSQL (generate_series, counts kept in step), then the export
# read twice, by a client as fast as loopback and by one limited to 2 MB/s (the core must
# then hold rows back, not buffer them). The core's resident memory (VmRSS from /proc) is
# sampled every 50 ms; the report says its peak growth over the idle core.
#   USES=1000000 SLOW_SECS=20 ./loadtest/export-memory.sh   (about 2 minutes)
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

USES=${USES:-1000000}
SLOW_SECS=${SLOW_SECS:-20}
OUT=${OUT:-reports/bench}
PORT=${PORT:-8091}
DB=export_$(date +%Y%m%d%H%M%S)
TOKEN=export-memory-token
ensure_postgres
ensure_database "$DB"
log "building voucher-core (release)"
cargo build --release -p voucher-core -p voucher-edge

conf="$RUN_DIR/export-core.toml"
printf '[http]\nlisten = "127.0.0.1:%s"\nmetrics_listen = "127.0.0.1:%s"\n' "$PORT" "$((PORT + 1000))" >"$conf"
start_bg export-core env VOUCHER_CONFIG="$conf" \
  VOUCHER__DATABASE__URL="$(local_db_url "$DB")" \
  VOUCHER__ADMIN__TOKEN="$TOKEN" "$TARGET_DIR"/release/voucher-core
trap 'stop_bg export-core; psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"$DB\"" >/dev/null' EXIT
wait_for_port 127.0.0.1 "$PORT" 60
pid=$(cat "$RUN_DIR/export-core.pid")
base="http://127.0.0.1:$PORT"

now=$(date -u +%s)
curl -fsS -o /dev/null -X POST "$base/vouchers" -H "Authorization: Bearer $TOKEN" \
  -H 'Content-Type: application/json' \
  -d "{\"code\":\"MILLION\",\"discountAmount\":100000,\"totalLimit\":$USES,\
\"startsAt\":\"$(date -u -d @$((now - 3600)) +%FT%TZ)\",\"endsAt\":\"$(date -u -d @$((now + 86400)) +%FT%TZ)\"}"
log "writing $USES reservations into PostgreSQL"
psql -h 127.0.0.1 -U postgres -d "$DB" -q <<SQL
WITH made AS (
  INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount, discount_amount,
                           status, expires_at, confirmed_at)
  SELECT 'MILLION', 'customer-' || i, 'order-' || i, 250000, 100000,
         CASE WHEN i % 4 = 0 THEN 'RESERVED' ELSE 'CONFIRMED' END, now() + interval '15 minutes',
         CASE WHEN i % 4 = 0 THEN NULL ELSE now() END
  FROM generate_series(1, $USES) i
  RETURNING customer_id, status
)
INSERT INTO customer_usage (voucher_code, customer_id, active_count, per_user_limit)
SELECT 'MILLION', customer_id, 1, 1 FROM made;
UPDATE vouchers SET used_count = $USES WHERE code = 'MILLION';
ANALYZE redemptions;
SQL

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
# sample_while PID_OF_CLIENT: peak RSS (KiB) while the client runs
sample_while() {
  local client=$1 peak=0 now
  while kill -0 "$client" 2>/dev/null; do
    now=$(rss_kib); ((now > peak)) && peak=$now
    sleep 0.05
  done
  echo "$peak"
}
# A warm-up export of a few rows, so the idle figure includes what any answer allocates once.
curl -fsS -o /dev/null -H "Authorization: Bearer $TOKEN" "$base/vouchers/MILLION/reservations?status=RESERVED&limit=10"
idle=$(rss_kib)

log "export, fast client"
start=$(date +%s.%N)
curl -fsS -H "Authorization: Bearer $TOKEN" "$base/vouchers/MILLION/export" -o "$RUN_DIR/export.csv" &
fast_peak=$(sample_while $!)
fast_secs=$(echo "$(date +%s.%N) - $start" | bc)
fast_lines=$(wc -l <"$RUN_DIR/export.csv")
fast_bytes=$(stat -c %s "$RUN_DIR/export.csv")

log "export, client limited to 2 MB/s for ${SLOW_SECS}s"
curl -sS -H "Authorization: Bearer $TOKEN" --limit-rate 2M --max-time "$SLOW_SECS" \
  "$base/vouchers/MILLION/export" -o /dev/null &
slow_peak=$(sample_while $!)
after=$(rss_kib)
rm -f "$RUN_DIR/export.csv"

mib() { echo "scale=1; $1 / 1024" | bc; }
mkdir -p "$OUT"
cat >"$OUT/EXPORT.md" <<EOF
# The CSV export of a million-use voucher, and a core's memory

\`USES=$USES SLOW_SECS=$SLOW_SECS ./loadtest/export-memory.sh\` on $(date -u +%F), $(nproc) cores:
a release core in standard mode, a voucher of $USES reservations written into PostgreSQL,
\`GET /vouchers/MILLION/export\` read by curl. Resident memory is the core's VmRSS from
\`/proc/<pid>/status\`, sampled every 50 ms while each client reads.

| | value |
|---|---|
| core idle (after one small answer) | $(mib "$idle") MiB |
| fast client: peak | $(mib "$fast_peak") MiB (growth $(mib $((fast_peak - idle))) MiB) |
| fast client: lines, bytes, seconds | $fast_lines (a header and $((fast_lines - 1)) rows), $fast_bytes, $fast_secs |
| client limited to 2 MB/s for ${SLOW_SECS} s: peak | $(mib "$slow_peak") MiB (growth $(mib $((slow_peak - idle))) MiB) |
| core after both | $(mib "$after") MiB |

The aim: the core's memory grows by less than 16 MiB while it streams. The rows come from
one statement on one pooled connection, read in chunks of 500 through a channel of four
chunks (\`core/src/store/ledger.rs\`): a slow client holds the statement back, it does not
fill the core.
EOF
log "report: $OUT/EXPORT.md"
cat "$OUT/EXPORT.md"
