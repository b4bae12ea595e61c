-- Loads a voucher's gate, only if it is not loaded (several instances may try at once;
-- the first wins and the others change nothing).
-- KEYS[1] meta, KEYS[2] remaining, KEYS[3] users, KEYS[4] orders
-- ARGV[1..6] total_limit, per_user_limit, starts_ms, ends_ms, min_order, discount
-- ARGV[7] remaining, ARGV[8] number of user pairs, then user/count pairs, then order/record pairs
-- Returns 1 when loaded, 0 when it already was.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
local users = tonumber(ARGV[8])
local i = 9
while i < 9 + users * 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
while i <= #ARGV do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('SET', KEYS[2], ARGV[7])
-- meta last: its presence is what opens the gate.
redis.call('HSET', KEYS[1], 'total_limit', ARGV[1], 'per_user_limit', ARGV[2], 'starts_ms', ARGV[3],
  'ends_ms', ARGV[4], 'min_order', ARGV[5], 'discount', ARGV[6])
return 1
