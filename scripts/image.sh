#!/usr/bin/env bash
# Builds the container image of edge and core with Debian's buildah, from scratch (no
# registry is reached): the two release binaries (stripped), the shared libraries they load
# (as ldd lists them, with the loader), the CA certificates, and a passwd entry for the
# non-root user 10001 it runs as. Nothing else: no shell, no package manager.
#   ./scripts/image.sh            # tags localhost/voucher-gate:local, prints its size
# The entrypoint is the core; the edge runs with --entrypoint /usr/local/bin/voucher-edge
# (deploy/kubernetes/ sets the command of each).
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

IMAGE=${IMAGE:-localhost/voucher-gate:local}
ensure_build_tools
if ! command -v buildah >/dev/null 2>&1; then
  log "installing buildah and podman (Debian packages)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah podman >/dev/null
fi
log "building voucher-core and voucher-edge (release)"
cargo build --release -p voucher-core -p voucher-edge

ctr=$(buildah from scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
root=$(buildah mount "$ctr")
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"
for bin in voucher-core voucher-edge; do
  strip -o "$root/usr/local/bin/$bin" "$TARGET_DIR/release/$bin"
  # Every library the binary loads, at the path it is loaded from, and the loader.
  for lib in $(ldd "$TARGET_DIR/release/$bin" | awk '/=> \// {print $3} /^\s*\/lib/ {print $1}'); do
    cp --parents -L -n "$lib" "$root/"
  done
done
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0::/:/nonexistent\nvoucher:x:10001:10001::/nonexistent:/nonexistent\n' >"$root/etc/passwd"
printf 'root:x:0:\nvoucher:x:10001:\n' >"$root/etc/group"
buildah umount "$ctr" >/dev/null
buildah config \
  --user 10001:10001 \
  --workingdir / \
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --entrypoint '["/usr/local/bin/voucher-core"]' \
  --port 8081 --port 9181 --port 8080 --port 9180 \
  --label org.opencontainers.image.title=voucher-gate \
  "$ctr"
buildah commit --quiet --rm "$ctr" "$IMAGE" >/dev/null
trap - EXIT
size=$(buildah images --format '{{.Size}}' "$IMAGE")
log "built $IMAGE: $size"
echo "$size"
