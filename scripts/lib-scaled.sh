# The scaled stack of ./scripts/up-scaled.sh, as functions; source it after lib.sh.
# start_scaled_stack brings every piece up (each is left alone when it already runs).

SCALED="$RUN_DIR/scaled"
REDIS_PORTS=(7101 7102 7103 7104 7105 7106)
PG_PRIMARY=5433 PG_STANDBY=5434 BROKER=9094
CORES=(8091 8092 8093) EDGES=(8190 8290)
SCALED_DB=${SCALED_DB:-vouchers}   # the cores' database (the benchmark makes one per run)
mkdir -p "$SCALED"

redis_nodes() { local p out=(); for p in "${REDIS_PORTS[@]}"; do out+=("redis://127.0.0.1:$p"); done; (IFS=,; echo "${out[*]}"); }

# scaled_primary: the port of whichever PostgreSQL server is the primary now (after a
# promotion, the standby's).
scaled_primary() {
  if [[ $(psql -X -At -h 127.0.0.1 -p "$PG_PRIMARY" -U postgres -c 'SELECT pg_is_in_recovery()' 2>/dev/null) == f ]]; then
    echo "$PG_PRIMARY"
  else
    echo "$PG_STANDBY"
  fi
}

start_redis_cluster() {
  local port
  for port in "${REDIS_PORTS[@]}"; do
    if redis-cli -p "$port" ping >/dev/null 2>&1; then continue; fi
    mkdir -p "$SCALED/redis-$port"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --dir "$SCALED/redis-$port" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --repl-diskless-sync-delay 0 --save "" --appendonly no \
      --pidfile "$SCALED/redis-$port.pid" --logfile "$SCALED/redis-$port.log"
  done
  for port in "${REDIS_PORTS[@]}"; do
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
  # Nodes that ran before keep their cluster in nodes.conf: wait for them to agree again.
  if redis-cli -p "${REDIS_PORTS[0]}" cluster info | grep -q cluster_slots_assigned:16384; then
    for _ in $(seq 150); do
      if redis-cli -p "${REDIS_PORTS[0]}" cluster info | grep -q cluster_state:ok; then
        log "the Redis Cluster on ${REDIS_PORTS[0]}-${REDIS_PORTS[5]} is up"
        return 0
      fi
      sleep 0.2
    done
    echo "the Redis Cluster on ${REDIS_PORTS[0]} knows its slots but is not ok" >&2
    return 1
  fi
  log "creating the Redis Cluster: 3 masters, a replica each"
  local addrs=(); for port in "${REDIS_PORTS[@]}"; do addrs+=("127.0.0.1:$port"); done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$SCALED/redis-create.log"
  for _ in $(seq 100); do
    redis-cli -p "${REDIS_PORTS[0]}" cluster info | grep -q cluster_state:ok && return 0
    sleep 0.2
  done
  echo "the Redis Cluster did not settle" >&2
  return 1
}

# as_postgres COMMAND...: PostgreSQL refuses to run as root.
as_postgres() {
  if [[ $(id -u) -eq 0 ]]; then setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; else "$@"; fi
}

# start_pg DIR PORT: the server of DIR on PORT, logging to DIR/../NAME.log.
start_pg() {
  local dir=$1 port=$2
  if pg_isready -q -h 127.0.0.1 -p "$port"; then return 0; fi
  as_postgres "$(pg_config --bindir)/pg_ctl" -D "$dir" -l "$dir.log" -w -t 60 \
    -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$SCALED -c max_connections=200" start >/dev/null
}

start_postgres_pair() {
  local bin; bin=$(pg_config --bindir)
  [[ $(id -u) -eq 0 ]] && chown postgres:postgres "$SCALED"
  if [[ ! -d $SCALED/pg-primary ]]; then
    log "initdb: PostgreSQL primary in $SCALED/pg-primary"
    as_postgres "$bin/initdb" --auth=trust --username=postgres --encoding=UTF8 -D "$SCALED/pg-primary" >/dev/null
    cat >>"$SCALED/pg-primary/postgresql.auto.conf" <<CONF
wal_level = replica
max_wal_senders = 10
wal_keep_size = '256MB'
synchronous_standby_names = '*'
synchronous_commit = on
CONF
  fi
  log "starting the PostgreSQL primary on $PG_PRIMARY"
  start_pg "$SCALED/pg-primary" "$PG_PRIMARY"
  if [[ ! -d $SCALED/pg-standby ]]; then
    log "pg_basebackup: its synchronous standby in $SCALED/pg-standby"
    as_postgres "$bin/pg_basebackup" -h 127.0.0.1 -p "$PG_PRIMARY" -U postgres -D "$SCALED/pg-standby" \
      -X stream -R --checkpoint=fast
  fi
  log "starting the standby on $PG_STANDBY"
  start_pg "$SCALED/pg-standby" "$PG_STANDBY"
  local primary; primary=$(scaled_primary)
  for _ in $(seq 100); do
    [[ $(psql -X -At -h 127.0.0.1 -p "$primary" -U postgres -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") -ge 1 ]] && break
    sleep 0.2
  done
  if ! psql -X -At -h 127.0.0.1 -p "$primary" -U postgres -c "SELECT 1 FROM pg_database WHERE datname = '$SCALED_DB'" | grep -q 1; then
    psql -X -q -h 127.0.0.1 -p "$primary" -U postgres -c "CREATE DATABASE \"$SCALED_DB\""
  fi
}

start_scaled_stack() {
  ensure_build_tools
  start_redis_cluster
  start_postgres_pair
  start_broker "$BROKER" broker-scaled

  log "building voucher-core and voucher-edge (release; the first build takes several minutes)"
  cargo build --release -p voucher-core -p voucher-edge

  DB_URL="postgres://postgres@127.0.0.1:$PG_PRIMARY,127.0.0.1:$PG_STANDBY/$SCALED_DB?target_session_attrs=read-write"
  upstreams=()
  for i in 0 1 2; do
    port=${CORES[$i]}
    log "starting core $((i + 1)) on :$port (metrics :$((port + 1100)))"
    start_bg "scaled-core$((i + 1))" env VOUCHER_CONFIG=config/core.toml \
      VOUCHER__DATABASE__URL="$DB_URL" VOUCHER__REDIS__TOPOLOGY=cluster VOUCHER__REDIS__URL="$(redis_nodes)" \
      VOUCHER__KAFKA__BROKERS=127.0.0.1:$BROKER VOUCHER__KAFKA__PARTITIONS=6 \
      VOUCHER__HTTP__LISTEN=127.0.0.1:$port VOUCHER__HTTP__METRICS_LISTEN=127.0.0.1:$((port + 1100)) \
      "$TARGET_DIR"/release/voucher-core
    wait_for_port 127.0.0.1 "$port" 60
    upstreams+=("127.0.0.1:$port")
  done
  for i in 0 1; do
    port=${EDGES[$i]}
    log "starting edge $((i + 1)) on :$port (metrics :$((port + 1000)))"
    start_bg "scaled-edge$((i + 1))" env EDGE_CONFIG=config/edge.yaml \
      EDGE__LISTEN=127.0.0.1:$port EDGE__METRICS_LISTEN=127.0.0.1:$((port + 1000)) \
      EDGE__UPSTREAMS="$(IFS=,; echo "${upstreams[*]}")" EDGE__REDIS_URL="$(redis_nodes)" \
      "$TARGET_DIR"/release/voucher-edge
    wait_for_port 127.0.0.1 "$port" 30
  done
  sleep 1  # the edges' first health checks of the cores
}
