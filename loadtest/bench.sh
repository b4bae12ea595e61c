#!/usr/bin/env bash
# The benchmark: brings the stack up (release builds), runs voucher-bench against it and
# writes reports/bench/REPORT.md with its plots: every ladder in one run, and at its end what
# now limits each path. Takes about 10 minutes.
#   STEP_SECS=3 SALE_RATES=5000,10000,20000 ./loadtest/bench.sh
#   BENCH_ONLY=rate-limits ./loadtest/bench.sh   # only the edge's rate limits' and access log's cost: RATE-LIMITS.md
#   BENCH_ONLY=accept ACCEPT_RATES=2000,4000,8000 ./loadtest/bench.sh   # only accepting at a core, CPU per process: ACCEPT.md
#   ACCEPT_MODE=standard BENCH_ONLY=accept ./loadtest/bench.sh   # the same on a standard voucher: ACCEPT-standard.md
#   BENCH_ONLY=sale ./loadtest/bench.sh     # only the flash sale through the edge, beside the edge's reject path: SALE.md
#   EDGE_BIN=/tmp/old/voucher-edge BENCH_ONLY=sale ./loadtest/bench.sh   # the same with another build of the edge (an A/B; keep the file's name: CPU is read by process name)
#   BENCH_ONLY=reject ./loadtest/bench.sh   # only the edge's reject path vs bare server, minimal Pingora, nginx: REJECT.md
#   STEP_SECS=6 BENCH_ONLY=overload ./loadtest/bench.sh   # only a core offered up to 10x what it takes: OVERLOAD.md
#   BENCH_ONLY=memory ./loadtest/bench.sh   # what the edge's and a core's memory is made of, part by part: MEMORY.md
#   OUT=reports/soak BENCH_ONLY=soak ./loadtest/bench.sh   # 10 minutes of sales at half the sustained rate, memory followed: SOAK.md
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

OUT=${OUT:-reports/bench}
# A database of the run's own, so the invariant check at the end covers exactly this run.
export DB_NAME=${DB_NAME:-bench_$(date +%Y%m%d%H%M%S)}
# And a topic of its own: the writers' offsets live in the database with the rows, so a new
# database on an old topic would first replay (and dead-letter) every earlier run's events.
export VOUCHER__KAFKA__TOPIC=${VOUCHER__KAFKA__TOPIC:-events_$DB_NAME}
export KAFKA_TOPIC=$VOUCHER__KAFKA__TOPIC
# And gate keys of its own in the machine's Redis, removed when the run ends: every run
# leaves its vouchers' gates behind otherwise (641 MB after three runs of a session, the
# accepting ladders' vouchers of 10,000,000 uses), and each later run's gate script works on
# a larger Redis than the first did. The database stays, for the invariants to be read
# again; its gates are rebuilt from it on demand.
export VOUCHER__REDIS__KEY_PREFIX=${VOUCHER__REDIS__KEY_PREFIX:-vg:$DB_NAME:}
export EDGE__KEY_PREFIX=$VOUCHER__REDIS__KEY_PREFIX GATE_PREFIX=$VOUCHER__REDIS__KEY_PREFIX
forget_gates() {
  redis-cli --scan --pattern "$VOUCHER__REDIS__KEY_PREFIX*" | xargs -r -n 100 redis-cli unlink >/dev/null
}
trap forget_gates EXIT
start_stack
command -v wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
command -v nginx >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; }
command -v redis-benchmark >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq redis-tools >/dev/null; }
cargo build --release -p voucher-bench
mkdir -p "$OUT"
if [[ ${BENCH_ONLY:-} == rate-limits || ${BENCH_ONLY:-} == accept || ${BENCH_ONLY:-} == overload || ${BENCH_ONLY:-} == reject || ${BENCH_ONLY:-} == sale || ${BENCH_ONLY:-} == memory ]]; then
  DATABASE_URL="$VOUCHER__DATABASE__URL" "$TARGET_DIR"/release/voucher-bench "$BENCH_ONLY" "$OUT"
  exit
fi
if [[ ${BENCH_ONLY:-} == soak ]]; then
  DATABASE_URL="$VOUCHER__DATABASE__URL" "$TARGET_DIR"/release/voucher-bench soak "$OUT"
  python3 -c 'import matplotlib' 2>/dev/null || pip install -q matplotlib
  python3 loadtest/plot.py --soak "$OUT"
  exit
fi
DATABASE_URL="$VOUCHER__DATABASE__URL" "$TARGET_DIR"/release/voucher-bench "$OUT"

log "plots"
python3 -c 'import matplotlib' 2>/dev/null || pip install -q matplotlib
python3 loadtest/plot.py "$OUT"
log "report: $OUT/REPORT.md"
