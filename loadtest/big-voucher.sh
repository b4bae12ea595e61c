#!/usr/bin/env bash
# A flash voucher of a million uses: sold out through a core, reloaded from PostgreSQL and
# reconciled, with Redis's slow log watching every call. Brings the stack up (release
# builds), writes reports/big/REPORT.md. Takes about 8 minutes at the default rate.
#   USES=1000000 BIG_RATE=3000 SLOW_US=2000 ./loadtest/big-voucher.sh
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

OUT=${OUT:-reports/big}
export DB_NAME=${DB_NAME:-big_$(date +%Y%m%d%H%M%S)}
export VOUCHER__KAFKA__TOPIC=${VOUCHER__KAFKA__TOPIC:-events_$DB_NAME}
export KAFKA_TOPIC=$VOUCHER__KAFKA__TOPIC
start_stack
cargo build --release -p voucher-bench
mkdir -p "$OUT"
DATABASE_URL="$VOUCHER__DATABASE__URL" "$TARGET_DIR"/release/voucher-bench big-voucher "$OUT"
log "report: $OUT/REPORT.md"
