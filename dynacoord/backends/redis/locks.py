"""The lock store on Redis.

Item: hash ``{LOCK#{ns}#{key}}`` (the pk in a hash tag, docs/redis.md) with ``owner``, ``fence``,
``expires_at_ms``; after a release or ``force_release`` also ``released_by`` (the call's request
token: its retry after a lost reply knows it applied) and after a ``force_release``
``released_held`` (whether it freed a live lock).

As on DynamoDB, a released lock is kept (``owner`` removed, ``expires_at_ms`` set to now) rather
than deleted, so that the next acquire continues from ``fence + 1``. Once the hash is gone (its
``PEXPIRE`` fired: expiry plus ``fence_grace``), the next acquire starts from ``now_ms * 1000 + 1``,
which is above every earlier fence as long as the grace outlasts the clock skew between clients.

Every write is a Lua script, so "check the owner, then change the item" is one atomic step on the
server: a release can never delete a lock that another owner took between a read and a write.
"""

from __future__ import annotations

from typing import Any

from ...errors import FenceRejectedError, InvalidValueError
from ...keys import lock_key
from ...locks import AcquireResult, LockInfo
from ._conn import RedisConn, as_int, as_str, item_key, request_token

__all__ = ["RedisLockStore"]

# KEYS[1]=lock; ARGV: owner, now, expires, fresh fence, gc ms
_ACQUIRE = """
local cur = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'expires_at_ms')
if cur[1] and tonumber(cur[3]) > tonumber(ARGV[2]) then
  return {0, cur[1], cur[2], cur[3]}
end
if cur[2] then
  redis.call('HINCRBY', KEYS[1], 'fence', 1)
else
  redis.call('HSET', KEYS[1], 'fence', ARGV[4])
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'expires_at_ms', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, ARGV[1], redis.call('HGET', KEYS[1], 'fence'), ARGV[3]}
"""

# KEYS[1]=lock; ARGV: owner, fence, now, expires, gc ms
_EXTEND = """
local cur = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'expires_at_ms')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], 'expires_at_ms', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""

# KEYS[1]=lock; ARGV: owner, fence, now, gc ms, request token
_RELEASE = """
local cur = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'expires_at_ms', 'released_by')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= tonumber(ARGV[3]) then
  if cur[4] == ARGV[5] then
    return 1
  end
  return 0
end
redis.call('HDEL', KEYS[1], 'owner')
redis.call('HSET', KEYS[1], 'expires_at_ms', ARGV[3], 'released_by', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# KEYS[1]=lock; ARGV: now, gc ms, request token
_FORCE_RELEASE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local cur = redis.call('HMGET', KEYS[1], 'owner', 'expires_at_ms', 'released_by', 'released_held')
if cur[3] == ARGV[3] then
  return tonumber(cur[4]) or 0
end
local held = 0
if cur[1] and tonumber(cur[2]) > tonumber(ARGV[1]) then
  held = 1
end
redis.call('HDEL', KEYS[1], 'owner')
redis.call('HSET', KEYS[1], 'expires_at_ms', ARGV[1], 'released_by', ARGV[3], 'released_held', held)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return held
"""

# lease.fenced_update: KEYS[1]=the application's hash; ARGV: fence field, fence, field, value, ...
# Refused (0 and the stored fence) when the hash holds a larger fence, or one that is no number.
# An equal fence is written again: the holder's next write, or its own write re-sent after a
# lost reply.
_FENCED_UPDATE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and not (tonumber(cur) and tonumber(cur) <= tonumber(ARGV[2])) then
  return {0, cur}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], unpack(ARGV, 3))
return {1, ARGV[2]}
"""


class RedisLockStore:
    def __init__(self, conn: RedisConn, namespace: str, *, fence_grace_s: int = 3600) -> None:
        self._conn = conn
        self._ns = namespace
        self._grace_ms = fence_grace_s * 1000

    def _key(self, key: str) -> str:
        return item_key(lock_key(self._ns, key).pk)

    def try_acquire(self, key: str, owner: str, ttl_ms: int, now_ms: int) -> AcquireResult:
        expires = now_ms + ttl_ms
        reply = self._conn.run(
            _ACQUIRE,
            [self._key(key)],
            [owner, now_ms, expires, now_ms * 1000 + 1, ttl_ms + self._grace_ms],
            "lock acquire",
        )
        info = LockInfo(key, as_str(reply[1]) or "", as_int(reply[2]), as_int(reply[3]))
        if as_int(reply[0]) == 1:
            return AcquireResult(info)
        return AcquireResult(None, info)

    def extend(self, key: str, owner: str, fence: int, ttl_ms: int, now_ms: int) -> LockInfo | None:
        expires = now_ms + ttl_ms
        ok = self._conn.run(
            _EXTEND,
            [self._key(key)],
            [owner, fence, now_ms, expires, ttl_ms + self._grace_ms],
            "lock extend",
        )
        return LockInfo(key, owner, fence, expires) if as_int(ok) == 1 else None

    def release(
        self, key: str, owner: str, fence: int, now_ms: int, token: str | None = None
    ) -> bool:
        ok = self._conn.run(
            _RELEASE,
            [self._key(key)],
            # the call's token: its re-sent script (a lost reply), or the caller's retry with
            # the same token after the call raised, knows it applied
            [owner, fence, now_ms, self._grace_ms, request_token() if token is None else token],
            "lock release",
        )
        return as_int(ok) == 1

    def force_release(self, key: str, now_ms: int) -> bool:
        ok = self._conn.run(
            _FORCE_RELEASE,
            [self._key(key)],
            # the call's token: its re-sent script (a lost reply) answers as the call did and
            # frees no lock taken in between
            [now_ms, self._grace_ms, request_token()],
            "lock force_release",
        )
        return as_int(ok) == 1

    def get(self, key: str, now_ms: int) -> LockInfo | None:
        owner, fence, expires = self._conn.call(
            "lock get", "hmget", self._key(key), ["owner", "fence", "expires_at_ms"]
        )
        if owner is None or as_int(expires) <= now_ms:
            return None
        return LockInfo(key, as_str(owner) or "", as_int(fence), as_int(expires))

    def fenced_update(
        self,
        table: Any,
        key: Any,
        values: Any,
        attr: str,
        fence: int,
        *,
        lock_key: str,
        owner: str,
    ) -> None:
        """One script on the application's hash ``key``: HSET ``values`` and ``attr = fence``
        unless the hash holds a larger fence in ``attr``. One key, so it runs on a cluster too.
        Redis has no multi-key transaction across slots: this write is the fence check."""
        from ...fencing import check_values

        if table is not None:
            raise InvalidValueError(
                f"Redis has no tables: key names the hash to write, table must be None, got {table!r}"
            )
        if type(key) is not str or not key:
            raise InvalidValueError(f"key must be the name of a Redis hash (a str), got {key!r}")
        fields = check_values(values, attr)
        args: list[Any] = [attr, fence]
        for name, value in fields.items():
            if not isinstance(value, str | bytes | int | float) or isinstance(value, bool):
                raise InvalidValueError(
                    f"a Redis hash field holds str, bytes, int or float, got {name!r}: {value!r}"
                )
            args += [name, value]
        reply = self._conn.run(_FENCED_UPDATE, [key], args, "fenced update")
        if as_int(reply[0]) == 1:
            return
        stored = as_str(reply[1])
        raise FenceRejectedError(
            f"write of Redis hash {key!r} with fence {fence} (lock {lock_key!r}, owner {owner!r}) "
            f"refused: it holds {attr} = {stored!r}",
            key=lock_key,
            owner=owner,
            fence=fence,
            stored_fence=int(stored) if stored is not None and stored.isdigit() else None,
            resource=key,
        )
