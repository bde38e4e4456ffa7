-- RQ's utcformat (rq/utils.py: '%Y-%m-%dT%H:%M:%S.%fZ') of an instant given as whole seconds and
-- microseconds since the epoch (Redis's TIME): the civil date by Howard Hinnant's
-- days_from_civil inverse, exact for every date of the proleptic Gregorian calendar (Lua's
-- numbers are doubles: exact integers far beyond year 9999). Prepended to rq.lua.
local function utcformat(s, us)
  local floor = math.floor
  local days = floor(s / 86400)
  local r = s - days * 86400
  local z = days + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local d = doy - floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%06dZ', y, m, d, floor(r / 3600),
    floor(r % 3600 / 60), r % 60, us)
end
