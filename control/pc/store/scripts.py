"""The Lua scripts of `RedisStore`: the lease, and every write with its fence and epoch rule (decision D7).

Redis runs a script atomically, so the fence check and the rule of `control.pc.core.durable` happen in
one step where the state lives: no read-then-write from Python, and no interleaving with a write of a
deposed leader.  Every key a script touches is passed in KEYS and carries the ``{pc}`` hash tag, so on a
Redis Cluster they all sit in one slot (the PC's state is written by one leader at a time anyway).

Every write script starts with the same check, ``KEYS[1]`` being the lease and ``ARGV[1]`` the
caller's lease value (``"TOKEN NONCE BASE_URI"``): the write goes through only while the lease holds
exactly that value, i.e. while the caller's grant is unexpired and no later grant (higher token) exists.
Replies are ``{'ok', ...}`` or ``{REFUSAL, recorded}`` with REFUSAL one of `Refusal`'s values.
"""

from __future__ import annotations

from typing import Final

_FENCE: Final = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'fenced'} end\n"

# KEYS: lease, fence counter.  ARGV: holder ("NONCE BASE_URI"), ttl_ms.  -> {token, value} or {0, value}
ACQUIRE: Final = """
local current = redis.call('GET', KEYS[1])
if current then return {0, current} end
local token = redis.call('INCR', KEYS[2])
local value = token .. ' ' .. ARGV[1]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {token, value}
"""

# KEYS: lease.  ARGV: value, ttl_ms.  -> 1 (renewed) or 0 (not ours any more)
RENEW: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: lease.  ARGV: value.
RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: lease, session set, session hash.  ARGV: value, session, field/value pairs.
OPEN_SESSION: Final = _FENCE + """
local epoch = redis.call('HGET', KEYS[3], 'epoch')
if epoch then return {'exists', tonumber(epoch)} end
redis.call('HSET', KEYS[3], unpack(ARGV, 3))
redis.call('SADD', KEYS[2], ARGV[2])
return {'ok'}
"""

# KEYS: lease, session hash.  ARGV: value, sender, epoch, output_offset, checkpoint JSON.
# Section 6.8: reject a lower epoch; only the owner at the current epoch; keep the highest output_offset.
CHECKPOINT: Final = _FENCE + """
local s = redis.call('HMGET', KEYS[2], 'epoch', 'owner', 'offset', 'closed', 'checkpoint')
if not s[1] then return {'not-found'} end
local epoch, new_epoch = tonumber(s[1]), tonumber(ARGV[3])
if new_epoch < epoch then return {'stale', epoch} end
if new_epoch > epoch then return {'unissued', epoch} end
if s[4] == '1' then return {'closed'} end
if s[2] ~= ARGV[2] then return {'forbidden'} end
local offset, new_offset = tonumber(s[3]), tonumber(ARGV[4])
if s[5] ~= '' and new_offset <= offset then return {'ok', offset} end
redis.call('HSET', KEYS[2], 'offset', ARGV[4], 'checkpoint', ARGV[5])
if new_offset > 0 then redis.call('HSET', KEYS[2], 'prompt', '') end
return {'ok', new_offset}
"""

# KEYS: lease, session set, session hash.  ARGV: value, session, epoch, output_offset, field/value pairs.
# Never to a lower epoch; a recorded checkpoint with a higher output_offset is kept (it was acknowledged).
SAVE_SESSION: Final = _FENCE + """
local s = redis.call('HMGET', KEYS[3], 'epoch', 'offset', 'checkpoint')
local new_epoch, new_offset = tonumber(ARGV[3]), tonumber(ARGV[4])
if s[1] and new_epoch < tonumber(s[1]) then return {'stale', tonumber(s[1])} end
redis.call('HSET', KEYS[3], unpack(ARGV, 5))
if s[1] and s[3] ~= '' and tonumber(s[2]) > new_offset then
  redis.call('HSET', KEYS[3], 'offset', s[2], 'checkpoint', s[3], 'prompt', '')
end
redis.call('SADD', KEYS[2], ARGV[2])
return {'ok'}
"""

# KEYS: lease, session set, session hashes...  ARGV: value, sessions...
DROP_SESSIONS: Final = _FENCE + """
for i = 3, #KEYS do redis.call('DEL', KEYS[i]) end
for i = 2, #ARGV do redis.call('SREM', KEYS[2], ARGV[i]) end
return {'ok'}
"""

# KEYS: lease, records hash, epochs hash.  ARGV: value, field, epoch or version, record JSON.
# Section 6.3 (the highest epoch seen) and 6.9 (the authoritative version): never lower.
SAVE_VERSIONED: Final = _FENCE + """
local recorded = redis.call('HGET', KEYS[3], ARGV[2])
if recorded and tonumber(ARGV[3]) < tonumber(recorded) then return {'stale', tonumber(recorded)} end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
return {'ok'}
"""

# KEYS: lease, directives hash, expiry sorted set.  ARGV: value, id, lifetime_ms, record JSON.
# Expired directives are pruned here, a bounded number per write, by the server's own clock.
SAVE_DIRECTIVE: Final = _FENCE + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 64)
for _, id in ipairs(gone) do
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[2])
return {'ok'}
"""
