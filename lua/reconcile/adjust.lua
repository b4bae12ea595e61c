-- Corrects a loaded gate's counts by deltas reconciliation computed against PostgreSQL.
-- Deltas, not values: reservations and give-backs that ran since the snapshot moved the
-- counts and the records together, so the correction still holds after them.
-- KEYS[1] meta, KEYS[2] remaining, KEYS[3] users
-- ARGV[1] delta of remaining, ARGV[2] the voucher identity the snapshot was taken of, then
-- customer/delta pairs
-- Returns the new remaining count, or false when the gate is not loaded (or is another
-- voucher's).
if redis.call('HGET', KEYS[1], 'voucher_id') ~= ARGV[2] then return false end
for i = 3, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[3], ARGV[i], ARGV[i + 1])
end
return redis.call('INCRBY', KEYS[2], ARGV[1])
