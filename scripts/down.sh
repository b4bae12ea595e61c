#!/usr/bin/env bash
# Stops what ./scripts/up.sh started (PostgreSQL is the machine's and keeps running).
. "$(dirname "$0")/lib.sh"
stop_bg core
log "stopped"
