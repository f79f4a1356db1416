"""The Lua scripts of the Redis store: each pointer change, and the sealed read before
one, is one script, so that no reader sees half a change. Their keys and arguments are
listed above each; the key layout is in :mod:`model_store._redis_common`."""

# Helpers of the pointer scripts. seal_hash: a seal's hash for the writers' compare-and-
# set, '' when there is none or the key holds another type (a writer without the key may
# store anything there; SET then replaces it); the hash, not the value, travels back, so a
# seal of any size stays in Redis. writable: whether a key is of the type a move appends
# to (or absent), checked before the first write so that a move is whole or nothing.
_SEAL_HASH_LUA = """
local function seal_hash(key)
    if redis.call('TYPE', key).ok ~= 'string' then return '' end
    return redis.sha1hex(redis.call('GET', key))
end
local function writable(key, want)
    local t = redis.call('TYPE', key).ok
    return t == want or t == 'none'
end
"""

# Read the pointer's seal for a writer's sealed move: at most ARGV[1] + 1 bytes of it (a
# longer one is no seal) and its hash for the compare-and-set; a key of another type reads
# as absent. Writers run scripts anyway; readers (workers, which may hold a read-only ACL
# user) use MGET instead.
# KEYS[1] seal of the pointer
# Returns {seal prefix or nil, seal hash or ''}
READ_SEAL_LUA = (
    _SEAL_HASH_LUA
    + """
local seal = false
if redis.call('TYPE', KEYS[1]).ok == 'string' then
    seal = redis.call('GETRANGE', KEYS[1], 0, tonumber(ARGV[1]))
end
return {seal, seal_hash(KEYS[1])}
"""
)

# Promote: move the active pointer to ARGV[1], push it on the history, log an event.
# With a signing key (ARGV[6] = '1') the writer also sets the pointer's seal, which it
# signed for ARGV[1] before calling (model_store._seal), but only if the seal is still the
# one it read (its hash ARGV[7]); else another writer moved the pointer in between and the
# caller signs again. With a key, promoting the active version writes a newer seal for it
# ('sealed'): how a key holder vouches again for the version in service.
# KEYS[1] versions zset of the KB   (membership = "fully written")
# KEYS[2] active pointer            (string)
# KEYS[3] history list              (newest first)
# KEYS[4] event stream of the KB
# KEYS[5] seal of the pointer       (string, JSON)
# ARGV[1] version to activate
# ARGV[2] unix time of the change, seconds as text
# ARGV[3] KB id (copied into the event)
# ARGV[4] history entries kept
# ARGV[5] approximate stream length kept
# ARGV[6] '1' to seal, '0' to leave the seal alone (no key)
# ARGV[7] the hash of the seal the caller read ('' for none)
# ARGV[8] the new seal
# Returns {'missing'} | {'corrupt'} (the history or the stream key holds another type:
# nothing is written) | {'raced'} | {'noop', cur} | {'ok' or 'sealed', version,
# previous_or_empty, event_id}
PROMOTE_LUA = (
    _SEAL_HASH_LUA
    + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {'missing'} end
if not writable(KEYS[3], 'list') or not writable(KEYS[4], 'stream') then return {'corrupt'} end
local sealing = ARGV[6] == '1'
if sealing and seal_hash(KEYS[5]) ~= ARGV[7] then return {'raced'} end
local cur = false
if redis.call('TYPE', KEYS[2]).ok == 'string' then cur = redis.call('GET', KEYS[2]) end
if cur == ARGV[1] then
    if not sealing then return {'noop', cur} end
    redis.call('SET', KEYS[5], ARGV[8])
    local sid = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*',
        'kb', ARGV[3], 'version', ARGV[1], 'previous', cur, 'action', 'seal', 'ts', ARGV[2])
    return {'sealed', ARGV[1], cur, sid}
end
if not cur then cur = '' end
redis.call('SET', KEYS[2], ARGV[1])
if sealing then redis.call('SET', KEYS[5], ARGV[8]) end
redis.call('LPUSH', KEYS[3], ARGV[1])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
local id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*',
    'kb', ARGV[3], 'version', ARGV[1], 'previous', cur, 'action', 'promote', 'ts', ARGV[2])
return {'ok', ARGV[1], cur, id}
"""
)

# Rollback: pop the history down to the first entry that differs from the active one and
# point at it. Equal neighbours are skipped because a history written by an older gc may
# hold some (``_store.previous_in`` is the same rule in Python). With a key the caller
# read the history and the seal, signed a seal for the version it expects to return to,
# and the script applies it only if both are unchanged ('raced' otherwise).
# KEYS[1..5] as for PROMOTE_LUA
# ARGV[1] unix time of the change, seconds as text
# ARGV[2] KB id (copied into the event)
# ARGV[3] approximate stream length kept
# ARGV[4] '1' to seal, '0' to leave the seal alone (no key)
# ARGV[5] the hash of the seal the caller read ('' for none)
# ARGV[6] the version the caller expects to return to
# ARGV[7] the new seal
# Returns {'nohistory'} | {'missing', prev} | {'corrupt'} | {'raced'} |
# {'ok', version, previous, event_id}
ROLLBACK_LUA = (
    _SEAL_HASH_LUA
    + """
local cur = redis.call('LINDEX', KEYS[3], 0)
local n = 1
local prev = redis.call('LINDEX', KEYS[3], n)
while prev and prev == cur do
    n = n + 1
    prev = redis.call('LINDEX', KEYS[3], n)
end
if not prev then return {'nohistory'} end
if not redis.call('ZSCORE', KEYS[1], prev) then return {'missing', prev} end
if not writable(KEYS[4], 'stream') then return {'corrupt'} end
if ARGV[4] == '1' then
    if seal_hash(KEYS[5]) ~= ARGV[5] or prev ~= ARGV[6] then return {'raced'} end
    redis.call('SET', KEYS[5], ARGV[7])
end
redis.call('LTRIM', KEYS[3], n, -1)
redis.call('SET', KEYS[2], prev)
local id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*',
    'kb', ARGV[2], 'version', prev, 'previous', cur, 'action', 'rollback', 'ts', ARGV[1])
return {'ok', prev, cur, id}
"""
)

# Unlist one version unless it is the active or the previous one (the first history entry
# that differs from the active one), and drop it from the history. Removing an entry can
# leave its neighbours equal (C B A B without A is C B B), and a later rollback from B to B
# would change nothing, so the history is rewritten with each run of equal entries as one.
# The version's data keys go in the same script: deleted apart from the unlisting, a put()
# of the same content between the two (it saw the version unlisted, wrote its keys and
# listed it again) would be left listed without its data.
# KEYS[1] versions zset, KEYS[2] active pointer, KEYS[3] history list (newest first),
# KEYS[4] manifest, KEYS[5] meta hash of the version
# ARGV[1] version to unlist, ARGV[2] its chunk key without the index ('...:chunk:'),
# ARGV[3] the most chunks a version has (the meta hash is unsigned: a count rewritten to
# 1e12 or inf would hold Redis in an unkillable loop)
# Returns 1 when unlisted and deleted, 0 when protected.
UNLIST_LUA = """
if redis.call('GET', KEYS[2]) == ARGV[1] then return 0 end
local h = redis.call('LRANGE', KEYS[3], 0, -1)
for i = 2, #h do
    if h[i] ~= h[1] then
        if h[i] == ARGV[1] then return 0 end
        break
    end
end
redis.call('ZREM', KEYS[1], ARGV[1])
local kept = {}
for _, v in ipairs(h) do
    if v ~= ARGV[1] and v ~= kept[#kept] then kept[#kept + 1] = v end
end
if #kept ~= #h then
    redis.call('DEL', KEYS[3])
    if #kept > 0 then redis.call('RPUSH', KEYS[3], unpack(kept)) end
end
local chunks = tonumber(redis.call('HGET', KEYS[5], 'chunks')) or 0
local most = tonumber(ARGV[3])
if chunks ~= chunks or chunks > most then chunks = most end
for i = 0, chunks - 1 do redis.call('DEL', ARGV[2] .. i) end
redis.call('DEL', KEYS[4], KEYS[5])
return 1
"""
