#!/usr/bin/env bash
# The project's test command: starts what the tests need, then runs every test of the
# workspace. Tests create their own databases, so it is safe to run while the stack is up.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

ensure_postgres
cargo test --workspace --locked "$@"
