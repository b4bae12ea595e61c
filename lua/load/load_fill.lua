-- Adds one chunk of a load: customers' counts and orders' records, while the load that
-- wrote the loading marker ARGV[1] is still the one under way.
-- KEYS[1] loading, KEYS[2] users, KEYS[3] orders
-- ARGV[1] loading marker (identity|generation), ARGV[2] number of customer pairs, then
-- customer/count pairs, then order/record pairs
-- Returns 1, or 0 when another load took over (nothing written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local users = tonumber(ARGV[2])
local first_order = 3 + users * 2
if users > 0 then
  redis.call('HSET', KEYS[2], unpack(ARGV, 3, first_order - 1))
end
if #ARGV >= first_order then
  redis.call('HSET', KEYS[3], unpack(ARGV, first_order, #ARGV))
end
return 1
