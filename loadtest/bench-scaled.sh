#!/usr/bin/env bash
# Many hot vouchers at once on the scaled stack (./scripts/up-scaled.sh's: a Redis Cluster,
# PostgreSQL with a synchronous standby, tansu with six partitions, three cores, two edges):
# ten flash vouchers selling out together, the load split over both edges, in a ladder of
# total rates; per voucher its master, partition, uses issued, p99 and the requests that
# reached a core after its sell-out. Writes reports/scaled/MANY.md.
#   MANY_RATES=2000,4000,8000 STEP_SECS=3 ./loadtest/bench-scaled.sh
# A database of the run's own, so the invariant check at the end covers exactly this run.
export SCALED_DB=${SCALED_DB:-bench_$(date +%Y%m%d%H%M%S)}
. "$(dirname "$0")/../scripts/lib.sh"
. "$(dirname "$0")/../scripts/lib-scaled.sh"
cd "$ROOT"

OUT=${OUT:-reports/scaled}
start_scaled_stack
cargo build --release -p voucher-bench
mkdir -p "$OUT"
metrics=(); for port in "${CORES[@]}"; do metrics+=("127.0.0.1:$((port + 1100))"); done
EDGE=127.0.0.1:${EDGES[0]} EDGES="127.0.0.1:${EDGES[0]},127.0.0.1:${EDGES[1]}" CORE=127.0.0.1:${CORES[0]} \
  CORE_METRICS="$(IFS=,; echo "${metrics[*]}")" \
  DATABASE_URL="postgres://postgres@127.0.0.1:$(scaled_primary)/$SCALED_DB" \
  REDIS_URL="$(redis_nodes)" REDIS_TOPOLOGY=cluster KAFKA_BROKERS=127.0.0.1:$BROKER VOUCHER__KAFKA__PARTITIONS=6 \
  "$TARGET_DIR"/release/voucher-bench many "$OUT"
