"""A prototype of the outbox store with one lease item per worker (issue 50; KCL's shape), beside
the default store and never used by it: ``WorkerLeaseOutboxStore``, opt-in by making it.

Why. With the default store a claimed event stays in the listing index under its lease's end,
so the claim *moves* its index entry (1 + 2 index WCU) and so does every lease extension, per
event held (3 WCU each); a completion takes it out again (1 + 1). Here:

* each worker (one store instance: ``one store per worker``) owns one item,
  ``pk=OUTBOX#{ns}#`` (the namespace's meta partition), ``sk=WORKER#{gen}``, holding its lease's
  end (``lease_until``) and the ids it holds or is about to claim (``ids``). It is in no index,
  so a renewal is one plain update: 1 WCU under 1 KB, whatever the batch;
* before a claim the worker writes its item listing the ids it is about to claim (one write per
  batch), then the claim takes each event *out* of the index (``REMOVE gsi1pk, gsi1sk``: 1 + 1
  index delete) and names the worker's generation (``held_by``); the completion touches no index
  (1 WCU);
* recovery lists the worker items (one consistent Query of the meta partition), reads the
  events an expired item lists, and returns those still held by that generation as in-flight
  records (``query_page(IN_FLIGHT, ...)``). Claiming one *fences* the dead worker's item first
  (``SET fenced``, conditional on ``lease_until`` being the value read: a renewal applied since
  the read refuses it, and the claim is refused with it); a fenced generation's renewals are
  refused, so its worker loses everything it held and starts a new generation.

Races this closes:

* a renewal between the recoverer's read and its claim: the fence is conditional on the
  ``lease_until`` read, so the recoverer finds it moved and does not claim;
* a worker that froze past its lease and comes back: its renewal and its next pre-claim write
  are conditional on ``attribute_not_exists(fenced)``; refused, it starts a new generation (a
  new item) and reports every event of the old one lost. Its outcomes stay conditional on each
  event's lease token, which the recoverer's claim replaced;
* an event claimed and then its worker dies before the next renewal: the pre-claim write
  listed it before the claim was sent;
* a claim whose call raised (maybe applied): its ids stay listed and are read back before the
  next pre-claim; one held by this generation under the token tried is given back (pending,
  its attempt not counted);
* a claim that lands after its worker's item was swept (the worker paused between writing
  its item and claiming, past the lease and ``DEAD_ITEM_GRACE_MS``): the sweep first marks
  each listed event still pending with ``swept_{gen}``, and every claim of this store is
  conditional on that attribute's absence for its own generation.

Ordered groups, gates, retries and attempt counting are the default store's: the claims are
its requests with the index attributes removed instead of moved.

Not a stream relay store: ``stream_handler`` and ``sweep_handler`` keep the default store. A
namespace is one shape for its readers: the default store's ``stats()``, ``in_flight()`` and
expired-lease scan do not see events held through worker items (this store also takes over the
default store's expired leases, so moving *to* it is safe, moving back is not).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from ...errors import NotSupportedError
from ...keys import Kind
from ...outbox import EventRecord, EventStatus, Outcome
from ...outbox.event import new_event_id
from ._limits import MAX_BATCH_GET_KEYS
from ._marshal import values
from ._outbox_items import event_record
from ._outbox_requests import OutboxRequests
from ._table import ConditionFailedError, DynamoTable
from .outbox import DynamoDBOutboxStore

__all__ = ["DEAD_ITEM_GRACE_MS", "WORKER_SK_PREFIX", "WorkerLeaseOutboxStore"]

WORKER_SK_PREFIX = "WORKER#"
#: an expired worker item listing nothing it still holds is deleted only this long after its
#: lease ended (a late claim sent before the lease's end has had botocore's retries to land)
DEAD_ITEM_GRACE_MS = 10 * 60 * 1000
#: a dead worker item is garbage-collected by DynamoDB's TTL this long after its last write
_ITEM_TTL_MS = 24 * 3600 * 1000


def swept(gen: str) -> str:
    """The attribute an event gets when the item of generation ``gen`` was deleted while it
    listed the event (see ``WorkerLeaseOutboxStore._sweep``)."""
    return "swept_" + gen


class _WorkerClaims(OutboxRequests):
    """The default store's claim, taking the event out of the index instead of moving it there
    (``REMOVE gsi1pk, gsi1sk``) and naming the claiming worker's generation (``held_by``)."""

    gen = ""
    #: ids of in-flight events read through a fenced worker item (their claim needs no more)
    fenced: set[str]

    def claim(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> dict[str, Any]:
        op = super().claim(seen, token, lease_until_ms, now_ms)
        update = op["UpdateExpression"]
        moved = ", gsi1pk = :gpk, gsi1sk = :gsk"
        assert moved in update, "the default claim moves the index entry"
        op["UpdateExpression"] = (
            update.replace(moved, ", held_by = :gen") + " REMOVE gsi1pk, gsi1sk"
        )
        vals = {
            k: v for k, v in op["ExpressionAttributeValues"].items() if k not in (":gpk", ":gsk")
        }
        vals.update(values(gen=self.gen))
        op["ExpressionAttributeValues"] = vals
        # a generation whose item was deleted while it listed this event (see _sweep) cannot
        # claim it any more: its claim would hold the event with no item listing it
        op["ConditionExpression"] += " AND attribute_not_exists(#swept)"
        op["ExpressionAttributeNames"] = {
            **op["ExpressionAttributeNames"],
            "#swept": swept(self.gen),
        }
        if seen.status is EventStatus.IN_FLIGHT and seen.event.id not in self.fenced:
            # an expired lease read from the index: a claim of the default store, whose lease
            # is the event's own; never one of a worker item (those carry held_by until their
            # outcome), whose event's due time is not its lease
            op["ConditionExpression"] += " AND attribute_not_exists(held_by)"
        return op

    def outcome(self, outcome: Outcome, now_ms: int, retention_ms: int | None) -> dict[str, Any]:
        """The default store's outcome, which also lets the event's worker go (``held_by``)."""
        ((action, op),) = super().outcome(outcome, now_ms, retention_ms).items()
        if action == "Update":
            update = op["UpdateExpression"]
            op = {
                **op,
                "UpdateExpression": update
                + (", held_by" if " REMOVE " in update else " REMOVE held_by"),
            }
        return {action: op}


@dataclasses.dataclass(slots=True)
class _Seen:
    """A worker item as a recovery read it."""

    gen: str
    lease_until: int
    fenced: bool
    ids: list[str]


class WorkerLeaseOutboxStore(DynamoDBOutboxStore):
    """The outbox store with one lease item per worker (see the module docstring). One instance
    per worker: its generation and what it holds are the instance's."""

    def __init__(self, table: DynamoTable, namespace: str, *, shards: int = 1) -> None:
        super().__init__(table, namespace, shards=shards)
        self._requests = self._claims = _WorkerClaims(table.name, self._items)
        self._claims.fenced = set()
        self._new_gen()
        #: expired worker items read by recovery: event id -> the item as read
        self._recovering: dict[str, _Seen] = {}
        #: generations this store fenced or saw fenced (their events are free to claim)
        self._dead: set[str] = set()

    # -- this worker's item --------------------------------------------------------------------

    def _new_gen(self) -> None:
        self._gen = new_event_id()
        self._claims.gen = self._gen
        self._created = False  # the item exists for certain
        self._until = 0  # the lease end last written
        #: ids claimed by this generation and not finished: id -> lease token
        self._mine: dict[str, str] = {}
        #: ids whose claim call raised (maybe applied): id -> the token tried
        self._uncertain: dict[str, str] = {}

    def _worker_key(self, gen: str) -> dict[str, Any]:
        return {
            "pk": {"S": f"{Kind.OUTBOX.value}#{self._ns}#"},
            "sk": {"S": WORKER_SK_PREFIX + gen},
        }

    def _listed(self, extra: Sequence[str] = ()) -> list[str]:
        return list(dict.fromkeys([*self._mine, *self._uncertain, *extra]))

    def _write_item(self, ids: list[str], until_ms: int) -> bool:
        """Write this generation's item (lease end, ids); False if it was fenced (the
        generation is over). One UpdateItem."""
        until_ms = max(until_ms, self._until)
        expires = until_ms + _ITEM_TTL_MS
        condition = (
            "attribute_exists(pk) AND attribute_not_exists(fenced)"
            if self._created
            else "attribute_not_exists(pk)"
        )
        try:
            self._table.call(
                "update_item",
                Key=self._worker_key(self._gen),
                UpdateExpression="SET lease_until = :until, ids = :ids, #ttl = :ttl",
                ConditionExpression=condition,
                ExpressionAttributeNames={"#ttl": "ttl"},
                ExpressionAttributeValues={
                    ":until": {"N": str(until_ms)},
                    ":ids": {"L": [{"S": i} for i in ids]},
                    ":ttl": {"N": str(math.ceil(expires / 1000))},
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            old = failed.item
            # the create sent again after its answer was lost: our own item, not fenced
            if old is None or "fenced" in old or self._created:
                return False
        except BaseException:
            if not self._created:
                # maybe written: a later create would be refused by our own item, and an update
                # could revive an item a recovery deleted. A new generation is always safe.
                self._new_gen()
            raise
        self._created = True
        self._until = until_ms
        return True

    def _pre_claim(self, ids: Sequence[str], until_ms: int, now_ms: int) -> None:
        """List ``ids`` on this worker's item before claiming them (a new generation when the
        old one was fenced: all it held is lost)."""
        self._resolve_uncertain(now_ms)
        if not self._write_item(self._listed(ids), until_ms):
            self._new_gen()
            if not self._write_item(list(dict.fromkeys(ids)), until_ms):
                raise NotSupportedError("a new worker item was refused")  # never: a fresh key

    def _resolve_uncertain(self, now_ms: int) -> None:
        """Give back events whose claim call raised but applied (held by this generation under
        the token tried): pending, due now, their attempt not counted."""
        if not self._uncertain:
            return
        raws = self._read_events(list(self._uncertain))
        back: list[Outcome] = []
        for event_id, token in list(self._uncertain.items()):
            raw = raws.get(event_id)
            held = (
                raw is not None
                and raw.get("held_by", {}).get("S") == self._gen
                and raw.get("lease_token", {}).get("S") == token
                and raw.get("status", {}).get("S") == EventStatus.IN_FLIGHT.value
            )
            if not held:
                del self._uncertain[event_id]
                continue
            record = event_record(raw, now_ms)
            if record is not None:
                back.append(Outcome(record, "pending", due_ms=now_ms, count_attempt=False))
        if back:
            written = super().finish_many(back, now_ms, None)
            for outcome, ok in zip(back, written, strict=True):
                if ok:
                    self._uncertain.pop(outcome.record.id, None)

    # -- claims ----------------------------------------------------------------------------------

    def _fence(self, seen: EventRecord) -> bool:
        """Before taking over ``seen`` (in flight, read by recovery): fence the item of the
        generation that holds it, conditional on its lease end being the one read. False when
        that worker renewed since (the event is still its)."""
        item = self._recovering.get(seen.id)
        if item is None:
            # read from the index: an expired lease of the default store's claim (a namespace
            # moving to this shape), claimed on its own lease (see _WorkerClaims.claim)
            self._claims.fenced.discard(seen.id)
            return True
        self._claims.fenced.add(seen.id)
        if item.gen in self._dead or item.fenced:
            return True
        try:
            self._table.call(
                "update_item",
                Key=self._worker_key(item.gen),
                UpdateExpression="SET fenced = :me",
                ConditionExpression="lease_until = :seen",
                ExpressionAttributeValues=values(me=self._gen, seen=item.lease_until),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            old = failed.item
            if old is not None and "fenced" not in old:
                return False  # renewed since the read: still held
            # fenced by someone else already, or deleted (only a dead item is)
        self._dead.add(item.gen)
        return True

    def claim(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> EventRecord | None:
        if seen.seq is not None:
            claimed = self.claim_many([seen], [token], lease_until_ms, now_ms)
            return claimed[0] if claimed else None
        if seen.status is EventStatus.IN_FLIGHT and not self._fence(seen):
            return None
        self._pre_claim([seen.id], lease_until_ms, now_ms)
        try:
            got = super().claim(seen, token, lease_until_ms, now_ms)
        except BaseException:
            self._uncertain[seen.id] = token
            raise
        if got is not None:
            self._mine[got.id] = token
        return got

    def claim_many(
        self, seen: Sequence[EventRecord], tokens: Sequence[str], lease_until_ms: int, now_ms: int
    ) -> list[EventRecord]:
        kept = [
            (record, token)
            for record, token in zip(seen, tokens, strict=True)
            if record.status is not EventStatus.IN_FLIGHT or self._fence(record)
        ]
        if not kept:
            return []
        self._pre_claim([r.id for r, _ in kept], lease_until_ms, now_ms)
        try:
            got = super().claim_many(
                [r for r, _ in kept], [t for _, t in kept], lease_until_ms, now_ms
            )
        except BaseException:
            for record, token in kept:
                if record.id not in self._mine:
                    self._uncertain[record.id] = token
            raise
        for record in got:
            assert record.lease_token is not None
            self._mine[record.id] = record.lease_token
        return got

    # -- renewal and outcomes --------------------------------------------------------------------

    def extend_many(
        self, held: Sequence[EventRecord], lease_until_ms: int, now_ms: int
    ) -> list[bool]:
        """One write, whatever the batch: this worker's item's lease end (and the ids it holds).
        An event is kept while this generation holds it and the write applied."""
        if not any(r.id in self._mine for r in held):
            return [False] * len(held)
        if not self._write_item(self._listed(), lease_until_ms):
            self._new_gen()  # fenced: everything of this generation is someone else's
            return [False] * len(held)
        return [self._mine.get(r.id) == r.lease_token for r in held]

    def finish_many(
        self,
        outcomes: Sequence[Outcome],
        now_ms: int,
        retention_ms: int | None,
        _shrunk: bool = False,
    ) -> list[bool]:
        written = super().finish_many(outcomes, now_ms, retention_ms, _shrunk)
        for outcome in outcomes:
            if self._mine.get(outcome.record.id) == outcome.token:
                del self._mine[outcome.record.id]
        return written

    # -- recovery and listing ----------------------------------------------------------------------

    def get(self, event_id: str, now_ms: int) -> EventRecord | None:
        """The stored event; an in-flight one with its lease's end as its worker item holds it
        (the event keeps its claim's, which renewals do not move): one more read."""
        raw = self._table.get_raw(self._items.key(event_id))
        record = event_record(raw, now_ms)
        if record is None or record.status is not EventStatus.IN_FLIGHT or raw is None:
            return record
        gen = raw.get("held_by", {}).get("S")
        if gen is None:
            return record
        item = self._table.get_raw(self._worker_key(gen))
        if item is None:
            return record  # deleted: its lease ended long ago, the claim's end is as good
        return dataclasses.replace(record, due_at_ms=int(item["lease_until"]["N"]))

    def _worker_items(self) -> list[_Seen]:
        items: list[_Seen] = []
        args: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": values(
                pk=f"{Kind.OUTBOX.value}#{self._ns}#", prefix=WORKER_SK_PREFIX
            ),
            "ConsistentRead": True,
        }
        while True:
            page = self._table.call("query", **args)
            for raw in page.get("Items", []):
                items.append(
                    _Seen(
                        raw["sk"]["S"][len(WORKER_SK_PREFIX) :],
                        int(raw.get("lease_until", {}).get("N", "0")),
                        "fenced" in raw,
                        [v["S"] for v in raw.get("ids", {}).get("L", [])],
                    )
                )
            cursor = page.get("LastEvaluatedKey")
            if cursor is None:
                return items
            args["ExclusiveStartKey"] = cursor

    def _read_events(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        """The events' items as stored (attribute values), read consistently."""
        found: dict[str, dict[str, Any]] = {}
        ids = list(dict.fromkeys(ids))
        for start in range(0, len(ids), MAX_BATCH_GET_KEYS):
            keys = [self._items.key(i) for i in ids[start : start + MAX_BATCH_GET_KEYS]]
            while keys:
                answer = self._table.call(
                    "batch_get_item",
                    RequestItems={self._table.name: {"Keys": keys, "ConsistentRead": True}},
                )
                for raw in answer.get("Responses", {}).get(self._table.name, []):
                    found[raw["event_id"]["S"]] = raw
                keys = answer.get("UnprocessedKeys", {}).get(self._table.name, {}).get("Keys", [])
        return found

    def _expired(self, due_before_ms: int | None) -> list[_Seen]:
        """The worker items whose lease ended by ``due_before_ms`` (None: every one)."""
        return [
            i
            for i in self._worker_items()
            if due_before_ms is None or i.lease_until <= due_before_ms
        ]

    def _held(
        self, items: list[_Seen], raws: dict[str, dict[str, Any]] | None = None
    ) -> list[tuple[EventRecord, _Seen]]:
        """The events ``items`` list that their generation still holds, earliest lease end
        first (``raws``: the listed events as read, else read here)."""
        if raws is None:
            raws = self._read_events([e for i in items for e in i.ids])
        held: list[tuple[EventRecord, _Seen]] = []
        for item in sorted(items, key=lambda i: i.lease_until):
            for event_id in dict.fromkeys(item.ids):
                raw = raws.get(event_id)
                if (
                    raw is None
                    or raw.get("held_by", {}).get("S") != item.gen
                    or raw.get("status", {}).get("S") != EventStatus.IN_FLIGHT.value
                ):
                    continue
                record = event_record(raw, 0)
                if record is not None:
                    held.append((dataclasses.replace(record, due_at_ms=item.lease_until), item))
        return held

    def _sweep(
        self,
        items: list[_Seen],
        held: list[tuple[EventRecord, _Seen]],
        raws: dict[str, dict[str, Any]],
        now: int,
    ) -> None:
        """Delete expired worker items that hold nothing any more, once their grace is over
        (conditional on the lease end read: a renewal since keeps the item).

        An item may list an event its worker has not claimed yet (it writes the item, then
        claims): a claim applied after the item is gone would hold the event with no item
        listing it. So each listed event still pending first gets the generation's ``swept_``
        attribute (the claim is conditional on its absence: a plain condition, which a PartiQL
        statement carries, where ``contains()`` would turn the batch into transactions); a
        refusal (the claim landed first) keeps the item for the next scan, which sees the event
        held."""
        holding = {item.gen for _, item in held}
        pending = EventStatus.PENDING.value
        for item in items:
            if item.gen in holding or item.lease_until + DEAD_ITEM_GRACE_MS > now:
                continue
            kept = False
            for event_id in dict.fromkeys(item.ids):
                raw = raws.get(event_id)
                if raw is None or raw.get("status", {}).get("S") != pending:
                    continue
                try:
                    self._table.call(
                        "update_item",
                        Key=self._items.key(event_id),
                        UpdateExpression="SET #swept = :one",
                        ConditionExpression="#status = :pending",
                        ExpressionAttributeNames={"#status": "status", "#swept": swept(item.gen)},
                        ExpressionAttributeValues={":one": {"N": "1"}, ":pending": {"S": pending}},
                    )
                except ConditionFailedError:
                    kept = True  # claimed (or moved) meanwhile: look again at the next scan
            if kept:
                continue
            with contextlib.suppress(ConditionFailedError):
                self._table.call(
                    "delete_item",
                    Key=self._worker_key(item.gen),
                    ConditionExpression="lease_until = :seen",
                    ExpressionAttributeValues=values(seen=item.lease_until),
                )

    def query_page(
        self,
        status: EventStatus,
        shard: int,
        *,
        due_before_ms: int | None,
        limit: int,
        cursor: Any = None,
    ) -> tuple[list[EventRecord], Any]:
        """In-flight events are in no index: they are read through the worker items that list
        them (all on shard 0's turn; one page). The rest as the default store."""
        if status is not EventStatus.IN_FLIGHT:
            return super().query_page(
                status, shard, due_before_ms=due_before_ms, limit=limit, cursor=cursor
            )
        # the default store's claims (a namespace moving to this shape) are in the index
        indexed, next_cursor = super().query_page(
            status, shard, due_before_ms=due_before_ms, limit=limit, cursor=cursor
        )
        for record in indexed:
            self._recovering.pop(record.id, None)
        if shard != 0 or cursor is not None:
            return indexed, next_cursor
        items = self._expired(due_before_ms)
        raws = self._read_events([e for i in items for e in i.ids])
        held = self._held(items, raws)
        for record, item in held:
            self._recovering[record.id] = item
        if due_before_ms is not None and limit > 1:  # a worker's scan, not stats()
            self._sweep(items, held, raws, due_before_ms)
        records = sorted([r for r, _ in held] + indexed, key=lambda r: r.due_at_ms)
        return records[:limit], next_cursor

    def count_page(
        self, status: EventStatus, shard: int, *, due_before_ms: int | None, cursor: Any = None
    ) -> tuple[int, Any]:
        if status is not EventStatus.IN_FLIGHT:
            return super().count_page(status, shard, due_before_ms=due_before_ms, cursor=cursor)
        indexed, next_cursor = super().count_page(
            status, shard, due_before_ms=due_before_ms, cursor=cursor
        )
        if shard != 0 or cursor is not None:
            return indexed, next_cursor
        return indexed + len(self._held(self._expired(due_before_ms))), next_cursor
