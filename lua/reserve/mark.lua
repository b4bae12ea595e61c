-- Moves an order's record from one of the states in ARGV[2] to state ARGV[3]. ARGV[4]:
--   'touch'  also sets the time its latest publish started to now, by Redis's clock (a
--            retry re-publishing a pending event "touches" it, so reconciliation leaves it
--            alone while that publish runs);
--   'settle' also drops it from the unsettled set: its row is known to be in PostgreSQL.
-- KEYS[1] orders, KEYS[2] unsettled; ARGV[1] order id, ARGV[2] allowed states (e.g. 'PA'),
-- ARGV[3] new state, ARGV[4] optional 'touch' or 'settle'
-- Returns the record's state after the call, or false when there is no record.
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then return false end
local state = string.sub(record, 1, 1)
if not string.find(ARGV[2], state, 1, true) then return state end
local body = string.sub(record, 2)
if ARGV[4] == 'touch' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  body = string.gsub(body, '|[^|]*$', '|' .. string.format('%.0f', now))
  redis.call('ZADD', KEYS[2], 'XX', now, ARGV[1])
elseif ARGV[4] == 'settle' then
  redis.call('ZREM', KEYS[2], ARGV[1])
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3] .. body)
return ARGV[3]
