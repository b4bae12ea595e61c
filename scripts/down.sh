#!/usr/bin/env bash
# Stops what ./scripts/up.sh started (PostgreSQL and Redis are the machine's and keep running).
. "$(dirname "$0")/lib.sh"
stop_bg edge
stop_bg core
stop_bg core2
stop_bg broker
log "stopped"
