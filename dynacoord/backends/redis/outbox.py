"""The outbox store on Redis.

Item: hash ``{OUTBOX#{ns}#0}|OUTBOX#{ns}#{event_id}`` with the DynamoDB item's attributes
(``event_id``, ``event_type``, ``payload``/``metadata`` codec text, ``event_group``,
``occurred_at_ms``, ``status``, ``attempts``, ``due_ms``, ``lease_token`` while claimed,
``last_error``, ``updated_ms``, ``gsi1sk``, ``seq`` for an ordered event, ``finished_by`` = the
lease token whose outcome was written last, ``retried_by`` = the token of the last
``outbox.retry``; completed events get ``completed_ms`` and ``expires_at_ms``).
Ordered group gate: hash ``{OUTBOX#{ns}#0}|grp|OUTBOX#{ns}#{group}`` with ``published`` (the last
place handed out), ``published_ms``, ``next_seq`` (the smallest place not finished; absent = 1)
and ``retry_due_ms`` (when the group's head waits for a retry). The publish script takes places
(``HINCRBY``) after its clash check, so a republished identical event takes none; the claim
script checks the gate and claims in one step; the finish script moves ``next_seq`` past every
completed or failed place (never back). Gates are kept (one small hash per group).
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
one script: it checks every id first and writes all events or none. A batch claim, a batch of
outcomes and a batch of lease extensions are one script each (one round trip). A script sent
again by redis-py after its reply was lost recognises its own write: a claim finds the event in
flight under its own token, an outcome finds ``finished_by`` = its token (or, for a completion
without retention, the event gone).

``backend.transaction()`` is not offered on Redis (the collector speaks DynamoDB's transaction
API); publish events with ``outbox.publish``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from typing_extensions import NotRequired, TypedDict

from ...errors import NotSupportedError
from ...keys import Kind, outbox_index_pk, outbox_index_sk, outbox_key, time_sk_bound
from ...outbox import (
    ORDERED_RECHECK_MS,
    Event,
    EventRecord,
    EventStatus,
    Outcome,
    RetryOutcome,
    pending_fields,
)
from ...outbox._claimable import claimable_stretches
from ...outbox.event import check_event_size
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
)

__all__ = ["RedisOutboxStore"]

#: The statuses a claim takes an event from (pending, or in flight with an expired lease).
_CLAIMABLE = (EventStatus.PENDING, EventStatus.IN_FLIGHT)
#: The widest place in a group the size check of a publish allows for (15 digits).
_WIDEST_SEQ = 10**15 - 1

# -- what each script reads from its JSON argument -----------------------------------------------
#
# Every entry is an object read by name in Lua; each is built by one function below. Numbers the
# script writes into a hash are exact decimal strings (Lua numbers are doubles); ``key`` and
# ``gate`` are small JSON numbers: the entry's position in KEYS (1-based) and its group gate's
# position after the items (0 = not ordered). A field left out reads as nil in Lua.


class _PublishEntry(TypedDict):
    gsk: str  # the pending index entry
    fields: list[str]  # the item's hash: name, value, name, value, ...
    gate: int


class _ClaimEntry(TypedDict):
    key: int
    status: str  # the status the caller saw
    seen_token: NotRequired[str]  # the lease token the caller saw; absent = none
    attempts: str  # the attempts the caller saw
    seq: NotRequired[str]  # the place in its ordered group the caller saw; absent = none
    token: str  # the claim's own lease token
    gsk: str  # the in-flight index entry
    id: str
    gate: int
    # in its group's claimable stretch (the script's word: "run"), or behind a missing place
    place: NotRequired[Literal["run", "gap"]]


class _ClaimSpec(TypedDict):
    lease_until: str
    recheck: str  # how long a refused place keeps out of the due queue (ms)
    starts: list[str]  # per gate: the first place of the stretch this claim takes
    events: list[_ClaimEntry]  # each group's stretch in place order


class _OutcomeEntry(TypedDict):
    key: int
    kind: str  # 'completed' | 'pending' | 'failed'
    token: str  # the lease token the outcome is written under
    expires: NotRequired[str]  # completed and kept until then; absent = deleted at once
    gc_ms: NotRequired[str]  # completed and kept: its relative PEXPIRE
    due: NotRequired[str]  # pending: when it is due again
    gsk: NotRequired[str]  # pending or failed: the new index entry
    error: NotRequired[str]  # failed: always; pending: only when there is one
    counted: NotRequired[bool]  # pending: the attempt counts (false = given back unhandled)
    uncounted: NotRequired[str]  # pending: earlier claims' attempts given back too (a re-claim's)


class _ExtendEntry(TypedDict):
    token: str
    gsk: str  # the in-flight index entry until the new lease ends


class _RetryEntry(TypedDict):
    seq: str  # the place the failed event holds in its group
    gsk: str  # its pending index entry


def _publish_entry(fields: dict[str, str], gate: int) -> _PublishEntry:
    flat = [part for pair in fields.items() for part in pair]
    return {"gsk": fields["gsi1sk"], "fields": flat, "gate": gate}


def _claim_entry(
    key: int,
    record: EventRecord,
    token: str,
    lease_until_ms: int,
    gate: int,
    place: Literal["run", "gap"] | None,
) -> _ClaimEntry:
    entry: _ClaimEntry = {
        "key": key,
        "status": record.status.value,
        "attempts": str(record.attempts),
        "token": token,
        "gsk": outbox_index_sk(lease_until_ms, record.id),
        "id": record.id,
        "gate": gate,
    }
    if record.lease_token:
        entry["seen_token"] = record.lease_token
    if record.seq is not None:
        entry["seq"] = str(record.seq)
    if place is not None:
        entry["place"] = place
    return entry


def _extend_entry(record: EventRecord, lease_until_ms: int) -> _ExtendEntry:
    return {
        "token": record.lease_token or "",
        "gsk": outbox_index_sk(lease_until_ms, record.id),
    }


def _retry_entry(record: EventRecord, now_ms: int) -> _RetryEntry:
    return {"seq": str(record.seq), "gsk": outbox_index_sk(now_ms, record.id)}


def _as_json(spec: object) -> str:
    return json.dumps(spec, ensure_ascii=False, separators=(",", ":"))


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
local function move_at(key, status, gsk)
  unindex(key)
  redis.call('HSET', key, 'status', status, 'gsi1sk', gsk)
  redis.call('ZADD', idx(status), 0, gsk)
end
local function move(status, gsk) move_at(KEYS[1], status, gsk) end
local function held_at(key, token)
  return redis.call('HGET', key, 'status') == 'in_flight'
     and redis.call('HGET', key, 'lease_token') == token
end
"""
)

# KEYS = items, then the gates of their ordered groups; ARGV[4] = JSON list of _PublishEntry, in
# KEYS order.
# An ordered event takes the next place of its group (HINCRBY) only once no id clashed.
_PUBLISH = (
    _HEAD
    + """
local events = cjson.decode(ARGV[4])
local n = #events
local clashes = {0}
for i = 1, n do
  if live(KEYS[i], now) then
    table.insert(clashes, i)
    table.insert(clashes, redis.call('HGETALL', KEYS[i]))
  end
end
if #clashes > 1 then return clashes end
for i = 1, n do
  local key = KEYS[i]
  unindex(key)
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(events[i].fields))
  if events[i].gate > 0 then
    local gate = KEYS[n + events[i].gate]
    local seq = redis.call('HINCRBY', gate, 'published', 1)
    redis.call('HSET', key, 'seq', string.format('%d', seq))
    redis.call('HSET', gate, 'published_ms', ARGV[1])
  end
  redis.call('ZADD', idx('pending'), 0, events[i].gsk)
end
return {1}
"""
)

# KEYS = items, then the gates of the ordered groups; ARGV[4] = JSON _ClaimSpec. Replies
# {key number, fields, ...} of the events claimed.
_CLAIM_MANY = (
    _HEAD
    + """
local spec = cjson.decode(ARGV[4])
local n = #spec.events
local open, retry = {}, {}
for j, start in ipairs(spec.starts) do
  local gate = KEYS[n + j]
  open[j] = tonumber(redis.call('HGET', gate, 'next_seq') or '1') >= tonumber(start)
  retry[j] = tonumber(redis.call('HGET', gate, 'retry_due_ms') or '0')
end
local function as_seen(key, e)
  if not live(key, now) or redis.call('HGET', key, 'status') ~= e.status then return false end
  if tonumber(redis.call('HGET', key, 'due_ms') or '0') > now then return false end
  -- HGET answers false for a missing field: no token seen must find none
  if redis.call('HGET', key, 'lease_token') ~= (e.seen_token or false) then return false end
  -- still at the place seen: the gate was checked for that place, and a redriven event took a
  -- new one at its group's tail (an old read of it must not claim it ahead of its group)
  if redis.call('HGET', key, 'seq') ~= (e.seq or false) then return false end
  return (redis.call('HGET', key, 'attempts') or '0') == e.attempts
end
local out = {}
for _, e in ipairs(spec.events) do
  local key = KEYS[e.key]
  local j = e.gate
  if held_at(key, e.token) then
    -- this very claim, sent again after its response was lost: it is ours
    table.insert(out, e.key)
    table.insert(out, redis.call('HGETALL', key))
  elseif j > 0 and (e.place == 'gap' or not open[j]) then
    -- waits behind its group's head: out of the way of the due queue for a while
    if as_seen(key, e) then
      local due = math.max(now + tonumber(spec.recheck), retry[j])
      move_at(key, e.status, string.format('%015d', due) .. '#' .. e.id)
      redis.call('HSET', key, 'due_ms', string.format('%d', due))
    end
  elseif as_seen(key, e) then
    move_at(key, 'in_flight', e.gsk)
    redis.call('HSET', key, 'lease_token', e.token, 'due_ms', spec.lease_until,
               'updated_ms', ARGV[1])
    redis.call('HINCRBY', key, 'attempts', 1)
    table.insert(out, e.key)
    table.insert(out, redis.call('HGETALL', key))
  elseif j > 0 and live(key, now) then
    local st = redis.call('HGET', key, 'status')
    -- someone else holds this place (or it waits for a retry): the rest of the stretch waits too
    if st == 'pending' or st == 'in_flight' then open[j] = false end
  end
end
return out
"""
)

# KEYS = items; ARGV[4] = gate prefix, ARGV[5] = JSON list of _OutcomeEntry, each group's in
# place order. Replies 1/0 per key.
# An ordered event's gate is named from its own stored group (same tag, so the same slot).
_FINISH_MANY = (
    _HEAD
    + """
local spec = cjson.decode(ARGV[5])
local result = {}
for i = 1, #KEYS do result[i] = 0 end
local function next_of(gate) return tonumber(redis.call('HGET', gate, 'next_seq') or '1') end
local function finished(gate, seq)
  if gate and seq + 1 > next_of(gate) then
    redis.call('HSET', gate, 'next_seq', string.format('%d', seq + 1))
    redis.call('HDEL', gate, 'retry_due_ms')
  end
end
for _, o in ipairs(spec) do
  local key = KEYS[o.key]
  local kind, token = o.kind, o.token
  if held_at(key, token) then
    local gate, seq = nil, nil
    local place = redis.call('HGET', key, 'seq')
    if place then
      gate = ARGV[4] .. redis.call('HGET', key, 'event_group')
      seq = tonumber(place)
    end
    if kind == 'completed' then
      unindex(key)
      if o.expires == nil then
        redis.call('DEL', key)
      else
        redis.call('HSET', key, 'status', 'completed', 'completed_ms', ARGV[1],
                   'updated_ms', ARGV[1], 'expires_at_ms', o.expires, 'finished_by', token)
        redis.call('HDEL', key, 'gsi1sk', 'lease_token', 'due_ms')
        redis.call('PEXPIRE', key, o.gc_ms)
      end
      finished(gate, seq)
    elseif kind == 'pending' then
      move_at(key, 'pending', o.gsk)
      redis.call('HSET', key, 'due_ms', o.due, 'updated_ms', ARGV[1], 'finished_by', token)
      if o.error ~= nil then redis.call('HSET', key, 'last_error', o.error) end
      if o.uncounted ~= nil then
        redis.call('HINCRBY', key, 'attempts', -tonumber(o.uncounted))
      end
      if not o.counted then
        redis.call('HINCRBY', key, 'attempts', -1)
      elseif gate and next_of(gate) == seq then
        redis.call('HSET', gate, 'retry_due_ms', o.due)  -- the group's head waits for its retry
      end
      redis.call('HDEL', key, 'lease_token')
    else
      move_at(key, 'failed', o.gsk)
      redis.call('HSET', key, 'due_ms', ARGV[1], 'updated_ms', ARGV[1], 'failed_ms', ARGV[1],
                 'last_error', o.error, 'finished_by', token)
      redis.call('HDEL', key, 'lease_token')
      finished(gate, seq)
    end
    result[o.key] = 1
  elseif redis.call('EXISTS', key) == 0 then
    -- deleted: by this very completion when its first response was lost (or by its taker)
    if kind == 'completed' and o.expires == nil then result[o.key] = 1 end
  elseif redis.call('HGET', key, 'finished_by') == token then
    result[o.key] = 1  -- this outcome, sent again after its response was lost
  end
end
return result
"""
)

# KEYS = items; ARGV[4] = lease until, ARGV[5] = JSON list of _ExtendEntry in KEYS order
_EXTEND_MANY = (
    _HEAD
    + """
local held = cjson.decode(ARGV[5])
local result = {}
for i, key in ipairs(KEYS) do
  result[i] = 0
  if held_at(key, held[i].token) then
    move_at(key, 'in_flight', held[i].gsk)
    redis.call('HSET', key, 'due_ms', ARGV[4], 'updated_ms', ARGV[1])
    result[i] = 1
  end
end
return result
"""
)

# KEYS[1]=item; ARGV: ..., new gsk, the retry's token. Replies 'retried' | 'not_found' |
# 'not_failed'.
_RETRY_FAILED = (
    _HEAD
    + """
if not live(KEYS[1], now) then return 'not_found' end
-- this very retry (ARGV[5], its token), run again after its answer was lost: never applied
-- twice, also when the event failed again in between
if redis.call('HGET', KEYS[1], 'retried_by') == ARGV[5] then return 'retried' end
if redis.call('HGET', KEYS[1], 'status') ~= 'failed' then return 'not_failed' end
move('pending', ARGV[4])
redis.call('HSET', KEYS[1], 'attempts', 0, 'due_ms', ARGV[1], 'updated_ms', ARGV[1],
  'retried_by', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'manual_retries', 1)
return 'retried'
"""
)

# KEYS = items in their old place order, then the group's gate; ARGV[4] = the call's token,
# ARGV[5] = the group, ARGV[6] = JSON list of _RetryEntry in KEYS order. Each item
# still failed in the group at its old place takes the group's next place (HINCRBY, as a publish
# does). Replies the key numbers moved, in their new order.
_RETRY_GROUP = (
    _HEAD
    + """
local spec = cjson.decode(ARGV[6])
local n = #spec
local gate = KEYS[n + 1]
local out = {}
-- this very retry, run again after its answer was lost: what it moved carries its token (also
-- an event that failed again in between), and nothing moves twice
for i = 1, n do
  if redis.call('HGET', KEYS[i], 'retried_by') == ARGV[4] then table.insert(out, i) end
end
if #out > 0 then return out end
for i = 1, n do
  local key = KEYS[i]
  if live(key, now) and redis.call('HGET', key, 'status') == 'failed'
     and redis.call('HGET', key, 'event_group') == ARGV[5]
     and redis.call('HGET', key, 'seq') == spec[i].seq then
    local seq = redis.call('HINCRBY', gate, 'published', 1)
    move_at(key, 'pending', spec[i].gsk)
    redis.call('HSET', key, 'seq', string.format('%d', seq), 'attempts', 0, 'due_ms', ARGV[1],
      'updated_ms', ARGV[1], 'retried_by', ARGV[4])
    redis.call('HINCRBY', key, 'manual_retries', 1)
    redis.call('HSET', gate, 'published_ms', ARGV[1])
    table.insert(out, i)
  end
end
return out
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
        # "{OUTBOX#ns#0}|grp|OUTBOX#ns#" + group is the gate of an ordered group
        self._gate_prefix = f"{{{self._tag}}}|grp|{Kind.OUTBOX.value}#{namespace}#"

    @property
    def shards(self) -> int:
        return 1

    def refresh_shards(self) -> int:
        return 1  # one index partition per status on Redis, whoever publishes

    def _item(self, event_id: str) -> str:
        return item_key(outbox_key(self._ns, event_id, status="", due_ms=0).pk, tag=self._tag)

    def _gate(self, group: str) -> str:
        return self._gate_prefix + group

    def _head(self, now_ms: int) -> list[Any]:
        return [now_ms, self._prefix, "#0"]

    def _fields(self, event: Event, due_ms: int) -> dict[str, str]:
        k = outbox_key(self._ns, event.id, status=EventStatus.PENDING.value, due_ms=due_ms)
        # An ordered event's place is taken in the publish script; the size check counts the
        # widest place.
        seq = _WIDEST_SEQ if event.ordered else None
        fields = {name: str(value) for name, value in pending_fields(event, due_ms, seq).items()}
        fields["gsi1sk"] = outbox_index_sk(due_ms, event.id)
        # Same size limit as the DynamoDB item, so an event fits every backend.
        check_event_size({**k.as_dict(), **fields}, key=event.id)
        fields.pop("seq", None)
        return fields

    # -- publishing ------------------------------------------------------------------------------

    def publish(self, events: Sequence[Event], now_ms: int) -> dict[str, EventRecord | None]:
        payload: list[_PublishEntry] = []
        gates: dict[str, int] = {}  # group -> its gate's number after the items (1-based)
        for event in events:
            gate = 0
            if event.ordered and event.group is not None:
                gate = gates.setdefault(event.group, len(gates) + 1)
            payload.append(
                _publish_entry(self._fields(event, min(event.occurred_at_ms, now_ms)), gate)
            )
        reply = self._conn.run(
            _PUBLISH,
            [self._item(e.id) for e in events] + [self._gate(g) for g in gates],
            [*self._head(now_ms), _as_json(payload)],
            "outbox publish",
        )
        if as_int(reply[0]) == 1:
            return {}
        clashes: dict[str, EventRecord | None] = {}
        for i in range(1, len(reply), 2):
            event = events[as_int(reply[i]) - 1]
            clashes[event.id] = EventRecord.from_item(pairs(reply[i + 1]), now_ms)
        return clashes

    def transaction_entry(self, event: Event, now_ms: int) -> tuple[Any, int]:
        raise NotSupportedError(
            "the Redis backend has no transaction collector: use outbox.publish(...)"
        )

    # -- reading ---------------------------------------------------------------------------------

    def get(self, event_id: str, now_ms: int) -> EventRecord | None:
        raw = self._conn.call("outbox get", "hgetall", self._item(event_id))
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
        index = f"{self._prefix}{status.value}#0"
        count = self._conn.call("outbox count", "zlexcount", index, low, high)
        return int(count), None

    # -- claim and state changes -------------------------------------------------------------------

    def claim(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> EventRecord | None:
        claimed = self.claim_many([seen], [token], lease_until_ms, now_ms)
        return claimed[0] if claimed else None

    def claim_many(
        self, seen: Sequence[EventRecord], tokens: Sequence[str], lease_until_ms: int, now_ms: int
    ) -> list[EventRecord]:
        if len(seen) != len(tokens):
            raise ValueError("claim_many needs one token per event")
        stretches = claimable_stretches(seen)
        gates = {group: number for number, group in enumerate(stretches, start=1)}
        keys: list[str] = []
        entries: list[_ClaimEntry] = []
        listed: set[str] = set()

        def add(record: EventRecord, token: str, place: Literal["run", "gap"] | None) -> None:
            if record.id in listed or record.status not in _CLAIMABLE:
                return
            listed.add(record.id)
            keys.append(self._item(record.id))
            gate = gates[record.event.group or ""] if place else 0
            entries.append(_claim_entry(len(keys), record, token, lease_until_ms, gate, place))

        token_of = {record.id: token for record, token in zip(seen, tokens, strict=True)}
        for record in seen:
            if record.seq is None:
                add(record, token_of[record.id], None)
        # Each stretch in place order: a place refused stops the rest.
        for stretch in stretches.values():
            for record in stretch.members:
                add(record, token_of[record.id], "run")
            for record in stretch.after_gap:
                add(record, token_of[record.id], "gap")
        if not entries:
            return []
        spec: _ClaimSpec = {
            "lease_until": str(lease_until_ms),
            "recheck": str(ORDERED_RECHECK_MS),
            "starts": [str(stretch.start) for stretch in stretches.values()],
            "events": entries,
        }
        reply = self._conn.run(
            _CLAIM_MANY,
            keys + [self._gate(group) for group in stretches],
            [*self._head(now_ms), _as_json(spec)],
            "outbox claim",
        )
        claimed: dict[str, EventRecord] = {}
        for i in range(0, len(reply), 2):
            got = EventRecord.from_item(pairs(reply[i + 1]), now_ms)
            if got is not None:
                claimed[got.id] = got
        return [claimed.pop(r.id) for r in seen if r.id in claimed]

    def finish_many(
        self, outcomes: Sequence[Outcome], now_ms: int, retention_ms: int | None
    ) -> list[bool]:
        if not outcomes:
            return []
        # Each group's outcomes in place order: s, s+1, s+2 completed in one batch move the
        # group's next place to s+3.
        order = sorted(
            range(len(outcomes)),
            key=lambda i: (
                outcomes[i].record.seq is not None,
                outcomes[i].record.event.group or "",
                outcomes[i].record.seq or 0,
            ),
        )
        keys = [self._item(o.record.id) for o in outcomes]
        spec = [
            self._outcome_entry(
                i + 1,
                outcomes[i].record.id,
                outcomes[i].kind,
                outcomes[i].token,
                now_ms,
                retention_ms,
                due_ms=outcomes[i].due_ms,
                error=outcomes[i].error,
                count_attempt=outcomes[i].count_attempt,
                uncounted=outcomes[i].uncounted,
            )
            for i in order
        ]
        return self._finish(keys, spec, now_ms)

    def _finish(self, keys: list[str], spec: list[_OutcomeEntry], now_ms: int) -> list[bool]:
        reply = self._conn.run(
            _FINISH_MANY,
            keys,
            [*self._head(now_ms), self._gate_prefix, _as_json(spec)],
            "outbox finish",
        )
        return [as_int(flag) == 1 for flag in reply]

    def _outcome_entry(
        self,
        number: int,
        event_id: str,
        kind: str,
        token: str,
        now_ms: int,
        retention_ms: int | None,
        *,
        due_ms: int = 0,
        error: str | None = None,
        count_attempt: bool = True,
        uncounted: int = 0,
    ) -> _OutcomeEntry:
        """One outcome of the finish script."""
        entry: _OutcomeEntry = {"key": number, "kind": kind, "token": token}
        if kind == "completed":
            if retention_ms is not None:
                expires = now_ms + retention_ms
                entry["expires"] = str(expires)
                entry["gc_ms"] = str(self._conn.gc_ms(expires, now_ms))
        elif kind == "pending":
            entry["due"] = str(due_ms)
            entry["gsk"] = outbox_index_sk(due_ms, event_id)
            entry["counted"] = count_attempt
            if uncounted:
                entry["uncounted"] = str(uncounted)
            if error:
                entry["error"] = error
        else:
            entry["gsk"] = outbox_index_sk(now_ms, event_id)
            entry["error"] = error or ""
        return entry

    def extend_many(
        self, held: Sequence[EventRecord], lease_until_ms: int, now_ms: int
    ) -> list[bool]:
        if not held:
            return []
        spec = [_extend_entry(r, lease_until_ms) for r in held]
        reply = self._conn.run(
            _EXTEND_MANY,
            [self._item(r.id) for r in held],
            [*self._head(now_ms), lease_until_ms, _as_json(spec)],
            "outbox extend",
        )
        return [as_int(flag) == 1 for flag in reply]

    def retry_failed(self, event_id: str, now_ms: int, token: str) -> RetryOutcome:
        outcome = as_str(
            self._conn.run(
                _RETRY_FAILED,
                [self._item(event_id)],
                [*self._head(now_ms), outbox_index_sk(now_ms, event_id), token],
                "outbox retry",
            )
        )
        if outcome == "retried":
            return "retried"
        return "not_failed" if outcome == "not_failed" else "not_found"

    def retry_group(
        self, group: str, records: Sequence[EventRecord], now_ms: int, token: str
    ) -> list[str]:
        """One script for the whole group (all or nothing, however many events)."""
        mine = [r for r in records if r.seq is not None and r.event.group == group]
        if not mine:
            return []
        spec = [_retry_entry(r, now_ms) for r in mine]
        reply = self._conn.run(
            _RETRY_GROUP,
            [self._item(r.id) for r in mine] + [self._gate(group)],
            [*self._head(now_ms), token, group, _as_json(spec)],
            "outbox retry",
        )
        return [mine[as_int(number) - 1].id for number in reply]
