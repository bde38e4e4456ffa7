-- jobrelay, conveyor layout: set free the children and heirs stranded by a close that raced
-- their push (docs/layouts/conveyor.md).
--
-- conveyor.lua pushes a child (heir) into the children (onComplete) list of a job that is
-- running, and notes that job in the watch set <ns>jobrelay:watch. Conveyor's close drains
-- those lists first and deletes the job's record <ns>job:<uuid> last, in separate commands:
-- a push that lands in between stays in a list nobody will drain again. This script looks at
-- the watched jobs noted at least ARGV[2] milliseconds ago: one whose record still exists is
-- looked at again later; for one whose record is gone (its close is over), every entry that
-- jobrelay relayed into its lists (it has a marker) goes out as a job of its own, as a late
-- job does in conveyor.lua: its bytes without parent and predecessor, to its queue or, with a
-- run_at in the future, to the scheduled set. Entries jobrelay did not write are left alone.
--
-- KEYS[1]  the watch set, <ns>jobrelay:watch (declared: a Redis Cluster routes the call by it)
-- ARGV[1]  key namespace (raw prefix)
-- ARGV[2]  grace in milliseconds
-- ARGV[3]  most watched jobs to look at in this call
-- ARGV[4]  the dedup marker TTL in milliseconds ("0": none): a job watched for longer (a record
--          conveyor leaked, say) is no longer looked at; the markers this script needs are gone
-- Returns the number of jobs set free.
--
-- Everything is read before anything is written: a Redis Cluster whose slot is being migrated
-- refuses, inside a script, a read of a key that has already moved, and a script is not rolled
-- back, so a call refused half-way must not have written anything yet.
local ns = ARGV[1]
local grace = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local WATCH = KEYS[1]
local MARKER_INFIX = 'jobrelay:job:'
local NO_ANCHOR = string.rep('-', 36)

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Key types as they will be once the writes planned so far are done.
local planned = {}
-- Whether `key` is free for, or already holds, a value of type `want`; if free, it is taken.
local function fits(key, want)
  local have = planned[key]
  if have == nil then
    have = redis.call('TYPE', key).ok
  end
  if have == 'none' or have == want then
    planned[key] = want
    return true
  end
  planned[key] = have
  return false
end

-- Phase 1: what to write.
local forget, again, moves = {}, {}, {}
local due = redis.call('ZRANGEBYSCORE', WATCH, '-inf', now_ms - grace, 'LIMIT', 0, limit)
for _, member in ipairs(due) do
  local colon = string.find(member, ':', 1, true)
  local since, anchor = tonumber(string.sub(member, 1, colon - 1)), string.sub(member, colon + 1)
  if redis.call('EXISTS', ns .. 'job:' .. anchor) == 1 then
    if ttl > 0 and now_ms - since > ttl then
      forget[#forget + 1] = member
    else
      -- Still running, or waiting for its children: look again later.
      again[#again + 1] = member
    end
  else
    forget[#forget + 1] = member
    for _, suffix in ipairs({ ':children', ':onComplete' }) do
      local list = ns .. 'job:' .. anchor .. suffix
      if redis.call('TYPE', list).ok == 'list' then
        for _, entry in ipairs(redis.call('LRANGE', list, 0, -1)) do
          -- A wire.Job starts with its uuid: field 1, 36 bytes (0a 24 <uuid>).
          local uuid = string.sub(entry, 3, 38)
          local marker = ns .. MARKER_INFIX .. uuid
          local m = redis.call('GET', marker)
          if m and string.sub(entry, 1, 2) == '\10\36' then
            local qkey, at = field(m, 38)
            local route, at2 = field(m, at)
            local bytes, at3 = field(m, at2)
            local alone = string.sub(m, at3)
            if bytes == entry and alone ~= '' then
              local _, _, _, exact, whole = string.match(route, '^([01])|([^|]*)|([^|]*)|([^|]*)|(.*)$')
              local where, key
              if exact and exact ~= '' and tonumber(exact) > now then
                if fits(ns .. 'scheduled', 'zset') then
                  where, key = 's', ns .. 'scheduled'
                end
              elseif fits(qkey, 'list') then
                where, key = 'q', qkey
              end
              if where then
                moves[#moves + 1] = {
                  where = where, key = key, score = whole, alone = alone, list = list,
                  entry = entry, marker = marker, pttl = redis.call('PTTL', marker),
                  value = where .. NO_ANCHOR .. #qkey .. ':' .. qkey .. #route .. ':' .. route
                    .. #alone .. ':' .. alone,
                }
              end
            end
          end
        end
      end
    end
  end
end

-- Phase 2: the writes.
for _, member in ipairs(forget) do redis.call('ZREM', WATCH, member) end
for _, member in ipairs(again) do redis.call('ZADD', WATCH, now_ms, member) end
for _, mv in ipairs(moves) do
  if mv.where == 's' then
    redis.call('ZADD', mv.key, mv.score, mv.alone)
  else
    redis.call('LPUSH', mv.key, mv.alone)
  end
  redis.call('LREM', mv.list, 1, mv.entry)
  if mv.pttl > 0 then
    redis.call('SET', mv.marker, mv.value, 'PX', mv.pttl)
  else
    redis.call('SET', mv.marker, mv.value)
  end
end
return #moves
