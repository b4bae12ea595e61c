#!/usr/bin/env bash
# Stops what ./scripts/up.sh and ./scripts/up-scaled.sh started (the machine's own PostgreSQL
# and Redis keep running). The scaled stack's data stays in run/scaled/ for the next start.
. "$(dirname "$0")/lib.sh"
stop_bg edge
stop_bg core
stop_bg core2
stop_bg broker
for name in scaled-edge1 scaled-edge2 scaled-core1 scaled-core2 scaled-core3 broker-scaled; do
  stop_bg "$name"
done
for port in 7101 7102 7103 7104 7105 7106; do
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
done
for dir in "$RUN_DIR"/scaled/pg-primary "$RUN_DIR"/scaled/pg-standby; do
  if [[ -f $dir/postmaster.pid ]]; then
    if [[ $(id -u) -eq 0 ]]; then
      setpriv --reuid=postgres --regid=postgres --init-groups -- "$(pg_config --bindir)/pg_ctl" -D "$dir" -m fast stop >/dev/null || true
    else
      "$(pg_config --bindir)/pg_ctl" -D "$dir" -m fast stop >/dev/null || true
    fi
  fi
done
log "stopped"
