-- jobrelay enqueue script, jobrelay layout (docs/layouts/algorithm.md#the-enqueue-algorithm): the
-- algorithm for a batch of jobs, in one atomic call. Helpers: prelude.lua, prepended.
--
-- KEYS     2 per job: marker key (<ns>jobs:<uuid>), queue key (<ns>queue:<queue>)
-- ARGV[1]  key namespace (may be empty)
-- ARGV[2]  dedup marker TTL in milliseconds ("0": the marker never expires)
-- then 2 values per job: route, marshalled job
-- where route is "" for a job with no parent, no predecessor, no run_at and dead_parent false
-- (the common case: no parsing here), and otherwise
--   <dead_parent "1"/"0">|<parent uuid or "">|<predecessor uuid or "">|<run_at score or "">
-- (score: epoch seconds, decimal). The client builds the keys: fewer arguments and no string
-- concatenation per job (measured: the per-job Lua work is most of the script's cost).
-- The keys every job names are declared (KEYS): a Redis Cluster routes the call by them, and
-- while their slot migrates it answers TRYAGAIN or ASK instead of running a call that would
-- write on the wrong side (a new job's marker exists on neither side yet). The other keys are
-- built here, under the same namespace, in the same slot (docs/redis.md#cluster).
--
-- Returns one element per job, in order: an integer outcome
--   1 queued, 2 scheduled, 3 children, 4 on_complete, 5 duplicate
-- or a string: why this job was refused. A refused job leaves no write behind (types are
-- checked before anything is written) and no marker, so its retry is not taken for a duplicate.
-- Markers are written last.
local ns = ARGV[1]
local ttl = ARGV[2]
local FIELDS = 2
local n = #KEYS / 2

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local markers = {}
local seen = {}
local result = {}

local some_exist = any_marker_exists(n)
read_order_keys(2 + FIELDS * n)

for i = 0, n - 1 do
  local b = 2 + i * FIELDS
  local marker, queue_key, route, job = KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[b + 1], ARGV[b + 2]
  if held_by_key(i) then
    result[i + 1] = held_by_key(i)
  elseif seen[marker] or (some_exist and redis.call('EXISTS', marker) == 1) then
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
    local refusal = wrong_type(key, want, active)
    if refusal then
      result[i + 1] = refusal
    else
      seen[marker] = true
      -- The marker key ends with the job's uuid (36 characters).
      stage(key, want, job, score, active, active and string.sub(marker, -36))
      markers[#markers + 1] = marker
      markers[#markers + 1] = job
      result[i + 1] = outcome
    end
  end
  note_answer(i, result[i + 1])
end

flush(ns .. 'scheduled')
write_markers(markers, ttl)
return result
