"""The outbox store on MongoDB.

Document: the DynamoDB item's attributes (``pk=OUTBOX#{ns}#{event_id}``, ``sk=EVENT``,
``event_id``, ``event_type``, ``payload``/``metadata`` codec text, ``event_group``,
``occurred_at_ms``, ``status``, ``attempts``, ``due_ms``, ``lease_token`` while claimed,
``last_error``, ``updated_ms``) with ``gsi1pk=OUTBOX#{ns}#{status}#0`` and
``gsi1sk={due_ms:015d}#{event_id}`` while pending, in flight or failed; completed events drop
both and get ``expires_at_ms`` plus ``expires_at`` (TTL monitor). The (gsi1pk, gsi1sk) index makes
"due pending events" and "in-flight events whose lease ran out" one index range, as on DynamoDB.

Every state change after the claim is one ``update_one``/``find_one_and_update`` filtered on
``status = in_flight AND lease_token = mine``.

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
from collections.abc import Sequence
from typing import Any

import pymongo
from pymongo import ReturnDocument
from pymongo.errors import BulkWriteError, DuplicateKeyError

from ... import codec
from ...errors import NotSupportedError
from ...keys import outbox_index_pk, outbox_index_sk, outbox_key, time_sk_bound
from ...outbox import Event, EventRecord, EventStatus, RetryOutcome, pending_fields
from ._collection import MongoCollection, translate_errors

__all__ = ["MongoOutboxStore"]

_IN_FLIGHT = EventStatus.IN_FLIGHT.value

logger = logging.getLogger(__name__)


class MongoOutboxStore:
    def __init__(self, coll: MongoCollection, namespace: str) -> None:
        self._coll = coll
        self._c = coll.collection
        self._ns = namespace

    @property
    def shards(self) -> int:
        return 1

    def _key(self, event_id: str) -> dict[str, Any]:
        return outbox_key(self._ns, event_id, status="", due_ms=0).primary

    def _gpk(self, status: EventStatus) -> str:
        return outbox_index_pk(self._ns, status.value, 0)

    def _doc(self, event: Event, now_ms: int) -> dict[str, Any]:
        due = min(event.occurred_at_ms, now_ms)
        k = outbox_key(self._ns, event.id, status=EventStatus.PENDING.value, due_ms=due)
        doc = {**k.as_dict(), **pending_fields(event, due)}
        # Same size limit as the DynamoDB item, so an event fits every backend.
        codec.check_item_size(doc, key=event.id)
        return doc

    # -- publishing ------------------------------------------------------------------------------

    def _clashes(self, events: Sequence[Event], now_ms: int) -> dict[str, EventRecord | None]:
        by_pk = {self._key(e.id)["pk"]: e.id for e in events}
        with translate_errors("outbox publish"):
            found = list(self._c.find({"pk": {"$in": list(by_pk)}, "sk": "EVENT"}))
        clashes: dict[str, EventRecord | None] = {}
        stale = []
        for doc in found:
            record = EventRecord.from_item(doc, now_ms)
            if record is None:
                stale.append(doc["pk"])  # completed and past retention: counts as absent
            else:
                clashes[by_pk[str(doc["pk"])]] = record
        if stale and not clashes:
            with translate_errors("outbox publish"):
                self._c.delete_many(
                    {"pk": {"$in": stale}, "sk": "EVENT", "expires_at_ms": {"$lte": now_ms}}
                )
        return clashes

    def publish(self, events: Sequence[Event], now_ms: int) -> dict[str, EventRecord | None]:
        docs = [self._doc(event, now_ms) for event in events]
        clashes = self._clashes(events, now_ms)
        if clashes:
            return clashes
        try:
            with translate_errors("outbox publish"):
                self._c.insert_many(docs, ordered=True)
        except (BulkWriteError, DuplicateKeyError) as exc:
            inserted = 0
            if isinstance(exc, BulkWriteError):
                inserted = int(exc.details.get("nInserted", 0))
            if inserted:
                # Roll back the prefix, but only events no worker has claimed yet: deleting a
                # claimed one would make an event that is being delivered vanish from the outbox.
                with translate_errors("outbox publish"):
                    removed = self._c.delete_many(
                        {
                            "_id": {"$in": [d["_id"] for d in docs[:inserted]]},
                            "status": EventStatus.PENDING.value,
                            "attempts": 0,
                        }
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

    def transaction_entry(self, event: Event, now_ms: int) -> Any:
        raise NotSupportedError(
            "the MongoDB backend has no transaction collector: use outbox.publish(...)"
        )

    # -- reading ---------------------------------------------------------------------------------

    def get(self, event_id: str, now_ms: int) -> EventRecord | None:
        with translate_errors("outbox get"):
            return EventRecord.from_item(self._c.find_one(self._key(event_id)), now_ms)

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
        with translate_errors("outbox query"):
            docs = list(
                self._c.find(self._query(status, due_before_ms, cursor))
                .sort("gsi1sk", pymongo.ASCENDING)
                .limit(limit + 1)
            )
        more = len(docs) > limit
        docs = docs[:limit]
        records = [r for r in (EventRecord.from_item(d, 0) for d in docs) if r is not None]
        return records, (str(docs[-1]["gsi1sk"]) if more else None)

    def count_page(
        self, status: EventStatus, shard: int, *, due_before_ms: int | None, cursor: Any = None
    ) -> tuple[int, Any]:
        with translate_errors("outbox count"):
            count = self._c.count_documents(self._query(status, due_before_ms, cursor))
        return int(count), None

    # -- claim and state changes -------------------------------------------------------------------

    def claim(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> EventRecord | None:
        if seen.status not in (EventStatus.PENDING, EventStatus.IN_FLIGHT):
            return None
        # Still as we saw it (status and lease token) and due. Of two workers racing for it the
        # first write changes the token/status, so the second one's filter no longer matches.
        query = {
            **self._key(seen.id),
            "status": seen.status.value,
            "due_ms": {"$lte": now_ms},
            "lease_token": seen.lease_token if seen.lease_token else {"$exists": False},
        }
        with translate_errors("outbox claim"):
            doc = self._c.find_one_and_update(
                query,
                {
                    "$set": {
                        "status": _IN_FLIGHT,
                        "lease_token": token,
                        "due_ms": lease_until_ms,
                        "gsi1pk": self._gpk(EventStatus.IN_FLIGHT),
                        "gsi1sk": outbox_index_sk(lease_until_ms, seen.id),
                        "updated_ms": now_ms,
                    },
                    "$inc": {"attempts": 1},
                },
                return_document=ReturnDocument.AFTER,
            )
            if doc is None:
                # The lease token is this claim's request token: finding it on the event means a
                # retry of this very claim whose first response was lost. The claim is ours.
                doc = self._c.find_one({**self._key(seen.id), "lease_token": token})
        return None if doc is None else EventRecord.from_item(doc, now_ms)

    def _if_held(self, event_id: str, token: str, update: dict[str, Any], what: str) -> bool:
        with translate_errors(what):
            result = self._c.update_one(
                {**self._key(event_id), "status": _IN_FLIGHT, "lease_token": token}, update
            )
        return bool(result.matched_count == 1)

    def extend(self, event_id: str, token: str, lease_until_ms: int, now_ms: int) -> bool:
        update = {
            "$set": {
                "due_ms": lease_until_ms,
                "gsi1sk": outbox_index_sk(lease_until_ms, event_id),
                "updated_ms": now_ms,
            }
        }
        return self._if_held(event_id, token, update, "outbox extend")

    def complete(self, event_id: str, token: str, now_ms: int, retention_ms: int | None) -> bool:
        if retention_ms is None:
            with translate_errors("outbox complete"):
                result = self._c.delete_one(
                    {**self._key(event_id), "status": _IN_FLIGHT, "lease_token": token}
                )
            return bool(result.deleted_count == 1)
        expires = now_ms + retention_ms
        update = {
            "$set": {
                "status": EventStatus.COMPLETED.value,
                "completed_ms": now_ms,
                "updated_ms": now_ms,
                "expires_at_ms": expires,
                "expires_at": self._coll.gc_date(expires, now_ms),
            },
            "$unset": {"gsi1pk": "", "gsi1sk": "", "lease_token": "", "due_ms": ""},
        }
        return self._if_held(event_id, token, update, "outbox complete")

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
        sets: dict[str, Any] = {
            "status": EventStatus.PENDING.value,
            "due_ms": due_ms,
            "gsi1pk": self._gpk(EventStatus.PENDING),
            "gsi1sk": outbox_index_sk(due_ms, event_id),
            "updated_ms": now_ms,
        }
        if error is not None:
            sets["last_error"] = error
        update: dict[str, Any] = {"$set": sets, "$unset": {"lease_token": ""}}
        if not count_attempt:
            update["$inc"] = {"attempts": -1}
        return self._if_held(event_id, token, update, "outbox reschedule")

    def fail(self, event_id: str, token: str, error: str, now_ms: int) -> bool:
        update = {
            "$set": {
                "status": EventStatus.FAILED.value,
                "due_ms": now_ms,
                "gsi1pk": self._gpk(EventStatus.FAILED),
                "gsi1sk": outbox_index_sk(now_ms, event_id),
                "updated_ms": now_ms,
                "failed_ms": now_ms,
                "last_error": error,
            },
            "$unset": {"lease_token": ""},
        }
        return self._if_held(event_id, token, update, "outbox fail")

    def retry_failed(self, event_id: str, now_ms: int) -> RetryOutcome:
        with translate_errors("outbox retry"):
            result = self._c.update_one(
                # Never creates (no upsert); only failed events move.
                {**self._key(event_id), "status": EventStatus.FAILED.value},
                {
                    "$set": {
                        "status": EventStatus.PENDING.value,
                        "attempts": 0,
                        "due_ms": now_ms,
                        "gsi1pk": self._gpk(EventStatus.PENDING),
                        "gsi1sk": outbox_index_sk(now_ms, event_id),
                        "updated_ms": now_ms,
                    },
                    "$inc": {"manual_retries": 1},
                },
            )
        if result.matched_count == 1:
            return "retried"
        return "not_failed" if self.get(event_id, now_ms) is not None else "not_found"
