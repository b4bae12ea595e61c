-- Starts loading a voucher's gate from a PostgreSQL read of generation ARGV[2] (see
-- load_fill.lua and load_open.lua). The gate stays closed (no meta) until it is opened.
-- KEYS[1] meta, KEYS[2] remaining, KEYS[3] users, KEYS[4] orders, KEYS[5] unsettled,
-- KEYS[6] loading
-- ARGV[1] voucher identity, ARGV[2] generation
-- Returns LOADED when this voucher's gate is open already (another load won; it takes on
-- the generation ARGV[2] if that is newer), SUPERSEDED
-- when a load of a later generation is under way, STARTED, or REPLACED when keys of an
-- older voucher of the same code were dropped (a new voucher never inherits them).
local open_for = redis.call('HGET', KEYS[1], 'voucher_id')
if open_for == ARGV[1] then
  -- The loader took generation ARGV[2] in PostgreSQL before finding the gate open; uses
  -- this gate decides are written only under the voucher's latest generation, so the
  -- open gate takes it on (never lowers it). Safe: no gate is built from that read, and
  -- every use this gate decided is in this gate, whichever generation it is written under
  -- (one decided under the older one and written after the bump is refused and undone
  -- here).
  local current = tonumber(redis.call('HGET', KEYS[1], 'generation') or '0')
  if tonumber(ARGV[2]) > current then
    redis.call('HSET', KEYS[1], 'generation', ARGV[2])
  end
  return 'LOADED'
end
local loading = redis.call('GET', KEYS[6])
if loading then
  local id, generation = string.match(loading, '^([^|]*)|(%d+)$')
  if id == ARGV[1] and tonumber(generation) > tonumber(ARGV[2]) then return 'SUPERSEDED' end
end
-- UNLINK frees big hashes in the background: no call here blocks on a voucher's size.
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('SET', KEYS[6], ARGV[1] .. '|' .. ARGV[2])
if open_for then return 'REPLACED' end
return 'STARTED'
