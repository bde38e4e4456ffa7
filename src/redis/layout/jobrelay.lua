-- jobrelay enqueue script: docs/layouts.md#the-enqueue-algorithm steps 3-8 for a batch of jobs, in one atomic call.
--
-- ARGV[1]  key namespace (may be empty)
-- ARGV[2]  dedup marker TTL in milliseconds ("0": the marker never expires)
-- then 4 values per job:
--   marker key (<ns>jobs:<uuid>), queue key (<ns>queue:<queue>), route, marshalled job
-- where route is "" for a job with no parent, no predecessor, no run_at and dead_parent false
-- (the common case: no parsing here), and otherwise
--   <dead_parent "1"/"0">|<parent uuid or "">|<predecessor uuid or "">|<run_at score or "">
-- (score: epoch seconds, decimal). The client builds the keys: fewer arguments and no string
-- concatenation per job (measured: the per-job Lua work is most of the script's cost).
--
-- Returns one element per job, in order: an integer outcome
--   1 queued, 2 scheduled, 3 children, 4 on_complete, 5 duplicate
-- or a string: why this job was refused. A refused job leaves no write behind (types are
-- checked before anything is written) and no marker, so its retry is not taken for a duplicate.
-- Markers are written last.
local ns = ARGV[1]
local ttl = ARGV[2]
local has_ttl = ttl ~= '0'
local FIELDS = 4
local n = (#ARGV - 2) / FIELDS
-- unpack() is bounded by the Lua stack: variadic commands go in chunks.
local CHUNK = 1000

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

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
local lists, list_keys = {}, {}
local sets, set_keys = {}, {}
local zset = {}
local markers = {}
local seen = {}
local result = {}

-- Dedup, fast path: one variadic EXISTS over every marker of the batch. Almost always none
-- exists, and the per-job EXISTS below is skipped; otherwise each job is checked on its own.
local marker_of = {}
for i = 0, n - 1 do
  marker_of[i + 1] = ARGV[2 + i * FIELDS + 1]
end
local some_exist = false
for s = 1, n, CHUNK do
  if redis.call('EXISTS', unpack(marker_of, s, math.min(s + CHUNK - 1, n))) > 0 then
    some_exist = true
    break
  end
end

local function append(tbl, order, key, value)
  local l = tbl[key]
  if l == nil then
    l = {}
    tbl[key] = l
    order[#order + 1] = key
  end
  l[#l + 1] = value
end

for i = 0, n - 1 do
  local b = 2 + i * FIELDS
  local marker, queue_key, route, job = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  if seen[marker] or (some_exist and redis.call('EXISTS', marker) == 1) then
    result[i + 1] = 5
  else
    local key, want, outcome, active, score
    if route == '' then
      key, want, outcome = queue_key, 'list', 1
    else
      local dead, parent, pred
      dead, parent, pred, score = string.match(route, '^([01])|([^|]*)|([^|]*)|(.*)$')
      if dead == nil then
        return redis.error_reply('jobrelay enqueue script: malformed route ' .. route)
      end
      dead = dead == '1'
      if parent ~= '' and not dead then
        key, want, outcome = ns .. 'jobs:' .. parent .. ':children', 'list', 3
      elseif pred ~= '' and not dead then
        key, want, outcome = ns .. 'jobs:' .. pred .. ':onComplete', 'list', 4
      elseif score ~= '' and tonumber(score) > now then
        key, want, outcome = ns .. 'scheduled', 'zset', 2
      else
        if parent ~= '' then active = ns .. 'jobs:' .. parent .. ':active' end
        key, want, outcome = queue_key, 'list', 1
      end
    end
    local refusal
    local have = type_of(key)
    if have ~= 'none' and have ~= want then
      refusal = 'WRONGTYPE key ' .. key .. ' holds a ' .. have .. ', not a ' .. want
    elseif active then
      local have_active = type_of(active)
      if have_active ~= 'none' and have_active ~= 'set' then
        refusal = 'WRONGTYPE key ' .. active .. ' holds a ' .. have_active .. ', not a set'
      end
    end
    if refusal then
      result[i + 1] = refusal
    else
      seen[marker] = true
      types[key] = want
      if want == 'zset' then
        zset[#zset + 1] = score
        zset[#zset + 1] = job
      else
        append(lists, list_keys, key, job)
      end
      if active then
        types[active] = 'set'
        -- The marker key ends with the job's uuid (36 characters).
        append(sets, set_keys, active, string.sub(marker, -36))
      end
      markers[#markers + 1] = marker
      markers[#markers + 1] = job
      result[i + 1] = outcome
    end
  end
end

local function variadic(cmd, key, values)
  for s = 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, s, math.min(s + CHUNK - 1, #values)))
  end
end

for _, key in ipairs(list_keys) do variadic('LPUSH', key, lists[key]) end
for _, key in ipairs(set_keys) do variadic('SADD', key, sets[key]) end
if #zset > 0 then variadic('ZADD', ns .. 'scheduled', zset) end
if has_ttl then
  for m = 1, #markers, 2 do
    redis.call('SET', markers[m], markers[m + 1], 'PX', ttl)
  end
else
  -- No TTL: one variadic MSET instead of a SET per job (measured: 0.8 µs a job less). CHUNK
  -- is even, so no key is parted from its value.
  for s = 1, #markers, CHUNK do
    redis.call('MSET', unpack(markers, s, math.min(s + CHUNK - 1, #markers)))
  end
end
return result
