-- jobrelay enqueue script, celery layout (docs/layouts/celery.md#how-the-celery-layout-pushes): the
-- second half of a MULTI/EXEC transaction whose first half LPUSHed every job's message onto its
-- queue's list, as kombu's Redis transport does. It settles those pushes, atomically with
-- them: the markers of the new jobs are written, and the messages of duplicates are taken back
-- out. No message passes through Lua. Helpers: prelude.lua, prepended.
--
-- KEYS     2 per job: marker key (<ns>jobrelay:celery:<uuid>), the list its message went to
--          (<ns><queue>, kombu's list for priority 0, or <ns><queue>\x06\x16<step> for the
--          job's priority option) (declared for a Redis Cluster's routing, as in
--          jobrelay.lua; celery's Redis transport itself has no Cluster support)
-- ARGV[1]  key namespace (kombu's global_keyprefix; empty for a stock worker)
-- ARGV[2]  dedup marker TTL in milliseconds ("0": the marker never expires)
--
-- The pushes: one LPUSH per list, with its jobs' messages in job order, so a list's k-th job
-- of m (counting from 1) is at index m - k. A list key holding another type refused its LPUSH
-- (WRONGTYPE, nothing written): its jobs are refused here.
--
-- No flows and no scheduled set: the relay sends a job once its run_at is due.
--
-- Returns one element per job, in order: 1 (queued) or 5 (duplicate: its marker existed, or
-- the same uuid came earlier in this call; its message was taken back out), or a string: why
-- this job was refused (its list key holds another type), or that it was held behind a
-- refused job of its ordering key (`HELD <i>`, prelude.lua; its message taken back out); a
-- refused or held job leaves no write behind and no marker. The marker's value is the queue's key. Markers are written last.
local ttl = ARGV[2]
local n = #KEYS / 2

-- What a message taken back out is first overwritten with (LSET by index), then removed by
-- (LREM from the head, where this transaction's messages are). A message is a JSON object and
-- never equals it.
local TAKEN = '\0jobrelay:taken'

local pushed, nth = {}, {}
for i = 0, n - 1 do
  local list = KEYS[2 * i + 2]
  pushed[list] = (pushed[list] or 0) + 1
end

local markers = {}
local seen = {}
local result = {}
local taken, taken_lists = {}, {}

local some_exist = any_marker_exists(n)
read_order_keys(2)

for i = 0, n - 1 do
  local marker, list = KEYS[2 * i + 1], KEYS[2 * i + 2]
  local k = (nth[list] or 0) + 1
  nth[list] = k
  local have = type_of(list)
  local held = held_by_key(i)
  if held or seen[marker] or (some_exist and redis.call('EXISTS', marker) == 1) then
    -- A list of another type refused the LPUSH: nothing to take back.
    if have == 'list' then
      redis.call('LSET', list, pushed[list] - k, TAKEN)
      if taken[list] == nil then
        taken[list] = 0
        taken_lists[#taken_lists + 1] = list
      end
      taken[list] = taken[list] + 1
    end
    result[i + 1] = held or 5
  elseif have ~= 'list' then
    result[i + 1] = 'WRONGTYPE key ' .. list .. ' holds a ' .. have .. ', not a list'
  else
    seen[marker] = true
    markers[#markers + 1] = marker
    markers[#markers + 1] = list
    result[i + 1] = 1
  end
  note_answer(i, result[i + 1])
end

for _, list in ipairs(taken_lists) do
  redis.call('LREM', list, taken[list], TAKEN)
end
write_markers(markers, ttl)
return result
