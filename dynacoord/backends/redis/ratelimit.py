"""The rate limiter store on Redis.

Item: hash ``{RATE#{ns}#{name}}`` (shard ``i``: ``{RATE#{ns}#{name}#{i}}|RATE#{i}``, a hash tag
of its own, so shards spread over a cluster) with ``tat`` (epoch microseconds, a decimal
string), and its writer slots ``...|rq`` beside it (dynacoord._writers, same tag).

An admission is one Lua script that decides on the server (no case to guess, nothing to read
first): a slot already holding the call's token means this very script ran before and its reply
was lost (redis-py re-sent it, or the call raised and the limiter sent it again), answered
"admitted" without counting again; else ``max(tat, now) + cost`` is written while it stays within
the limit, and nothing is written when refused. ``PEXPIRE`` keeps the hash the client's retry
window plus an hour past its ``tat``: a removed hash and a full bucket are the same thing.
"""

from __future__ import annotations

from typing import Any

from ..._breaker_window import WindowWrite
from ...keys import rate_key
from ...ratelimit import RateAttempt
from ._conn import COUNT_WINDOW_MS, LUA_TOKENS, RedisConn, as_int, as_str, item_key, tokens_key

__all__ = ["RedisRateLimitStore"]

#: how long past its ``tat`` a hash stays, besides the retry window (ms)
_GRACE_MS = 3_600_000

# KEYS[1] = limiter, KEYS[2] = its writer slots; ARGV: now_us, cost_us, limit_us, token, now_ms,
# keep_ms. Numbers are written with string.format('%d'): tostring would write 16 digits in
# exponent notation.
_ADMIT = (
    LUA_TOKENS
    + """
local tat = redis.call('HGET', KEYS[1], 'tat')
if seen(KEYS[2], ARGV[4]) then return {1, tat or ''} end
local now = tonumber(ARGV[1])
local base = now
if tat and tonumber(tat) > now then base = tonumber(tat) end
if base - now > tonumber(ARGV[3]) then return {0, tat} end
local new = base + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'tat', string.format('%d', new))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((new - now) / 1000) + ARGV[6]))
remember(KEYS[2], ARGV[4], ARGV[5])
return {1, string.format('%d', new)}
"""
)

_READ = "return redis.call('HGET', KEYS[1], 'tat')"


class RedisRateLimitStore:
    def __init__(self, conn: RedisConn, namespace: str) -> None:
        self._conn = conn
        self._ns = namespace

    def _key(self, name: str, shard: int | None) -> str:
        key = rate_key(self._ns, name, shard)
        return item_key(key.pk) if shard is None else item_key(key.pk, key.sk)

    def read(self, name: str, shard: int | None) -> int | None:
        """One script (an HGET)."""
        raw: Any = self._conn.run(_READ, [self._key(name, shard)], [], "rate limiter read")
        text = as_str(raw)
        return int(text) if text else None

    def admit(
        self,
        name: str,
        shard: int | None,
        cost_us: int,
        limit_us: int,
        now_us: int,
        idle: bool,
        write: WindowWrite,
    ) -> RateAttempt:
        """One script (``idle`` is not needed: the script takes the max on the server)."""
        now_ms = now_us // 1000
        slot, value = write.take(now_ms, COUNT_WINDOW_MS)
        item = self._key(name, shard)
        reply = self._conn.run(
            _ADMIT,
            [item, tokens_key(item)],
            [now_us, cost_us, limit_us, f"{slot}:{value}", now_ms, COUNT_WINDOW_MS + _GRACE_MS],
            "rate limiter admit",
        )
        text = as_str(reply[1]) if len(reply) > 1 else None
        return RateAttempt(as_int(reply[0]) == 1, int(text) if text else None)
