-- Reads a voucher's gate in one consistent step, for reconciliation, with the moment of
-- the read by Redis's clock (the clock the records' times come from).
-- KEYS[1] meta, KEYS[2] remaining, KEYS[3] users, KEYS[4] orders
-- Returns false when not loaded, else
-- {now_ms, remaining, n, customer, count (n pairs), order, record, order, record, ...}.
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local out = {string.format('%.0f', now), redis.call('GET', KEYS[2]) or '0'}
local users = redis.call('HGETALL', KEYS[3])
out[#out + 1] = tostring(#users / 2)
for i = 1, #users do out[#out + 1] = users[i] end
local orders = redis.call('HGETALL', KEYS[4])
for i = 1, #orders do out[#out + 1] = orders[i] end
return out
