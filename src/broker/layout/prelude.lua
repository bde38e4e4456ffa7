-- jobrelay's script prelude, shared by every layout's enqueue script (prepended at build
-- time: a Redis script cannot include another). Helpers only; each script does its own work.

-- unpack() is bounded by the Lua stack: variadic commands go in chunks.
local CHUNK = 1000

-- Key types, looked up once per call.
local types = {}
local function type_of(key)
  local k = types[key]
  if k == nil then
    k = redis.call('TYPE', key)
    if type(k) == 'table' then k = k.ok end
    types[key] = k
  end
  return k
end

-- Writes are gathered per key and flushed after all checks, so one variadic command serves
-- every job bound for the same list, set or sorted set. LPUSH k a b c leaves the list as
-- c b a, exactly as three LPUSHes in a row would: FIFO order through BRPOP is kept.
local function append(tbl, order, key, value)
  local l = tbl[key]
  if l == nil then
    l = {}
    tbl[key] = l
    order[#order + 1] = key
  end
  l[#l + 1] = value
end

local function variadic(cmd, key, values)
  for s = 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, s, math.min(s + CHUNK - 1, #values)))
  end
end

-- Why a job bound for `key` (which must hold a `want`, or nothing yet) and, with a parent,
-- for the set `active`, is refused; nil if the keys fit. Types are checked before anything is
-- written, so a refused job leaves no write behind.
local function wrong_type(key, want, active)
  local have = type_of(key)
  if have ~= 'none' and have ~= want then
    return 'WRONGTYPE key ' .. key .. ' holds a ' .. have .. ', not a ' .. want
  end
  if active then
    local have_active = type_of(active)
    if have_active ~= 'none' and have_active ~= 'set' then
      return 'WRONGTYPE key ' .. active .. ' holds a ' .. have_active .. ', not a set'
    end
  end
  return nil
end

-- The writes of the jobs accepted so far, by key, in order.
local lists, list_keys = {}, {}
local sets, set_keys = {}, {}
local zset = {}

-- Accepts a job's write: `member` into `key` (a list, or the scheduled set with `score`), and
-- with `active`, `active_member` into that set.
local function stage(key, want, member, score, active, active_member)
  types[key] = want
  if want == 'zset' then
    zset[#zset + 1] = score
    zset[#zset + 1] = member
  else
    append(lists, list_keys, key, member)
  end
  if active then
    types[active] = 'set'
    append(sets, set_keys, active, active_member)
  end
end

-- The gathered writes: LPUSH per list, SADD per set, one ZADD into `zset_key`.
local function flush(zset_key)
  for _, key in ipairs(list_keys) do variadic('LPUSH', key, lists[key]) end
  for _, key in ipairs(set_keys) do variadic('SADD', key, sets[key]) end
  if #zset > 0 then variadic('ZADD', zset_key, zset) end
end

-- Whether any of `keys` exists: one variadic EXISTS per CHUNK.
local function any_exists(keys)
  local n = #keys
  for s = 1, n, CHUNK do
    if redis.call('EXISTS', unpack(keys, s, math.min(s + CHUNK - 1, n))) > 0 then
      return true
    end
  end
  return false
end

-- Dedup, fast path: one variadic EXISTS over the markers of the call's n jobs (KEYS[1], KEYS[3],
-- ...: every layout passes each job's marker, then its queue). Almost always none exists, and
-- the per-job EXISTS is skipped; otherwise each job is checked on its own.
local function any_marker_exists(n)
  local markers = {}
  for i = 0, n - 1 do
    markers[i + 1] = KEYS[2 * i + 1]
  end
  return any_exists(markers)
end

-- Writes the markers, pairs of key and value, last: with the TTL (milliseconds, a string) a SET
-- each; without ("0"), one variadic MSET per CHUNK (measured: 0.8 us a job less than a SET
-- each). CHUNK is even, so no key is parted from its value.
local function write_markers(markers, ttl)
  if ttl ~= '0' then
    for m = 1, #markers, 2 do
      redis.call('SET', markers[m], markers[m + 1], 'PX', ttl)
    end
  else
    for s = 1, #markers, CHUNK do
      redis.call('MSET', unpack(markers, s, math.min(s + CHUNK - 1, #markers)))
    end
  end
end

-- Per-key order (docs/guarantees.md#per-key-order). When two jobs of the call share an ordering
-- key, the call's last argument, after the `used` ones the script reads, gives each job in turn
-- the number of its key within the call ("0": none), space-separated. Once a job of a key is
-- refused, the key's later jobs in the call are held: answered 'HELD <i>' (i: the refused
-- job's place in the call, from 0) and, like a refused job, not written.
local key_of, stopped = {}, {}
local function read_order_keys(used)
  if #ARGV > used then
    local i = 0
    for g in string.gmatch(ARGV[#ARGV], '%d+') do
      key_of[i] = g
      i = i + 1
    end
  end
end

-- The answer of job i (from 0) when an earlier job of its key was refused in this call.
local function held_by_key(i)
  local g = key_of[i]
  if g ~= nil and g ~= '0' then return stopped[g] end
  return nil
end

-- After job i's answer `answer`: a refusal (a string) stops its key for the rest of the call.
local function note_answer(i, answer)
  local g = key_of[i]
  if type(answer) == 'string' and g ~= nil and g ~= '0' and stopped[g] == nil then
    stopped[g] = 'HELD ' .. i
  end
end

-- One length-prefixed field ("<n>:<n bytes>") of a value, from position `at`: the field and
-- the position after it.
local function field(m, at)
  local colon = string.find(m, ':', at, true)
  local len = tonumber(string.sub(m, at, colon - 1))
  return string.sub(m, colon + 1, colon + len), colon + len + 1
end


-- Dedup markers as members of sets (the bullmq and rq layouts; docs/layouts/markers.md#markers-as-sets).
-- A key with a TTL per job costs Redis a keyspace entry and an expiry entry per job; a member of
-- a set costs one entry, and a call writes a set's members with one SADD. The sets:
-- <prefix><TTL>:<interval>:<shard>, where interval = floor(Redis TIME in ms / TTL) and shard is
-- the uuid's first character (16 sets an interval); relays of another TTL keep sets of their
-- own. A uuid is marked while it is in its shard's set of the current or the previous interval: a marker lives between one TTL and two. A set expires
-- three intervals after its own began, one after it is last read; before that, a call that finds
-- sets of the interval before the previous one unlinks them (Redis then frees them in the
-- background, not in the command that would have expired them). TTL "0": one set per shard,
-- forever (<prefix><shard>).
local marks = {}
local SHARDS = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f'}
local function open_marks(prefix, ttl, now_ms)
  local period = tonumber(ttl)
  if period > 0 then
    local iv = math.floor(now_ms / period)
    prefix = prefix .. ttl .. ':'
    marks.sets = {prefix .. string.format('%d', iv) .. ':', prefix .. string.format('%d', iv - 1) .. ':'}
    marks.stale = prefix .. string.format('%d', iv - 2) .. ':'
    marks.expire_at = string.format('%d', (iv + 3) * period)
  else
    marks.sets = {prefix}
  end
end

-- The marks of `uuids`: a table of the uuids already marked (true), or of the uuids whose
-- shard's set is a key of another type (the refusal, a string; nothing is written for them).
-- Keeps the uuids by shard for write_marks.
local function marked(uuids)
  local by, order = {}, {}
  for i = 1, #uuids do
    local u = uuids[i]
    append(by, order, string.sub(u, 1, 1), u)
  end
  marks.by, marks.order = by, order
  local found = {}
  for _, shard in ipairs(order) do
    local us = by[shard]
    for _, base in ipairs(marks.sets) do
      local key = base .. shard
      for s = 1, #us, CHUNK do
        local e = math.min(s + CHUNK - 1, #us)
        local r = redis.pcall('SMISMEMBER', key, unpack(us, s, e))
        if r.err then
          local refusal = 'WRONGTYPE key ' .. key .. ' holds a ' .. type_of(key) .. ', not a set'
          for j = s, e do found[us[j]] = refusal end
        else
          for j = 1, #r do
            if r[j] == 1 and found[us[s + j - 1]] == nil then found[us[s + j - 1]] = true end
          end
        end
      end
    end
  end
  return found
end

-- Writes the marks of the uuids the call accepted (`accepted[uuid]` true), last: one SADD per
-- shard (and its expiry), then unlinks the stale sets.
local function write_marks(accepted)
  local current = marks.sets[1]
  for _, shard in ipairs(marks.order) do
    local new = {}
    for _, u in ipairs(marks.by[shard]) do
      if accepted[u] then new[#new + 1] = u end
    end
    if #new > 0 then
      local key = current .. shard
      variadic('SADD', key, new)
      if marks.expire_at then redis.call('PEXPIREAT', key, marks.expire_at) end
    end
  end
  if marks.stale then
    local stale = {}
    for _, shard in ipairs(SHARDS) do
      stale[#stale + 1] = marks.stale .. shard
    end
    if redis.call('EXISTS', unpack(stale)) > 0 then redis.call('UNLINK', unpack(stale)) end
  end
end
