/** The Redis store's scripts: each is atomic, and callers pass keys of one hash tag, so each runs in one slot. */

/** ARGV[1] is the expiry, ARGV[i + 1] the hits for KEYS[i]. */
export const COUNT_HITS = `
local out = {}
for i, key in ipairs(KEYS) do
  local n = tonumber(ARGV[i + 1])
  local count = redis.call('INCRBY', key, n)
  if count == n then redis.call('PEXPIRE', key, ARGV[1]) end
  out[i] = count
end
return out`

/** Nil when claimed, else the holder's record, with no gap between SET NX and GET in which the holder could expire. */
export const CLAIM = `
if redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then return false end
return redis.call('GET', KEYS[1])`

/** Compare (ARGV[1], the exact pending record) and set (ARGV[2] for ARGV[3] ms). */
export const COMPLETE = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`

export const RELEASE = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])`

/** Every gateway's leases expire by the server's clock, whatever their own say. */
const NOW = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`

/**
 * ARGV: lease id, cap, lease ms, then the gateway's ended leases, removed first so the order in which their ZREM and
 * this call reach a cluster never matters.
 */
export const ENTER_UPLOAD = `${NOW}
for i = 4, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`

/**
 * ARGV: lease ms, then lease ids. Never puts a lease back (ZADD XX): the call may run long after it was sent, after
 * its uploads ended; it returns the ids no longer there.
 */
export const RENEW_UPLOADS = `${NOW}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local gone = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
  else gone[#gone + 1] = ARGV[i] end
end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return gone`
