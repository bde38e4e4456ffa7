-- jobrelay enqueue script, rq layout (docs/layouts/rq.md): what RQ 2.x's client writes for
-- Queue.enqueue / enqueue_at (rq/queue.py _enqueue_async_job, schedule_job; rq/job.py
-- Job.to_dict; the unique enqueue of rq/scripts.py does the same in one script), for a batch of
-- jobs, in one atomic call, with a dedup marker of jobrelay's own. Helpers: prelude.lua and
-- rq_utcformat.lua, prepended.
--
-- KEYS[1]  <ns>jobrelay:rq:marks:absent, never written (declared so that a Cluster would refuse
--          the call while its slot migrates; RQ itself has no Cluster support and the relay
--          refuses a Cluster URL in this layout)
-- then 1 key per job: its queue key (<ns>rq:queue:<queue>)
-- ARGV[1]  key namespace, a raw prefix (empty for a stock RQ)
-- ARGV[2]  dedup marker TTL in milliseconds ("0": the marker never expires)
-- then 4 values per job: uuid, created_at, data, description
-- where created_at is "@<run_at>|<created_at>" for a job with a run_at (epoch seconds,
-- decimal), and description is "\0<n>:<n bytes of description><meta>" for a job with a meta
-- and no options, "\0<n>:<n bytes of description>\0<F or L>" followed by "\0<field>\0<value>"
-- per hash field for a job with options (rq/options.rs, write_fields): L (at_front) pushes the
-- job to the queue's head (LPUSH), or for a scheduled job writes enqueue_at_front 1 (RQ's
-- scheduler pushes it to the head); a timeout field replaces the default 180; a ttl field is
-- also the job hash's expiry (EXPIRE, as Job.cleanup).
-- Every argument a job adds costs Redis about 1,500 instructions (measured): the rare parts ride
-- on the common ones, and enqueued_at is Redis's own TIME, formatted once per call.
--
-- Per job, unless its uuid is marked (prelude.lua, markers as sets: <ns>jobrelay:rq:marks:...),
-- the same uuid came earlier in this call, or a job hash rq:job:<uuid> exists (RQ's own job of that id, or one RQ keeps after it ran): duplicate (5),
-- nothing written. Else:
--   run_at later than Redis's TIME -> HSET <ns>rq:job:<uuid> ... status scheduled,
--                                     ZADD <ns>rq:scheduled:<queue> <ceil(run_at)> <uuid>,
--                                     SADD <ns>rq:queues <queue key>                (outcome 2)
--   otherwise                      -> HSET <ns>rq:job:<uuid> ... enqueued_at, status queued,
--                                     RPUSH <ns>rq:queue:<queue> <uuid> (LPUSH: at_front),
--                                     SADD <ns>rq:queues <queue key>                (outcome 1)
-- A key of another type refuses the job (a string answer; nothing written for it, no marker).
-- Markers are written last.
local ns = ARGV[1]
local ttl = ARGV[2]
local FIELDS = 4
local n = #KEYS - 1
local QUEUES = ns .. 'rq:queues'
local JOB = ns .. 'rq:job:'
local SCHEDULED = ns .. 'rq:scheduled:'
-- Where a queue's name starts in its key <ns>rq:queue:<name>.
local NAME_AT = #ns + #'rq:queue:' + 1

local t = redis.call('TIME')
local secs, usecs = tonumber(t[1]), tonumber(t[2])
local now = secs + usecs / 1000000
-- RQ sets enqueued_at when it pushes the job: the moment of this call.
local ENQUEUED_AT = utcformat(secs, usecs)

-- The jobs' ids and hashes. If no hash exists (almost always), no per-job look.
local uuids, job_keys = {}, {}
for i = 1, n do
  local uuid = ARGV[3 + (i - 1) * FIELDS]
  uuids[i], job_keys[i] = uuid, JOB .. uuid
end
local some_jobs = any_exists(job_keys)

-- The job hash's fields and values in Job.to_dict's order, one table for queued jobs and one for
-- scheduled ones, whose values 2 (created_at), 4 (data), 22 (origin) and 24 (description) are
-- filled in per job: no table per job (measured: 0.9 us a job less). A job's meta or options
-- add fields after the last, taken out again after its HSET.
local function fields(queued)
  local h = {
    'created_at', '', 'data', '', 'success_callback_name', '', 'failure_callback_name', '',
    'stopped_callback_name', '', 'started_at', '', 'ended_at', '', 'last_heartbeat', '',
    'worker_name', '', 'group_id', '', 'origin', '', 'description', '',
  }
  if queued then
    h[#h + 1], h[#h + 2] = 'enqueued_at', ENQUEUED_AT
  end
  h[#h + 1], h[#h + 2] = 'timeout', '180'
  h[#h + 1], h[#h + 2] = 'status', queued and 'queued' or 'scheduled'
  return h
end
local FIELDS_QUEUED, FIELDS_SCHEDULED = fields(true), fields(false)
-- Where each table holds the timeout's value.
local TIMEOUT_AT = {}
for _, h in ipairs({FIELDS_QUEUED, FIELDS_SCHEDULED}) do
  for k = 1, #h, 2 do
    if h[k] == 'timeout' then TIMEOUT_AT[h] = k + 1 end
  end
end

-- A job's options (`opts`: its description argument after the description) into `h`, the
-- fields of its hash: "<F or L>" then "\0<field>\0<value>" per field (the timeout's value in
-- its place, the others added after the last). Answers whether the job goes to the queue's head
-- and its ttl (nil for none).
local function with_options(h, opts, scheduled)
  local front, ttl = string.byte(opts, 1) == 76, nil -- 'L'
  local at, n = 2, #opts
  while at <= n do
    local value_at = string.find(opts, '\0', at + 1, true)
    local next_at = string.find(opts, '\0', value_at + 1, true) or n + 1
    local name = string.sub(opts, at + 1, value_at - 1)
    local value = string.sub(opts, value_at + 1, next_at - 1)
    if name == 'timeout' then
      h[TIMEOUT_AT[h]] = value
    else
      h[#h + 1], h[#h + 2] = name, value
      if name == 'ttl' then ttl = value end
    end
    at = next_at
  end
  if front and scheduled then
    h[#h + 1], h[#h + 2] = 'enqueue_at_front', '1'
  end
  return front, ttl
end

-- Each queue's name (origin), by its key.
local origins = {}
-- The keys a job of this call fits (its type checked once).
local fits = {}

local seen = {}
local result = {}
-- RPUSH per queue (LPUSH for at_front jobs), ZADD per scheduled registry, SADD of each queue key
-- once. A list's LPUSHes and RPUSHes leave it as they would in any order: each end is its own.
local pushes, push_keys = {}, {}
local fronts, front_keys = {}, {}
local zadds, zadd_keys = {}, {}
local pushed, queue_keys = {}, {}

open_marks(ns .. 'jobrelay:rq:marks:', ttl, secs * 1000 + math.floor(usecs / 1000))
local marked_already = marked(uuids)
-- The first byte of a created_at argument with a run_at ('@'), and of a description with a meta
-- or options (and of the options after the description).
local ROUTED, FRAMED = 64, 0
read_order_keys(2 + FIELDS * n)

for i = 1, n do
  -- Job i's arguments: ARGV[b + 1] (its uuid), then created_at, data, description.
  local b = 2 + (i - 1) * FIELDS
  local queue_key = KEYS[i + 1]
  local uuid = uuids[i]
  local job_key = job_keys[i]
  local job_type = some_jobs and type_of(job_key) or 'none'
  local m = marked_already[uuid]
  if held_by_key(i - 1) then
    result[i] = held_by_key(i - 1)
  elseif seen[uuid] or job_type == 'hash' or m == true then
    result[i] = 5
  elseif m then
    result[i] = m
  elseif job_type ~= 'none' then
    result[i] = 'WRONGTYPE key ' .. job_key .. ' holds a ' .. job_type .. ', not a hash'
  else
    local created = ARGV[b + 2]
    local key, want, outcome, score = queue_key, 'list', 1, nil
    if string.byte(created, 1) == ROUTED then
      local bar = string.find(created, '|', 2, true)
      local at = bar and tonumber(string.sub(created, 2, bar - 1))
      if at == nil then
        return redis.error_reply('rq enqueue script: malformed run_at ' .. created)
      end
      created = string.sub(created, bar + 1)
      if at > now then
        -- RQ's scheduler moves a job once its score <= the current whole second: rounded up,
        -- the job never runs before its run_at.
        key, want, outcome = SCHEDULED .. string.sub(queue_key, NAME_AT), 'zset', 2
        score = math.ceil(at)
      end
    end
    -- A key's type is checked until a job fits it (then the call's own writes decide it).
    local refusal = nil
    if not fits[key] then
      refusal = wrong_type(key, want, QUEUES)
    end
    if refusal then
      result[i] = refusal
    else
      if not fits[key] then
        fits[key] = true
        types[key] = want
        types[QUEUES] = 'set'
      end
      seen[uuid] = true
      local origin = origins[queue_key]
      if origin == nil then
        origin = string.sub(queue_key, NAME_AT)
        origins[queue_key] = origin
      end
      local desc, meta, opts = ARGV[b + 4], nil, nil
      if string.byte(desc, 1) == FRAMED then
        local after
        desc, after = field(desc, 2)
        if string.byte(ARGV[b + 4], after) == FRAMED then
          opts = string.sub(ARGV[b + 4], after + 1)
        else
          meta = string.sub(ARGV[b + 4], after)
        end
      end
      local h = outcome == 1 and FIELDS_QUEUED or FIELDS_SCHEDULED
      h[2], h[4], h[22], h[24] = created, ARGV[b + 3], origin, desc
      local last = #h
      local front, expire
      if meta then
        h[last + 1], h[last + 2] = 'meta', meta
      elseif opts then
        front, expire = with_options(h, opts, outcome == 2)
      end
      redis.call('HSET', job_key, unpack(h))
      -- The next job's fields go in the same table.
      if opts then
        if expire then redis.call('EXPIRE', job_key, expire) end
        for k = #h, last + 1, -1 do h[k] = nil end
        h[TIMEOUT_AT[h]] = '180'
      else
        h[last + 1], h[last + 2] = nil, nil
      end
      if outcome == 2 then
        append(zadds, zadd_keys, key, score)
        append(zadds, zadd_keys, key, uuid)
      elseif front then
        append(fronts, front_keys, key, uuid)
      else
        append(pushes, push_keys, key, uuid)
      end
      if not pushed[queue_key] then
        pushed[queue_key] = true
        queue_keys[#queue_keys + 1] = queue_key
      end
      result[i] = outcome
    end
  end
  note_answer(i - 1, result[i])
end

for _, key in ipairs(push_keys) do variadic('RPUSH', key, pushes[key]) end
for _, key in ipairs(front_keys) do variadic('LPUSH', key, fronts[key]) end
for _, key in ipairs(zadd_keys) do variadic('ZADD', key, zadds[key]) end
if #queue_keys > 0 then variadic('SADD', QUEUES, queue_keys) end
write_marks(seen)
return result
