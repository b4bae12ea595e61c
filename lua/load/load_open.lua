-- Opens a filled gate, if its load is still the one under way. The caller has checked in
-- PostgreSQL, after filling, that its generation is the voucher's latest.
-- KEYS[1] meta, KEYS[2] remaining, KEYS[3] loading
-- ARGV[1] loading marker (identity|generation), ARGV[2] identity, ARGV[3..8] total_limit,
-- per_user_limit, starts_ms, ends_ms, min_order, discount, ARGV[9] remaining,
-- ARGV[10] generation, ARGV[11] the definition's version, ARGV[12] its state
-- Returns 1 when opened, 0 when another load took over.
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[9])
-- meta last: its presence is what opens the gate.
redis.call('HSET', KEYS[1], 'voucher_id', ARGV[2], 'total_limit', ARGV[3], 'per_user_limit', ARGV[4],
  'starts_ms', ARGV[5], 'ends_ms', ARGV[6], 'min_order', ARGV[7], 'discount', ARGV[8],
  'generation', ARGV[10], 'version', ARGV[11], 'state', ARGV[12])
redis.call('DEL', KEYS[3])
return 1
