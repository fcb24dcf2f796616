-- Candidate batch script (tried 2026-12-02, 14:50 UTC, not kept): one pcall around the
-- whole loop, resumed after a request that raised, instead of one pcall per request.

local out, m = {}, 0
local same, stamp = nil, nil
local k, a, last = 3, 2, #ARGV
local kind, n
local function count(s)
  if s == '1' then return 1 elseif s == '0' then return 0 end
  return tonumber(s)
end
local function acquire(token, ttl)
  if n == 1 then
    if not redis.call('SET', KEYS[k], token, 'NX', 'PX', ttl) then
      if redis.call('GET', KEYS[k]) ~= token then return false end
      redis.call('PEXPIRE', KEYS[k], ttl)
    end
    return true
  end
  for i = k, k + n - 1 do
    local v = redis.call('GET', KEYS[i])
    if v and v ~= token then return false end
  end
  for i = k, k + n - 1 do
    redis.call('SET', KEYS[i], token, 'PX', ttl)
  end
  return true
end
-- Runs the requests from the current one to the last. A request that raises an error leaves
-- k, a and kind at that request, so the caller can answer the error and go on after it.
local function run()
  while a <= last do
    kind, n = ARGV[a], nil
    n = count(ARGV[a + 1])
    local token = ARGV[a + 2]
    if kind == 'R' then
      local c = count(ARGV[a + 3])
      local done, heard = 0, c > 0 and 0 or -1
      for i = 0, n - 1 do
        if redis.call('GET', KEYS[k + i]) == token then
          redis.call('DEL', KEYS[k + i])
          done = done + 1
          if i < c then
            local r = redis.pcall('PUBLISH', ARGV[a + 5 + i], ARGV[a + 4])
            if type(r) == 'number' and heard >= 0 then heard = heard + r else heard = -1 end
          end
        end
      end
      -- Written only now, once every key was handled: a release that fails part-way answers
      -- one error entry and no partial pair.
      out[m + 1], out[m + 2] = done, heard
      m = m + 2
      k = k + n
      a = a + 5 + c
    else
      local r
      if kind == 'A' or kind == 'U' then
        if same == nil then same = redis.call('GET', KEYS[1]) == ARGV[1] end
        if not same then
          r = -2
        elseif not acquire(token, ARGV[a + 3]) then
          r = 0
        elseif kind == 'U' then
          r = 1
        elseif stamp then
          stamp = stamp + 1
          r = stamp
        else
          local t = redis.call('TIME')
          local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
          local prev = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
          stamp = math.max(now, prev + 1)
          r = stamp
        end
      elseif kind == 'S' then
        r = redis.call('SET', KEYS[k], token, 'NX', 'PX', ARGV[a + 3]) and 1 or 0
      elseif kind == 'E' then
        r = 1
        for i = k, k + n - 1 do
          if redis.call('GET', KEYS[i]) ~= token then r = 0 break end
        end
        if r == 1 then
          for i = k, k + n - 1 do
            redis.call('PEXPIRE', KEYS[i], ARGV[a + 3])
          end
        end
      else
        r = 'Eunknown request kind'
      end
      m = m + 1
      out[m] = r
      k = k + n
      a = a + 4
    end
  end
end
while true do
  local ok, e = pcall(run)
  if ok then break end
  if type(e) == 'table' and e.err then e = 'E' .. e.err else e = 'E' .. tostring(e) end
  m = m + 1
  out[m] = e
  k = k + n
  if kind == 'R' then a = a + 5 + count(ARGV[a + 3]) else a = a + 4 end
end
if stamp then redis.call('SET', KEYS[2], string.format('%.0f', stamp)) end
return out
