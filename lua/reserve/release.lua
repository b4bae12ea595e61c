-- Gives one held use back, at most once per order.
-- KEYS[1] meta, KEYS[2] remaining, KEYS[3] users, KEYS[4] orders, KEYS[5] unsettled
-- ARGV[1] order id
-- ARGV[2] 'release': the order was released in PostgreSQL; keep the record as R so that a
--                    retry is answered, not re-run.
--         'forget':  the order's event was never recorded; drop the record (a retry may
--                    reserve anew). Only from the states in ARGV[3], and only if the
--                    latest publish started at or before ARGV[4] (ms): a publish still
--                    running may yet be written.
-- ARGV[5] the availability channel, ARGV[6] the voucher code: a use given back is announced
--         to the edges in the same script, so no crash can come between the two.
-- Returns RELEASED, ALREADY (nothing held), ABSENT (no record), BUSY (not forgotten) or NOT_LOADED.
if redis.call('EXISTS', KEYS[1]) == 0 then return 'NOT_LOADED' end
local record = redis.call('HGET', KEYS[4], ARGV[1])
if not record then return 'ABSENT' end
local state = string.sub(record, 1, 1)
local forget = ARGV[2] == 'forget'
if state == 'R' then
  return 'ALREADY'
end
if forget then
  local attempt = tonumber(string.match(record, '|([^|]*)$'))
  if not string.find(ARGV[3], state, 1, true) or attempt > tonumber(ARGV[4]) then
    return 'BUSY'
  end
end
local customer = string.match(record, '^.|([^|]*)|')
redis.call('INCR', KEYS[2])
if redis.call('HINCRBY', KEYS[3], customer, -1) <= 0 then
  redis.call('HDEL', KEYS[3], customer)
end
if forget then
  redis.call('HDEL', KEYS[4], ARGV[1])
else
  redis.call('HSET', KEYS[4], ARGV[1], 'R' .. string.sub(record, 2))
end
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 'RELEASED'
