-- Reads what reconciliation checks, in one consistent step, with the moment of the read by
-- Redis's clock (the clock the records' times come from): the remaining count and the
-- unsettled orders (taken by the gate, row not yet seen in PostgreSQL) with their latest
-- publish start, oldest first, at most ARGV[1] of them. Its cost follows the reservations
-- in flight, not the voucher's size.
-- KEYS[1] meta, KEYS[2] remaining, KEYS[3] unsettled
-- ARGV[1] the most unsettled orders to return
-- Returns false when not loaded, else
-- {now_ms, remaining, unsettled count, total_limit, order, publish_ms, order, publish_ms,
-- ...}: the gate's own limit with its remaining count, so the uses it counts are exact
-- whatever change of the limit (amend.lua) came before or after.
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local out = {string.format('%.0f', now), redis.call('GET', KEYS[2]) or '0',
  tostring(redis.call('ZCARD', KEYS[3])), redis.call('HGET', KEYS[1], 'total_limit') or '0'}
local orders = redis.call('ZRANGE', KEYS[3], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #orders do out[#out + 1] = orders[i] end
return out
