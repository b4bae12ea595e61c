#!/usr/bin/env bash
# Runs the image (scripts/image.sh) with podman and serves a sale through it: a core and
# an edge, each a container of the image as its non-root user, on the host's network
# against this machine's PostgreSQL; a standard voucher of 50 uses, 200 customers through
# the edge, exactly 50 served. Prints what each container ran as and what the sale gave.
#   ./scripts/image-sale.sh
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

IMAGE=${IMAGE:-localhost/voucher-gate:local}
export CONTAINERS_CONF="$ROOT/deploy/podman/containers.conf"
RUN=(podman --runtime runc run -d --network host)
ensure_postgres
command -v runc >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null; }
[[ -n $(buildah images -q "$IMAGE" 2>/dev/null) ]] || ./scripts/image.sh
DB=image_sale_$(date +%Y%m%d%H%M%S)
cleanup() {
  for name in vg-image-core vg-image-edge; do
    podman --runtime runc rm -f "$name" >/dev/null 2>&1 || true
    # A container whose start failed may be left in storage only.
    podman rm -f --storage "$name" >/dev/null 2>&1 || true
  done
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"$DB\"" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
ensure_database "$DB"
"${RUN[@]}" --name vg-image-core \
  -e VOUCHER__DATABASE__URL="$(local_db_url "$DB")" \
  -e VOUCHER__HTTP__LISTEN=127.0.0.1:8191 -e VOUCHER__HTTP__METRICS_LISTEN=127.0.0.1:9191 \
  -e VOUCHER__ADMIN__TOKEN=image-sale-admin -e VOUCHER__ADMIN__ORDERS_TOKEN=image-sale-orders \
  "$IMAGE" >/dev/null
wait_for_port 127.0.0.1 8191 30
"${RUN[@]}" --name vg-image-edge --entrypoint /usr/local/bin/voucher-edge \
  -e EDGE__LISTEN=127.0.0.1:8190 -e EDGE__METRICS_LISTEN=127.0.0.1:9190 \
  -e EDGE__UPSTREAMS=localhost:8191 -e EDGE__SOLD_OUT_ANSWERS=false \
  "$IMAGE" >/dev/null
wait_for_port 127.0.0.1 8190 30
for name in vg-image-core vg-image-edge; do
  pid=$(podman inspect -f '{{.State.Pid}}' "$name")
  echo "$name: uid $(awk '/^Uid/ {print $2}' "/proc/$pid/status"), $(podman inspect -f '{{.ImageName}}' "$name")"
done
now=$(date -u +%s)
curl -fsS -o /dev/null -X POST http://127.0.0.1:8191/vouchers -H 'Authorization: Bearer image-sale-admin' \
  -H 'Content-Type: application/json' -d "{\"code\":\"IMAGE50\",\"discountAmount\":1000,\"totalLimit\":50,\
\"startsAt\":\"$(date -u -d @$((now - 60)) +%FT%TZ)\",\"endsAt\":\"$(date -u -d @$((now + 3600)) +%FT%TZ)\"}"
until curl -fsS -o /dev/null http://127.0.0.1:8190/readyz; do sleep 0.2; done
declare -A answers=()
for i in $(seq 1 200); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST http://127.0.0.1:8190/vouchers/IMAGE50/reservations \
    -H 'Content-Type: application/json' -d "{\"customerId\":\"c$i\",\"orderId\":\"o$i\",\"orderAmount\":5000}")
  answers[$code]=$(( ${answers[$code]:-0} + 1 ))
done
for code in "${!answers[@]}"; do echo "answers $code: ${answers[$code]}"; done
used=$(curl -fsS http://127.0.0.1:8191/vouchers/IMAGE50 | python3 -c 'import json,sys; print(json.load(sys.stdin)["usedCount"])')
echo "usedCount: $used"
[[ ${answers[201]:-0} == 50 && $used == 50 ]] || { echo "the sale through the image did not sell exactly 50" >&2; exit 1; }
log "a sale through the image: 50 of 200 served, the rest refused"
