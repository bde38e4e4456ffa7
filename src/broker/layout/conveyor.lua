-- jobrelay enqueue script, conveyor layout (docs/layouts/conveyor.md): conveyor's AddJob for a batch of
-- jobs, in one atomic call, with a dedup marker of jobrelay's own and late children set free.
--
-- KEYS     2 per job: marker key (<ns>jobrelay:job:<uuid>), queue key (<ns>queue:<queue>)
--          (declared for a Redis Cluster's routing and slot migrations, as in jobrelay.lua)
-- ARGV[1]  key namespace, a raw prefix ("conv:" is conveyor's namespace "conv")
-- ARGV[2]  dedup marker TTL in milliseconds ("0": the marker never expires)
-- then 3 values per job: route, the job's bytes (wire.Job), and for a child or an heir its
--   bytes with parent_uuid and predecessor_uuid cleared ("" otherwise)
-- where route is "" for a job with no parent, no predecessor, no run_at and dead_parent false,
-- and otherwise
--   <dead_parent "1"/"0">|<parent uuid or "">|<predecessor uuid or "">|<run_at exact>|<run_at whole>
-- (epoch seconds; conveyor compares the exact instant with now and scores whole seconds).
--
-- Branches, in conveyor's AddJob order:
--   parent, not dead_parent       -> LPUSH <ns>job:<parent>:children     (outcome 3)
--   predecessor, not dead_parent  -> LPUSH <ns>job:<pred>:onComplete     (outcome 4)
--   run_at in the future          -> ZADD <ns>scheduled <whole seconds>  (outcome 2)
--   otherwise                     -> SADD <ns>job:<parent>:active <uuid> if it has a parent,
--                                    LPUSH <ns>queue:<queue>             (outcome 1)
-- except for a late job (outcome 6): its parent (or predecessor) was relayed by jobrelay and
-- has finished since: no record <ns>job:<anchor>, and its bytes are no longer waiting where
-- they went (queue, scheduled set, or its own parent's or predecessor's list). Nobody would
-- drain its lists any more, and conveyor's close of a child fails when the parent's record is
-- gone: it goes out as a job of its own (the second bytes), to the scheduled set or the queue.
-- An anchor jobrelay never relayed, or whose marker expired, is taken to be alive (conveyor's
-- own rule).
--
-- Returns one element per job, in order: an integer outcome
--   1 queued, 2 scheduled, 3 children, 4 on_complete, 5 duplicate, 6 late
-- or a string: why this job was refused; a refused job leaves no write behind and no marker.
-- The marker of a plain job (empty route) is its bytes; any other's holds
--   <where 1 char><anchor uuid or 36 "-"><#queue key>:<queue key><#route>:<route><#bytes>:<bytes><alone>
-- where "where" is q (queue), s (scheduled), c (a parent's children), o (a predecessor's
-- onComplete), bytes are what was pushed and alone the job's bytes as a job of its own ("" for
-- a job without parent or predecessor). Markers are written last.
--
-- A child or heir pushed into the lists of a job that is running (its record exists) is
-- racing conveyor's close of that job, which drains the lists first and deletes the record
-- last: "<ms>:<the job's uuid>" goes into the watch set <ns>jobrelay:watch (score: when it is
-- next due, in milliseconds), and conveyor_repair.lua sets free what is left in those lists
-- once the record is gone.
local ns = ARGV[1]
local ttl = ARGV[2]
local FIELDS = 3
local n = #KEYS / 2
local NO_ANCHOR = string.rep('-', 36)
local MARKER_INFIX = 'jobrelay:job:'
local WATCH = ns .. 'jobrelay:watch'

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local watch = {}
local markers = {}
local seen = {}
local result = {}

local some_exist = any_marker_exists(n)

-- Whether `bytes` still wait in the list `key` (or, with zset, in the scheduled set).
local function in_list(key, bytes)
  return type_of(key) == 'list' and redis.call('LPOS', key, bytes, 'RANK', -1) ~= false
end

-- The queue field (3) of a wire.Job's bytes. The relay writes fields in number order and
-- always sets uuid (1), type (2) and queue (3), each a tag byte, a varint length, the bytes.
local function queue_of(bytes)
  local at = 1
  while at <= #bytes do
    local tag = string.byte(bytes, at)
    local len, shift = 0, 0
    at = at + 1
    repeat
      local b = string.byte(bytes, at)
      len = len + (b % 128) * 2 ^ shift
      shift = shift + 7
      at = at + 1
    until b < 128
    if tag == 26 then return string.sub(bytes, at, at + len - 1) end
    at = at + len
  end
  return nil
end

-- Whether the job with this uuid may still drain its children and onComplete lists:
-- 'pending' if pushed earlier in this call, never relayed by jobrelay or relayed too long ago
-- to know (no marker), or still waiting where the relay put it (conveyor moves a job from its
-- parent's or predecessor's list, or from the scheduled set, to its queue, re-encoded to the
-- same bytes); 'running' while its record exists (running, or waiting for its children);
-- false once it has finished.
local alive_cache = {}
local function alive(uuid)
  if seen[ns .. MARKER_INFIX .. uuid] then return 'pending' end
  local cached = alive_cache[uuid]
  if cached ~= nil then return cached end
  local answer = 'pending'
  if redis.call('EXISTS', ns .. 'job:' .. uuid) == 1 then
    answer = 'running'
  else
    local m = redis.call('GET', ns .. MARKER_INFIX .. uuid)
    if m then
      local where, anchor, qkey, bytes
      if string.byte(m, 1) == 10 then
        -- A plain job's marker is its bytes (it went to its queue).
        where, bytes = 'q', m
        qkey = ns .. 'queue:' .. (queue_of(m) or '')
      else
        local at, route_end
        where, anchor = string.sub(m, 1, 1), string.sub(m, 2, 37)
        qkey, at = field(m, 38)
        route_end = select(2, field(m, at))
        bytes = field(m, route_end)
      end
      local waiting = in_list(qkey, bytes)
        or (type_of(ns .. 'scheduled') == 'zset' and redis.call('ZSCORE', ns .. 'scheduled', bytes) ~= false)
        or (where == 'c' and in_list(ns .. 'job:' .. anchor .. ':children', bytes))
        or (where == 'o' and in_list(ns .. 'job:' .. anchor .. ':onComplete', bytes))
      if not waiting then answer = false end
    end
  end
  alive_cache[uuid] = answer
  return answer
end

read_order_keys(2 + FIELDS * n)
for i = 0, n - 1 do
  local b = 2 + i * FIELDS
  local marker, queue_key, route, job, alone =
    KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  if held_by_key(i) then
    result[i + 1] = held_by_key(i)
  elseif seen[marker] or (some_exist and redis.call('EXISTS', marker) == 1) then
    result[i + 1] = 5
  else
    -- key: where the bytes go; where: the marker's tag; anchor: whose list it is; racing:
    -- that anchor is running (its lists are drained by a close that may be under way).
    local key, want, outcome, active, whole, where, anchor, racing
    local bytes = job
    if route == '' then
      key, want, outcome, where = queue_key, 'list', 1, 'q'
    else
      local dead, parent, pred, exact
      dead, parent, pred, exact, whole = string.match(route, '^([01])|([^|]*)|([^|]*)|([^|]*)|(.*)$')
      if dead == nil then
        return redis.error_reply('jobrelay enqueue script: malformed route ' .. route)
      end
      dead = dead == '1'
      local future = exact ~= '' and tonumber(exact) > now
      local state = 'pending'
      if parent ~= '' then
        state = alive(parent)
      elseif pred ~= '' and not dead then
        state = alive(pred)
      end
      local late = state == false
      racing = state == 'running'
      if late then
        bytes = alone
        if future then
          key, want, outcome, where = ns .. 'scheduled', 'zset', 6, 's'
        else
          key, want, outcome, where = queue_key, 'list', 6, 'q'
        end
      elseif parent ~= '' and not dead then
        key, want, outcome, where, anchor = ns .. 'job:' .. parent .. ':children', 'list', 3, 'c', parent
      elseif pred ~= '' and not dead then
        key, want, outcome, where, anchor = ns .. 'job:' .. pred .. ':onComplete', 'list', 4, 'o', pred
      elseif future then
        key, want, outcome, where = ns .. 'scheduled', 'zset', 2, 's'
      else
        if parent ~= '' then active = ns .. 'job:' .. parent .. ':active' end
        key, want, outcome, where = queue_key, 'list', 1, 'q'
      end
    end
    local refusal = wrong_type(key, want, active)
    if refusal then
      result[i + 1] = refusal
    else
      seen[marker] = true
      -- The marker key ends with the job's uuid (36 characters).
      stage(key, want, bytes, whole, active, active and string.sub(marker, -36))
      if racing and anchor then
        watch[#watch + 1] = now_ms
        watch[#watch + 1] = now_ms .. ':' .. anchor
      end
      markers[#markers + 1] = marker
      if route == '' then
        -- A plain job (no parent, predecessor or run_at): its bytes say all (they start with
        -- 0x0a, field 1's tag, where a tagged marker starts with a letter).
        markers[#markers + 1] = bytes
      else
        markers[#markers + 1] = where .. (anchor or NO_ANCHOR) .. #queue_key .. ':' .. queue_key
          .. #route .. ':' .. route .. #bytes .. ':' .. bytes .. (bytes == alone and '' or alone)
      end
      result[i + 1] = outcome
    end
  end
  note_answer(i, result[i + 1])
end

flush(ns .. 'scheduled')
if #watch > 0 then variadic('ZADD', WATCH, watch) end
write_markers(markers, ttl)
return result
