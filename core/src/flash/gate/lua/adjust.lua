-- Corrects a loaded gate's remaining count by a delta reconciliation computed against
-- PostgreSQL. A delta, not a value: reservations and give-backs that ran since the snapshot
-- moved the count and the records together, so the correction still holds after them.
-- KEYS[1] meta, KEYS[2] remaining
-- ARGV[1] delta, ARGV[2] the voucher identity the snapshot was taken of
-- Returns the new remaining count, or false when the gate is not loaded (or is another
-- voucher's).
if redis.call('HGET', KEYS[1], 'voucher_id') ~= ARGV[2] then return false end
return redis.call('INCRBY', KEYS[2], ARGV[1])
