-- Hands an open gate a newer generation (never an older one), if it is this voucher's.
-- KEYS[1] meta
-- ARGV[1] voucher identity, ARGV[2] generation
-- Returns 1 when raised, 0 otherwise (not open, another voucher's, or not older).
-- Safe only because no gate is built from anything here: every use this open gate
-- decided is in it, whichever generation it is written under (see store::batch).
if redis.call('HGET', KEYS[1], 'voucher_id') ~= ARGV[1] then return 0 end
local current = tonumber(redis.call('HGET', KEYS[1], 'generation') or '0')
if tonumber(ARGV[2]) <= current then return 0 end
redis.call('HSET', KEYS[1], 'generation', ARGV[2])
return 1
