/**
 * The Lua scripts of the Redis store. Redis runs a script whole, so each is
 * atomic. Every script names its keys in KEYS and touches only those, and the
 * callers pass keys of one hash tag (one user: keys.ts), so each runs in one
 * Redis Cluster slot.
 */

/**
 * Count a batch of hits in one call: KEYS are window keys (one per distinct
 * key), ARGV[1] the expiry, ARGV[i + 1] the hits for KEYS[i]. A key's first
 * hits give it its expiry. Each key's counts are exact, as N separate INCRs
 * would be. In a cluster the callers send one call per slot.
 */
export const COUNT_HITS = `
local out = {}
for i, key in ipairs(KEYS) do
  local n = tonumber(ARGV[i + 1])
  local count = redis.call('INCRBY', key, n)
  if count == n then redis.call('PEXPIRE', key, ARGV[1]) end
  out[i] = count
end
return out`

/**
 * Claim KEYS[1] with the pending record ARGV[1] (which holds the owner's
 * token) for ARGV[2] ms, or read who holds it: nil when claimed, else the
 * holder's record. One round trip, and no gap between SET NX and GET in which
 * the holder could expire.
 */
export const CLAIM = `
if redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then return false end
return redis.call('GET', KEYS[1])`

/**
 * Compare and set: replace KEYS[1] with ARGV[2] for ARGV[3] ms only while it
 * is still the claim ARGV[1] (the exact pending record, owner token included).
 * 1 when written, 0 when the claim is gone or someone else's.
 */
export const COMPLETE = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`

/** Compare and delete: KEYS[1] goes only while it is still the claim ARGV[1]. 1 when deleted, else 0. */
export const RELEASE = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])`

/** The server's clock in ms: every gateway's leases expire by one clock, whatever their own say. */
const NOW = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`

/**
 * Take an upload place (DECISIONS 23): KEYS[1] is the subject's sorted set
 * of leases scored by expiry; ARGV[1] the lease id, ARGV[2] the cap, ARGV[3]
 * the lease's length in ms, ARGV[4..] leases of the same gateway whose
 * uploads have ended and whose ZREM it has not seen answered: removed here
 * first, so the order in which that ZREM and this call reach Redis (they can
 * take different paths in a cluster while a slot moves) never matters.
 * Expired leases (a gateway that died mid-upload) are trimmed too. 1 when
 * taken, 0 when the cap is reached. The key itself expires with its last lease.
 */
export const ENTER_UPLOAD = `${NOW}
for i = 4, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`

/**
 * Renew leases of one subject: KEYS[1] as above, ARGV[1] the length in ms,
 * ARGV[2..] the lease ids. Only leases still there are extended (ZADD XX),
 * never put back: this call may run long after it was sent (it sat in the
 * receive buffer of a connection the gateway gave up on while Redis hung),
 * when those uploads have ended and their ZREM has already run. Returns the
 * ids no longer there; the gateway takes those places again in a separate
 * call, only for the uploads still in progress when this answer arrives.
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
