"""The cache store on Redis.

Item: hash ``{CACHE#{ns}#{shard}}|CACHE#{ns}#{key}`` (filed under its shard's hash tag, the
DynamoDB gsi1pk of the key, ``shard`` = a stable hash of the key modulo ``SHARDS``) with the value in ``n`` (a plain integer in Redis's signed 64-bit
range, so that ``incr`` is one atomic ``HINCRBY``) or ``v`` (codec text of everything else), and
``expires_at_ms`` when it expires (``PEXPIRE`` removes it a grace period later).
Index: one sorted set per shard, ``{CACHE#{ns}#{shard}}|idx``, of the keys, all with score 0, in
the slot of the shard's items: ``keys(pattern)`` reads, shard by shard (one script per shard and
page), the lexicographic range of the pattern's literal prefix (``ZRANGEBYLEX``). Listing
never uses ``KEYS``, and never ``SCAN`` over the whole keyspace either. A page drops the index
entries whose item Redis has already removed. Batches (``set_many``, ``delete_many``) are one
MULTI/EXEC on a single primary and one per shard on a cluster (a transaction cannot span slots).

Item size: the same limit as DynamoDB (400 KB) is enforced, so data written through one backend
always fits in the others.
"""

from __future__ import annotations

from typing import Any

from ... import codec
from ..._clock import Clock, now_ms
from ..._compat import Record
from ...cache import CacheEntry, KeyPage, is_int64_text
from ...errors import InvalidValueError
from ...keys import cache_index_pk, cache_key, cache_pk
from ._conn import (
    LUA_LIVE,
    LUA_TOKENS,
    SHARDS,
    RedisConn,
    as_int,
    as_str,
    counting_token,
    index_key,
    item_key,
    request_token,
    shard_tokens_key,
)

__all__ = ["RedisCacheStore"]

_PAGE = 1000
#: the fields an entry is read from
_READ = ["n", "v", "expires_at_ms"]

# Every script below calls live(KEYS[1], ARGV[1]): ARGV[1] is now.

# KEYS[1]=item, KEYS[2]=index; ARGV: now, member, field (n|v), value, expires|'', gc ms|'',
# request token. A live item written by this very request (a retry after a lost reply) is ours.
_ADD = (
    LUA_LIVE
    + """
if live(KEYS[1], ARGV[1]) then
  if redis.call('HGET', KEYS[1], 'req') == ARGV[7] then return 1 end
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4], 'req', ARGV[7])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'expires_at_ms', ARGV[5])
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
end
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return 1
"""
)

# KEYS[1]=item, KEYS[2]=index; ARGV: now, member
_DELETE = (
    LUA_LIVE
    + """
local was = live(KEYS[1], ARGV[1])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
if was then return 1 end
return 0
"""
)

# KEYS[1]=item; ARGV: now, expires|'', gc ms|''
_TOUCH = (
    LUA_LIVE
    + """
if not live(KEYS[1], ARGV[1]) then return 0 end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'expires_at_ms')
  redis.call('PERSIST', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'expires_at_ms', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
"""
)

# KEYS[1]=item, KEYS[2]=index; ARGV: now, by, member, create ('1' or ''), expires|'', gc ms|''.
# An absent or expired key becomes a new counter of `by` (when create is set) in the same atomic
# script. Returns {0} absent/expired and not created, {2} not an integer, {3} overflow,
# {1, value} (value read back as a string: a Lua number would round above 2^53).
_INCR = (
    LUA_LIVE
    + LUA_TOKENS
    + """
-- KEYS[3] = recent request tokens, ARGV[7] = this request's token: a retry counts once
if seen(KEYS[3], ARGV[7]) then return {1, redis.call('HGET', KEYS[1], 'n')} end
if not live(KEYS[1], ARGV[1]) then
  if ARGV[4] == '' then return {0} end
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'n', ARGV[2])
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[1], 'expires_at_ms', ARGV[5])
    redis.call('PEXPIRE', KEYS[1], ARGV[6])
  end
  redis.call('ZADD', KEYS[2], 0, ARGV[3])
  remember(KEYS[3], ARGV[7], ARGV[1])
  return {1, ARGV[2]}
end
if redis.call('HEXISTS', KEYS[1], 'n') == 0 then return {2} end
local res = redis.pcall('HINCRBY', KEYS[1], 'n', ARGV[2])
if type(res) == 'table' and res.err then return {3} end
remember(KEYS[3], ARGV[7], ARGV[1])
return {1, redis.call('HGET', KEYS[1], 'n')}
"""
)

# KEYS[1]=index; ARGV: now, min, max, count, item prefix
_KEYS_PAGE = """
local members = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[2], ARGV[3], 'LIMIT', 0, tonumber(ARGV[4]))
local out = {}
for _, m in ipairs(members) do
  local item = ARGV[5] .. m
  local state = 'gone'
  if redis.call('EXISTS', item) == 1 then
    local exp = redis.call('HGET', item, 'expires_at_ms')
    if exp and tonumber(exp) <= tonumber(ARGV[1]) then state = 'expired' else state = 'live' end
  else
    redis.call('ZREM', KEYS[1], m)
  end
  table.insert(out, m)
  table.insert(out, state)
end
return out
"""


def _field(encoded: str) -> tuple[str, str]:
    if is_int64_text(encoded):
        return "n", encoded
    return "v", encoded


class _Names(Record):
    item: str
    zset: str
    tokens: str


class RedisCacheStore:
    partitions = SHARDS
    max_batch_get = 100
    max_batch_write = 100

    def __init__(self, conn: RedisConn, namespace: str, clock: Clock) -> None:
        self._conn = conn
        self._ns = namespace
        self._clock = clock

    def _names(self, key: str) -> _Names:
        """The key names of a cache key, all under its shard's tag (the gsi1pk): one slot."""
        k = cache_key(self._ns, key, SHARDS)
        tag = str(k.gsi1pk)
        return _Names(item_key(k.pk, tag=tag), index_key(tag), shard_tokens_key(tag, k.pk))

    def _item(self, key: str) -> str:
        return self._names(key).item

    def _by_shard(self, keys: list[str]) -> list[list[int]]:
        """Positions of ``keys`` grouped as one MULTI/EXEC can take them: all together on a
        single primary, one group per shard (slot) on a cluster."""
        if not self._conn.cluster:
            return [list(range(len(keys)))]
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(self._names(key).zset, []).append(i)
        return list(groups.values())

    @staticmethod
    def _entry(n: Any, v: Any, expires: Any, now: int) -> CacheEntry | None:
        if n is None and v is None:
            return None
        fields = {"n": as_str(n), "v": as_str(v), "expires_at_ms": as_str(expires)}
        return CacheEntry.from_item({k: x for k, x in fields.items() if x is not None}, now)

    def check_entry(self, key: str, encoded: str, expires_at_ms: int | None) -> None:
        k = cache_key(self._ns, key)
        item: dict[str, Any] = {**k.as_dict(), "v": encoded}
        if expires_at_ms is not None:
            item["expires_at_ms"] = expires_at_ms
        codec.check_item_size(item, key=key)

    # -- single items ---------------------------------------------------------------------------

    def get(self, key: str, now_ms: int, *, consistent: bool = True) -> CacheEntry | None:
        # reads here are always consistent: ``consistent`` changes nothing
        n, v, expires = self._conn.call("cache get", "hmget", self._item(key), _READ)
        return self._entry(n, v, expires, now_ms)

    def _set_commands(
        self, key: str, encoded: str, expires_at_ms: int | None, now: int
    ) -> list[tuple[Any, ...]]:
        item, index, _ = self._names(key)
        field, value = _field(encoded)
        commands: list[tuple[Any, ...]] = [("delete", item), ("hset", item, field, value)]
        if expires_at_ms is not None:
            commands.append(("hset", item, "expires_at_ms", str(expires_at_ms)))
            commands.append(("pexpire", item, self._conn.gc_ms(expires_at_ms, now)))
        commands.append(("zadd", index, {key: 0}))
        return commands

    def set(self, key: str, encoded: str, expires_at_ms: int | None) -> None:
        now = now_ms(self._clock)
        commands = self._set_commands(key, encoded, expires_at_ms, now)
        # MULTI/EXEC: one atomic write
        self._conn.pipeline("cache set", commands, transaction=True)

    def add(self, key: str, encoded: str, expires_at_ms: int | None, now_ms: int) -> bool:
        field, value = _field(encoded)
        names = self._names(key)
        ok = self._conn.run(
            _ADD,
            [names.item, names.zset],
            [
                now_ms,
                key,
                field,
                value,
                "" if expires_at_ms is None else expires_at_ms,
                "" if expires_at_ms is None else self._conn.gc_ms(expires_at_ms, now_ms),
                request_token(),
            ],
            "cache add",
        )
        return as_int(ok) == 1

    def create_counter(self, key: str, value: int, expires_at_ms: int | None, now_ms: int) -> bool:
        return self.add(key, str(value), expires_at_ms, now_ms)

    def delete(self, key: str, now_ms: int) -> bool:
        names = self._names(key)
        ok = self._conn.run(_DELETE, [names.item, names.zset], [now_ms, key], "cache delete")
        return as_int(ok) == 1

    def touch(self, key: str, expires_at_ms: int | None, now_ms: int) -> bool:
        ok = self._conn.run(
            _TOUCH,
            [self._item(key)],
            [
                now_ms,
                "" if expires_at_ms is None else expires_at_ms,
                "" if expires_at_ms is None else self._conn.gc_ms(expires_at_ms, now_ms),
            ],
            "cache touch",
        )
        return as_int(ok) == 1

    def incr(self, key: str, by: int, now_ms: int, expires_if_new: int | None) -> int | None:
        # One script: add to a live counter or create the key. A `by` outside int64 cannot be a
        # Redis counter; create_counter then stores it as text, as `set` would.
        create = is_int64_text(str(by))
        names = self._names(key)
        reply = self._conn.run(
            _INCR,
            [names.item, names.zset, names.tokens],
            [
                now_ms,
                by,
                key,
                "1" if create else "",
                "" if expires_if_new is None else expires_if_new,
                "" if expires_if_new is None else self._conn.gc_ms(expires_if_new, now_ms),
                counting_token(now_ms),
            ],
            "cache incr",
        )
        outcome = as_int(reply[0])
        if outcome == 0:
            return None
        if outcome == 2:
            raise InvalidValueError(
                f"cache key {key!r} holds a value that is not an integer (in Redis's signed "
                "64-bit range): incr needs an int (set it with an int, or delete it first)"
            )
        if outcome == 3:
            raise InvalidValueError(
                f"incr of cache key {key!r} by {by} would leave Redis's signed 64-bit range"
            )
        return as_int(reply[1])

    # -- listing and batches --------------------------------------------------------------------

    def keys_page(self, partition: int, prefix: str, now_ms: int, cursor: Any) -> KeyPage:
        raw_prefix = prefix.encode("utf-8", "surrogatepass")
        # 0xFF never occurs in UTF-8, so "prefix + 0xFF" bounds every key with that prefix.
        high = b"(" + raw_prefix + b"\xff" if prefix else b"+"
        if cursor is not None:
            low = b"(" + str(cursor).encode("utf-8", "surrogatepass")
        else:
            low = b"[" + raw_prefix if prefix else b"-"
        tag = cache_index_pk(self._ns, partition)  # this shard's tag: its index and items
        item_prefix = item_key(cache_pk(self._ns, "x"), tag=tag)[:-1]
        reply = self._conn.run(
            _KEYS_PAGE,
            [index_key(tag)],
            [now_ms, low, high, _PAGE + 1, item_prefix],
            "cache keys",
        )
        pairs = [(as_str(reply[i]) or "", as_str(reply[i + 1])) for i in range(0, len(reply), 2)]
        more = len(pairs) > _PAGE
        pairs = pairs[:_PAGE]
        live = [m for m, state in pairs if state == "live"]
        expired = [m for m, state in pairs if state == "expired"]
        return KeyPage(live, expired, pairs[-1][0] if more else None)

    def get_batch(
        self, keys: list[str], now_ms: int, *, consistent: bool = True
    ) -> tuple[dict[str, CacheEntry], list[str]]:
        replies = self._conn.pipeline(
            "cache get_many", [("hmget", self._item(key), _READ) for key in keys], transaction=False
        )
        found: dict[str, CacheEntry] = {}
        for key, (n, v, expires) in zip(keys, replies, strict=True):
            entry = self._entry(n, v, expires, now_ms)
            if entry is not None:
                found[key] = entry
        return found, []

    def set_batch(
        self, entries: list[tuple[str, str, int | None]]
    ) -> list[tuple[str, str, int | None]]:
        now = now_ms(self._clock)
        for group in self._by_shard([key for key, _, _ in entries]):
            commands = [c for i in group for c in self._set_commands(*entries[i], now)]
            self._conn.pipeline("cache set_many", commands, transaction=True)
        return []

    def delete_batch(self, keys: list[str]) -> list[str]:
        if not keys:
            return []
        for group in self._by_shard(keys):
            names = [self._names(keys[i]) for i in group]
            by_index: dict[str, list[str]] = {}
            for i, n in zip(group, names, strict=True):
                by_index.setdefault(n.zset, []).append(keys[i])
            commands: list[tuple[Any, ...]] = [("delete", *[n.item for n in names])]
            commands += [("zrem", index, *members) for index, members in by_index.items()]
            self._conn.pipeline("cache delete_many", commands, transaction=True)
        return []
