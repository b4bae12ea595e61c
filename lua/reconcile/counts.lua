-- Uses the gate counts for some customers, with the moment of the read by Redis's clock.
-- KEYS[1] meta, KEYS[2] users; ARGV customers
-- Returns false when not loaded, else {now_ms, count, count, ...} in ARGV's order.
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local time = redis.call('TIME')
local out = {string.format('%.0f', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))}
for i = 1, #ARGV do
  out[#out + 1] = redis.call('HGET', KEYS[2], ARGV[i]) or '0'
end
return out
