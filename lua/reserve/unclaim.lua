-- Drops an orderId's claim across vouchers, if this voucher holds it: the order's use went
-- back and nothing of it was written (PostgreSQL refused it, or it was never sent), so the
-- orderId is free for another voucher.
-- KEYS[1] the claim (`<prefix>order-owner:<orderId>`, outside any voucher's hash tag)
-- ARGV[1] the voucher code
-- Returns 1 when the claim was dropped, 0 when another voucher (or nobody) holds it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
