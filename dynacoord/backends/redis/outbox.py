"""The outbox store on Redis.

Item: hash ``{OUTBOX#{ns}#0}|OUTBOX#{ns}#{event_id}`` with the DynamoDB item's attributes
(``event_id``, ``event_type``, ``payload``/``metadata`` codec text, ``event_group``,
``occurred_at_ms``, ``status``, ``attempts``, ``due_ms``, ``lease_token`` while claimed,
``last_error``, ``updated_ms``, ``gsi1sk``; completed events get ``completed_ms`` and
``expires_at_ms``).
Index: one sorted set per status, ``{OUTBOX#{ns}#0}|idx|OUTBOX#{ns}#{status}#0``, holding the
DynamoDB ``gsi1sk`` strings (``{due_ms:015d}#{event_id}``) with score 0, so "due pending events" and "in-flight events
whose lease ran out" are one ``ZRANGEBYLEX`` below ``now + 1``, exactly the gsi1 range query.
One index partition per status is enough on Redis (no hot partitions), so ``shards`` is 1, and
every key of a namespace's outbox carries the one hash tag ``{OUTBOX#{ns}#0}``: on a cluster the
outbox of a namespace lives in one slot. That is deliberate: a multi-event publish is one atomic
script (all events or none), which Redis can only run on keys of one slot, and every state change
moves an event between status indexes that must be in the event's slot. Outboxes of different
namespaces spread over the cluster.

Every script moves the event's index entry together with its status in the same atomic step;
every state change after the claim first checks ``status == in_flight`` and the caller's lease
token, so a worker whose lease was taken over cannot change the event. A multi-event publish is
one script: it checks every id first and writes all events or none.

``backend.transaction()`` is not offered on Redis (the collector speaks DynamoDB's transaction
API); publish events with ``outbox.publish``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ... import codec
from ...errors import NotSupportedError
from ...keys import Kind, outbox_index_pk, outbox_index_sk, outbox_key, time_sk_bound
from ...outbox import Event, EventRecord, EventStatus, RetryOutcome, pending_fields
from ._conn import (
    LUA_LIVE,
    LUA_REPLY,
    RedisConn,
    as_int,
    as_str,
    hash_fields,
    index_key,
    item_key,
    pairs,
    shard_tag,
    translate_errors,
)

__all__ = ["RedisOutboxStore"]

# ARGV[1] = now, ARGV[2] = index prefix "idx|OUTBOX#{ns}#", ARGV[3] = index suffix "#0"
_HEAD = (
    LUA_REPLY
    + LUA_LIVE
    + """
local now = tonumber(ARGV[1])
local function idx(status) return ARGV[2] .. status .. ARGV[3] end
local function unindex(key)
  local st = redis.call('HGET', key, 'status')
  local gsk = redis.call('HGET', key, 'gsi1sk')
  if st and gsk then redis.call('ZREM', idx(st), gsk) end
end
local function move(status, gsk)
  unindex(KEYS[1])
  redis.call('HSET', KEYS[1], 'status', status, 'gsi1sk', gsk)
  redis.call('ZADD', idx(status), 0, gsk)
end
local function held(token)
  return redis.call('HGET', KEYS[1], 'status') == 'in_flight'
     and redis.call('HGET', KEYS[1], 'lease_token') == token
end
"""
)

# KEYS = items; ARGV[4] = JSON list of {gsk, fields: [name, value, ...]} in KEYS order
_PUBLISH = (
    _HEAD
    + """
local events = cjson.decode(ARGV[4])
local clashes = {0}
for i, key in ipairs(KEYS) do
  if live(key, now) then
    table.insert(clashes, i)
    table.insert(clashes, redis.call('HGETALL', key))
  end
end
if #clashes > 1 then return clashes end
for i, key in ipairs(KEYS) do
  unindex(key)
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(events[i].fields))
  redis.call('ZADD', idx('pending'), 0, events[i].gsk)
end
return {1}
"""
)

# KEYS[1]=item; ARGV: ..., expected status, seen token|'', token, lease until, new gsk
_CLAIM = (
    _HEAD
    + """
if not live(KEYS[1], now) or redis.call('HGET', KEYS[1], 'status') ~= ARGV[4] then return {0} end
if tonumber(redis.call('HGET', KEYS[1], 'due_ms') or '0') > now then return {0} end
local current = redis.call('HGET', KEYS[1], 'lease_token')
if (ARGV[5] == '' and current) or (ARGV[5] ~= '' and current ~= ARGV[5]) then return {0} end
move('in_flight', ARGV[8])
redis.call('HSET', KEYS[1], 'lease_token', ARGV[6], 'due_ms', ARGV[7], 'updated_ms', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
return reply(1)
"""
)

# KEYS[1]=item; ARGV: ..., token, lease until, new gsk
_EXTEND = (
    _HEAD
    + """
if not held(ARGV[4]) then return 0 end
move('in_flight', ARGV[6])
redis.call('HSET', KEYS[1], 'due_ms', ARGV[5], 'updated_ms', ARGV[1])
return 1
"""
)

# KEYS[1]=item; ARGV: ..., token, expires|'' (''=delete), gc ms
_COMPLETE = (
    _HEAD
    + """
if not held(ARGV[4]) then return 0 end
unindex(KEYS[1])
if ARGV[5] == '' then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('HSET', KEYS[1], 'status', 'completed', 'completed_ms', ARGV[1], 'updated_ms', ARGV[1],
           'expires_at_ms', ARGV[5])
redis.call('HDEL', KEYS[1], 'gsi1sk', 'lease_token', 'due_ms')
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
"""
)

# KEYS[1]=item; ARGV: ..., token, due, new gsk, error|'', count attempt 0/1
_RESCHEDULE = (
    _HEAD
    + """
if not held(ARGV[4]) then return 0 end
move('pending', ARGV[6])
redis.call('HSET', KEYS[1], 'due_ms', ARGV[5], 'updated_ms', ARGV[1])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'last_error', ARGV[7]) end
if ARGV[8] == '0' then redis.call('HINCRBY', KEYS[1], 'attempts', -1) end
redis.call('HDEL', KEYS[1], 'lease_token')
return 1
"""
)

# KEYS[1]=item; ARGV: ..., token, error, new gsk
_FAIL = (
    _HEAD
    + """
if not held(ARGV[4]) then return 0 end
move('failed', ARGV[6])
redis.call('HSET', KEYS[1], 'due_ms', ARGV[1], 'updated_ms', ARGV[1], 'failed_ms', ARGV[1],
           'last_error', ARGV[5])
redis.call('HDEL', KEYS[1], 'lease_token')
return 1
"""
)

# KEYS[1]=item; ARGV: ..., new gsk. Replies 'retried' | 'not_found' | 'not_failed'.
_RETRY_FAILED = (
    _HEAD
    + """
if not live(KEYS[1], now) then return 'not_found' end
if redis.call('HGET', KEYS[1], 'status') ~= 'failed' then return 'not_failed' end
move('pending', ARGV[4])
redis.call('HSET', KEYS[1], 'attempts', 0, 'due_ms', ARGV[1], 'updated_ms', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'manual_retries', 1)
return 'retried'
"""
)

# KEYS[1]=index; ARGV: min, max, count, item prefix "OUTBOX#{ns}#"
_QUERY = """
local members = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, m in ipairs(members) do
  local fields = redis.call('HGETALL', ARGV[4] .. string.sub(m, 17))
  if #fields == 0 then redis.call('ZREM', KEYS[1], m) end
  table.insert(out, m)
  table.insert(out, fields)
end
return out
"""


class RedisOutboxStore:
    def __init__(self, conn: RedisConn, namespace: str) -> None:
        self._conn = conn
        self._ns = namespace
        self._tag = shard_tag(Kind.OUTBOX, namespace, 0)  # the one slot of this outbox
        # "{OUTBOX#ns#0}|idx|OUTBOX#ns#" + status + "#0" is the index of that status
        self._prefix = index_key(outbox_index_pk(namespace, "", 0), tag=self._tag)[: -len("#0")]
        self._item_prefix = self._item("x")[:-1]

    @property
    def shards(self) -> int:
        return 1

    def _item(self, event_id: str) -> str:
        return item_key(outbox_key(self._ns, event_id, status="", due_ms=0).pk, tag=self._tag)

    def _head(self, now_ms: int) -> list[Any]:
        return [now_ms, self._prefix, "#0"]

    def _fields(self, event: Event, due_ms: int) -> dict[str, str]:
        k = outbox_key(self._ns, event.id, status=EventStatus.PENDING.value, due_ms=due_ms)
        fields = {name: str(value) for name, value in pending_fields(event, due_ms).items()}
        fields["gsi1sk"] = outbox_index_sk(due_ms, event.id)
        # Same size limit as the DynamoDB item, so an event fits every backend.
        codec.check_item_size({**k.as_dict(), **fields}, key=event.id)
        return fields

    # -- publishing ------------------------------------------------------------------------------

    def publish(self, events: Sequence[Event], now_ms: int) -> dict[str, EventRecord | None]:
        payload = []
        for event in events:
            due = min(event.occurred_at_ms, now_ms)
            fields = self._fields(event, due)
            flat = [part for pair in fields.items() for part in pair]
            payload.append({"gsk": fields["gsi1sk"], "fields": flat})
        reply = self._conn.run(
            _PUBLISH,
            [self._item(e.id) for e in events],
            [*self._head(now_ms), json.dumps(payload, ensure_ascii=False)],
            "outbox publish",
        )
        if as_int(reply[0]) == 1:
            return {}
        clashes: dict[str, EventRecord | None] = {}
        for i in range(1, len(reply), 2):
            event = events[as_int(reply[i]) - 1]
            clashes[event.id] = EventRecord.from_item(pairs(reply[i + 1]), now_ms)
        return clashes

    def transaction_entry(self, event: Event, now_ms: int) -> Any:
        raise NotSupportedError(
            "the Redis backend has no transaction collector: use outbox.publish(...)"
        )

    # -- reading ---------------------------------------------------------------------------------

    def get(self, event_id: str, now_ms: int) -> EventRecord | None:
        with translate_errors("outbox get"):
            raw = self._conn.client.hgetall(self._item(event_id))
        return EventRecord.from_item(hash_fields(raw), now_ms)

    def _range(self, due_before_ms: int | None, cursor: Any) -> tuple[str, str]:
        low = "-" if cursor is None else f"({cursor}"
        # gsi1sk is "{due:015d}#{id}": everything due at or before T sorts below T + 1.
        high = "+" if due_before_ms is None else "(" + time_sk_bound(due_before_ms + 1)
        return low, high

    def query_page(
        self,
        status: EventStatus,
        shard: int,
        *,
        due_before_ms: int | None,
        limit: int,
        cursor: Any = None,
    ) -> tuple[list[EventRecord], Any]:
        low, high = self._range(due_before_ms, cursor)
        reply = self._conn.run(
            _QUERY,
            [f"{self._prefix}{status.value}#0"],
            [low, high, limit + 1, self._item_prefix],
            "outbox query",
        )
        rows = [(as_str(reply[i]) or "", reply[i + 1]) for i in range(0, len(reply), 2)]
        more = len(rows) > limit
        rows = rows[:limit]
        records = []
        for _member, flat in rows:
            record = EventRecord.from_item(pairs(flat), 0)
            if record is not None:
                records.append(record)
        return records, (rows[-1][0] if more else None)

    def count_page(
        self, status: EventStatus, shard: int, *, due_before_ms: int | None, cursor: Any = None
    ) -> tuple[int, Any]:
        low, high = self._range(due_before_ms, cursor)
        with translate_errors("outbox count"):
            count = self._conn.client.zlexcount(f"{self._prefix}{status.value}#0", low, high)
        return int(count), None

    # -- claim and state changes -------------------------------------------------------------------

    def _run(self, script: str, event_id: str, now_ms: int, args: list[Any], what: str) -> Any:
        return self._conn.run(script, [self._item(event_id)], [*self._head(now_ms), *args], what)

    def claim(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> EventRecord | None:
        if seen.status not in (EventStatus.PENDING, EventStatus.IN_FLIGHT):
            return None
        reply = self._run(
            _CLAIM,
            seen.id,
            now_ms,
            [
                seen.status.value,
                seen.lease_token or "",
                token,
                lease_until_ms,
                outbox_index_sk(lease_until_ms, seen.id),
            ],
            "outbox claim",
        )
        if as_int(reply[0]) != 1:
            return None
        return EventRecord.from_item(pairs(reply[1:]), now_ms)

    def extend(self, event_id: str, token: str, lease_until_ms: int, now_ms: int) -> bool:
        ok = self._run(
            _EXTEND,
            event_id,
            now_ms,
            [token, lease_until_ms, outbox_index_sk(lease_until_ms, event_id)],
            "outbox extend",
        )
        return as_int(ok) == 1

    def complete(self, event_id: str, token: str, now_ms: int, retention_ms: int | None) -> bool:
        if retention_ms is None:
            args: list[Any] = [token, "", ""]
        else:
            expires = now_ms + retention_ms
            args = [token, expires, self._conn.gc_ms(expires, now_ms)]
        return as_int(self._run(_COMPLETE, event_id, now_ms, args, "outbox complete")) == 1

    def reschedule(
        self,
        event_id: str,
        token: str,
        due_ms: int,
        error: str | None,
        now_ms: int,
        *,
        count_attempt: bool = True,
    ) -> bool:
        ok = self._run(
            _RESCHEDULE,
            event_id,
            now_ms,
            [token, due_ms, outbox_index_sk(due_ms, event_id), error or "", int(count_attempt)],
            "outbox reschedule",
        )
        return as_int(ok) == 1

    def fail(self, event_id: str, token: str, error: str, now_ms: int) -> bool:
        ok = self._run(
            _FAIL,
            event_id,
            now_ms,
            [token, error, outbox_index_sk(now_ms, event_id)],
            "outbox fail",
        )
        return as_int(ok) == 1

    def retry_failed(self, event_id: str, now_ms: int) -> RetryOutcome:
        outcome = as_str(
            self._run(
                _RETRY_FAILED, event_id, now_ms, [outbox_index_sk(now_ms, event_id)], "outbox retry"
            )
        )
        if outcome == "retried":
            return "retried"
        return "not_failed" if outcome == "not_failed" else "not_found"
