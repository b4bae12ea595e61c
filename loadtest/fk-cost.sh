#!/usr/bin/env bash
# What the foreign keys to vouchers cost the grouped write, measured in PostgreSQL's backend:
#
#   ./loadtest/fk-cost.sh            # prints a markdown table; reports/bench/ACCEPT-foreign-keys.md
#
# A database of its own (dropped at the end) with the migrations, one flash voucher and
# 200,000 rows already written; then statements in the shape of the recorder's
# (`OPTIMISTIC` in core/src/store/batch.rs: the voucher's row locked, the rows inserted, the
# customers' counters upserted, the voucher's count raised; its input from generate_series
# instead of bound arrays), prepared once and executed once per batch (autocommit), by one
# psql session.
# The figure is that session's backend CPU (user + system time from /proc/<pid>/stat)
# divided by the uses written: no hardware counters in these VMs, and a backend's own CPU
# time is far steadier than a rate on two shared cores. Three schemas, interleaved, ROUNDS
# times per batch size:
#   keys      the two FOREIGN KEYs of migrations/0001 (what runs)
#   triggers  the keys replaced by one AFTER INSERT ... FOR EACH STATEMENT trigger per table
#             that locks the statement's distinct vouchers FOR KEY SHARE and refuses a
#             missing one (a check per statement, not per row)
#   none      no check at all (the floor)
set -euo pipefail
# measure runs in $(...): without this a failure inside it would not stop the script.
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_postgres

ROUNDS=${ROUNDS:-3}
BATCHES=${BATCHES:-"10 50 200"}
USES=${USES:-20000}
DB=fkcost_$(date +%Y%m%d%H%M%S)
WORK=$(mktemp -d)
P=(psql -h 127.0.0.1 -U postgres -d "$DB" -qAt -v ON_ERROR_STOP=1)
cleanup() {
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null ||
    echo "fk-cost: could not drop database $DB; drop it by hand" >&2
  rm -rf "$WORK"
}
trap cleanup EXIT

ensure_database "$DB"
for m in migrations/*.sql; do "${P[@]}" -f "$m" >/dev/null; done
"${P[@]}" -c "INSERT INTO vouchers (code, discount_amount, total_limit, per_user_limit, starts_at, ends_at, mode)
              VALUES ('FKX', 100000, 100000000, 1, now() - interval '1 day', now() + interval '30 days', 'flash')"
"${P[@]}" -c "WITH r AS (INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount,
                                                 discount_amount, reserved_at, expires_at)
                         SELECT 'FKX', 'pre-' || g, 'FKX-pre-' || g, 100000, 100000, now(), now() + interval '15 min'
                         FROM generate_series(1, 200000) g RETURNING customer_id)
              INSERT INTO customer_usage (voucher_code, customer_id, active_count, per_user_limit)
              SELECT 'FKX', customer_id, 1, 1 FROM r"
"${P[@]}" -c "UPDATE vouchers SET used_count = 200000 WHERE code = 'FKX'"
"${P[@]}" -c "VACUUM ANALYZE"

keys_off() {
  "${P[@]}" -c "ALTER TABLE redemptions DROP CONSTRAINT redemptions_voucher_fkey;
                ALTER TABLE customer_usage DROP CONSTRAINT customer_usage_voucher_fkey"
}
keys_on() {
  "${P[@]}" -c "ALTER TABLE redemptions ADD CONSTRAINT redemptions_voucher_fkey
                  FOREIGN KEY (voucher_code) REFERENCES vouchers (code);
                ALTER TABLE customer_usage ADD CONSTRAINT customer_usage_voucher_fkey
                  FOREIGN KEY (voucher_code) REFERENCES vouchers (code)"
}
triggers_on() {
  "${P[@]}" >/dev/null <<'SQL'
CREATE FUNCTION voucher_reference_exists() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM vouchers v WHERE v.code IN (SELECT DISTINCT voucher_code FROM written)
    ORDER BY v.code COLLATE "C" FOR KEY SHARE;
    IF EXISTS (SELECT 1 FROM written w
               WHERE NOT EXISTS (SELECT 1 FROM vouchers v WHERE v.code = w.voucher_code)) THEN
        RAISE EXCEPTION 'foreign key' USING ERRCODE = 'foreign_key_violation', CONSTRAINT = TG_ARGV[0];
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER redemptions_voucher_ref AFTER INSERT ON redemptions REFERENCING NEW TABLE AS written
    FOR EACH STATEMENT EXECUTE FUNCTION voucher_reference_exists('redemptions_voucher_fkey');
CREATE TRIGGER customer_usage_voucher_ref AFTER INSERT ON customer_usage REFERENCING NEW TABLE AS written
    FOR EACH STATEMENT EXECUTE FUNCTION voucher_reference_exists('customer_usage_voucher_fkey');
SQL
}
triggers_off() {
  "${P[@]}" -c "DROP TRIGGER redemptions_voucher_ref ON redemptions;
                DROP TRIGGER customer_usage_voucher_ref ON customer_usage;
                DROP FUNCTION voucher_reference_exists()"
}

# statements COUNT BATCH TAG [prepare]: COUNT executions of the grouped statement, one per
# line, prepared first if asked: as sqlx runs the recorder's, a prepared statement whose
# plan PostgreSQL may keep (`plan_cache_mode` auto), so the figures are not its parsing.
statements() {
  python3 - "$@" <<'PY'
import sys
n, b, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = """WITH input AS (
 SELECT 'FKX'::text AS voucher_code, $1 || g AS customer_id, $2 || g AS order_id,
        100000::int8 AS order_amount, 100000::int8 AS discount_amount, now() AS reserved_at,
        now() + interval '15 min' AS expires_at, 0::int8 AS generation, g AS idx
 FROM generate_series(1, {b}) g),
voucher AS (
 SELECT code, used_count, total_limit, per_user_limit, gate_generation, state
 FROM vouchers WHERE code = ANY(ARRAY['FKX']) ORDER BY code COLLATE "C" FOR NO KEY UPDATE),
candidate AS (
 SELECT i.*, CASE WHEN v.code IS NULL THEN 'redemptions_voucher_fkey'
                  WHEN i.generation <> 0 AND i.generation <> v.gate_generation THEN 'stale'
                  WHEN v.state <> 'active' THEN 'voucher_' || v.state
                  WHEN v.used_count >= v.total_limit THEN 'vouchers_used_within_limit' END AS verdict
 FROM input i LEFT JOIN voucher v ON v.code = i.voucher_code),
inserted AS (
 INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount, discount_amount,
                          reserved_at, expires_at)
 SELECT voucher_code, customer_id, order_id, order_amount, discount_amount, reserved_at, expires_at
 FROM candidate WHERE verdict IS NULL ORDER BY order_id
 ON CONFLICT (order_id) DO NOTHING
 RETURNING voucher_code, customer_id, order_id, discount_amount, reserved_at, expires_at),
customers AS (
 INSERT INTO customer_usage AS u (voucher_code, customer_id, active_count, per_user_limit)
 SELECT i.voucher_code, i.customer_id, count(*)::int4, v.per_user_limit
 FROM inserted i JOIN voucher v ON v.code = i.voucher_code
 GROUP BY i.voucher_code, i.customer_id, v.per_user_limit ORDER BY i.voucher_code, i.customer_id
 ON CONFLICT (voucher_code, customer_id) DO UPDATE SET active_count = u.active_count + excluded.active_count),
used AS (
 UPDATE vouchers v SET used_count = v.used_count + n.uses
 FROM (SELECT voucher_code, count(*)::int4 AS uses FROM inserted GROUP BY voucher_code) n
 WHERE v.code = n.voucher_code)
SELECT count(*) FROM inserted;"""
if len(sys.argv) > 4:
    print("DEALLOCATE ALL; PREPARE grouped(text, text) AS " + s.replace("{b}", str(b)).replace("\n", " "))
for k in range(n):
    print(f"EXECUTE grouped('c-{tag}-{k}-', 'FKX-{tag}-{k}-');")
PY
}

# await WORD SESSION: until the session has printed WORD; fails if the session ended first
# (psql stops at its first error).
await() {
  until grep -q "^$1\$" "$WORK/out"; do
    if ! kill -0 "$2" 2>/dev/null; then
      cat "$WORK/out" >&2
      echo "fk-cost: the psql session ended before '$1'" >&2
      return 1
    fi
    sleep 0.05
  done
}

# measure SCHEMA BATCH: backend CPU µs per use over about USES uses (whole batches), after 5
# untimed statements.
measure() {
  local schema=$1 batch=$2 n=$((USES / $2)) tag
  tag=$schema$RANDOM$RANDOM
  statements "$n" "$batch" "$tag" >"$WORK/timed.sql"
  rm -f "$WORK/fifo" "$WORK/out"
  mkfifo "$WORK/fifo"
  "${P[@]}" <"$WORK/fifo" >"$WORK/out" 2>&1 &
  local session=$!
  exec 3>"$WORK/fifo"
  echo "SELECT 'pid', pg_backend_pid();" >&3
  statements 5 "$batch" "w$tag" prepare >&3
  echo "SELECT 'warm';" >&3
  await warm "$session"
  local pid t0 t1
  pid=$(grep '^pid|' "$WORK/out" | cut -d'|' -f2)
  [[ -n $pid ]] || { echo "fk-cost: no backend pid" >&2; return 1; }
  t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  cat "$WORK/timed.sql" >&3
  echo "SELECT 'done';" >&3
  await done "$session"
  t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  exec 3>&-
  wait "$session"
  echo $(((t1 - t0) * 1000000 / $(getconf CLK_TCK) / (n * batch)))
}

median() { tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }

echo "| batch | keys (µs per use, rounds) | triggers | none | keys - none |"
echo "|---|---|---|---|---|"
for batch in $BATCHES; do
  k="" t="" z=""
  for _ in $(seq 1 "$ROUNDS"); do
    k+=" $(measure keys "$batch")"
    keys_off; triggers_on
    t+=" $(measure triggers "$batch")"
    triggers_off
    z+=" $(measure none "$batch")"
    keys_on
  done
  mk=$(echo $k | median) mt=$(echo $t | median) mz=$(echo $z | median)
  echo "| $batch | $mk ($(echo $k | tr ' ' ',')) | $mt ($(echo $t | tr ' ' ',')) | $mz ($(echo $z | tr ' ' ',')) | $((mk - mz)) |"
done
