"""The Lua scripts of the run's streams (`searchr1.streams`): each checks and writes in one atomic
step what a sequence of commands would leave open to another consumer (or a stale lease holder) acting in
between. Entry ids and arguments are passed as ARGV; the field names are the streams layer's."""

from __future__ import annotations

from searchr1.streams.lease import FENCE_CHECK

CLAIM_OWN = """
local out = {}
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #p > 0 then
    if ARGV[3] == '1' then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
      out[#out + 1] = ARGV[i]
    else
      local c = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i])
      local fields = false
      if c[1] then fields = c[1][2] end
      out[#out + 1] = {ARGV[i], p[1][4], fields}
    end
  end
end
return out
"""
"""Claim the entries ARGV[4..] for consumer ARGV[2] of group ARGV[1] only while they are still pending
for it (XPENDING … consumer, then XCLAIM, atomically). ARGV[3] '1': JUSTID (a heartbeat: idle time reset,
delivery count unchanged), returns the ids; '0': a re-delivery (count raised), returns {id, deliveries
before, fields or false}."""

RELEASE_OWN = """
local n = 0
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #p == 1 then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
    n = n + 1
  end
end
return n
"""
"""Release the entries ARGV[4..] still pending for consumer ARGV[2] of group ARGV[1]: each keeps its owner
and delivery count but gets idle time ARGV[3] ms (past the visibility timeout), so any consumer's next
reclaim takes it at once; one another consumer reclaimed meanwhile is left alone. Returns how many."""

BURY_IF = FENCE_CHECK + """
if #KEYS == 4 and fenced_off(KEYS[3], KEYS[4], ARGV[9], ARGV[10]) then return -1 end
local p
if ARGV[3] ~= '' then
  p = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[4], ARGV[2], ARGV[2], 1, ARGV[3])
else
  p = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[4], ARGV[2], ARGV[2], 1)
end
if #p == 0 then return 0 end
local payload = ''
local rows = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #rows > 0 then
  local f = rows[1][2]
  for j = 1, #f, 2 do if f[j] == 'm' then payload = f[j + 1] end end
end
local reason = ARGV[5]
if #payload > tonumber(ARGV[8]) then  -- bounded in bytes like every dead letter (sha1: Redis scripts' digest)
  reason = reason .. ' [payload of ' .. #payload .. ' bytes not kept, sha1 ' .. redis.sha1hex(payload) .. ']'
  payload = ''
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', 'source', KEYS[1], 'source_id', ARGV[2],
           'reason', reason, 'payload', payload, 'at', ARGV[6])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
"""Dead-letter entry ARGV[2] (reason ARGV[5]; a payload over ARGV[8] bytes is replaced by its size and
sha1) and ack it, only while it is still pending for consumer ARGV[3] ('' = any consumer) and idle at
least ARGV[4] ms: an entry claimed meanwhile by another consumer (its idle time reset) is left alone.
With a lease (KEYS[3], KEYS[4]; token and value ARGV[9], ARGV[10]) it returns -1 and writes nothing when
the lease fences off that token, as `BURY_FENCED` does."""

ACK_FENCED = FENCE_CHECK + """
if fenced_off(KEYS[2], KEYS[3], ARGV[2], ARGV[3]) then return -1 end
local n = 0
for i = 4, #ARGV, 1000 do
  n = n + redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return n
"""
"""XACK of ARGV[4..] in group ARGV[1], unless the lease (KEYS[2], KEYS[3]) fences off token ARGV[2]."""

BURY_FENCED = FENCE_CHECK + """
if fenced_off(KEYS[3], KEYS[4], ARGV[3], ARGV[4]) then return -1 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', unpack(ARGV, 6))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
"""Dead-letter entry ARGV[2] (record fields ARGV[6..]) and ack it, unless the lease (KEYS[3], KEYS[4])
fences off token ARGV[3]."""
