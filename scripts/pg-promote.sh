#!/usr/bin/env bash
# Promotes a PostgreSQL standby after its primary is lost (docs/RUNBOOK.md, "PostgreSQL
# primary lost"). The cores need nothing: their database URL names both servers, and they
# move to the new primary within `database.primary_check_interval`.
#
#   scripts/pg-promote.sh --standby HOST:PORT --old-primary HOST:PORT [--user NAME] [--force]
#
# 1. Refuses while the old primary still answers as a primary: two primaries would split
#    the ledger. Fence it first (stop its machine or its postmaster), or pass --force once
#    you know it takes no writes (a network partition you have closed at its side).
# 2. Refuses a server that is not a standby, and prints how far it had received and
#    replayed the old primary's log: with synchronous replication every acknowledged commit
#    was flushed there before the client got its answer.
# 3. Promotes it (pg_promote, waiting until done) and checks it takes writes.
#
# The promoted server keeps the old primary's synchronous_standby_names: it commits nothing
# until a standby of its own streams (docs/RUNBOOK.md), so no answer is given on one
# copy of the data. The old primary never comes back as a primary: rebuild it as a standby.
set -euo pipefail

standby="" old="" user=postgres force=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --standby) standby=$2; shift 2 ;;
    --old-primary) old=$2; shift 2 ;;
    --user) user=$2; shift 2 ;;
    --force) force=1; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[[ -n $standby && -n $old ]] || { echo "usage: $0 --standby HOST:PORT --old-primary HOST:PORT" >&2; exit 2; }

# sql HOST:PORT QUERY: one value, or nothing when the server does not answer in 3 s.
sql() {
  PGCONNECT_TIMEOUT=3 psql -X -q -At -h "${1%:*}" -p "${1##*:}" -U "$user" -d postgres -c "$2" 2>/dev/null || true
}

if [[ $(sql "$old" "SELECT pg_is_in_recovery()") == f ]]; then
  if [[ $force -eq 0 ]]; then
    echo "the old primary $old still answers as a primary: fence it first (or --force)" >&2
    exit 1
  fi
  echo "warning: $old still answers as a primary; promoting anyway (--force)" >&2
fi

case $(sql "$standby" "SELECT pg_is_in_recovery()") in
  t) ;;
  f) echo "$standby is a primary already: nothing to promote" >&2; exit 1 ;;
  *) echo "$standby does not answer" >&2; exit 1 ;;
esac
echo "standby $standby: received $(sql "$standby" "SELECT pg_last_wal_receive_lsn()"), replayed $(sql "$standby" "SELECT pg_last_wal_replay_lsn()")"

[[ $(sql "$standby" "SELECT pg_promote(true, 60)") == t ]] || { echo "promotion of $standby failed" >&2; exit 1; }
[[ $(sql "$standby" "SELECT pg_is_in_recovery()") == f ]] || { echo "$standby is still in recovery" >&2; exit 1; }
echo "promoted $standby: it is the primary (timeline $(sql "$standby" "SELECT timeline_id FROM pg_control_checkpoint()"))"
sync=$(sql "$standby" "SHOW synchronous_standby_names")
if [[ -n $sync ]]; then
  echo "synchronous_standby_names = '$sync': commits wait until a standby of $standby streams (docs/RUNBOOK.md)"
fi
