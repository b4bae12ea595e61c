#!/usr/bin/env bash
# What a core's memory holds with many busy connections: a core of its own (port 18083,
# metrics 19183) on the machine's PostgreSQL, Redis and up.sh's broker, sent new flash
# reservations of one voucher by wrk with CONNS connections in closed loop for SECS
# seconds. Twice: the release build as it ships (mimalloc; its peak resident memory,
# VmHWM, as the benchmark reads it), then the same code built with the feature
# `system-allocator` under heaptrack (which sees only malloc), whose peak heap is broken
# down by what allocated it (loadtest/heap/group.py). Report in reports/heap/REPORT.md.
#   CONNS=1000 SECS=6 ./loadtest/heap-core.sh
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

CONNS=${CONNS:-1000}
SECS=${SECS:-6}
OUT=${OUT:-reports/heap}
PORT=18083
WORK="$RUN_DIR/heap"
mkdir -p "$WORK" "$OUT"

VOUCHER__DATABASE__URL=$(local_db_url vouchers)
export VOUCHER__DATABASE__URL
ensure_build_tools
ensure_postgres
ensure_redis
ensure_database vouchers
start_broker 9092
command -v wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
command -v heaptrack >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq heaptrack >/dev/null; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# The profiled build first, copied aside; then the shipped one, so the target directory is
# left holding what up.sh runs.
log "building voucher-core with the system allocator (for heaptrack), then as it ships"
cargo build --release -p voucher-core --features system-allocator
cp "$TARGET_DIR"/release/voucher-core "$WORK/voucher-core-system-allocator"
cargo build --release -p voucher-core

# run NAME COMMAND...: a core started by COMMAND on $PORT, a voucher of its own, the load;
# prints "rest_mib peak_mib accepted refused" and leaves wrk's output in $WORK/NAME.wrk.
run() {
  local name=$1; shift
  env VOUCHER_CONFIG=config/core.toml VOUCHER__HTTP__LISTEN=127.0.0.1:$PORT \
    VOUCHER__HTTP__METRICS_LISTEN=127.0.0.1:19183 VOUCHER__LOG__ACCESS=false \
    "$@" >"$WORK/$name.log" 2>&1 &
  local launcher=$! pid code
  wait_for_port 127.0.0.1 $PORT 60
  pid=$(ss -ltnpH "sport = :$PORT" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
  code="HEAP$(date +%s%N | tail -c 9)"
  demo_voucher "http://127.0.0.1:$PORT" "$code" 100000000 >/dev/null
  wrk_reserve_script "$code" "$WORK/reserve.lua"
  sleep 2
  local rest
  rest=$(awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status")
  wrk -t2 -c"$CONNS" -d"${SECS}s" -s "$WORK/reserve.lua" "http://127.0.0.1:$PORT" >"$WORK/$name.wrk"
  local peak counts
  peak=$(awk '/^VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status")
  counts=$(curl -s localhost:19183/metrics | awk '
    /^voucher_reservations_total\{mode="flash",outcome="reserved"\}/ { a = $2 }
    /^voucher_admission_refused_total/ { r = $2 }
    END { printf "%d %d", a, r }')
  kill -TERM "$pid"
  wait "$launcher" 2>/dev/null || true
  echo "$rest $peak $counts"
}

log "the core as it ships, $CONNS connections for ${SECS}s"
read -r rest peak accepted refused < <(run shipped "$TARGET_DIR"/release/voucher-core)
log "the core under heaptrack, the same load"
rm -f "$WORK"/profile.*
read -r h_rest h_peak h_accepted h_refused < <(run profiled heaptrack -o "$WORK/profile" "$WORK/voucher-core-system-allocator")
profile=$(ls "$WORK"/profile.*)
heaptrack_print -f "$profile" --print-peaks 0 --print-allocators 0 --print-temporary 0 --print-leaks 0 \
  -F "$WORK/stacks.txt" --flamegraph-cost-type peak >"$WORK/summary.txt" 2>/dev/null
heap_peak=$(awk '/^peak heap memory consumption/ { print $5 }' "$WORK/summary.txt")

{
  echo "# A core's memory with $CONNS busy connections"
  echo
  echo "\`CONNS=$CONNS SECS=$SECS ./loadtest/heap-core.sh\`, $(date -u '+%F %H:%M') UTC, $(nproc) cores"
  echo "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')). A core of its own on"
  echo "the machine's PostgreSQL and Redis; wrk -t2 -c$CONNS -d${SECS}s sends new flash reservations"
  echo "of one voucher (100,000,000 uses, so none is refused for stock) in closed loop, which keeps"
  echo "the core past its admission limit: most answers are 503 OVERLOADED, and every connection has"
  echo "a request in flight nearly all the time."
  echo
  echo "| build | resident at rest | peak resident (VmHWM) | accepted | refused (503) |"
  echo "|---|---|---|---|---|"
  echo "| as shipped (mimalloc) | $rest MiB | $peak MiB | $accepted | $refused |"
  echo "| system allocator under heaptrack | $h_rest MiB | $h_peak MiB | $h_accepted | $h_refused |"
  echo
  echo "heaptrack's peak heap (system-allocator build): **$heap_peak**. Its parts at that peak,"
  echo "grouped by the frame that allocated them (\`loadtest/heap/group.py\` on heaptrack's"
  echo "stacks, cost type peak; per connection = the part / $CONNS):"
  echo
  python3 loadtest/heap/group.py "$WORK/stacks.txt" "$CONNS"
  echo
  echo "Resident memory is more than the heap: the binary's pages, thread stacks, the"
  echo "allocator's free pages not yet returned (mimalloc, in the shipped build), and heaptrack's"
  echo "own bookkeeping in the profiled one."
} >"$OUT/REPORT.md"
log "report in $OUT/REPORT.md"
cat "$OUT/REPORT.md"
