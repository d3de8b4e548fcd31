"""The outbox store on MongoDB.

Document: the DynamoDB item's attributes (``pk=OUTBOX#{ns}#{event_id}``, ``sk=EVENT``,
``event_id``, ``event_type``, ``payload``/``metadata`` codec text, ``event_group``,
``occurred_at_ms``, ``status``, ``attempts``, ``due_ms``, ``lease_token`` while claimed,
``last_error``, ``updated_ms``) with ``gsi1pk=OUTBOX#{ns}#{status}#0`` and
``gsi1sk={due_ms:015d}#{event_id}`` while pending, in flight or failed; completed events drop
both and get ``expires_at_ms`` plus ``expires_at`` (TTL monitor). The (gsi1pk, gsi1sk) index makes
"due pending events" and "in-flight events whose lease ran out" one index range, as on DynamoDB.

Every state change after the claim is filtered on ``status = in_flight AND lease_token = mine``.
Outcomes set ``finished_by`` = the lease token, so an outcome sent again after its response was
lost recognises its own write (a completion without retention: the event is gone); a retry of a
failed event sets ``retried_by`` = its own token for the same reason.

Batches: ``claim_many`` is one ``bulk_write`` of conditional updates (unordered: one contended
event never costs the others their claim) and one ``find`` of the events now holding the batch's
tokens (a claim whose first response was lost is found the same way) and of the ordered groups'
gates: 2 round trips. ``finish_many`` and ``extend_many`` are one ``bulk_write`` each, plus a
``find`` only when some write did not match (a lost lease, or a retry after a lost response), plus
one ``bulk_write`` of gate updates when the batch has ordered events. (The bulk operations are
``UpdateMany`` on the unique (pk, sk), so at most one document each: mongomock refuses
``UpdateOne`` in a bulk with current pymongo.)

Ordered groups: gate document ``pk=OUTBOX#{ns}#{group}``, ``sk=GROUP`` with ``published`` (the
last place handed out), ``published_ms``, ``next_seq`` (the smallest place not finished),
``retry_due_ms`` (when the group's head waits for a retry) and, after ``retry(group=...)``,
``retried_by``/``retry_first`` (that call's token and the first place it took). MongoDB cannot write the gate and the
events atomically, so an ordered publish takes its places first (one ``find_one_and_update`` with
``$inc`` per group, after the clash check: a republished identical event takes none) and then
inserts the events, each with its ``seq`` and ``published_ms``. A claim claims a group's claimable
stretch first and reads the gate after (the gate only moves forward, so a gate that lets the
stretch go after the claim let it go at the claim); a stretch the gate holds back is given back
(attempt included) and postponed with the group's other blocked events in one more ``bulk_write``. A place that never got
its event (the publisher died between the two steps, or its insert was undone after a clash) or
whose event is finished while the gate was not moved (a worker died between the two writes of
``finish_many``) would hold its group forever: a claim held back at such a place, whose stretch's
first event was published at least 60 s ago (so the place before it was taken even earlier),
looks up the places before the stretch (one ``find``) and moves the gate past every one of
them that has no event or a finished one, up to the first event on its way. So a publisher stalled for more
than 60 s between taking its place and inserting its event can see that event delivered after
later events of its group (never lost). A place-taking ``$inc`` sent again after its response was
lost takes its places twice: the first ones stay empty and are skipped the same way (the group's
next events wait those 60 s once).

Publishing several events: MongoDB has no multi-document atomic write outside a replica-set
transaction, so ``publish`` first reads every id (one query) and refuses the batch if any is
taken; then it inserts them in one ordered ``insert_many``. If a racing publisher inserted one of
the ids in between, the events this call inserted are deleted again (only those still pending
and never claimed: a worker may have claimed one in that moment, and an event being delivered
must not vanish; that case is logged) and the clash is reported. A process that dies in the
middle of the insert can leave a prefix of the batch published; publishing the same batch again completes it
(republishing an identical event is a no-op). ``backend.transaction()`` is not offered on MongoDB
(the collector speaks DynamoDB's transaction API).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import pymongo
from pymongo import ReturnDocument
from pymongo.errors import BulkWriteError, DuplicateKeyError

from ...errors import NotSupportedError, OutboxError
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
from ...outbox._gates import by_group as ordered_by_group
from ...outbox._gates import gate_move
from ...outbox._race import race_rounds
from ...outbox.event import check_event_size
from ._collection import MongoCollection

__all__ = ["MongoOutboxStore"]

_IN_FLIGHT = EventStatus.IN_FLIGHT.value
_GATE_SK = "GROUP"
#: The statuses a claim takes an event from (pending, or in flight with an expired lease).
_CLAIMABLE = (EventStatus.PENDING, EventStatus.IN_FLIGHT)
#: The widest place in a group the size check of a publish allows for (15 digits).
_WIDEST_SEQ = 10**15 - 1
#: A group's next place that has no event (or a finished one) is skipped once the stretch behind it
#: was published this long ago: its publisher took the place earlier and has not written it.
HOLE_WAIT_MS = 60_000

logger = logging.getLogger(__name__)


class MongoOutboxStore:
    def __init__(self, coll: MongoCollection, namespace: str) -> None:
        self._coll = coll
        self._ns = namespace

    @property
    def shards(self) -> int:
        return 1

    def refresh_shards(self) -> int:
        return 1  # one index partition per status on MongoDB, whoever publishes

    def _key(self, event_id: str) -> dict[str, Any]:
        return outbox_key(self._ns, event_id, status="", due_ms=0).primary

    def _gate_key(self, group: str) -> dict[str, Any]:
        return {"pk": f"{Kind.OUTBOX.value}#{self._ns}#{group}", "sk": _GATE_SK}

    def _gpk(self, status: EventStatus) -> str:
        return outbox_index_pk(self._ns, status.value, 0)

    def _doc(self, event: Event, now_ms: int) -> dict[str, Any]:
        due = min(event.occurred_at_ms, now_ms)
        k = outbox_key(self._ns, event.id, status=EventStatus.PENDING.value, due_ms=due)
        # An ordered event's place is taken after the clash check; the size check counts the
        # widest place.
        seq = _WIDEST_SEQ if event.ordered else None
        doc = {**k.as_dict(), **pending_fields(event, due, seq)}
        if event.ordered:
            doc["published_ms"] = now_ms
        # Same size limit as the DynamoDB item, so an event fits every backend.
        check_event_size(doc, key=event.id)
        return doc

    # -- publishing ------------------------------------------------------------------------------

    def _clashes(self, events: Sequence[Event], now_ms: int) -> dict[str, EventRecord | None]:
        by_pk = {self._key(e.id)["pk"]: e.id for e in events}
        found = self._coll.find("outbox publish", {"pk": {"$in": list(by_pk)}, "sk": "EVENT"})
        clashes: dict[str, EventRecord | None] = {}
        stale = []
        for doc in found:
            record = EventRecord.from_item(doc, now_ms)
            if record is None:
                stale.append(doc["pk"])  # completed and past retention: counts as absent
            else:
                clashes[by_pk[str(doc["pk"])]] = record
        if stale and not clashes:
            self._coll.call(
                "outbox publish",
                "delete_many",
                {"pk": {"$in": stale}, "sk": "EVENT", "expires_at_ms": {"$lte": now_ms}},
            )
        return clashes

    def _take_places(
        self, events: Sequence[Event], docs: list[dict[str, Any]], now_ms: int
    ) -> None:
        """Give each ordered event the next place of its group, in the order of ``events``: one
        ``$inc`` of the group's gate per group (MongoDB cannot write it with the events)."""
        counts: dict[str, int] = {}
        for event in events:
            if event.ordered and event.group is not None:
                counts[event.group] = counts.get(event.group, 0) + 1
        first: dict[str, int] = {}
        for group, count in counts.items():
            update = {
                "$inc": {"published": count},
                "$set": {"published_ms": now_ms},
                "$setOnInsert": {"next_seq": 1},
            }
            try:
                gate = self._coll.call(
                    "outbox publish",
                    "find_one_and_update",
                    self._gate_key(group),
                    update,
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            except DuplicateKeyError:  # a racing publisher created the gate first
                gate = self._coll.call(
                    "outbox publish",
                    "find_one_and_update",
                    self._gate_key(group),
                    update,
                    return_document=ReturnDocument.AFTER,
                )
            first[group] = int(gate["published"]) - count + 1
        for event, doc in zip(events, docs, strict=True):
            if event.ordered and event.group is not None:
                doc["seq"] = first[event.group]
                first[event.group] += 1

    def publish(self, events: Sequence[Event], now_ms: int) -> dict[str, EventRecord | None]:
        docs = [self._doc(event, now_ms) for event in events]
        clashes = self._clashes(events, now_ms)
        if clashes:
            return clashes
        self._take_places(events, docs, now_ms)
        try:
            self._coll.call("outbox publish", "insert_many", docs, ordered=True)
        except (BulkWriteError, DuplicateKeyError) as exc:
            inserted = 0
            if isinstance(exc, BulkWriteError):
                inserted = int(exc.details.get("nInserted", 0))
            if inserted:
                # Roll back the prefix, but only events no worker has claimed yet: deleting a
                # claimed one would make an event that is being delivered vanish from the outbox.
                # (An ordered event rolled back leaves its place empty: a claim skips it later.)
                removed = self._coll.call(
                    "outbox publish",
                    "delete_many",
                    {
                        "_id": {"$in": [d["_id"] for d in docs[:inserted]]},
                        "status": EventStatus.PENDING.value,
                        "attempts": 0,
                    },
                ).deleted_count
                if removed < inserted:
                    logger.warning(
                        "outbox publish refused after %d of %d events were inserted; %d of them "
                        "were already claimed by a worker and stay published",
                        inserted,
                        len(docs),
                        inserted - removed,
                    )
            return self._clashes(events, now_ms) or {events[inserted].id: None}
        return {}

    def transaction_entry(self, event: Event, now_ms: int) -> tuple[Any, int]:
        raise NotSupportedError(
            "the MongoDB backend has no transaction collector: use outbox.publish(...)"
        )

    # -- reading ---------------------------------------------------------------------------------

    def get(self, event_id: str, now_ms: int) -> EventRecord | None:
        return EventRecord.from_item(
            self._coll.call("outbox get", "find_one", self._key(event_id)), now_ms
        )

    def _query(self, status: EventStatus, due_before_ms: int | None, cursor: Any) -> dict[str, Any]:
        sk: dict[str, Any] = {}
        if due_before_ms is not None:
            # gsi1sk is "{due:015d}#{id}": everything due at or before T sorts below T + 1.
            sk["$lt"] = time_sk_bound(due_before_ms + 1)
        if cursor is not None:
            sk["$gt"] = str(cursor)
        query: dict[str, Any] = {"gsi1pk": self._gpk(status)}
        if sk:
            query["gsi1sk"] = sk
        return query

    def query_page(
        self,
        status: EventStatus,
        shard: int,
        *,
        due_before_ms: int | None,
        limit: int,
        cursor: Any = None,
    ) -> tuple[list[EventRecord], Any]:
        docs = self._coll.find(
            "outbox query",
            self._query(status, due_before_ms, cursor),
            sort=("gsi1sk", pymongo.ASCENDING),
            limit=limit + 1,
        )
        more = len(docs) > limit
        docs = docs[:limit]
        records = [r for r in (EventRecord.from_item(d, 0) for d in docs) if r is not None]
        return records, (str(docs[-1]["gsi1sk"]) if more else None)

    def count_page(
        self, status: EventStatus, shard: int, *, due_before_ms: int | None, cursor: Any = None
    ) -> tuple[int, Any]:
        count = self._coll.call(
            "outbox count", "count_documents", self._query(status, due_before_ms, cursor)
        )
        return int(count), None

    # -- claim -------------------------------------------------------------------------------------

    def _as_seen(self, seen: EventRecord) -> dict[str, Any]:
        """The filter "still as ``seen``": status, lease token, attempts and, of an ordered
        event, its place (a redriven event took a new place at its group's tail: an old read
        of it must not claim it at the old one, ahead of the places before its new one)."""
        return {
            **self._key(seen.id),
            "status": seen.status.value,
            "lease_token": seen.lease_token if seen.lease_token else {"$exists": False},
            "attempts": seen.attempts,
            "seq": seen.seq if seen.seq is not None else {"$exists": False},
        }

    def _claimable(self, seen: EventRecord, now_ms: int) -> dict[str, Any]:
        """The filter of a claim, one for both paths: still as ``seen`` and due (a pending
        event whose attempt has come, or an in-flight one whose lease ran out and was not
        renewed since it was read)."""
        return {**self._as_seen(seen), "due_ms": {"$lte": now_ms}}

    def _claim_update(self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int) -> Any:
        return {
            "$set": {
                "status": _IN_FLIGHT,
                "lease_token": token,
                "due_ms": lease_until_ms,
                "gsi1pk": self._gpk(EventStatus.IN_FLIGHT),
                "gsi1sk": outbox_index_sk(lease_until_ms, seen.id),
                "updated_ms": now_ms,
            },
            "$inc": {"attempts": 1},
        }

    def claim(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> EventRecord | None:
        if seen.status not in _CLAIMABLE:
            return None
        if seen.seq is not None:  # its group's gate decides too
            claimed = self.claim_many([seen], [token], lease_until_ms, now_ms)
            return claimed[0] if claimed else None
        # Still as we saw it and due, as a batch's claim. Of two workers racing for it the first
        # write changes the token/status, so the second one's filter no longer matches.
        doc = self._coll.call(
            "outbox claim",
            "find_one_and_update",
            self._claimable(seen, now_ms),
            self._claim_update(seen, token, lease_until_ms, now_ms),
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            # The lease token is this claim's request token: finding it on the event means a
            # retry of this very claim whose first response was lost. The claim is ours.
            doc = self._coll.call(
                "outbox claim", "find_one", {**self._key(seen.id), "lease_token": token}
            )
        return None if doc is None else EventRecord.from_item(doc, now_ms)

    def claim_many(
        self, seen: Sequence[EventRecord], tokens: Sequence[str], lease_until_ms: int, now_ms: int
    ) -> list[EventRecord]:
        if len(seen) != len(tokens):
            raise ValueError("claim_many needs one token per event")
        token_of: dict[str, str] = {}
        for record, token in zip(seen, tokens, strict=True):
            if record.status in _CLAIMABLE:
                token_of.setdefault(record.id, token)
        stretches = claimable_stretches([r for r in seen if r.id in token_of])
        after_gap = {r.id for stretch in stretches.values() for r in stretch.after_gap}
        to_claim = {r.id: r for r in seen if r.id in token_of and r.id not in after_gap}
        # 1. Claim every event still as seen (a stretch's members too: the gate is checked after,
        #    and a claim it refuses is given back).
        ops = [
            pymongo.UpdateMany(  # unique (pk, sk): at most one document (mongomock: no UpdateOne)
                self._claimable(r, now_ms),
                self._claim_update(r, token_of[r.id], lease_until_ms, now_ms),
            )
            for r in to_claim.values()
        ]
        if ops:
            self._coll.call("outbox claim", "bulk_write", ops, ordered=False)
        # 2. Which claims hold (by token: a claim whose first response was lost holds too),
        #    and the gates of the groups, read after the claims.
        query: dict[str, Any] = {
            "pk": {"$in": [self._key(i)["pk"] for i in to_claim]},
            "sk": "EVENT",
            "lease_token": {"$in": [token_of[i] for i in to_claim]},
        }
        if stretches:
            query = {
                "$or": [
                    query,
                    {"pk": {"$in": [self._gate_key(g)["pk"] for g in stretches]}, "sk": _GATE_SK},
                ]
            }
        found = self._coll.find("outbox claim", query) if to_claim else []
        docs = {str(d["event_id"]): d for d in found if d.get("sk") == "EVENT"}
        claimed = {
            i: d for i, d in docs.items() if i in token_of and d.get("lease_token") == token_of[i]
        }
        gates = {str(d["pk"]): d for d in found if d.get("sk") == _GATE_SK}
        # 3. Of each ordered group, what the gate does not let go is given back and postponed.
        give_back: list[tuple[EventRecord, int]] = []
        postpone: list[tuple[EventRecord, int]] = []
        for group, stretch in stretches.items():
            gate = gates.get(self._gate_key(group)["pk"], {})
            head = int(gate.get("next_seq", 1))
            start = claimed.get(stretch.members[0].id)
            if head < stretch.start and start is not None:
                head = self._repair(group, head, stretch.start, start, now_ms)
            later = max(now_ms + ORDERED_RECHECK_MS, int(gate.get("retry_due_ms") or 0))
            open_stretch = head >= stretch.start
            for record in stretch.members:
                if open_stretch and record.id in claimed:
                    continue
                open_stretch = False  # a place someone else holds: the rest of the stretch waits
                if record.id in claimed:
                    give_back.append((record, later))
                    del claimed[record.id]
                else:
                    postpone.append((record, later))
            postpone.extend((record, later) for record in stretch.after_gap)
        if give_back or postpone:
            self._postpone(give_back, postpone, token_of, now_ms)
        records = [EventRecord.from_item(claimed[r.id], now_ms) for r in seen if r.id in claimed]
        return [r for r in records if r is not None]

    def _repair(
        self, group: str, head: int, start: int, start_doc: dict[str, Any], now_ms: int
    ) -> int:
        """The group's next place when a claim of the stretch from ``start`` found it at ``head``.

        A place whose event is finished (completed or failed, its gate update lost with a worker
        that died in between) or missing (a publisher that died between taking the place and
        inserting the event, or a publish undone after a clash) would hold the group forever:
        once the stretch's first event was published ``HOLE_WAIT_MS`` ago (so the place before it
        was taken at least that long ago) the gate moves past it."""
        published = int(start_doc.get("published_ms") or now_ms)
        if now_ms - published < HOLE_WAIT_MS:
            return head
        # Every place from the head up to the stretch: all were taken before the stretch's first
        # event, so all are that old. The gate moves past all the holes at once (one at a
        # time, a group with several needed a claim round each after the wait).
        docs = self._coll.find(
            "outbox claim",
            {
                "pk": {
                    "$gte": f"{Kind.OUTBOX.value}#{self._ns}#",
                    "$lt": f"{Kind.OUTBOX.value}#{self._ns}$",
                },
                "sk": "EVENT",
                "event_group": group,
                "seq": {"$gte": head, "$lt": start},
            },
        )
        on_its_way: set[int] = set()
        finished: dict[int, str] = {}
        for doc in docs:
            record = EventRecord.from_item(doc, now_ms)
            if record is None or record.seq is None:
                continue
            if record.status in _CLAIMABLE:
                on_its_way.add(record.seq)
            else:
                finished[record.seq] = record.status.value
        after = head
        while after < start and after not in on_its_way:
            after += 1
        if after == head:
            return head  # the group's head is on its way
        logger.warning(
            "outbox group %r: places %s have %s; the group moves past them",
            group,
            ", ".join(str(place) for place in range(head, after)),
            ", ".join(
                f"a {finished[place]} event" if place in finished else "no event"
                for place in range(head, after)
            ),
        )
        gate = self._coll.call(
            "outbox claim",
            "find_one_and_update",
            {**self._gate_key(group), "next_seq": head},
            {"$set": {"next_seq": after}, "$unset": {"retry_due_ms": ""}},
            return_document=ReturnDocument.AFTER,
        )
        if gate is None:  # moved meanwhile
            gate = self._coll.call("outbox claim", "find_one", self._gate_key(group)) or {}
        return int(gate.get("next_seq", after))

    def _postpone(
        self,
        give_back: list[tuple[EventRecord, int]],
        postpone: list[tuple[EventRecord, int]],
        token_of: dict[str, str],
        now_ms: int,
    ) -> None:
        """Out of the due queue's way while their group's head is not done: events this claim
        got give their claim back (attempt included); events still as seen are pushed back."""
        ops: list[Any] = []
        for record, due in give_back:
            ops.append(
                pymongo.UpdateMany(
                    {
                        **self._key(record.id),
                        "status": _IN_FLIGHT,
                        "lease_token": token_of[record.id],
                    },
                    {
                        "$set": {
                            "status": EventStatus.PENDING.value,
                            "due_ms": due,
                            "gsi1pk": self._gpk(EventStatus.PENDING),
                            "gsi1sk": outbox_index_sk(due, record.id),
                        },
                        "$unset": {"lease_token": ""},
                        "$inc": {"attempts": -1},
                    },
                )
            )
        for record, due in postpone:
            ops.append(
                pymongo.UpdateMany(
                    {**self._as_seen(record), "due_ms": {"$lt": due}},
                    {"$set": {"due_ms": due, "gsi1sk": outbox_index_sk(due, record.id)}},
                )
            )
        self._coll.call("outbox claim", "bulk_write", ops, ordered=False)

    # -- outcomes ----------------------------------------------------------------------------------

    def _outcome_write(
        self,
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
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(filter, update) of an outcome, conditional on ``token`` holding the event; the
        update is None for a deletion (completed without retention)."""
        held = {**self._key(event_id), "status": _IN_FLIGHT, "lease_token": token}
        if kind == "completed":
            if retention_ms is None:
                return held, None
            expires = now_ms + retention_ms
            return held, {
                "$set": {
                    "status": EventStatus.COMPLETED.value,
                    "completed_ms": now_ms,
                    "updated_ms": now_ms,
                    "expires_at_ms": expires,
                    "expires_at": self._coll.gc_date(expires, now_ms),
                    "finished_by": token,
                },
                "$unset": {"gsi1pk": "", "gsi1sk": "", "lease_token": "", "due_ms": ""},
            }
        if kind == "pending":
            sets: dict[str, Any] = {
                "status": EventStatus.PENDING.value,
                "due_ms": due_ms,
                "gsi1pk": self._gpk(EventStatus.PENDING),
                "gsi1sk": outbox_index_sk(due_ms, event_id),
                "updated_ms": now_ms,
                "finished_by": token,
            }
            if error is not None:
                sets["last_error"] = error
            update: dict[str, Any] = {"$set": sets, "$unset": {"lease_token": ""}}
            if not count_attempt or uncounted:
                update["$inc"] = {"attempts": -(uncounted + (0 if count_attempt else 1))}
            return held, update
        return held, {
            "$set": {
                "status": EventStatus.FAILED.value,
                "due_ms": now_ms,
                "gsi1pk": self._gpk(EventStatus.FAILED),
                "gsi1sk": outbox_index_sk(now_ms, event_id),
                "updated_ms": now_ms,
                "failed_ms": now_ms,
                "last_error": error or "",
                "finished_by": token,
            },
            "$unset": {"lease_token": ""},
        }

    def finish_many(
        self, outcomes: Sequence[Outcome], now_ms: int, retention_ms: int | None
    ) -> list[bool]:
        if not outcomes:
            return []
        ops: list[Any] = []
        for outcome in outcomes:
            where, update = self._outcome_write(
                outcome.record.id,
                outcome.kind,
                outcome.token,
                now_ms,
                retention_ms,
                due_ms=outcome.due_ms,
                error=outcome.error,
                count_attempt=outcome.count_attempt,
                uncounted=outcome.uncounted,
            )
            ops.append(
                pymongo.DeleteOne(where) if update is None else pymongo.UpdateMany(where, update)
            )
        result = self._coll.call("outbox finish", "bulk_write", ops, ordered=False)
        if result.matched_count + result.deleted_count == len(ops):
            written = [True] * len(outcomes)
        else:
            # Which were written: by this call, or by its first attempt whose response was
            # lost (the event shows finished_by = the token, or is gone when deleted).
            docs = {
                str(d["event_id"]): d
                for d in self._coll.find(
                    "outbox finish",
                    {
                        "pk": {"$in": [self._key(o.record.id)["pk"] for o in outcomes]},
                        "sk": "EVENT",
                    },
                )
            }
            written = [
                self._was_written(docs.get(o.record.id), o.token, o.kind, retention_ms)
                for o in outcomes
            ]
        self._move_gates([o for o, ok in zip(outcomes, written, strict=True) if ok])
        return written

    @staticmethod
    def _was_written(
        doc: dict[str, Any] | None, token: str, kind: str, retention_ms: int | None
    ) -> bool:
        if doc is None:
            return kind == "completed" and retention_ms is None
        return doc.get("finished_by") == token

    def _move_gates(self, written: Sequence[Outcome]) -> None:
        """The gate updates of the written outcomes of ordered events: the next place moves past
        every completed or failed one (never back); a retried head sets when the group may move
        again. One request for all groups, none without ordered events."""
        ops: list[Any] = []
        for group, members in ordered_by_group(written).items():
            move = gate_move(members)
            if move is None:
                continue
            key = self._gate_key(group)
            if move.after is not None:
                ops.append(
                    pymongo.UpdateMany(
                        {**key, "next_seq": {"$lt": move.after}},
                        {"$set": {"next_seq": move.after}, "$unset": {"retry_due_ms": ""}},
                    )
                )
            if move.retry_seq is not None:
                ops.append(
                    pymongo.UpdateMany(
                        {**key, "next_seq": move.retry_seq},
                        {"$set": {"retry_due_ms": move.retry_due_ms}},
                    )
                )
        if ops:
            self._coll.call(
                "outbox finish", "bulk_write", ops, ordered=True
            )  # in order: a retry after the moves

    def extend_many(
        self, held: Sequence[EventRecord], lease_until_ms: int, now_ms: int
    ) -> list[bool]:
        if not held:
            return []
        ops = [
            pymongo.UpdateMany(
                {**self._key(r.id), "status": _IN_FLIGHT, "lease_token": r.lease_token or ""},
                {
                    "$set": {
                        "due_ms": lease_until_ms,
                        "gsi1sk": outbox_index_sk(lease_until_ms, r.id),
                        "updated_ms": now_ms,
                    }
                },
            )
            for r in held
        ]
        result = self._coll.call("outbox extend", "bulk_write", ops, ordered=False)
        if result.matched_count == len(ops):
            return [True] * len(held)
        docs = {
            str(d["event_id"]): d
            for d in self._coll.find(
                "outbox extend",
                {"pk": {"$in": [self._key(r.id)["pk"] for r in held]}, "sk": "EVENT"},
            )
        }
        return [
            (d := docs.get(r.id)) is not None
            and d.get("status") == _IN_FLIGHT
            and d.get("lease_token") == r.lease_token
            for r in held
        ]

    def retry_failed(self, event_id: str, now_ms: int, token: str) -> RetryOutcome:
        result = self._coll.call(
            "outbox retry",
            "update_one",
            # Never creates (no upsert); only failed events move, once per retry (its re-sent
            # write after a lost answer must not move the event again if it failed again).
            {
                **self._key(event_id),
                "status": EventStatus.FAILED.value,
                "retried_by": {"$ne": token},
            },
            {
                "$set": {
                    "status": EventStatus.PENDING.value,
                    "attempts": 0,
                    "due_ms": now_ms,
                    "gsi1pk": self._gpk(EventStatus.PENDING),
                    "gsi1sk": outbox_index_sk(now_ms, event_id),
                    "updated_ms": now_ms,
                    "retried_by": token,
                },
                "$inc": {"manual_retries": 1},
            },
        )
        if result.matched_count == 1:
            return "retried"
        stored = self._coll.call("outbox retry", "find_one", self._key(event_id))
        if stored is not None and stored.get("retried_by") == token:
            return "retried"  # this very retry, applied, its answer lost
        return "not_failed" if EventRecord.from_item(stored, now_ms) is not None else "not_found"

    # -- redriving an ordered group's failed events ------------------------------------------------

    def retry_group(
        self, group: str, records: Sequence[EventRecord], now_ms: int, token: str
    ) -> list[str]:
        """As an ordered publish: the places first (one compare-and-set of the gate's publish
        counter), then the events (one ``bulk_write``). An event moved by someone else between
        the two leaves its new place empty, which the next claim skips after 60 s."""
        mine = [r for r in records if r.seq is not None and r.event.group == group]
        if not mine:
            return []
        first = self._take_retry_places(group, len(mine), now_ms, token)
        gpk = self._gpk(EventStatus.PENDING)
        ops = [
            pymongo.UpdateMany(  # unique (pk, sk): at most one document (mongomock: no UpdateOne)
                {
                    **self._key(record.id),
                    "status": EventStatus.FAILED.value,
                    "event_group": group,
                    "seq": record.seq,
                    # once per call: sent again after a lost answer, it finds its own token
                    "retried_by": {"$ne": token},
                },
                {
                    "$set": {
                        "status": EventStatus.PENDING.value,
                        "seq": first + n,
                        "attempts": 0,
                        "due_ms": now_ms,
                        "gsi1pk": gpk,
                        "gsi1sk": outbox_index_sk(now_ms, record.id),
                        "updated_ms": now_ms,
                        "retried_by": token,
                        # the place was taken now: an empty place before it is skipped only
                        # 60 s after this (HOLE_WAIT_MS)
                        "published_ms": now_ms,
                    },
                    "$inc": {"manual_retries": 1},
                },
            )
            for n, record in enumerate(mine)
        ]
        result = self._coll.call("outbox retry", "bulk_write", ops, ordered=True)
        if result.matched_count == len(ops):
            return [r.id for r in mine]
        found = self._coll.find(
            "outbox retry",
            {
                "pk": {"$in": [self._key(r.id)["pk"] for r in mine]},
                "sk": "EVENT",
                "retried_by": token,
            },
            {"event_id": 1},
        )
        moved = {str(d["event_id"]) for d in found}
        return [r.id for r in mine if r.id in moved]

    def _take_retry_places(self, group: str, count: int, now_ms: int, token: str) -> int:
        """The first of ``count`` places taken at the group's tail: the gate's publish counter
        moved from the value read, carrying ``token`` and the first place, so that a move sent
        again after its answer was lost finds its own places instead of taking more."""
        key = self._gate_key(group)
        for _ in race_rounds(time.sleep):  # a racing publisher moved the counter
            gate = self._coll.call("outbox retry", "find_one", key)
            if gate is not None and gate.get("retried_by") == token:
                return int(gate["retry_first"])  # taken by this call, its answer lost
            seen = int(gate.get("published", 0)) if gate is not None else 0
            update = {
                "$set": {
                    "published": seen + count,
                    "published_ms": now_ms,
                    "retried_by": token,
                    "retry_first": seen + 1,
                },
                "$setOnInsert": {"next_seq": 1},
            }
            # still the count read (none: a gate made now, never one a racer made)
            expected = seen if seen else {"$exists": False}
            try:
                taken = self._coll.call(
                    "outbox retry",
                    "find_one_and_update",
                    {**key, "published": expected},
                    update,
                    upsert=gate is None,
                )
            except DuplicateKeyError:  # a racing publisher created the gate first
                continue
            if taken is not None or gate is None:
                return seen + 1
        raise OutboxError(
            f"retry of group {group!r}: racing publishers kept moving the group's counter; "
            "nothing was moved, retry again"
        )
