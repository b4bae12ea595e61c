#!/usr/bin/env bash
# Promotes a PostgreSQL standby after its primary is lost (docs/RUNBOOK.md, "PostgreSQL
# primary lost"). The cores need nothing: their database URL names both servers, and they
# point new connections at the new primary within `database.primary_check_interval`.
#
#   scripts/pg-promote.sh --standby HOST:PORT --old-primary HOST:PORT --fenced [--user NAME] [--force]
#
# 1. Fencing is the operator's: a frozen primary (a stalled VM) cannot be told from a dead
#    one over the network, and one that wakes after the promotion would be a second
#    primary. So the script refuses unless --fenced says the old primary's machine or
#    postmaster is stopped, and refuses even then while the old primary still answers as a
#    primary (--force overrides that, once you know it takes no writes). An old primary it
#    cannot log in to (not unreachable: refused credentials) stops the script too.
# 2. Refuses a server that is not a standby, and prints how far it had received and
#    replayed the old primary's log. With it the only synchronous standby, every
#    acknowledged commit was flushed there before its client got the answer; with several
#    (`ANY 1 (b, c)`), promote the one that received the most.
# 3. Promotes it (pg_promote, waiting up to 60 s) and checks it is out of recovery.
#
# The promoted server keeps the synchronous_standby_names it was given (pg_basebackup
# copies postgresql.auto.conf): then it commits nothing until a standby of its own streams
# (docs/RUNBOOK.md), so no answer is given on one copy of the data. The script says which.
# The old primary never comes back as a primary: rebuild it as a standby.
set -euo pipefail

standby="" old="" user=postgres force=0 fenced=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --standby) standby=$2; shift 2 ;;
    --old-primary) old=$2; shift 2 ;;
    --user) user=$2; shift 2 ;;
    --fenced) fenced=1; shift ;;
    --force) force=1; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
for server in "$standby" "$old"; do
  [[ $server =~ ^[^:]+:[0-9]+$ ]] || { echo "usage: $0 --standby HOST:PORT --old-primary HOST:PORT --fenced (got '$server')" >&2; exit 2; }
done

# ask HOST:PORT QUERY: prints the value and returns 0; returns 1 when the server cannot be
# reached (refused, timed out, no such host); returns 2 on any other error (a refused
# login, a failed statement), printing it. Callers stop on 2.
ask() {
  local out err
  err=$(mktemp)
  if out=$(PGCONNECT_TIMEOUT=3 PGOPTIONS='-c statement_timeout=70s' \
    psql -X -q -At -h "${1%:*}" -p "${1##*:}" -U "$user" -d postgres -c "$2" 2>"$err"); then
    rm -f "$err"; echo "$out"; return 0
  fi
  if grep -qiE 'connection refused|timeout expired|could not translate host|no route to host|could not connect|network is unreachable' "$err"; then
    rm -f "$err"; return 1
  fi
  echo "$1: $(cat "$err")" >&2; rm -f "$err"; return 2
}

rc=0; old_state=$(ask "$old" "SELECT pg_is_in_recovery()") || rc=$?
[[ $rc -eq 2 ]] && exit 1
if [[ $rc -eq 0 ]]; then
  if [[ $old_state == f && $force -eq 0 ]]; then
    echo "the old primary $old still answers as a primary: stop it first (or --force)" >&2
    exit 1
  fi
  [[ $old_state == f ]] && echo "warning: $old still answers as a primary; promoting anyway (--force)" >&2
elif [[ $fenced -eq 0 ]]; then
  echo "the old primary $old does not answer, but a frozen server does not either: stop its machine or postmaster, then run again with --fenced" >&2
  exit 1
fi

rc=0; state=$(ask "$standby" "SELECT pg_is_in_recovery()") || rc=$?
[[ $rc -eq 0 ]] || { [[ $rc -eq 1 ]] && echo "$standby does not answer" >&2; exit 1; }
[[ $state == t ]] || { echo "$standby is not a standby: nothing to promote" >&2; exit 1; }
echo "standby $standby: received $(ask "$standby" "SELECT pg_last_wal_receive_lsn()"), replayed $(ask "$standby" "SELECT pg_last_wal_replay_lsn()")"

[[ $(ask "$standby" "SELECT pg_promote(true, 60)") == t ]] \
  || { echo "pg_promote on $standby did not finish within 60 s: check its log before running again" >&2; exit 1; }
[[ $(ask "$standby" "SELECT pg_is_in_recovery()") == f ]] || { echo "$standby is still in recovery" >&2; exit 1; }
echo "promoted $standby: it is out of recovery, the primary"
sync=$(ask "$standby" "SHOW synchronous_standby_names")
if [[ -n $sync ]]; then
  echo "synchronous_standby_names = '$sync': commits wait until a standby of $standby streams (docs/RUNBOOK.md)"
else
  echo "warning: synchronous_standby_names is empty on $standby: it commits without waiting for any standby, so every answer now lives on this one server" >&2
fi
