-- jobrelay enqueue script, bullmq layout (docs/layouts/bullmq.md): what BullMQ's Queue.add writes
-- for a job with a custom id (taskforcesh/bullmq 6.x src/commands/addStandardJob-9.lua and
-- addDelayedJob-6.lua with includes/storeJob.lua, getOrSetMaxEvents.lua,
-- isQueuePausedOrMaxed.lua, addJobInTargetList.lua, addBaseMarkerIfNeeded.lua, addDelayedJob.lua,
-- getDelayedScore.lua, addDelayMarkerIfNeeded.lua; for a job of priority above 0,
-- addPrioritizedJob-9.lua with addJobWithPriority.lua and getPriorityScore.lua), for a batch of
-- jobs in one atomic call, with a dedup marker of jobrelay's own. Helpers: prelude.lua, prepended.
--
-- KEYS[1]  <ns>jobrelay:bullmq:marks:absent, a key never written: while a Cluster migrates the
--          slot, a call declaring a key that exists on neither node is refused before it runs
-- then 1 key per job: the queue's wait list (<ns><queue>:wait); the queue's other keys (<ns><queue>:id, :meta, :events, :marker,
--          :delayed, :active, :paused) and the job's hash (<ns><queue>:<uuid>) are named from it,
--          all under the namespace (one hash slot with a hash-tagged namespace, as BullMQ's own
--          scripts on a Cluster).
-- ARGV[1]  key namespace: BullMQ's prefix followed by ':' ("bull:" for BullMQ's default)
-- ARGV[2]  dedup marker TTL in milliseconds ("0": the marker never expires)
-- then 5 values per job: uuid, route, name, data, opts
-- where route is "" for a job without run_at, else run_at in epoch milliseconds (rounded up),
-- name is the job's name (job_type), data its JSON (the payload), and opts "" for a job without
-- options (opts stored: {"jobId":..,"attempts":0}), else "F" or "L" (lifo: RPUSH to the wait
-- list's head, as BullMQ's addJobInTargetList), the priority's digits when above 0, and the
-- members opts holds after jobId and delay, each with its leading comma (bullmq.rs, opts_arg).
--
-- Per job, as Queue.add with opts {jobId: <uuid>}:
--   INCR <q>:id (BullMQ counts custom ids too; here one INCRBY per queue and call)
--   HMSET <q>:<uuid> name data opts timestamp delay priority (0 unless given)
--   XADD <q>:events * event added jobId <uuid> name <name>        (storeJob: not trimmed)
--   run_at later than Redis's TIME (ms):
--     ZADD <q>:delayed <score> <uuid> (getDelayedScore: run_at ms * 0x1000, + n within the ms)
--     XADD <q>:events * event delayed jobId <uuid> delay <run_at ms>
--     ZADD <q>:marker <next delayed ms> 1                                     (outcome 2)
--   otherwise, for a priority above 0 (addPrioritizedJob, whatever lifo says):
--     ZADD <q>:prioritized <priority * 2^32 + (INCR <q>:pc) % 2^32> <uuid>
--   otherwise:
--     LPUSH <q>:wait <uuid> (<q>:paused for a paused queue of BullMQ 5, whose meta's version
--     says bullmq:5.; BullMQ 6 has no paused list)
--   and for both:
--     ZADD <q>:marker 0 0 unless the queue is paused or at its global concurrency
--     XADD <q>:events * event waiting jobId <uuid>                           (outcome 1)
--   and, per queue after its jobs, XTRIM <q>:events MAXLEN ~ <maxEvents> LIMIT 0: where BullMQ
--   trims at each delayed or waiting entry, one trim leaves the same stream (an approximate trim
--   drops whole nodes from the head while the rest still holds maxEvents entries, and nothing
--   reads the stream before the script ends); measured 0.25 us a job less.
-- maxEvents: HGET <q>:meta opts.maxLenEvents, set to 10000 if absent (getOrSetMaxEvents).
--
-- Dedup: the job's uuid is marked (prelude.lua, markers as sets: <ns>jobrelay:bullmq:marks:...),
-- or the same uuid came earlier in this call, or BullMQ already
-- holds a job hash of that id (its own add would answer "duplicated" and change nothing):
-- outcome 5, nothing written. A key of another type refuses the job (a string, nothing
-- written for it, no marker). Markers are written last.
local ttl = ARGV[2]
local FIELDS = 5
local n = #KEYS - 1

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = string.format('%d', now)

-- The keys of a queue besides its wait list, and the type each must have.
local QUEUE_KEYS = {
  {'wait', 'list'}, {'paused', 'list'}, {'id', 'string'}, {'meta', 'hash'},
  {'events', 'stream'}, {'marker', 'zset'}, {'delayed', 'zset'}, {'active', 'list'},
}

-- Per queue, by its base key <ns><queue>: (the wait key without 'wait'): a refusal, or the
-- jobs accepted for it.
local queues, queue_order = {}, {}
local function queue_of(base)
  local q = queues[base]
  if q then return q end
  q = {base = base}
  for _, k in ipairs(QUEUE_KEYS) do
    local key = base .. k[1]
    local have = type_of(key)
    if have ~= 'none' and have ~= k[2] then
      q.refusal = 'WRONGTYPE key ' .. key .. ' holds a ' .. have .. ', not a ' .. k[2]
      break
    end
  end
  if not q.refusal and type_of(base .. 'id') == 'string' then
    -- INCRBY would fail on another string, after other writes of the call.
    local id = redis.call('GET', base .. 'id')
    if not string.find(id, '^%-?%d+$') then
      q.refusal = 'key ' .. base .. 'id holds ' .. string.format('%q', string.sub(id, 1, 40)) ..
        ', not an integer (BullMQ\'s job id counter)'
    end
  end
  queues[base] = q
  return q
end

-- A prioritized job's keys (<q>:prioritized, <q>:pc), looked at only when the call has a due job
-- of priority above 0 for the queue: nil when they are fit, else why not.
local function prioritized_refusal(q)
  if q.prio_checked then return q.prio_refusal end
  q.prio_checked = true
  for _, k in ipairs({{'prioritized', 'zset'}, {'pc', 'string'}}) do
    local key = q.base .. k[1]
    local have = type_of(key)
    if have ~= 'none' and have ~= k[2] then
      q.prio_refusal = 'WRONGTYPE key ' .. key .. ' holds a ' .. have .. ', not a ' .. k[2]
      return q.prio_refusal
    end
  end
  if type_of(q.base .. 'pc') == 'string' then
    local pc = redis.call('GET', q.base .. 'pc')
    if not string.find(pc, '^%-?%d+$') then
      q.prio_refusal = 'key ' .. q.base .. 'pc holds ' .. string.format('%q', string.sub(pc, 1, 40)) ..
        ', not an integer (BullMQ\'s priority counter)'
    end
  end
  return q.prio_refusal
end

local seen = {}
local result = {}
-- The accepted jobs, in order: their positions (1-based), and by position their queue and delay.
local accepted, queue_at, delays = {}, {}, {}

-- Likewise the job hashes: one variadic EXISTS over every job's hash key (almost always none
-- exists: BullMQ already holds a job of that id only if the relay's marker expired or the job was
-- added by BullMQ's own client), and only if any does, each job's key is looked at on its own.
local ids, bases, job_keys = {}, {}, {}
local base_of = {}
for i = 1, n do
  -- Job i's uuid is its first argument; the wait key ends with 'wait'.
  local wait = KEYS[i + 1]
  local id, base = ARGV[3 + (i - 1) * FIELDS], base_of[wait]
  if base == nil then
    base = string.sub(wait, 1, -5)
    base_of[wait] = base
  end
  ids[i], bases[i], job_keys[i] = id, base, base .. id
end
local some_jobs_exist = any_exists(job_keys)
open_marks(ARGV[1] .. 'jobrelay:bullmq:marks:', ttl, now)
local marked_already = marked(ids)
read_order_keys(2 + FIELDS * n)

for i = 0, n - 1 do
  local b = 2 + i * FIELDS
  local route = ARGV[b + 2]
  local id = ids[i + 1]
  local m = marked_already[id]
  if held_by_key(i) then
    result[i + 1] = held_by_key(i)
  elseif seen[id] or m == true then
    result[i + 1] = 5
  elseif m then
    result[i + 1] = m
  else
    local q = queue_of(bases[i + 1])
    if q.refusal then
      result[i + 1] = q.refusal
    else
      local job_key = job_keys[i + 1]
      local have = 'none'
      if some_jobs_exist then have = type_of(job_key) end
      if have == 'hash' then
        -- BullMQ's own job of this id: as its add, a duplicate that changes nothing.
        result[i + 1] = 5
      elseif have ~= 'none' then
        result[i + 1] = 'WRONGTYPE key ' .. job_key .. ' holds a ' .. have .. ', not a hash'
      else
        local delay = 0
        if route ~= '' then
          local at = tonumber(route)
          if at == nil then
            return redis.error_reply('bullmq enqueue script: malformed run_at ' .. route)
          end
          if at > now then delay = at - now end
        end
        -- A due job of priority above 0 (its opts start with the flag and a digit 1-9) goes to
        -- the prioritized set: refused, with nothing written, if its keys are unfit.
        local refusal = nil
        if delay == 0 and string.find(ARGV[b + 5], '^%a[1-9]') then
          refusal = prioritized_refusal(q)
        end
        if refusal then
          result[i + 1] = refusal
        else
          seen[id] = true
          if q.jobs == nil then
            q.jobs = 0
            queue_order[#queue_order + 1] = q
          end
          q.jobs = q.jobs + 1
          accepted[#accepted + 1] = i + 1
          queue_at[i + 1], delays[i + 1] = q, delay
          result[i + 1] = delay > 0 and 2 or 1
        end
      end
    end
  end
  note_answer(i, result[i + 1])
end

-- Per queue, what each of BullMQ's adds reads first: getOrSetMaxEvents and
-- isQueuePausedOrMaxed (nothing in this call changes them).
for _, q in ipairs(queue_order) do
  -- The id counter: one INCR per job in BullMQ (custom ids too), one INCRBY of as many here.
  redis.call('INCRBY', q.base .. 'id', q.jobs)
  local meta = q.base .. 'meta'
  local max_events = redis.call('HGET', meta, 'opts.maxLenEvents')
  if not max_events then
    max_events = 10000
    redis.call('HSET', meta, 'opts.maxLenEvents', max_events)
  end
  q.max_events = tostring(max_events)
  q.events = q.base .. 'events'
  local attrs = redis.call('HMGET', meta, 'paused', 'concurrency', 'version')
  q.target = q.base .. 'wait'
  if attrs[1] then
    q.paused_or_maxed = true
    if attrs[3] and string.find(attrs[3], '^bullmq[%w_-]*:5%.') then
      q.target = q.base .. 'paused'
    end
  elseif attrs[2] then
    q.paused_or_maxed = redis.call('LLEN', q.base .. 'active') >= tonumber(attrs[2])
  end
end

for _, j in ipairs(accepted) do
  local q, id, job_key, delay = queue_at[j], ids[j], job_keys[j], delays[j]
  -- Job j's arguments: ARGV[3 + FIELDS * (j - 1)] (uuid), then its route, name, data, opts.
  local name, data = ARGV[FIELDS * j], ARGV[FIELDS * j + 1]
  local opts, lifo, priority = ARGV[FIELDS * j + 2], false, '0'
  if opts == '' then
    opts = ',"attempts":0'
  else
    local flag, digits, members = string.match(opts, '^(%a)(%d*)(.*)$')
    lifo = flag == 'L'
    if digits ~= '' then priority = digits end
    opts = members
  end
  local events = q.events
  if delay > 0 then
    local d = string.format('%d', delay)
    redis.call('HMSET', job_key, 'name', name, 'data', data,
      'opts', '{"jobId":"' .. id .. '","delay":' .. d .. opts .. '}',
      'timestamp', now_s, 'delay', d, 'priority', priority)
  else
    redis.call('HMSET', job_key, 'name', name, 'data', data,
      'opts', '{"jobId":"' .. id .. '"' .. opts .. '}',
      'timestamp', now_s, 'delay', '0', 'priority', priority)
  end
  redis.call('XADD', events, '*', 'event', 'added', 'jobId', id, 'name', name)
  if delay > 0 then
    -- getDelayedScore: the due time's milliseconds times 0x1000, plus one per job already due
    -- in the same millisecond (FIFO among them).
    local delayed = q.base .. 'delayed'
    local due = now + delay
    local min_score = due * 0x1000
    local max_score = (due + 1) * 0x1000 - 1
    local score = min_score
    local top = redis.call('ZREVRANGEBYSCORE', delayed, max_score, min_score, 'WITHSCORES', 'LIMIT', 0, 1)
    local current = tonumber(top[2])
    if current ~= nil then
      if current >= max_score then score = max_score else score = current + 1 end
    end
    redis.call('ZADD', delayed, score, id)
    redis.call('XADD', events, '*', 'event', 'delayed', 'jobId', id, 'delay', due)
    q.delayed = true
  elseif priority ~= '0' then
    -- addJobWithPriority: the score is a number, which Redis's Lua writes as BullMQ's does.
    local counter = redis.call('INCR', q.base .. 'pc')
    redis.call('ZADD', q.base .. 'prioritized',
      tonumber(priority) * 0x100000000 + counter % 0x100000000, id)
    q.pushed = true
    redis.call('XADD', events, '*', 'event', 'waiting', 'jobId', id)
  else
    if lifo then
      redis.call('RPUSH', q.target, id)
    else
      append(lists, list_keys, q.target, id)
    end
    q.pushed = true
    redis.call('XADD', events, '*', 'event', 'waiting', 'jobId', id)
  end
end

flush(nil)

-- The workers' marker: addBaseMarkerIfNeeded for a queue that got jobs to wait and is neither
-- paused nor at its concurrency; addDelayMarkerIfNeeded (the next delayed job's time) for one
-- that got delayed jobs.
for _, q in ipairs(queue_order) do
  redis.call('XTRIM', q.events, 'MAXLEN', '~', q.max_events, 'LIMIT', 0)
  local marker = q.base .. 'marker'
  if q.pushed and not q.paused_or_maxed then
    redis.call('ZADD', marker, 0, '0')
  end
  if q.delayed then
    local first = redis.call('ZRANGE', q.base .. 'delayed', 0, 0, 'WITHSCORES')
    local next_at = tonumber(first[2])
    if next_at ~= nil then
      redis.call('ZADD', marker, next_at / 0x1000, '1')
    end
  end
end

write_marks(seen)
return result
