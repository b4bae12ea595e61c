#!/usr/bin/env bash
# What traces cost the edge's reject path (the sold-out 409s the edge answers itself), with
# edge-ab.sh's interleaved wrk rounds in front of the running stack's cores
# (./scripts/up.sh first). Three edges:
#   untraced  built without the `traces` feature: no tracing code at all;
#   off       the default build, as shipped: tracing.otlp_endpoint unset;
#   on        the default build exporting every request's span (sample_ratio 1) to an
#             OTLP/HTTP receiver on 127.0.0.1:14318 (loadtest/bench's otlp-sink).
# Prints every round, then each variant's mean and its ratio to the untraced build.
#   ROUNDS=5 loadtest/traces-ab.sh
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"
ROUNDS=${ROUNDS:-5}
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
  "/tmp/voucher-edge-traced:EDGE__TRACING__OTLP_ENDPOINT=http://127.0.0.1:14318 EDGE__TRACING__SAMPLE_RATIO=1" | tee "$OUT"
kill "$SINK"; wait "$SINK" 2>/dev/null || true
echo "spans the receiver took: $(tail -1 /tmp/otlp-sink.out)"
awk '
  /requests\/s/ {
    v = ($0 ~ /OTLP_ENDPOINT/) ? "on" : ($0 ~ /untraced/ ? "untraced" : "off")
    match($0, /[0-9]+ requests\/s/); rate[v] += substr($0, RSTART, RLENGTH - 11)
    match($0, /requests\/s, [0-9.]+/); cpu[v] += substr($0, RSTART + 12, RLENGTH - 12)
    n[v]++
  }
  END {
    split("untraced off on", names, " ")
    for (i = 1; i <= 3; i++) {
      v = names[i]
      printf "%-8s %8.0f requests/s (%.3f of untraced), %5.2f µs of CPU per answer (%.3f)\n",
        v, rate[v] / n[v], (rate[v] / n[v]) / (rate["untraced"] / n["untraced"]),
        cpu[v] / n[v], (cpu[v] / n[v]) / (cpu["untraced"] / n["untraced"])
    }
  }' "$OUT"
rm -f "$OUT"
