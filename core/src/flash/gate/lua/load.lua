-- Loads a voucher's gate unless this voucher's gate is loaded (several instances may try
-- at once; the first wins and the others change nothing). Keys left by an older voucher of
-- the same code (its database was reset or restored, Redis kept its keys) are replaced,
-- never inherited: the voucher's identity is in meta.
-- KEYS[1] meta, KEYS[2] remaining, KEYS[3] users, KEYS[4] orders
-- ARGV[1] voucher identity, ARGV[2..7] total_limit, per_user_limit, starts_ms, ends_ms,
-- min_order, discount, ARGV[8] remaining, ARGV[9] number of user pairs, then user/count
-- pairs, then order/record pairs
-- Returns 1 when loaded, 0 when it already was, 2 when it replaced another voucher's keys.
local loaded_for = redis.call('HGET', KEYS[1], 'voucher_id')
local outcome = 1
if loaded_for == ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then outcome = 2 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
local users = tonumber(ARGV[9])
local i = 10
while i < 10 + users * 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
while i <= #ARGV do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('SET', KEYS[2], ARGV[8])
-- meta last: its presence is what opens the gate.
redis.call('HSET', KEYS[1], 'voucher_id', ARGV[1], 'total_limit', ARGV[2], 'per_user_limit', ARGV[3],
  'starts_ms', ARGV[4], 'ends_ms', ARGV[5], 'min_order', ARGV[6], 'discount', ARGV[7])
return outcome
