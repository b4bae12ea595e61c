#!/usr/bin/env bash
# Where the edge's CPU goes on its reject path, beside the framework's own: the edge and
# the minimal Pingora (loadtest/bench/src/bin/minimal-pingora.rs: reads the body, answers
# the same 409 from request_filter, nothing else) each answer sold-out reservations to wrk
# -t1 -c64, one after the other, ROUNDS times; then each is recorded with perf. Needs the
# running stack's core 1 (./scripts/up.sh or loadtest/bench.sh). Writes OUT/EDGE.md
# (default reports/perf).
#
#   ROUNDS=3 THREADS=1,2 ./loadtest/perf-edge.sh
#
# Method: CPU per answer is user plus system time of the server process from
# /proc/<pid>/stat over a 5 s wrk run, divided by the answers wrk counted; each server
# runs with 1 and with 2 worker threads (THREADS), interleaved. Then, for each server
# with 2 threads, `perf record -e cpu-clock` (no hardware counters on this kind of machine)
# at 1999 Hz of all its threads for 6 s of wrk: shares of the server's own samples by
# part (kernel, allocator, framework and runtime, ours), the symbols with the most samples,
# and the same symbols' shares in both, side by side. Wall-clock sampling on two shared
# cores: compare shares within one recording and CPU per answer within one run.
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-1,2}
OUT=${OUT:-reports/perf}
command -v perf >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null; }
command -v wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
# The same two builds as start_stack and bench.sh (one command for both would resolve other
# features and rebuild the dependencies).
cargo build --release -p voucher-core -p voucher-edge
cargo build --release -p voucher-bench
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"; [[ -n ${SERVER_PID:-} ]] && kill -9 "$SERVER_PID" 2>/dev/null' EXIT

CODE=PE$(date +%H%M%S)
sold_out_voucher "$CODE"
SCRIPT=$work/reserve.lua
wrk_reserve_script "$CODE" "$SCRIPT"
PORT=18080

start_server() { # edge|minimal THREADS
  if [[ $1 == edge ]]; then
    env EDGE_CONFIG=config/edge.yaml EDGE__LISTEN=127.0.0.1:$PORT EDGE__METRICS_LISTEN=127.0.0.1:19180 \
      EDGE__THREADS="$2" "$TARGET_DIR"/release/voucher-edge >"$work/edge.log" 2>&1 &
  else
    "$TARGET_DIR"/release/minimal-pingora 127.0.0.1:$PORT "$2" >"$work/minimal.log" 2>&1 &
  fi
  SERVER_PID=$!
  if [[ $1 == edge ]]; then
    until_served_by_edge $PORT "$CODE"
  else
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.2; done
  fi
  wrk -t1 -c64 -d2s -s "$SCRIPT" http://127.0.0.1:$PORT >/dev/null
}
stop_server() {
  # Killed, not drained: a drain waits for its grace period, and nothing here needs one.
  kill -9 "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
ticks() { awk '{print $14+$15}' "/proc/$SERVER_PID/stat"; }

# CPU per answer, interleaved.
: >"$work/rates"
for round in $(seq "$ROUNDS"); do
  for threads in ${THREADS//,/ }; do
    for server in edge minimal; do
      start_server $server "$threads"
      before=$(ticks)
      answers=$(wrk -t1 -c64 -d5s -s "$SCRIPT" http://127.0.0.1:$PORT | awk '/requests in/{print $1}')
      after=$(ticks)
      stop_server
      echo "$round $threads $server $answers $((after - before))" >>"$work/rates"
      log "round $round, $server, $threads threads: $answers answers in 5 s"
    done
  done
done

# Profiles, 2 threads each.
for server in edge minimal; do
  start_server $server 2
  perf record -q -e cpu-clock -F 1999 -p "$SERVER_PID" -o "$work/$server.data" -- sleep 6 >/dev/null 2>&1 &
  recording=$!
  wrk -t1 -c64 -d6s -s "$SCRIPT" http://127.0.0.1:$PORT >/dev/null
  wait "$recording" || true
  stop_server
  perf report -i "$work/$server.data" --stdio -g none --sort dso,sym 2>/dev/null |
    { grep -v '^#' || true; } | grep -v '^$' >"$work/$server.symbols" || true
done

python3 - "$work" "$OUT/EDGE.md" "$ROUNDS" "$THREADS" "$(git rev-parse --short HEAD)" <<'PY'
import collections, re, statistics, sys, datetime
work, out, rounds, threads, rev = sys.argv[1:6]

rates = collections.defaultdict(list)
for line in open(f"{work}/rates"):
    rnd, th, server, answers, ticks = line.split()
    answers, ticks = int(answers), int(ticks)
    # wrk ran 5 s; ticks are 1/100 s.
    rates[(th, server)].append((answers / 5.0, ticks * 1e4 / max(answers, 1)))

def part(dso, sym):
    if dso == "[kernel.kallsyms]":
        return "kernel (TCP, syscalls, scheduler)"
    if sym.startswith(("mi_", "_mi_")):
        return "allocator (mimalloc)"
    if dso.startswith("libc") or dso == "[vdso]":
        return "libc (memcpy, clock, locks)"
    ours = ("voucher_edge", "voucher_contract", "voucher_admission", "prometheus", "moka",
            "serde", "tracing", "pingora_limits", "<voucher_edge", "<voucher_contract",
            "<serde", "<&mut serde", "<moka", "<prometheus", "<tracing")
    if sym.startswith(ours) or "voucher_edge::" in sym:
        return "ours (the edge's phases, metrics, flags, JSON, logs)"
    return "framework and runtime (pingora, tokio, http, bytes)"

def load(server):
    rows = []
    for line in open(f"{work}/{server}.symbols"):
        m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+\[[.k]\]\s+(.*?)\s*$", line)
        if m:
            rows.append((float(m.group(1)), m.group(2), m.group(3)))
    return rows

profiles = {s: load(s) for s in ("edge", "minimal")}
with open(out, "w") as f:
    w = lambda s="": f.write(s + "\n")
    w("# Where the edge's CPU goes on its reject path, beside its framework's")
    w()
    w(f"- when: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}; code: {rev}")
    w(f"- command: `ROUNDS={rounds} THREADS={threads} ./loadtest/perf-edge.sh` (the stack of `./scripts/up.sh` running)")
    w("- load: wrk -t1 -c64, each request a new reservation of a sold-out flash voucher; every answer the 409 the edge gives from its flag, or the minimal Pingora's same 409 from `request_filter`")
    w("- method: see the head of loadtest/perf-edge.sh: CPU per answer from `/proc/<pid>/stat` over 5 s of wrk, servers interleaved; then 6 s of `perf record -e cpu-clock` at 1999 Hz of each server with 2 threads, shares of that server's own samples")
    w()
    w("## CPU per answer, and answers per second")
    w()
    w("| threads | server | answers/s (each round) | µs of CPU per answer (each round) | median µs | edge / minimal (median µs) |")
    w("|---|---|---|---|---|---|")
    for th in threads.split(","):
        med = {}
        for server in ("edge", "minimal"):
            got = rates.get((th, server), [])
            med[server] = statistics.median(c for _, c in got) if got else float("nan")
        for server in ("edge", "minimal"):
            got = rates.get((th, server), [])
            ratio = f"{med['minimal'] / med['edge']:.2f} of the minimal's answers per µs" if server == "edge" else ""
            w(f"| {th} | {server} | {', '.join(f'{r:,.0f}' for r, _ in got)} | {', '.join(f'{c:.1f}' for _, c in got)} | {med[server]:.1f} | {ratio} |")
    w()
    w("## By part (2 threads)")
    w()
    w("| part | edge | minimal Pingora |")
    w("|---|---|---|")
    shares = {s: collections.Counter() for s in profiles}
    for s, rows in profiles.items():
        for share, dso, sym in rows:
            shares[s][part(dso, sym)] += share
    for p in sorted(set(shares["edge"]) | set(shares["minimal"]), key=lambda p: -shares["edge"][p]):
        w(f"| {p} | {shares['edge'][p]:.1f}% | {shares['minimal'][p]:.1f}% |")
    w()
    w("## The edge's symbols that the minimal Pingora does not run, or runs less (2 threads)")
    w()
    w("Shares are of each server's own samples; the edge spends more CPU per answer, so a share that is equal in both is more time in the edge.")
    w()
    w("| symbol | edge | minimal Pingora |")
    w("|---|---|---|")
    minimal = collections.Counter()
    for share, _, sym in profiles["minimal"]:
        minimal[sym[:110]] += share
    extra = collections.Counter()
    for share, _, sym in profiles["edge"]:
        extra[sym[:110]] += share
    listed = sorted(extra, key=lambda s: -(extra[s] - minimal.get(s, 0.0)))[:30]
    for sym in listed:
        w(f"| `{sym}` | {extra[sym]:.2f}% | {minimal.get(sym, 0.0):.2f}% |")
    w()
    w("## The 25 symbols with the most samples of their own, each server (2 threads)")
    w()
    for s in ("edge", "minimal"):
        w(f"### {s}")
        w()
        w("| share | library | symbol |")
        w("|---|---|---|")
        for share, dso, sym in profiles[s][:25]:
            w(f"| {share:.2f}% | `{dso}` | `{sym[:110]}` |")
        w()
PY
log "report: $OUT/EDGE.md"
