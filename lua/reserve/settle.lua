-- A batch of the recorder is committed in PostgreSQL: its orders' records move from P
-- (taken by the gate, undecided) to A (decided) and leave the unsettled set, in one call
-- per voucher and batch, made after the clients have their answers. A record in another
-- state (confirmed or released meanwhile) or gone is left as it is; a record left in P
-- (this call lost) is settled by reconciliation, which finds its row.
-- KEYS[1] orders, KEYS[2] unsettled; ARGV the order ids
-- Returns how many records moved.
local moved = 0
for i = 1, #ARGV do
  local record = redis.call('HGET', KEYS[1], ARGV[i])
  if record and string.sub(record, 1, 1) == 'P' then
    redis.call('HSET', KEYS[1], ARGV[i], 'A' .. string.sub(record, 2))
    redis.call('ZREM', KEYS[2], ARGV[i])
    moved = moved + 1
  end
end
return moved
