-- jobrelay enqueue script, sidekiq layout (docs/layouts/sidekiq.md): what Sidekiq's client
-- writes (lib/sidekiq/client.rb, atomic_push) for a batch of jobs, in one atomic call, with a
-- dedup marker of jobrelay's own. Helpers: prelude.lua, prepended.
--
-- KEYS     2 per job: marker key (<ns>jobrelay:sidekiq:<uuid>), queue key (<ns>queue:<queue>)
--          (declared for a Redis Cluster's routing, as in jobrelay.lua; Sidekiq itself does
--          not run on a Cluster)
-- ARGV[1]  key namespace, a raw prefix (empty for a stock Sidekiq)
-- ARGV[2]  dedup marker TTL in milliseconds ("0": the marker never expires)
-- then 2 values per job: route, the job's JSON
-- where route is "" for a job without run_at (its JSON carries enqueued_at: the common case,
-- no parsing and no string work here), else run_at in epoch seconds (decimal), and the JSON
-- then has no enqueued_at and ends with "}".
--
-- Branches, as atomic_push:
--   run_at later than Redis's TIME -> ZADD <ns>schedule <run_at> <json>            (outcome 2)
--   otherwise                      -> LPUSH <ns>queue:<queue> <json>, SADD <ns>queues <queue>
--                                     (outcome 1); a job whose run_at has passed gets
--                                     ,"enqueued_at":<TIME> before its last "}"
--
-- Returns one element per job, in order: an integer outcome
--   1 queued, 2 scheduled, 5 duplicate
-- or a string: why this job was refused; a refused job leaves no write behind and no marker.
-- The marker holds the JSON written. Markers are written last.
local ns = ARGV[1]
local ttl = ARGV[2]
local FIELDS = 2
local n = #KEYS / 2
local QUEUES = ns .. 'queues'
local SCHEDULE = ns .. 'schedule'
-- Where a queue's name starts in its key <ns>queue:<name>.
local NAME_AT = #ns + #'queue:' + 1

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
-- ,"enqueued_at":<now>} for the jobs whose run_at has passed, built once when needed.
local enqueued_tail

local markers = {}
local seen = {}
local result = {}
-- The names of the queues pushed to, once each, for SADD <ns>queues.
local pushed, names = {}, {}

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
    local key, want, outcome, score = queue_key, 'list', 1, nil
    if route ~= '' then
      local at = tonumber(route)
      if at == nil then
        return redis.error_reply('sidekiq enqueue script: malformed run_at ' .. route)
      end
      if at > now then
        key, want, outcome, score = SCHEDULE, 'zset', 2, route
      else
        if enqueued_tail == nil then
          enqueued_tail = ',"enqueued_at":' .. t[1] .. '.' .. string.format('%06d', tonumber(t[2])) .. '}'
        end
        job = string.sub(job, 1, -2) .. enqueued_tail
      end
    end
    local refusal = wrong_type(key, want, want == 'list' and QUEUES or nil)
    if refusal then
      result[i + 1] = refusal
    else
      seen[marker] = true
      stage(key, want, job, score)
      if want == 'list' and not pushed[key] then
        pushed[key] = true
        names[#names + 1] = string.sub(key, NAME_AT)
      end
      markers[#markers + 1] = marker
      markers[#markers + 1] = job
      result[i + 1] = outcome
    end
  end
  note_answer(i, result[i + 1])
end

flush(SCHEDULE)
if #names > 0 then variadic('SADD', QUEUES, names) end
write_markers(markers, ttl)
return result
