"""The Lua scripts of the Index Service's Redis back-end (``control.index.redis_store``), one per operation.

Each script touches the keys of one hash tag only, so it runs on one Redis Cluster node, atomically:
the record keys it builds from the index key (``P{K}:`` -> ``P{K}:FIELD``) share that key's
``{block key}`` tag, hence its slot.  (The per-node lookup reads the tags of several keys, all served
by the node it runs on.)  Record keys are the truth about liveness (their Redis TTL); the index hash
of a Block Key only says which fields to look at, and is pruned as it is met.  The key layout is
described in ``control.index.redis_store`` and docs/scale.md.

Times come from the server (``TIME``), in milliseconds: no IS clock takes part in any expiry.
"""

from __future__ import annotations

from typing import Final

# The server's time in ms; Lua numbers are doubles, exact for integers far beyond 2^41 ms.
_NOW: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS[1] index hash, KEYS[2] record key; ARGV: field, match (scope_id ‖ compat_id), record JSON,
# ttl_ms (capped), may_create ("1"/"0").  Returns {created (1/0, or -1: full), old PTTL (-2: none), now}.
PUT: Final = _NOW + """
local old = redis.call('PTTL', KEYS[2])
if old < 0 and ARGV[5] ~= '1' then return {-1, old, now} end
local ttl = tonumber(ARGV[4])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ttl)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local fields = redis.call('HKEYS', KEYS[1])
if #fields > 1 then
  local base = KEYS[1]
  for _, f in ipairs(fields) do
    if f ~= ARGV[1] and redis.call('EXISTS', base .. f) == 0 then redis.call('HDEL', KEYS[1], f) end
  end
end
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
if old < 0 then return {1, old, now} end
return {0, old, now}
"""

# KEYS[1] index hash; ARGV: the fields to withdraw (those the caller may withdraw).
# Returns {now, PTTL of each withdrawn live record...}; fields whose record expired are dropped silently.
WITHDRAW: Final = _NOW + """
local base = KEYS[1]
local out = {now}
for i = 1, #ARGV do
  if redis.call('HDEL', KEYS[1], ARGV[i]) == 1 then
    local k = base .. ARGV[i]
    local left = redis.call('PTTL', k)
    if left >= 0 then
      redis.call('DEL', k)
      out[#out + 1] = left
    end
  end
end
return out
"""

# KEYS[1] index hash; ARGV[1] a holder-id.  Returns the JSON of that holder's live records.
RECORDS: Final = """
local base = KEYS[1]
local names = {}
local holder, n = ARGV[1], #ARGV[1]
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if f == holder or string.sub(f, 1, n + 1) == holder .. '/' then names[#names + 1] = base .. f end
end
if #names == 0 then return {} end
local out = {}
for _, v in ipairs(redis.call('MGET', unpack(names))) do
  if v then out[#out + 1] = v end
end
return out
"""

# The answer's text: each matched key's records joined by TAB, the keys' groups by LF.  Canonical JSON
# never holds a raw control character (JCS escapes them), so the separators cannot occur in a record;
# the IS turns the text into the answer's "replicas" members with two replacements, and splits it to
# decode records (cached by their text) only when a lookup asks for estimates.
# group(k, want): the records of index key k that match, joined by TAB, or nil when none is live.
_GROUP: Final = """
local function group(k, want)
  local kv = redis.call('HGETALL', k)
  local names = {}
  for i = 1, #kv, 2 do
    if kv[i + 1] == want then names[#names + 1] = k .. kv[i] end
  end
  if #names == 1 then  -- the usual case, one replica per key: GET costs less than MGET
    return redis.call('GET', names[1]) or nil
  end
  if #names == 0 then return nil end
  local found = {}
  for _, v in ipairs(redis.call('MGET', unpack(names))) do
    if v then found[#found + 1] = v end
  end
  if #found == 0 then return nil end
  return table.concat(found, '\\t')
end
"""

# ARGV[1] match (scope_id ‖ compat_id), ARGV[2] the length of an index key's name (they all have one
# length), ARGV[3] the index keys of the requested Block Keys, in prompt order, concatenated.  Stops
# at the first key without a live match; returns the groups joined by LF ("" when the first misses).
# One redis-server: one call for the whole prompt.  Redis Cluster: one call per node, with the keys
# that node serves.  The keys travel as one argument, not as KEYS: a cluster refuses declared keys of
# several slots (CROSSSLOT), while allow-cross-slot-keys lets a script read keys of several slots that
# its node serves; and packing 64 arguments costs the IS more than the rest of the call.
LOOKUP: Final = "#!lua flags=no-writes,allow-cross-slot-keys\n" + _GROUP + """
local want, width, all = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local out = {}
for at = 1, #all, width do
  local text = group(string.sub(all, at, at + width - 1), want)
  if not text then break end
  out[#out + 1] = text
end
return table.concat(out, '\\n')
"""

# KEYS[1] one index key; ARGV[1] match.  Its group or "": the per-key fallback of a cluster lookup, in a
# pipeline that redis-py routes by the declared key and redirects when a slot has moved.
LOOKUP_ONE: Final = "#!lua flags=no-writes\n" + _GROUP + """
return group(KEYS[1], ARGV[1]) or ''
"""

# KEYS[1] the counter hash: field = expiry bucket (expiry_ms // bucket_ms), value = records expiring in it.
# ARGV: bucket_ms, an expiry to add ("" for none), then expiries to remove.  Buckets that have passed are
# dropped: a record stops counting at most one bucket after it expired, without anybody decrementing it,
# and a removal from a passed bucket is skipped for the same reason.  Returns the live total (never
# below 0: an increment lost with a killed IS may leave a bucket negative until that bucket passes).
COUNT: Final = _NOW + """
local size = tonumber(ARGV[1])
local current = math.floor(now / size)
if ARGV[2] ~= '' then
  redis.call('HINCRBY', KEYS[1], string.format('%d', math.floor(tonumber(ARGV[2]) / size)), 1)
end
for i = 3, #ARGV do
  local b = math.floor(tonumber(ARGV[i]) / size)
  if b >= current then redis.call('HINCRBY', KEYS[1], string.format('%d', b), -1) end
end
local total = 0
local kv = redis.call('HGETALL', KEYS[1])
for i = 1, #kv, 2 do
  if tonumber(kv[i]) < current then redis.call('HDEL', KEYS[1], kv[i]) else total = total + tonumber(kv[i + 1]) end
end
if total < 0 then return 0 end
return total
"""

# KEYS[1] statuses hash (instance -> "expiry_ms JSON"), KEYS[2] highest epochs (instance -> epoch).
# ARGV: instance URI, epoch, ttl_ms, status JSON.  Returns {1, expiry} or {0, highest epoch seen}.
PUT_STATUS: Final = _NOW + """
local seen = redis.call('HGET', KEYS[2], ARGV[1])
if seen and tonumber(ARGV[2]) < tonumber(seen) then return {0, seen} end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local expires = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', expires) .. ' ' .. ARGV[4])
return {1, expires}
"""

# KEYS[1] statuses hash; ARGV: instance URIs.  Returns, per instance, its status JSON or false (none, expired).
GET_STATUSES: Final = _NOW + """
local out = {}
local values = redis.call('HMGET', KEYS[1], unpack(ARGV))
for i = 1, #ARGV do
  local v = values[i]
  out[i] = false
  if v then
    local cut = string.find(v, ' ', 1, true)
    if tonumber(string.sub(v, 1, cut - 1)) > now then out[i] = string.sub(v, cut + 1) end
  end
end
return out
"""

# KEYS[1] statuses hash.  Drops expired statuses (the epochs stay); returns how many.
SWEEP_STATUSES: Final = _NOW + """
local kv = redis.call('HGETALL', KEYS[1])
local dropped = 0
for i = 1, #kv, 2 do
  local cut = string.find(kv[i + 1], ' ', 1, true)
  if tonumber(string.sub(kv[i + 1], 1, cut - 1)) <= now then
    redis.call('HDEL', KEYS[1], kv[i])
    dropped = dropped + 1
  end
end
return dropped
"""

SCRIPTS: Final = {"put": PUT, "withdraw": WITHDRAW, "records": RECORDS, "lookup": LOOKUP, "lookup_one": LOOKUP_ONE,
                  "count": COUNT,
                  "put_status": PUT_STATUS, "get_statuses": GET_STATUSES, "sweep_statuses": SWEEP_STATUSES}
