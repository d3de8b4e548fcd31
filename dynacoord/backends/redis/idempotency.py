"""The idempotency store on Redis.

Item: hash ``{IDEMP#{ns}#{key}}`` (the pk in a hash tag) with ``status``, ``expires_at_ms``,
``token`` (in progress), ``payload_hash`` (optional), ``result`` (completed), ``created_ms``,
``completed_ms``, ``completed_by`` (the completing call's request token, which its retry after a
lost reply recognises).

Claim, complete and release are Lua scripts: the check (free? our token?) and the write are one
atomic step, so two racing claims cannot both win and a call that lost its lease cannot overwrite
or delete the record of the call that took the key over.
"""

from __future__ import annotations

from typing import Any

from ...idempotency import Claim, ClaimResult, IdempotencyRecord
from ...keys import idempotency_key
from ._conn import RedisConn, as_int, as_str, item_key, request_token

__all__ = ["RedisIdempotencyStore"]

_FIELDS = ["status", "expires_at_ms", "payload_hash", "result", "token"]

# KEYS[1]=record; ARGV: token, payload hash|'', now, expires, gc ms
_CLAIM = """
local cur = redis.call('HMGET', KEYS[1], 'status', 'expires_at_ms', 'payload_hash', 'result', 'token')
if cur[1] and tonumber(cur[2]) > tonumber(ARGV[3]) then
  return {0, cur[1], cur[2], cur[3], cur[4], cur[5]}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'status', 'IN_PROGRESS', 'token', ARGV[1], 'expires_at_ms', ARGV[4],
           'created_ms', ARGV[3])
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'payload_hash', ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1}
"""

# KEYS[1]=record; ARGV: token, result, now, expires, gc ms, request token
_COMPLETE = """
local cur = redis.call('HMGET', KEYS[1], 'status', 'token', 'completed_by')
if cur[1] ~= 'IN_PROGRESS' or cur[2] ~= ARGV[1] then
  if cur[1] == 'COMPLETED' and cur[3] == ARGV[6] then
    return 1
  end
  return 0
end
redis.call('HSET', KEYS[1], 'status', 'COMPLETED', 'result', ARGV[2], 'expires_at_ms', ARGV[4],
           'completed_ms', ARGV[3], 'completed_by', ARGV[6])
redis.call('HDEL', KEYS[1], 'token')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""

# KEYS[1]=record; ARGV: token
_RELEASE = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
"""


def _record(key: str, values: list[Any]) -> IdempotencyRecord | None:
    fields = {name: as_str(v) for name, v in zip(_FIELDS, values, strict=True)}
    return IdempotencyRecord.from_item(key, {k: v for k, v in fields.items() if v is not None})


class RedisIdempotencyStore:
    def __init__(self, conn: RedisConn, namespace: str) -> None:
        self._conn = conn
        self._ns = namespace

    def _key(self, key: str) -> str:
        return item_key(idempotency_key(self._ns, key).pk)

    def claim(
        self, key: str, token: str, payload_hash: str | None, lease_ms: int, now_ms: int
    ) -> ClaimResult:
        expires = now_ms + lease_ms
        reply = self._conn.run(
            _CLAIM,
            [self._key(key)],
            [token, payload_hash or "", now_ms, expires, self._conn.gc_ms(expires, now_ms)],
            "idempotency claim",
        )
        if as_int(reply[0]) == 1:
            return ClaimResult(Claim(key, token, expires, payload_hash))
        return ClaimResult(None, _record(key, list(reply[1:6])))

    def complete(self, key: str, token: str, result_text: str, ttl_ms: int, now_ms: int) -> bool:
        expires = now_ms + ttl_ms
        ok = self._conn.run(
            _COMPLETE,
            [self._key(key)],
            # the call's request token: its re-sent script (a lost reply) knows it applied
            [
                token,
                result_text,
                now_ms,
                expires,
                self._conn.gc_ms(expires, now_ms),
                request_token(),
            ],
            "idempotency complete",
        )
        return as_int(ok) == 1

    def release(self, key: str, token: str) -> bool:
        ok = self._conn.run(_RELEASE, [self._key(key)], [token], "idempotency release")
        return as_int(ok) == 1

    def get(self, key: str) -> IdempotencyRecord | None:
        values = self._conn.call("idempotency get", "hmget", self._key(key), _FIELDS)
        return _record(key, list(values))

    def delete(self, key: str) -> bool:
        return bool(self._conn.call("idempotency delete", "delete", self._key(key)))
