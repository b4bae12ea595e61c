#!/usr/bin/env bash
# The seeded fault campaign: rounds of paced flash sales through the edge, one fault per
# round chosen by the seed, every invariant checked after each round.
#   SEED=1 ROUNDS=100 ./loadtest/campaign.sh        # report in reports/campaign/REPORT.md
#   FAULTS=kill-core,pause-broker ROUNDS=10 ./loadtest/campaign.sh
# It runs a stack of its own (database, tansu, Redis, two cores, the edge on free ports),
# so it may run beside ./scripts/up.sh's stack. Exits 1 if any round failed.
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

ensure_build_tools
ensure_postgres
ensure_redis
ensure_tansu
ensure_faketime   # the clock-behind fault's libfaketime: without it that round skews nothing
log "building voucher-core, voucher-edge and voucher-campaign (release)"
cargo build --release -p voucher-core -p voucher-edge -p voucher-campaign
OUT=${OUT:-reports/campaign}
BIN_DIR="$TARGET_DIR/release" OUT="$OUT" CAMPAIGN_LOGS=${CAMPAIGN_LOGS:-$RUN_DIR/campaign-logs} \
  "$TARGET_DIR"/release/voucher-campaign
