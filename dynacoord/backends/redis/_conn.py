"""Helpers shared by the Redis stores: the connection wrapper and the one error translation point.

Key layout (DESIGN.md section 2): an item is a Redis hash named after its ``pk`` (single-item
kinds) or ``{pk}|{sk}`` (checkpoints); what DynamoDB does with ``gsi1`` is done with sorted sets
named ``idx|{gsi1pk}`` (and ``idx|{pk}`` for a task's checkpoints by sequence). The ``idx|``
prefix matters: item names start with a kind (``CACHE#``...) and contain user keys, so an index
named by the bare ``gsi1pk`` (``CACHE#{ns}#0``) would collide with the item of cache key ``"0"``;
nothing that starts with ``idx|`` can be an item. Every field value is a string; numbers are
written as decimal strings computed in Python (never by Lua ``tostring``, which rounds above 14
digits).

Expiry: the truth is the ``expires_at_ms`` field compared with the caller's ``now_ms``, exactly
as on DynamoDB. ``PEXPIRE`` is only garbage collection: it is set *relative* (remaining lifetime
plus a grace period), so it works with any injected clock and never removes an item before the
caller's clock says it expired.

Compare-and-set operations are Lua scripts (run atomically by the server), never a read followed
by a separate write.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ...errors import BackendError

__all__ = [
    "LUA_LIVE",
    "LUA_REPLY",
    "LUA_TOKENS",
    "RedisConn",
    "as_int",
    "as_str",
    "hash_fields",
    "index_key",
    "item_key",
    "pairs",
    "request_token",
    "tokens_key",
    "translate_errors",
]

logger = logging.getLogger("dynacoord.backends.redis")


#: Counting scripts keep the request tokens of recent writes in a sorted set beside the item
#: (``{item}|rq``, scored by the caller's now) for this long: a retried script whose token is
#: there knows its first run applied and does not count again.
COUNT_WINDOW_MS = 60_000

#: Lua ``seen(rq, token)`` and ``remember(rq, token, now)`` for counting scripts.
LUA_TOKENS = f"""
local function seen(rq, token)
  return redis.call('ZSCORE', rq, token) ~= false
end
local function remember(rq, token, now)
  redis.call('ZADD', rq, now, token)
  redis.call('ZREMRANGEBYSCORE', rq, '-inf', tonumber(now) - {COUNT_WINDOW_MS})
  redis.call('PEXPIRE', rq, {2 * COUNT_WINDOW_MS})
end
"""


def tokens_key(item: str) -> str:
    """The sorted set of recent request tokens of the counting item ``item``."""
    return f"{item}|rq"


def request_token() -> str:
    """A fresh per-call request token (64 random bits), stored in the ``req`` field of the item
    a script creates: a retried script that finds it knows its first run applied."""
    return secrets.token_hex(8)


#: Lua ``live(key, now)``: the hash exists and has no ``expires_at_ms`` or one after ``now``.
LUA_LIVE = """
local function live(key, now)
  if redis.call('EXISTS', key) == 0 then return false end
  local exp = redis.call('HGET', key, 'expires_at_ms')
  return (not exp) or tonumber(exp) > tonumber(now)
end
"""

#: Lua ``reply(flag)``: ``{flag, field, value, ...}`` with every field of the hash ``KEYS[1]``
#: (read back with :func:`pairs`). Scripts start with it.
LUA_REPLY = """
local function reply(flag)
  local out = {flag}
  for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do table.insert(out, v) end
  return out
end
"""


def as_str(value: Any) -> str | None:
    """A reply value as str (clients may or may not use ``decode_responses``)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogatepass")
    return str(value)


def as_int(value: Any, default: int = 0) -> int:
    """A reply value (bytes, str, int or None) as int."""
    if value is None:
        return default
    if isinstance(value, bytes):
        return int(value.decode("ascii"))
    return int(value)


def pairs(flat: Sequence[Any]) -> dict[str, str]:
    """A flat ``[field, value, field, value, ...]`` reply (``HGETALL`` in a script) as a dict."""
    return {as_str(flat[i]) or "": as_str(flat[i + 1]) or "" for i in range(0, len(flat) - 1, 2)}


def hash_fields(raw: Mapping[Any, Any]) -> dict[str, str]:
    """An ``HGETALL`` reply of the client (bytes or str keys and values) as a dict of str."""
    return {as_str(k) or "": as_str(v) or "" for k, v in raw.items()}


def item_key(pk: str, sk: str | None = None) -> str:
    """The Redis key of an item: ``pk`` or ``pk|sk``."""
    return pk if sk is None else f"{pk}|{sk}"


def index_key(name: str) -> str:
    """The Redis key of the sorted set that plays the part of a gsi1 partition ``name``."""
    return f"idx|{name}"


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Turn redis-py errors into :class:`BackendError` (chained) in one place."""
    import redis

    try:
        yield
    except redis.RedisError as exc:
        raise BackendError(
            f"Redis {type(exc).__name__} during {what}: {exc}", code=type(exc).__name__
        ) from exc


class RedisConn:
    """The client all Redis stores share, with the scripts they registered."""

    def __init__(self, client: Any, *, gc_grace_ms: int = 60_000) -> None:
        self.client = client
        self.gc_grace_ms = gc_grace_ms
        self._scripts: dict[str, Any] = {}

    def script(self, source: str) -> Any:
        """A registered Lua script (EVALSHA, falling back to EVAL once per server)."""
        found = self._scripts.get(source)
        if found is None:
            found = self.client.register_script(source)
            self._scripts[source] = found
        return found

    def run(self, source: str, keys: list[str], args: list[Any], what: str) -> Any:
        """Run a Lua script: one round trip, atomic on the server."""
        with translate_errors(what):
            return self.script(source)(keys=keys, args=[_arg(a) for a in args])

    def gc_ms(self, expires_at_ms: int, now_ms: int, grace_ms: int | None = None) -> int:
        """Relative PEXPIRE for an item that logically expires at ``expires_at_ms``."""
        grace = self.gc_grace_ms if grace_ms is None else grace_ms
        return max(0, expires_at_ms - now_ms) + grace


def _arg(value: Any) -> Any:
    # Numbers go over the wire as exact decimal strings (Lua would round big doubles).
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return value
