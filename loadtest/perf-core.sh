#!/usr/bin/env bash
# Where a core's CPU goes while it accepts: perf samples of core 1 while voucher-bench's
# accept step offers RATE new reservations/s of one flash voucher straight to it (open
# model, PostgreSQL deciding). Writes OUT/CORE.md (default reports/perf).
#
#   RATE=8000 PERF_SECS=8 ./loadtest/perf-core.sh
#
# Method: `perf record -e cpu-clock` (this kind of machine has no hardware counters: `perf
# stat -e cycles true` says "not supported"), sampling at 997 Hz every thread of the core
# for PERF_SECS, starting 3 s into a step of PERF_SECS + 6 s. Shares are of the core's own
# samples: by thread, by library, and the 40 symbols with the most samples of their own.
# Then a second, shorter recording with DWARF call graphs gives the inclusive share of the
# frames that name a part of the request (hyper's reads and writes, the handler, the gate
# call, the recorder, tracing's spans). Wall-clock sampling on two shared cores: compare
# shares within one recording, not across runs.
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

RATE=${RATE:-8000}
PERF_SECS=${PERF_SECS:-8}
OUT=${OUT:-reports/perf}
export DB_NAME=${DB_NAME:-perf_$(date +%Y%m%d%H%M%S)}
export VOUCHER__KAFKA__TOPIC=${VOUCHER__KAFKA__TOPIC:-events_$DB_NAME}
export KAFKA_TOPIC=$VOUCHER__KAFKA__TOPIC
command -v perf >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null; }
if [[ -z ${REPORT_ONLY:-} ]]; then
  start_stack
  cargo build --release -p voucher-bench
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# The recordings (tens of MiB) stay in WORK when it is given, for perf report by hand.
if [[ -n ${WORK:-} ]]; then mkdir -p "$WORK"; work=$WORK; else work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi
core_pid=$(cat "$RUN_DIR/core.pid" 2>/dev/null || echo none)

# One step, recorded twice: flat, then with call graphs.
profile() { # $1: perf record options, $2: seconds, $3: output
  STEP_SECS=$(($2 + 6)) ACCEPT_RATES=$RATE DATABASE_URL="$VOUCHER__DATABASE__URL" \
    "$TARGET_DIR"/release/voucher-bench accept "$work/bench" >"$work/bench.log" 2>&1 &
  local bench=$!
  sleep 3
  # shellcheck disable=SC2086
  perf record -q -e cpu-clock -F 997 $1 -p "$core_pid" -o "$3" -- sleep "$2" >/dev/null 2>&1
  wait "$bench"
}
if [[ -z ${REPORT_ONLY:-} ]]; then # REPORT_ONLY=1 WORK=dir: only rewrite CORE.md from WORK
  log "recording core 1 (pid $core_pid) for ${PERF_SECS}s at $RATE accepts/s offered"
  profile "" "$PERF_SECS" "$work/flat.data"
  cp "$work/bench/ACCEPT.md" "$work/flat-step.md"
  profile "--call-graph dwarf,16384" 4 "$work/graph.data"
fi

table() { # perf report rows as a markdown table: $1 the header's name, then report options
  local name=$1; shift
  printf '| share | %s |\n|---|---|\n' "$name"
  perf report -i "$work/flat.data" --stdio -g none "$@" 2>/dev/null |
    { grep -v '^#' || true; } | grep -v '^$' | head -40 |
    sed -E 's/^ *([0-9.]+%) +(\[[.k]\] )?(.*)$/| \1 | `\3` |/' | cut -c1-220 || true
}
inclusive() { # the inclusive share of the first frame matching $2, named $1
  local share
  share=$(perf report -i "$work/graph.data" --children --sort sym --stdio -g none 2>/dev/null |
    grep -v '^#' | grep -F -- "$2" | head -1 | awk '{print $1}') || true
  printf '| %s | %s | `%s` |\n' "$1" "${share:-not sampled}" "$2"
}

{
  echo "# Where a core's CPU goes while it accepts"
  echo
  echo "- when: $(date -u +%FT%TZ); code: $(git rev-parse --short HEAD)"
  echo "- command: \`RATE=$RATE PERF_SECS=$PERF_SECS ./loadtest/perf-core.sh\`"
  echo "- load: voucher-bench's accept step, $RATE new reservations/s offered to core 1, one flash voucher, PostgreSQL deciding; the step's own result: $(grep -E '^\| [0-9]+ \|' "$work/flat-step.md" | head -1 | cut -d'|' -f2-5 | tr -s ' ' | sed 's/|/ offered, /; s/|/ accepted, p99 /; s/|$//') (flat recording's step)"
  echo "- method: see the head of loadtest/perf-core.sh: cpu-clock samples at 997 Hz of every thread of the core, shares of its samples"
  echo
  echo "## By thread"
  echo
  table thread --sort comm
  echo
  echo "## By library"
  echo
  table library --sort dso
  echo
  echo "## The 40 symbols with the most samples of their own"
  echo
  table symbol --sort sym
  echo
  echo "## Inclusive shares of the request's parts (DWARF call graphs, 4 s)"
  echo
  echo "Frames that unwinding could not follow (about a third of the samples) count for none, so these are lower bounds."
  echo
  echo '| part | inclusive share | frame |'
  echo '|---|---|---|'
  inclusive "HTTP: the connection's whole life (hyper)" "hyper::proto::h1::dispatch::Dispatcher<D,Bs,I,T>::poll_catch"
  inclusive "HTTP: writing answers (writev)" "__GI___writev"
  inclusive "HTTP: reading requests" "poll_read_head<hyper"
  inclusive "the reserve handler, gate call and recorder wait included" "voucher_core::http::reservations::reserve::{async_fn#0}"
  inclusive "the gate's reserve script call" "voucher_core::flash::gate::reserve::<impl voucher_core::flash::gate::Gate>::reserve"
  inclusive "Redis connection's driver task" "redis::aio::multiplexed_connection::PipelineSink"
  inclusive "the recorder's worker" "voucher_core::flash::recorder::Worker::run"
  inclusive "the event's announcement" "voucher_core::flash::events::publisher::Announcer::announce"
  inclusive "tracing: making spans" "tracing_subscriber::fmt::Subscriber<N,E,F,W> as tracing_core::subscriber::Subscriber>::new_span"
  inclusive "allocation (mimalloc)" "mi_malloc"
} >"$OUT/CORE.md"
log "report: $OUT/CORE.md"
