-- Hands an open gate a newer definition of its voucher (an operator's change, pause,
-- resume or archive, committed in PostgreSQL as `version`), in one step: no reservation
-- sees one field changed and not another, nor both limits. The limit moves `remaining` by
-- its own change, so the uses the gate counts stay what they were (and reconciliation,
-- which counts them as the gate's limit minus remaining, reads both in one step). Only a
-- newer version is taken: two changes that reach Redis out of order leave the later one.
-- KEYS[1] meta, KEYS[2] remaining
-- ARGV[1] the voucher identity, ARGV[2] version, ARGV[3..8] total_limit, per_user_limit,
-- starts_ms, ends_ms, min_order, discount, ARGV[9] state, ARGV[10] the availability
-- channel, ARGV[11] the stop channel (sold-out), ARGV[12] the voucher code
-- Returns AMENDED, CURRENT (this version or a later one is there) or NOT_LOADED.
if redis.call('HGET', KEYS[1], 'voucher_id') ~= ARGV[1] then return 'NOT_LOADED' end
local meta = redis.call('HMGET', KEYS[1], 'version', 'total_limit', 'state')
if tonumber(meta[1] or '0') >= tonumber(ARGV[2]) then return 'CURRENT' end
local raised = tonumber(ARGV[3]) - tonumber(meta[2])
if raised ~= 0 then redis.call('INCRBY', KEYS[2], raised) end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'total_limit', ARGV[3], 'per_user_limit', ARGV[4],
  'starts_ms', ARGV[5], 'ends_ms', ARGV[6], 'min_order', ARGV[7], 'discount', ARGV[8],
  'state', ARGV[9])
local was = meta[3] or 'active'
-- Edges drop their flags when uses may be taken again, and fetch the voucher's filter
-- (which says it is paused) when it stops taking them.
if ARGV[9] == 'active' and (raised > 0 or was ~= 'active') then
  redis.call('PUBLISH', ARGV[10], ARGV[12])
elseif ARGV[9] ~= 'active' and was == 'active' then
  redis.call('PUBLISH', ARGV[11], ARGV[12])
end
return 'AMENDED'
