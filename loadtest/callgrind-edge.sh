#!/usr/bin/env bash
# Instructions per sold-out answer of the edge, beside the framework's own (the minimal
# Pingora of loadtest/bench/src/bin/minimal-pingora.rs: reads the body, answers the same 409
# from request_filter, nothing else), counted by callgrind: repeatable on two shared,
# noisy cores where wall-clock rates are not. Needs the running stack's core 1
# (./scripts/up.sh or loadtest/bench.sh) for the edge's flag.
#
#   ROUNDS=2 N=2000 loadtest/callgrind-edge.sh [EDGE_BINARY...]
#
# Method: each server runs under `valgrind --tool=callgrind` with 2
# worker threads; its flag set (the edge) and warmed with 200 requests, the counts are
# zeroed (`callgrind_control --zero`), one curl sends N new reservations of the sold-out
# voucher over one keep-alive connection (a config file of N requests, each its own
# customer and orderId, as wrk's reject runs send), and the counts are dumped. Instructions
# of the whole process (every thread: pingora's, tokio's, the edge's background tasks)
# divided by N. Servers interleaved, ROUNDS times. With EDGE_BINARY given (several for an
# A/B), those are counted instead of the release build. The last round's dumps are kept in
# OUT (default /tmp/callgrind-edge) for `callgrind_annotate --inclusive=yes`.
#
# FORWARD=1 counts the forward path instead: the edge without its sold-out answers
# (EDGE__SOLD_OUT_ANSWERS=false) and the minimal Pingora given core 1 as its upstream both
# send every reservation on to core 1, whose gate answers it 409 OUT_OF_STOCK; only the
# proxy's instructions are counted, per forwarded request.
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

ROUNDS=${ROUNDS:-2}
N=${N:-2000}
OUT=${OUT:-/tmp/callgrind-edge}
command -v valgrind >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
# The same two builds as start_stack and bench.sh (one command for both would resolve other
# features and rebuild the dependencies).
cargo build --release -p voucher-core -p voucher-edge
cargo build --release -p voucher-bench
EDGES=("$@")
[[ ${#EDGES[@]} -eq 0 ]] && EDGES=("$TARGET_DIR/release/voucher-edge")
mkdir -p "$OUT"
PORT=18080
# Pingora listens with SO_REUSEPORT: a server left on the port would share the requests.
if (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null; then
  echo "something listens on 127.0.0.1:$PORT already; stop it first" >&2
  exit 1
fi
CODE=CE$(date +%H%M%S)
sold_out_voucher "$CODE"

# requests FILE TAG COUNT: COUNT reservations of CODE for one curl, each its own customer
# and order.
requests() {
  local file=$1 tag=$2 count=$3 i
  : >"$file"
  for i in $(seq "$count"); do
    [[ $i -gt 1 ]] && echo next >>"$file"
    printf 'url = "http://127.0.0.1:%s/vouchers/%s/reservations"\nheader = "content-type: application/json"\ndata = "{\\"customerId\\":\\"%s%s\\",\\"orderId\\":\\"%s-%s%s\\",\\"orderAmount\\":250000}"\noutput = "/dev/null"\nwrite-out = "%%{http_code}\\n"\n' \
      "$PORT" "$CODE" "$tag" "$i" "$CODE" "$tag" "$i" >>"$file"
  done
}
WARM=$OUT/warm.curl
requests "$WARM" w 200

# count NAME COMMAND...: instructions per answer of COMMAND's process, printed.
count() {
  local name=$1 pid tag answers; shift
  "$@" >"$OUT/$name.log" 2>&1 &
  pid=$!
  wait_for_port 127.0.0.1 $PORT 180
  [[ $name == edge* && ${FORWARD:-0} != 1 ]] && until_served_by_edge $PORT "$CODE"
  curl -s -K "$WARM" >/dev/null
  tag=n$RANDOM
  requests "$OUT/measured.curl" "$tag" "$N"
  rm -f "$OUT/$name.cg"*
  callgrind_control --zero "$pid" >/dev/null 2>&1
  answers=$(curl -s -K "$OUT/measured.curl" | grep -c '^409$')
  callgrind_control --dump=counted "$pid" >/dev/null 2>&1
  # The dump is written by the process itself, after the control call returns.
  for _ in $(seq 300); do compgen -G "$OUT/cg.$pid.out.*" >/dev/null && break; sleep 0.1; done
  sleep 1
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true
  cp "$(ls -t "$OUT"/cg."$pid".out.* | head -1)" "$OUT/$name.cg"
  rm -f "$OUT"/cg."$pid".*
  [[ $answers -eq $N ]] || echo "$name: $answers of $N answers were 409s" >&2
  grep -h -m1 '^totals:\|^summary:' "$OUT/$name.cg" | awk -v n="$N" -v name="$name" '{printf "%s %d\n", name, $2 / n}'
}

# valgrind is exec'd in place (env, or directly), so $! is the pid callgrind names its dump by.
CALLGRIND=(valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.%p.out")
UPSTREAM=()
FORWARDING=()
if [[ ${FORWARD:-0} == 1 ]]; then
  UPSTREAM=(127.0.0.1:8081)
  FORWARDING=(EDGE__SOLD_OUT_ANSWERS=false EDGE__UPSTREAMS=127.0.0.1:8081)
fi
for round in $(seq "$ROUNDS"); do
  echo "round $round (instructions per answer, N=$N):"
  count minimal "${CALLGRIND[@]}" "$TARGET_DIR"/release/minimal-pingora 127.0.0.1:$PORT 2 "${UPSTREAM[@]}"
  i=0
  for bin in "${EDGES[@]}"; do
    i=$((i + 1))
    count "edge$i" env EDGE_CONFIG=config/edge.yaml EDGE__LISTEN=127.0.0.1:$PORT \
      EDGE__METRICS_LISTEN=127.0.0.1:19180 EDGE__THREADS=2 "${FORWARDING[@]}" \
      "${CALLGRIND[@]}" "$bin"
  done
done
echo "dumps of the last round: $OUT/*.cg (callgrind_annotate --inclusive=yes FILE)"
