#!/usr/bin/env bash
# Brings up the scaled stack on this machine, beside the machine's own Redis (6379) and
# PostgreSQL (5432) and beside ./scripts/up.sh's stack, then runs a demo sale through both
# edges:
#   - a Redis Cluster of three masters with a replica each (redis-server with
#     cluster-enabled on 7101-7106, joined by redis-cli --cluster create);
#   - PostgreSQL on 5433 with a synchronous standby on 5434 (initdb, pg_basebackup -R;
#     synchronous_standby_names = '*', synchronous_commit = on);
#   - tansu on 9094, the events topic with 6 partitions (the cores create it);
#   - three cores on 8091-8093 (metrics 9191-9193), each given both PostgreSQL servers in one
#     URL (they follow the primary) and the cluster's nodes;
#   - two edges on 8190 and 8290 (metrics 9190 and 9290) in front of all three cores.
# Data, logs and pids live in run/scaled/ and run/. Stop it with ./scripts/down.sh.
# Promote the standby after losing the primary: scripts/pg-promote.sh --standby
# 127.0.0.1:5434 --old-primary 127.0.0.1:5433 --fenced, once the primary is stopped (docs/RUNBOOK.md).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-scaled.sh"
cd "$ROOT"

start_scaled_stack

code="SCALED$(date +%s)"
demo_voucher "http://127.0.0.1:${CORES[0]}" "$code"
log "demo sale: 1,000 customers at once, odd ones through edge 1, even ones through edge 2"
seq 1 1000 | xargs -P 50 -I{} sh -c 'port=$(( {} % 2 == 1 ? '"${EDGES[0]}"' : '"${EDGES[1]}"' )); curl -sS -o /dev/null -w "%{http_code}\n" -X POST "http://127.0.0.1:$port/vouchers/'"$code"'/reservations" \
  -H "Content-Type: application/json" -d "{\"customerId\":\"demo-c{}\",\"orderId\":\"'"$code"'-o{}\",\"orderAmount\":250000}"' \
  | sort | uniq -c | sed 's/^/   HTTP /'
sleep 1
log "voucher after the sale (usedCount must be exactly 100)"
curl -fsS "http://127.0.0.1:${EDGES[0]}/vouchers/$code"; echo
log "replication: the primary's synchronous standby"
psql -X -h 127.0.0.1 -p "$PG_PRIMARY" -U postgres -c 'SELECT application_name, state, sync_state FROM pg_stat_replication' 2>/dev/null \
  || psql -X -h 127.0.0.1 -p "$PG_STANDBY" -U postgres -c 'SELECT application_name, state, sync_state FROM pg_stat_replication'

cat <<TXT

Edges: http://127.0.0.1:${EDGES[0]} and http://127.0.0.1:${EDGES[1]}; cores :${CORES[0]}, :${CORES[1]}, :${CORES[2]} (admin calls).
Redis Cluster 127.0.0.1:${REDIS_PORTS[0]}-${REDIS_PORTS[5]}; PostgreSQL primary :$PG_PRIMARY, standby :$PG_STANDBY; tansu :$BROKER.
Logs in run/ (scaled-core*.log, scaled-edge*.log, broker-scaled.log) and run/scaled/.
Stop: ./scripts/down.sh
TXT
