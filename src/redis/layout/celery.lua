-- jobrelay enqueue script, celery layout (docs/layouts.md#celery): each job's message LPUSHed
-- onto its queue's list, as kombu's Redis transport does, with a dedup marker of jobrelay's own,
-- in one atomic call. Helpers: prelude.lua, prepended.
--
-- KEYS     2 per job: marker key (<ns>jobrelay:celery:<uuid>), the queue's list (<ns><queue>,
--          kombu's list for priority 0) (declared for a Redis Cluster's routing, as in
--          jobrelay.lua; celery's Redis transport itself has no Cluster support)
-- ARGV[1]  key namespace (kombu's global_keyprefix; empty for a stock worker)
-- ARGV[2]  dedup marker TTL in milliseconds ("0": the marker never expires)
-- then 1 value per job: the message (kombu's JSON envelope)
--
-- No flows and no scheduled set: the relay sends a job once its run_at is due.
--
-- Returns one element per job, in order: 1 (queued) or 5 (duplicate: its marker existed, or
-- the same uuid came earlier in this call), or a string: why this job was refused (its list key
-- holds another type); a refused job leaves no write behind and no marker. The marker's value is
-- the queue's key. Markers are written last.
local ttl = ARGV[2]
local n = #KEYS / 2

local markers = {}
local seen = {}
local result = {}

local some_exist = any_marker_exists(n)

for i = 0, n - 1 do
  local marker, queue_key, message = KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[3 + i]
  if seen[marker] or (some_exist and redis.call('EXISTS', marker) == 1) then
    result[i + 1] = 5
  else
    local refusal = wrong_type(queue_key, 'list', nil)
    if refusal then
      result[i + 1] = refusal
    else
      seen[marker] = true
      stage(queue_key, 'list', message)
      markers[#markers + 1] = marker
      markers[#markers + 1] = queue_key
      result[i + 1] = 1
    end
  end
end

flush(nil)
write_markers(markers, ttl)
return result
