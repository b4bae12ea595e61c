#!/usr/bin/env bash
# The project's test command: installs and starts what the tests need, then runs every
# test of the workspace. Tests create their own databases, Redis key prefixes, brokers
# (tansu on free ports), topics and groups, so it is safe to run while the stack is up.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

ensure_build_tools
ensure_postgres
ensure_redis
ensure_tansu
ensure_k6
ensure_prometheus
ensure_faketime
ensure_schemathesis
ensure_socat
ensure_openapi_client
ensure_kubernetes_tools
cargo test --workspace --locked "$@"
