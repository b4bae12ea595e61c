-- A batch of the recorder is committed in PostgreSQL: its orders' records move from P
-- (taken by the gate, undecided) to A (decided) and leave the unsettled set, in one call
-- per voucher and batch, made after the clients have their answers. Only the record that
-- was committed moves: same customer and same reservation time (a record made since for
-- the same orderId, after this one was forgotten, is another reservation). A record in
-- another state (confirmed or released meanwhile) or gone is left as it is; a record left
-- in P (this call lost) is settled by reconciliation, which finds its row.
-- KEYS[1] orders, KEYS[2] unsettled
-- ARGV triples: order id, customer id, reservation time (ms, as in the record)
-- Returns how many records moved.
local moved = 0
for i = 1, #ARGV, 3 do
  local order = ARGV[i]
  local record = redis.call('HGET', KEYS[1], order)
  if record then
    local state, customer, reserved =
      string.match(record, '^(.)|([^|]*)|[^|]*|[^|]*|([^|]*)|')
    if state == 'P' and customer == ARGV[i + 1] and reserved == ARGV[i + 2] then
      redis.call('HSET', KEYS[1], order, 'A' .. string.sub(record, 2))
      redis.call('ZREM', KEYS[2], order)
      moved = moved + 1
    end
  end
end
return moved
