#!/usr/bin/env bash
# A/B of edge builds or settings on the sold-out reject path, with wrk, interleaved: each
# variant is started on :18080 in front of the running stack's cores (./scripts/up.sh or
# loadtest/bench.sh), its flag for a sold-out voucher set, warmed up for 2 s, measured
# for 5 s (wrk -t1 -c64), then stopped; three rounds. Prints requests/s, the edge's CPU
# per answer (from /proc/<pid>/stat: user and kernel apart, since callgrind counts only the
# first), peak RSS, and, where perf can read the kernel's syscall tracepoints, the edge's
# system calls per answer (SYSCALLS=1; perf stat -e raw_syscalls:sys_enter on its pid).
#   loadtest/edge-ab.sh "BINARY_A:ENV=VALUE" "BINARY_B:ENV=VALUE" ...
# e.g. loadtest/edge-ab.sh "/tmp/edge-old:EDGE__READ_BUFFER_BYTES=65536" "$HOME/.cache/voucher-gate/target/release/voucher-edge:EDGE__READ_BUFFER_BYTES=4096"
# FORWARD=1 measures the forward path instead, as loadtest/callgrind-edge.sh's FORWARD=1
# counts it: each variant runs with EDGE__SOLD_OUT_ANSWERS=false and core 1 alone as its
# upstream, so every reservation goes on to core 1, whose gate answers it 409 (a minimal
# Pingora variant is a wrapper that execs `minimal-pingora 127.0.0.1:18080 2 127.0.0.1:8081`).
# Core 1 then sets the rate; what the edge's CPU per answer says is what forwarding costs it.
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"
command -v wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
ROUNDS=${ROUNDS:-3}
CODE=AB$(date +%H%M%S)
sold_out_voucher "$CODE"
SCRIPT=$(mktemp --suffix=.lua)
trap 'rm -f "$SCRIPT" "$SCRIPT.perf"' EXIT
wrk_reserve_script "$CODE" "$SCRIPT"
FORWARDING=()
[[ ${FORWARD:-0} == 1 ]] && FORWARDING=(EDGE__SOLD_OUT_ANSWERS=false EDGE__UPSTREAMS=127.0.0.1:8081)
start_edge() { # BINARY [ENV=VALUE...]
  local bin=$1; shift
  env EDGE_CONFIG=config/edge.yaml EDGE__LISTEN=127.0.0.1:18080 EDGE__METRICS_LISTEN=127.0.0.1:19180 "$@" "${FORWARDING[@]}" "$bin" >/dev/null 2>&1 &
  EDGE_PID=$!
  if [[ ${FORWARD:-0} == 1 ]]; then
    wait_for_port 127.0.0.1 18080 30
    sleep 1  # the edge's first health check of core 1
  else
    until_served_by_edge 18080 "$CODE"
  fi
  wrk -t1 -c64 -d2s -s "$SCRIPT" http://127.0.0.1:18080 >/dev/null
}
for round in $(seq "$ROUNDS"); do
  for variant in "$@"; do
    IFS=: read -r bin envs <<<"$variant"
    # shellcheck disable=SC2086 # envs is a list of ENV=VALUE words
    start_edge "$bin" $envs
    read -r user_before sys_before < <(awk '{print $14, $15}' /proc/$EDGE_PID/stat)
    calls=""
    if [ "${SYSCALLS:-0}" = 1 ]; then
      perf stat -x, -e raw_syscalls:sys_enter -p "$EDGE_PID" -o "$SCRIPT.perf" -- sleep 6 &
      PERF_PID=$!
    fi
    answers=$(wrk -t1 -c64 -d5s -s "$SCRIPT" http://127.0.0.1:18080 | awk '/requests in/{print $1}')
    read -r user_after sys_after < <(awk '{print $14, $15}' /proc/$EDGE_PID/stat)
    if [ "${SYSCALLS:-0}" = 1 ]; then
      wait "$PERF_PID"
      # Counted over 6 s against wrk's 5: the edge is idle in the sixth.
      calls=$(awk -F, -v n="$answers" '/raw_syscalls/{printf ", %.2f syscalls per answer", $1 / n}' "$SCRIPT.perf")
    fi
    peak=$(awk '/VmHWM/{printf "%.1f", $2/1024}' /proc/$EDGE_PID/status)
    # CPU per answer (clock ticks of 10 ms): steadier than the rate on two shared cores,
    # where wrk and the edge take turns.
    cpu=$(awk -v u=$((user_after - user_before)) -v s=$((sys_after - sys_before)) -v n="$answers" \
      'BEGIN{printf "%.1f (user %.1f, kernel %.1f)", (u + s) * 1e4 / n, u * 1e4 / n, s * 1e4 / n}')
    echo "round $round, $variant: $((answers / 5)) requests/s, $cpu µs of the edge's CPU per answer, peak RSS $peak MiB$calls"
    # Measured: no graceful shutdown to wait for (pingora's own lasts a minute).
    kill -9 "$EDGE_PID"; wait "$EDGE_PID" 2>/dev/null || true
  done
done
