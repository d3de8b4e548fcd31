"""The counter / flag / join store on Redis.

Item: hash ``{COUNTER#{ns}#{key}}`` (the pk in a hash tag; its recent request tokens in
``{COUNTER#{ns}#{key}}|rq``, same slot) with ``kind`` (counter | flag | join) and

* counter: ``n``
* flag: ``value`` (codec text)
* join: ``n`` (distinct members), ``expected``, and one field ``m:{member}`` per member (so the
  "already counted?" check and the add are one atomic script on one key)

plus ``expires_at_ms`` when it expires (``PEXPIRE`` removes it a grace period later). Every
script treats an item with ``expires_at_ms <= now`` as absent, exactly like the DynamoDB store's
conditions. Counters are ``HINCRBY`` (signed 64-bit).
"""

from __future__ import annotations

from typing import Any

from ... import codec
from ...counters import COUNTER, JOIN, CounterItem, WriteOutcome, value_fields
from ...keys import counter_key
from ._conn import (
    LUA_REPLY,
    LUA_TOKENS,
    RedisConn,
    as_int,
    counting_token,
    hash_fields,
    item_key,
    pairs,
    request_token,
    tokens_key,
)

__all__ = ["RedisCounterStore"]

# Common head. state(): 'absent' | 'expired' | 'live'. reply(flag): {flag, field, value, ...}.
_HEAD = (
    LUA_REPLY
    + """
local now = tonumber(ARGV[1])
local function state()
  if redis.call('EXISTS', KEYS[1]) == 0 then return 'absent' end
  local exp = redis.call('HGET', KEYS[1], 'expires_at_ms')
  if exp and tonumber(exp) <= now then return 'expired' end
  return 'live'
end
local function set_expiry(exp, gc, only_if_none)
  if exp == '' then return end
  if only_if_none and redis.call('HEXISTS', KEYS[1], 'expires_at_ms') == 1 then return end
  redis.call('HSET', KEYS[1], 'expires_at_ms', exp)
  redis.call('PEXPIRE', KEYS[1], gc)
end
local s = state()
"""
)

# KEYS[2] = recent request tokens; ARGV: now, by, expires|'', gc, request token
_ADD = (
    _HEAD
    + LUA_TOKENS
    + """
if seen(KEYS[2], ARGV[5]) then return reply(1) end  -- a retry of this very add: counted once
-- an expired counter is written again by another request that keeps no slot: the stale slots of
-- its earlier life go now, or a key restarted by one-shot writers would keep them
if s == 'expired' then prune(KEYS[2], ARGV[1]) return {0} end
if s == 'live' and redis.call('HGET', KEYS[1], 'kind') ~= 'counter' then return reply(0) end
-- HINCRBY first: a sum outside int64 is refused before anything is written
local added = redis.pcall('HINCRBY', KEYS[1], 'n', ARGV[2])
if type(added) == 'table' and added.err then return {3} end
redis.call('HSET', KEYS[1], 'kind', 'counter')
set_expiry(ARGV[3], ARGV[4], true)
remember(KEYS[2], ARGV[5], ARGV[1])
return reply(1)
"""
)

# ARGV: now, field..., (pairs start at ARGV[4], the first pair is 'req', the request token);
# ARGV[2]=expires|'', ARGV[3]=gc. A live item this very request wrote (a retry after a lost
# reply) is a success.
_REPLACE = (
    _HEAD
    + """
if s == 'live' then
  if redis.call('HGET', KEYS[1], 'req') == ARGV[5] then return reply(1) end
  return reply(0)
end
redis.call('DEL', KEYS[1])
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
set_expiry(ARGV[2], ARGV[3], false)
return reply(1)
"""
)

# ARGV: now
_DELETE = (
    _HEAD
    + """
redis.call('DEL', KEYS[1])
if s == 'live' then return 1 end
return 0
"""
)

# ARGV: now, expires, gc
_EXTEND = (
    _HEAD
    + """
if s ~= 'live' then return 0 end
set_expiry(ARGV[2], ARGV[3], false)
return 1
"""
)

# ARGV: now, member field, expected, expires|'', gc
_JOIN_ADD = (
    _HEAD
    + """
-- the join's state without its members (a reply of constant size whatever the member count):
-- only this arrival's own member field, which tells a redelivery it arrived before
local function join_reply(flag)
  local out = {flag}
  for _, f in ipairs({'kind', 'n', 'expected', 'last', 'expires_at_ms', ARGV[2]}) do
    local v = redis.call('HGET', KEYS[1], f)
    if v then table.insert(out, f); table.insert(out, v) end
  end
  return out
end
if s == 'expired' then return {0} end
if s == 'live' then
  if redis.call('HGET', KEYS[1], 'kind') ~= 'join' then return reply(0) end
  if redis.call('HGET', KEYS[1], 'expected') ~= ARGV[3]
     or redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then
    return join_reply(0)
  end
end
-- 'last' names the member that completed the join: arrivals beyond expected leave it alone
if tonumber(redis.call('HGET', KEYS[1], 'n') or '0') < tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'last', string.sub(ARGV[2], 3))
end
redis.call('HSET', KEYS[1], 'kind', 'join', 'expected', ARGV[3], ARGV[2], '1')
redis.call('HINCRBY', KEYS[1], 'n', 1)
set_expiry(ARGV[4], ARGV[5], true)
return join_reply(1)
"""
)


def _read(fields: dict[str, str], now_ms: int) -> CounterItem | None:
    # A join's members are hash fields "m:{member}", not one field.
    members = [f[2:] for f in fields if f.startswith("m:")]
    return CounterItem.from_item(fields, now_ms, members=members)


class RedisCounterStore:
    def __init__(self, conn: RedisConn, namespace: str) -> None:
        self._conn = conn
        self._ns = namespace

    def _key(self, key: str) -> str:
        return item_key(counter_key(self._ns, key).pk)

    def _expiry(self, ttl_ms: int | None, now_ms: int) -> list[Any]:
        if ttl_ms is None:
            return ["", ""]
        return [now_ms + ttl_ms, self._conn.gc_ms(now_ms + ttl_ms, now_ms)]

    def _outcome(self, reply: list[Any], now_ms: int) -> WriteOutcome:
        item = _read(pairs(list(reply[1:])), now_ms)
        if as_int(reply[0]) == 1:
            return WriteOutcome(True, item=item)
        return WriteOutcome(False, current=item)

    def _replace(
        self, key: str, fields: dict[str, Any], ttl_ms: int | None, now_ms: int, what: str
    ) -> WriteOutcome:
        args: list[Any] = [now_ms, *self._expiry(ttl_ms, now_ms), "req", request_token()]
        for name, value in fields.items():
            args.extend([name, value])
        return self._outcome(self._conn.run(_REPLACE, [self._key(key)], args, what), now_ms)

    def add(self, key: str, by: int, ttl_ms: int | None, now_ms: int) -> WriteOutcome:
        if (
            not codec.INT64_MIN <= by <= codec.INT64_MAX
        ):  # a Redis counter is a signed 64-bit integer
            return WriteOutcome(False, out_of_range=codec.INT64_MAX)
        reply = self._conn.run(
            _ADD,
            [self._key(key), tokens_key(self._key(key))],
            [now_ms, by, *self._expiry(ttl_ms, now_ms), counting_token(now_ms)],
            "counter add",
        )
        if as_int(reply[0]) == 3:
            return WriteOutcome(False, out_of_range=codec.INT64_MAX)
        return self._outcome(reply, now_ms)

    def restart(self, key: str, by: int, ttl_ms: int | None, now_ms: int) -> WriteOutcome:
        return self._replace(key, {"kind": COUNTER, "n": by}, ttl_ms, now_ms, "counter restart")

    def put_if_absent(
        self,
        key: str,
        kind: str,
        value: Any,
        ttl_ms: int | None,
        now_ms: int,
        token: str | None = None,
    ) -> bool:
        if token is None:
            fields = value_fields(kind, value)
            return self._replace(key, fields, ttl_ms, now_ms, "counter set_if_absent").ok
        # _replace with the caller's token (kept across its attempts when a call raised): the
        # script finding it on the live item is this caller's write, applied
        args: list[Any] = [now_ms, *self._expiry(ttl_ms, now_ms), "req", token]
        for name, field in value_fields(kind, value).items():
            args.extend([name, field])
        reply = self._conn.run(_REPLACE, [self._key(key)], args, "counter set_if_absent")
        return self._outcome(reply, now_ms).ok

    def get(self, key: str, now_ms: int) -> CounterItem | None:
        raw = self._conn.call("counter get", "hgetall", self._key(key))
        return _read(hash_fields(raw), now_ms)

    def delete(self, key: str, now_ms: int) -> bool:
        return as_int(self._conn.run(_DELETE, [self._key(key)], [now_ms], "counter delete")) == 1

    def extend(self, key: str, ttl_ms: int, now_ms: int) -> bool:
        expires = now_ms + ttl_ms
        ok = self._conn.run(
            _EXTEND,
            [self._key(key)],
            [now_ms, expires, self._conn.gc_ms(expires, now_ms)],
            "counter extend",
        )
        return as_int(ok) == 1

    def join_add(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        reply = self._conn.run(
            _JOIN_ADD,
            [self._key(key)],
            [now_ms, f"m:{member}", expected, *self._expiry(ttl_ms, now_ms)],
            "join arrive",
        )
        return self._outcome(reply, now_ms)

    def join_restart(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        fields = {"kind": JOIN, "expected": expected, "n": 1, f"m:{member}": "1", "last": member}
        return self._replace(key, fields, ttl_ms, now_ms, "join restart")
