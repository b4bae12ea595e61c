-- Decides one reservation. All or nothing: either every write below happens or none.
-- KEYS[1] meta, KEYS[2] remaining, KEYS[3] users, KEYS[4] orders, KEYS[5] unsettled
-- ARGV[1] order id, ARGV[2] customer id, ARGV[3] order amount, ARGV[4] ttl (ms),
-- ARGV[5] the sold-out channel, ARGV[6] the voucher code (published there when this call
-- takes the last use, so that edges start their flag without waiting for a refusal)
-- Returns {OUTCOME}, or {OUTCOME, record, generation} for EXISTS and RESERVED: the gate's
-- generation (of the PostgreSQL read it was loaded from, or a later one it was handed),
-- which must still be the voucher's latest when the use is written (store::record_decided).
-- Time is Redis's own (TIME), never the caller's: every core decides the sale window and
-- the TTL by the same clock, however far its own is off.
local meta = redis.call('HMGET', KEYS[1], 'per_user_limit', 'starts_ms', 'ends_ms', 'min_order', 'discount', 'generation', 'state')
-- A gate without a generation (loaded by an older version, or by hand with 0) cannot fence
-- its writes: treated as missing, its rebuild finds it open and gives it the latest
-- (load_begin.lua).
if not meta[1] or not meta[6] or meta[6] == '0' then
  return {'NOT_LOADED'}
end
-- A retry is answered from its record, even after the sale ended or sold out.
local existing = redis.call('HGET', KEYS[4], ARGV[1])
if existing then
  return {'EXISTS', existing, meta[6]}
end
-- An operator's pause or archive (amend.lua) comes before the window: a paused voucher
-- says so whenever it is asked. (No state: a gate loaded before states existed, active.)
if meta[7] == 'paused' then return {'PAUSED'} end
if meta[7] == 'archived' then return {'ARCHIVED'} end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if now < tonumber(meta[2]) then return {'NOT_STARTED'} end
if now >= tonumber(meta[3]) then return {'EXPIRED'} end
local amount = tonumber(ARGV[3])
if amount < tonumber(meta[4]) then return {'BELOW_MIN_ORDER'} end
if tonumber(redis.call('GET', KEYS[2]) or '0') <= 0 then
  return {'OUT_OF_STOCK'}
end
if tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0') >= tonumber(meta[1]) then
  return {'ALREADY_USED'}
end
local left = redis.call('DECR', KEYS[2])
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
-- '%.0f' keeps large integers as digits (tostring would switch to exponent notation).
local discount = math.min(tonumber(meta[5]), amount)
-- The last field is when the latest publish of the order's event started.
local stamp = string.format('%.0f', now)
local record = table.concat({'P', ARGV[2], ARGV[3], string.format('%.0f', discount), stamp,
  string.format('%.0f', now + tonumber(ARGV[4])), stamp}, '|')
redis.call('HSET', KEYS[4], ARGV[1], record)
-- Unsettled until reconciliation sees its row (or gives the use back).
redis.call('ZADD', KEYS[5], now, ARGV[1])
if left == 0 and ARGV[5] and ARGV[6] then
  redis.call('PUBLISH', ARGV[5], ARGV[6])
end
return {'RESERVED', record, meta[6]}
