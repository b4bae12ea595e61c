#!/usr/bin/env bash
# What the gate's reserve script costs inside Redis, and which part of it: the script whole
# and cut short at three points (each cut returns at once), run against keys of a voucher of
# its own in the machine's Redis with redis-benchmark (4 clients, a new order and customer
# each call), the time Redis spent per call read from INFO commandstats (usec_per_call of
# evalsha: the command's own time, without the network). ROUNDS rounds, variants
# interleaved. Needs only Redis (started by ./scripts/up.sh or before the session).
#
#   ROUNDS=2 N=30000 loadtest/gate-script-cost.sh
#
# Variants: empty (`return` alone: Redis's fixed cost of a script call), meta (the HMGET of
# the voucher's definition), checks (and the order's record, TIME, the uses left, the
# customer's count: every read of an accept), full (and the writes: DECR, HINCRBY, the
# record's HSET, the unsettled set's ZADD); last, of the full script's time, what the
# commands it called took by their own count (the rest is Lua and the script machinery
# around each redis.call). The commandstats are reset for each variant:
# do not run it beside a benchmark that reads them.
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

ROUNDS=${ROUNDS:-2}
N=${N:-30000}
WORK=$(mktemp -d)
K="gsc$$:{GSC}"
trap 'rm -rf "$WORK"; redis-cli --scan --pattern "gsc$$:*" | xargs -r redis-cli unlink >/dev/null' EXIT
SCRIPT=lua/reserve/reserve.lua
printf "return {'CUT'}\n" >"$WORK/empty.lua"
# The script up to a line that starts with MARK, then a return.
cut_at() { awk -v mark="$1" 'index($0, mark) == 1 {exit} {print}' "$SCRIPT"; printf "return {'CUT'}\n"; }
cut_at "-- A retry is answered" >"$WORK/meta.lua"
cut_at "local left = redis.call('DECR'" >"$WORK/checks.lua"
cp "$SCRIPT" "$WORK/full.lua"
# A mark no longer in the script leaves the whole script plus the return: longer than it.
for v in meta checks; do
  [[ $(wc -l <"$WORK/$v.lua") -lt $(wc -l <"$SCRIPT") ]] ||
    { echo "the cut for $v no longer matches $SCRIPT" >&2; exit 1; }
done

# usec_per_call VARIANT: Redis's time per EVALSHA of the variant, on fresh keys.
usec_per_call() {
  local sha now
  sha=$(redis-cli script load "$(cat "$WORK/$1.lua")")
  now=$(date +%s%3N)
  redis-cli unlink "$K:meta" "$K:remaining" "$K:users" "$K:orders" "$K:unsettled" >/dev/null
  redis-cli hset "$K:meta" per_user_limit 1 starts_ms 0 ends_ms $((now + 3600000)) min_order 0 \
    discount 100000 generation 1 state active >/dev/null
  redis-cli set "$K:remaining" 1000000000 >/dev/null
  redis-cli config resetstat >/dev/null
  redis-benchmark -n "$N" -c 4 -r 1000000000 -q evalsha "$sha" 5 "$K:meta" "$K:remaining" \
    "$K:users" "$K:orders" "$K:unsettled" "o__rand_int__" "c__rand_int__" 250000 600000 "" "" \
    >/dev/null 2>&1
  redis-cli info commandstats | awk -F'usec_per_call=' '/^cmdstat_evalsha:/{split($2, a, ","); print a[1]}'
}

# The commands the last variant called, their own time per EVALSHA (the rest of a call's
# time is the script's: Lua, and Redis's work around each redis.call).
commands_per_call() {
  redis-cli info commandstats | tr -d '\r' | awk -F'[:=,]' '
    /^cmdstat_evalsha:/ {calls = $3; next}
    /^cmdstat_(config|script|info)/ {next}
    /^cmdstat_/ {usec += $5}
    END {if (calls) printf "%.2f", usec / calls}'
}

echo "| round | empty | meta | checks | full | of full, its commands' own |"
echo "|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  row="| $round |"
  for v in empty meta checks full; do row="$row $(usec_per_call $v) |"; done
  echo "$row $(commands_per_call) |"
done
echo "(µs per call inside Redis, usec_per_call of evalsha in INFO commandstats; $N calls, 4 clients)"
