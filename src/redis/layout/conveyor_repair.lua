-- jobrelay, conveyor layout: set free the children and heirs stranded by a close that raced
-- their push (docs/layouts.md#conveyor).
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
-- ARGV[1]  key namespace (raw prefix)
-- ARGV[2]  grace in milliseconds
-- ARGV[3]  most watched jobs to look at in this call
-- ARGV[4]  the dedup marker TTL in milliseconds ("0": none): a job watched for longer (a record
--          conveyor leaked, say) is no longer looked at; the markers this script needs are gone
-- Returns the number of jobs set free.
local ns = ARGV[1]
local grace = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local WATCH = ns .. 'jobrelay:watch'
local MARKER_INFIX = 'jobrelay:job:'
local NO_ANCHOR = string.rep('-', 36)

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Whether `key` is free for, or already holds, a value of type `want`.
local function fits(key, want)
  local have = redis.call('TYPE', key).ok
  return have == 'none' or have == want
end

local freed = 0
local due = redis.call('ZRANGEBYSCORE', WATCH, '-inf', now_ms - grace, 'LIMIT', 0, limit)
for _, member in ipairs(due) do
  local colon = string.find(member, ':', 1, true)
  local since, anchor = tonumber(string.sub(member, 1, colon - 1)), string.sub(member, colon + 1)
  if redis.call('EXISTS', ns .. 'job:' .. anchor) == 1 then
    if ttl > 0 and now_ms - since > ttl then
      redis.call('ZREM', WATCH, member)
    else
      -- Still running, or waiting for its children: look again later.
      redis.call('ZADD', WATCH, now_ms, member)
    end
  else
    redis.call('ZREM', WATCH, member)
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
              local where
              if exact and exact ~= '' and tonumber(exact) > now then
                if fits(ns .. 'scheduled', 'zset') then
                  redis.call('ZADD', ns .. 'scheduled', whole, alone)
                  where = 's'
                end
              elseif fits(qkey, 'list') then
                redis.call('LPUSH', qkey, alone)
                where = 'q'
              end
              if where then
                redis.call('LREM', list, 1, entry)
                local ttl = redis.call('PTTL', marker)
                local value = where .. NO_ANCHOR .. #qkey .. ':' .. qkey .. #route .. ':' .. route
                  .. #alone .. ':' .. alone
                if ttl > 0 then
                  redis.call('SET', marker, value, 'PX', ttl)
                else
                  redis.call('SET', marker, value)
                end
                freed = freed + 1
              end
            end
          end
        end
      end
    end
  end
end
return freed
