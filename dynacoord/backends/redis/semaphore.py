"""The semaphore store on Redis.

Item: hash ``{SEM#{ns}#{name}}`` (the pk in a hash tag) with ``fence`` (the last fence handed out)
and one field ``s:{token}`` per permit, ``"{fence} {expires_at_ms} {released 0/1} {owner}"``; a
released slot keeps ``"{fence} {release time} 1 "`` for the client's retry window (a re-sent
release recognises itself), at most ``limit`` of them.

An acquire is one Lua script, so counting the taken slots and adding one is a single atomic step
on the server: it drops every expired slot, counts the rest, and adds its own only while fewer
than ``limit`` are taken (never more than ``limit`` held, ``2 * limit`` slots in all). A slot already keyed by
the caller's token (an earlier run of this very script whose reply was lost) is answered as the
permit. Every write pushes the hash's ``PEXPIRE`` to
:data:`~dynacoord.semaphore.MAX_PERMIT_TTL` plus ``fence_grace`` past it, so the hash outlives
every permit in it; once it is gone the fence restarts from ``now_ms * 1000 + 1``.
"""

from __future__ import annotations

from typing import Any

from ...keys import semaphore_key
from ...semaphore import MAX_PERMIT_TTL, AcquireAttempt, PermitInfo, SemaphoreSlot, SemaphoreState
from ._conn import (
    COUNT_WINDOW_MS,
    RedisConn,
    as_int,
    hash_fields,
    item_key,
    pairs,
)

__all__ = ["RedisSemaphoreStore"]

# KEYS[1]=semaphore; ARGV: token, owner, limit, now, expires, fresh fence, gc ms, keep released ms,
# prune cap. The rule of dynacoord.semaphore.plan_acquire: a slot is taken while neither released
# nor expired; expired ones are dropped (all: the script sees them all), released ones past the
# window too, and more of the oldest released while the hash would hold over 2 x limit slots.
# Numbers stay strings where they are stored: Lua's tostring of a fence near 2^50 would be
# written in exponent notation.
_ACQUIRE = """
local now = tonumber(ARGV[4])
local limit = tonumber(ARGV[3])
local old_before = now - tonumber(ARGV[8])
local all = redis.call('HGETALL', KEYS[1])
local taken = 0
local released = {}
local mine = nil
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 's:' then
    local f, e, r = string.match(all[i + 1], '^(%d+) (%d+) (%d) ')
    e = tonumber(e)
    if string.sub(all[i], 3) == ARGV[1] then
      mine = {f, e, r}
    elseif r == '1' then
      if e <= old_before then
        redis.call('HDEL', KEYS[1], all[i])
      else
        released[#released + 1] = {all[i], e}
      end
    elseif e <= now then
      redis.call('HDEL', KEYS[1], all[i])
    else
      taken = taken + 1
    end
  end
end
if mine and mine[3] == '0' and mine[2] > now then
  return {1, mine[1], string.format('%d', mine[2])}
end
if taken >= limit then
  return {0, redis.call('HGETALL', KEYS[1])}
end
table.sort(released, function(a, b) return a[2] < b[2] end)
local kept = #released
local i = 1
while taken + kept + 1 > 2 * limit do
  redis.call('HDEL', KEYS[1], released[i][1])
  kept = kept - 1
  i = i + 1
end
local fence
if redis.call('HEXISTS', KEYS[1], 'fence') == 1 then
  fence = string.format('%d', redis.call('HINCRBY', KEYS[1], 'fence', 1))
else
  fence = ARGV[6]
  redis.call('HSET', KEYS[1], 'fence', fence)
end
redis.call('HSET', KEYS[1], 's:' .. ARGV[1], fence .. ' ' .. ARGV[5] .. ' 0 ' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return {1, fence, ARGV[5]}
"""

# KEYS[1]=semaphore; ARGV: token, fence, now, expires, gc ms
_EXTEND = """
local v = redis.call('HGET', KEYS[1], 's:' .. ARGV[1])
if not v then
  return 0
end
local f, e, r, o = string.match(v, '^(%d+) (%d+) (%d) (.*)$')
if f ~= ARGV[2] or r ~= '0' or tonumber(e) <= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], 's:' .. ARGV[1], f .. ' ' .. ARGV[4] .. ' 0 ' .. o)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""

# KEYS[1]=semaphore; ARGV: token, fence, now, gc ms
_RELEASE = """
local v = redis.call('HGET', KEYS[1], 's:' .. ARGV[1])
if not v then
  return 0
end
local f, e, r = string.match(v, '^(%d+) (%d+) (%d) ')
if f ~= ARGV[2] then
  return 0
end
if r == '1' then
  return 1
end
if tonumber(e) <= tonumber(ARGV[3]) then
  return 0
end
-- the owner goes (a released slot is kept small), the fence stays for a re-sent release
redis.call('HSET', KEYS[1], 's:' .. ARGV[1], f .. ' ' .. ARGV[3] .. ' 1 ')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""


def _state(fields: dict[str, str]) -> SemaphoreState:
    if not fields:
        return SemaphoreState(None, 0)
    slots = []
    for field, value in fields.items():
        if field.startswith("s:"):
            fence, expires, released, owner = value.split(" ", 3)
            slots.append(SemaphoreSlot(field[2:], owner, int(fence), int(expires), released == "1"))
    return SemaphoreState(0, as_int(fields.get("fence")), tuple(slots))


class RedisSemaphoreStore:
    #: the script counts and writes on the server: no read first
    reads_first = False

    def __init__(self, conn: RedisConn, namespace: str, *, fence_grace_s: int = 3600) -> None:
        self._conn = conn
        self._ns = namespace
        self._gc_ms = (MAX_PERMIT_TTL + fence_grace_s) * 1000

    def _key(self, name: str) -> str:
        return item_key(semaphore_key(self._ns, name).pk)

    def read(self, name: str, now_ms: int) -> SemaphoreState:
        """One HGETALL."""
        raw: Any = self._conn.call("semaphore read", "hgetall", self._key(name))
        return _state(hash_fields(raw))

    def try_acquire(
        self,
        name: str,
        token: str,
        owner: str,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        seen: SemaphoreState,
    ) -> AcquireAttempt:
        """One script (``seen`` is not needed: the script counts on the server)."""
        expires = now_ms + ttl_ms
        reply = self._conn.run(
            _ACQUIRE,
            [self._key(name)],
            [
                token,
                owner,
                limit,
                now_ms,
                expires,
                now_ms * 1000 + 1,
                self._gc_ms,
                COUNT_WINDOW_MS,
            ],
            "semaphore acquire",
        )
        if as_int(reply[0]) == 1:
            # a token is sent only with its own owner, so the slot found by it is this owner's
            fence, until = as_int(reply[1]), as_int(reply[2])
            return AcquireAttempt(PermitInfo(name, owner, fence, until, token))
        return AcquireAttempt(None, _state(pairs(reply[1])))

    def extend(self, name: str, token: str, fence: int, ttl_ms: int, now_ms: int) -> int | None:
        """One script (run again after a lost reply, it applies the same)."""
        expires = now_ms + ttl_ms
        ok = self._conn.run(
            _EXTEND,
            [self._key(name)],
            [token, fence, now_ms, expires, self._gc_ms],
            "semaphore extend",
        )
        return expires if as_int(ok) == 1 else None

    def release(self, name: str, token: str, fence: int, now_ms: int) -> bool:
        """One script; run again after a lost reply, it finds the slot released by this permit
        and answers True as the first run did."""
        ok = self._conn.run(
            _RELEASE, [self._key(name)], [token, fence, now_ms, self._gc_ms], "semaphore release"
        )
        return as_int(ok) == 1
