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
local meta = redis.call('HMGET', KEYS[1], 'version', 'total_limit')
if tonumber(meta[1] or '0') >= tonumber(ARGV[2]) then return 'CURRENT' end
local raised = tonumber(ARGV[3]) - tonumber(meta[2])
if raised ~= 0 then redis.call('INCRBY', KEYS[2], raised) end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'total_limit', ARGV[3], 'per_user_limit', ARGV[4],
  'starts_ms', ARGV[5], 'ends_ms', ARGV[6], 'min_order', ARGV[7], 'discount', ARGV[8],
  'state', ARGV[9])
-- Edges drop their flags when the voucher is active (it may have uses again: resumed,
-- its limit raised; an edge whose flag still holds refetches on the next refusal), and
-- fetch its filter, which says it is paused, when it is not. Also when the gate's own
-- state did not change: the edges may have heard of the pause from a core's refusals
-- while this gate was behind.
if ARGV[9] == 'active' then
  redis.call('PUBLISH', ARGV[10], ARGV[12])
else
  redis.call('PUBLISH', ARGV[11], ARGV[12])
end
return 'AMENDED'
