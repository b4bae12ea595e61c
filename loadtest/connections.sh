#!/usr/bin/env bash
# 10,000 idle or slow connections to the edge: what they cost in memory, and whether the
# others notice. Runs an edge of its own (release build, the file of up.sh's stack, on
# :18490) in front of up.sh's cores, with a sold-out voucher, and measures its resident
# memory and the sold-out reject path's latency (wrk, closed loop, 32 connections) without
# and with IDLE + SLOW connections held open. Report in reports/connections/REPORT.md.
#   IDLE=5000 SLOW=5000 ./loadtest/connections.sh
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

IDLE=${IDLE:-5000}
SLOW=${SLOW:-5000}
HOLD_SECS=${HOLD_SECS:-40}
OUT=${OUT:-reports/connections}
TOKEN=${VOUCHER__ADMIN__TOKEN:-dev-admin-token}
PORT=18490

start_stack
command -v wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
mkdir -p "$OUT"
# The run's own files (the edge's log, wrk's script and output) stay out of the report.
WORK="$RUN_DIR/connections"
mkdir -p "$WORK"
# Each held connection is a file descriptor at both ends (each end in its own process).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if (( $(ulimit -n) < IDLE + SLOW + 1000 )); then
  echo "open files limited to $(ulimit -n): lower IDLE and SLOW" >&2
  exit 1
fi

log "an edge of the run's own on :$PORT"
EDGE_CONFIG=config/edge.yaml EDGE__LISTEN=127.0.0.1:$PORT EDGE__METRICS_LISTEN=127.0.0.1:19490 \
  "$TARGET_DIR"/release/voucher-edge >"$WORK/edge.log" 2>&1 &
edge_pid=$!
trap 'kill $edge_pid 2>/dev/null' EXIT
wait_for_port 127.0.0.1 $PORT 30
sleep 1

code="CONN$(date +%s)"
ADMIN_TOKEN=$TOKEN sold_out_voucher "$code"
until_served_by_edge "$PORT" "$code"

rss() { awk '/^VmRSS/ { print $2 / 1024 }' "/proc/$edge_pid/status"; }
wrk_reserve_script "$code" "$WORK/reserve.lua"
# p50 p99 and requests/s of the reject path, closed loop.
reject() {
  wrk -t1 -c32 -d10s --latency -s "$WORK/reserve.lua" "http://127.0.0.1:$PORT" >"$WORK/wrk-$1.log"
  awk '/^ +50%/ { p50 = $2 } /^ +99%/ { p99 = $2 } /^Requests\/sec/ { rate = $2 } END { printf "%s | %s | %.0f/s", p50, p99, rate }' "$WORK/wrk-$1.log"
}

rss_before=$(rss)
log "reject path alone"
alone=$(reject alone)
log "holding $IDLE idle and $SLOW slow connections for ${HOLD_SECS}s"
python3 loadtest/connections/hold.py 127.0.0.1 $PORT "$IDLE" "$SLOW" "$HOLD_SECS" >"$WORK/hold.json" &
hold_pid=$!
sleep 8   # all opened (the hold script paces its connects)
established=$(ss -Htn state established "( sport = :$PORT )" | wc -l)
rss_held=$(rss)
log "reject path while they are open ($established connections established at the edge)"
held=$(reject held)
rss_after_load=$(rss)
wait $hold_pid
sleep 2
rss_end=$(rss)
established_end=$(ss -Htn state established "( sport = :$PORT )" | wc -l)
log "which of them the edge closes on its own: 300 idle and 300 slow held for 75 s"
closing=$(python3 loadtest/connections/hold.py 127.0.0.1 $PORT 300 300 75)

{
  echo "# Idle and slow connections at the edge"
  echo
  echo "command: \`IDLE=$IDLE SLOW=$SLOW HOLD_SECS=$HOLD_SECS ./loadtest/connections.sh\` ($(date -u +%F)); 2 cores shared by the edge, the cores, the holder and wrk"
  echo "the edge: release build, \`config/edge.yaml\` (client_timeout and threads at their defaults: 5 s, 2)"
  echo
  echo "| | edge RSS | reject path p50 | p99 | rate (wrk -t1 -c32 -d10s, every answer a 409 from the edge) |"
  echo "|---|---|---|---|---|"
  echo "| no held connections | ${rss_before} MiB | $alone |"
  echo "| $IDLE idle + $SLOW slow held ($established established at the edge when measured) | ${rss_held} MiB (${rss_after_load} MiB after wrk) | $held |"
  echo
  echo "holder: $(cat "$WORK/hold.json")"
  echo "after the holder finished: edge RSS ${rss_end} MiB, $established_end connections established"
  echo
  echo "held 75 s (300 idle, 300 slow): $closing"
  echo "(idle connections are closed by pingora's 60 s first-read timeout; a slow client that sends a header byte every 2 s is not: pingora 0.9 bounds each read, not the whole header.)"
} >"$OUT/REPORT.md"
cat "$OUT/REPORT.md"
