#!/usr/bin/env bash
# What traces cost the edge's reject path (the sold-out 409s the edge answers itself), with
# edge-ab.sh's interleaved wrk rounds in front of the running stack's cores
# (./scripts/up.sh first). Three edges:
#   untraced  built without the `traces` feature: no tracing code at all;
#   off       the default build, as shipped: tracing.otlp_endpoint unset;
#   on        the default build exporting every request's span (sample_ratio 1) to an
#             OTLP/HTTP receiver on 127.0.0.1:14318 (loadtest/bench's otlp-sink);
#   on-1%     the same keeping 1% of the traces (sample_ratio 0.01).
# Prints every round, then each variant's mean and its ratio to the untraced build. Wall
# time on two shared cores (with steal time) moves by tens of percent between rounds, so
# each variant's instructions per answer are counted too, by callgrind: the edge under
# valgrind, its flag set and warmed, then N answers, one request at a time, counted from
# the first to the last (every thread, the exporter's included).
#   ROUNDS=5 N=500 loadtest/traces-ab.sh
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"
ROUNDS=${ROUNDS:-5}
N=${N:-500}
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
release=$TARGET_DIR/release
# The default build first, as scripts/lib.sh builds it (the same features everywhere).
cargo build --release -q -p voucher-core -p voucher-edge
cp "$release/voucher-edge" /tmp/voucher-edge-traced
cargo build --release -q -p voucher-edge --no-default-features
cp "$release/voucher-edge" /tmp/voucher-edge-untraced
cargo build --release -q -p voucher-core -p voucher-edge
cargo build --release -q -p voucher-bench --bin otlp-sink
"$release/otlp-sink" --listen 127.0.0.1:14318 >/tmp/otlp-sink.out 2>/dev/null &
SINK=$!
trap 'kill "$SINK" 2>/dev/null || true' EXIT
OUT=$(mktemp)
ROUNDS=$ROUNDS ./loadtest/edge-ab.sh \
  "/tmp/voucher-edge-untraced:" \
  "/tmp/voucher-edge-traced:" \
  "/tmp/voucher-edge-traced:EDGE__TRACING__OTLP_ENDPOINT=http://127.0.0.1:14318 EDGE__TRACING__SAMPLE_RATIO=1" \
  "/tmp/voucher-edge-traced:EDGE__TRACING__OTLP_ENDPOINT=http://127.0.0.1:14318 EDGE__TRACING__SAMPLE_RATIO=0.01" | tee "$OUT"

# count_instructions BINARY [ENV=VALUE...]: instructions per sold-out answer of the edge.
CG=$(mktemp -d)
count_instructions() {
  local bin=$1 code i pid; shift
  code=CG$(date +%H%M%S)
  sold_out_voucher "$code"
  env EDGE_CONFIG=config/edge.yaml EDGE__LISTEN=127.0.0.1:18080 EDGE__METRICS_LISTEN=127.0.0.1:19180 "$@" \
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$CG/cg.%p.out" "$bin" >/dev/null 2>&1 &
  pid=$!
  wait_for_port 127.0.0.1 18080 180
  until_served_by_edge 18080 "$code"
  for i in $(seq 20); do
    curl -s -o /dev/null -X POST localhost:18080/vouchers/"$code"/reservations -H 'content-type: application/json' \
      -d "{\"customerId\":\"w$i\",\"orderId\":\"$code-w$i\",\"orderAmount\":250000}"
  done
  callgrind_control -i on "$pid" >/dev/null 2>&1
  for i in $(seq "$N"); do
    curl -s -o /dev/null -X POST localhost:18080/vouchers/"$code"/reservations -H 'content-type: application/json' \
      -d "{\"customerId\":\"n$i\",\"orderId\":\"$code-n$i\",\"orderAmount\":250000}"
  done
  callgrind_control --dump=counted "$pid" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  grep -h -m1 '^totals:\|^summary:' "$CG"/cg."$pid".out.1 | awk -v n="$N" '{printf "%d", $2 / n}'
  rm -f "$CG"/cg."$pid".*
}
untraced=$(count_instructions /tmp/voucher-edge-untraced)
off=$(count_instructions /tmp/voucher-edge-traced)
on=$(count_instructions /tmp/voucher-edge-traced EDGE__TRACING__OTLP_ENDPOINT=http://127.0.0.1:14318 EDGE__TRACING__SAMPLE_RATIO=1)
sampled=$(count_instructions /tmp/voucher-edge-traced EDGE__TRACING__OTLP_ENDPOINT=http://127.0.0.1:14318 EDGE__TRACING__SAMPLE_RATIO=0.01)
rmdir "$CG"
kill "$SINK"; wait "$SINK" 2>/dev/null || true
echo "spans the receiver took: $(tail -1 /tmp/otlp-sink.out)"
echo "instructions per sold-out answer (callgrind, N=$N, one request at a time):"
awk -v u="$untraced" -v f="$off" -v o="$on" -v s="$sampled" 'BEGIN {
  printf "untraced %d\noff      %d (%.3f of untraced)\non       %d (%.3f of untraced)\non-1%%    %d (%.3f of untraced)\n",
    u, f, f / u, o, o / u, s, s / u }'

awk '
  /requests\/s/ {
    v = ($0 ~ /RATIO=0.01/) ? "on-1%" : ($0 ~ /OTLP_ENDPOINT/) ? "on" : ($0 ~ /untraced/ ? "untraced" : "off")
    match($0, /[0-9]+ requests\/s/); rate[v] += substr($0, RSTART, RLENGTH - 11)
    match($0, /requests\/s, [0-9.]+/); cpu[v] += substr($0, RSTART + 12, RLENGTH - 12)
    n[v]++
  }
  END {
    split("untraced off on on-1%", names, " ")
    for (i = 1; i <= 4; i++) {
      v = names[i]
      printf "%-8s %8.0f requests/s (%.3f of untraced), %5.2f µs of CPU per answer (%.3f)\n",
        v, rate[v] / n[v], (rate[v] / n[v]) / (rate["untraced"] / n["untraced"]),
        cpu[v] / n[v], (cpu[v] / n[v]) / (cpu["untraced"] / n["untraced"])
    }
  }' "$OUT"
rm -f "$OUT"
