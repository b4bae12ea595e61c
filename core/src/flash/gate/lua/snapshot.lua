-- Reads a voucher's gate in one consistent step, for reconciliation.
-- KEYS[1] meta, KEYS[2] remaining, KEYS[3] orders
-- Returns false when not loaded, else {remaining, order, record, order, record, ...}.
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local out = {redis.call('GET', KEYS[2]) or '0'}
local orders = redis.call('HGETALL', KEYS[3])
for i = 1, #orders do out[#out + 1] = orders[i] end
return out
