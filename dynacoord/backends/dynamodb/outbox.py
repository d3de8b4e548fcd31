"""The outbox store on the single table.

Item: ``pk=OUTBOX#{ns}#{event_id}``, ``sk=EVENT``, ``event_id``, ``event_type``, ``payload`` and
``metadata`` (codec JSON text), ``event_group``, ``occurred_at_ms``, ``status``, ``attempts``,
``due_ms``, ``lease_token`` (only while claimed), ``last_error``, ``updated_ms``.

Index: ``gsi1pk=OUTBOX#{ns}#{status}#{shard}``, ``gsi1sk={due_ms:015d}#{event_id}`` for pending,
in_flight and failed; completed events drop both (they leave the index) and get ``expires_at_ms``
and ``ttl`` (the retention). ``due_ms`` is the next attempt time (pending), the lease expiry
(in_flight) or the failure time (failed), so "due pending events" and "in-flight events whose
lease ran out" are the same range query: ``gsi1sk < {now + 1:015d}``.

Every state change after the claim is conditional on ``status = in_flight AND lease_token = :mine``:
a worker whose lease ran out and was taken over cannot change the event any more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ... import codec
from ...errors import InvalidKeyError, TransactionCancelledError
from ...keys import outbox_index_pk, outbox_key, time_sk_bound
from ...outbox import Event, EventRecord, EventStatus, RetryOutcome, pending_fields
from ._table import FREE, ConditionFailedError, DynamoTable, marshal, unmarshal, values
from .transaction import check_transaction_items

__all__ = ["DynamoDBOutboxStore"]

_NAMES = {"#status": "status"}
# Fresh items only; an expired (retention over, not yet swept) completed event counts as absent.
_HOLDS_LEASE = "#status = :in_flight AND lease_token = :token"


class DynamoDBOutboxStore:
    def __init__(self, table: DynamoTable, namespace: str, *, shards: int = 1) -> None:
        self._table = table
        self._ns = namespace
        self._shards = shards

    @property
    def shards(self) -> int:
        return self._shards

    # -- items -----------------------------------------------------------------------------------

    def _index(self, event_id: str, status: EventStatus, due_ms: int) -> tuple[str, str]:
        k = outbox_key(self._ns, event_id, status=status.value, due_ms=due_ms, shards=self._shards)
        assert k.gsi1pk is not None and k.gsi1sk is not None
        return k.gsi1pk, k.gsi1sk

    @staticmethod
    def _publish_due(event: Event, now_ms: int) -> int:
        # Due when it occurred (never later than now). The stored item then depends only on the
        # event, not on the moment of publishing, so a retried TransactWriteItems with the same
        # ClientRequestToken is the identical request DynamoDB recognises.
        return min(event.occurred_at_ms, now_ms)

    def _item(self, event: Event, due_ms: int) -> dict[str, Any]:
        k = outbox_key(
            self._ns, event.id, status=EventStatus.PENDING.value, due_ms=due_ms, shards=self._shards
        )
        item = {**k.as_dict(), **pending_fields(event, due_ms)}
        codec.check_item_size(item, key=event.id)
        return item

    def _put(self, event: Event, now_ms: int, *, stable: bool = False) -> dict[str, Any]:
        due = self._publish_due(event, now_ms)
        return {
            "TableName": self._table.name,
            "Item": marshal(self._item(event, due)),
            # An expired completed event (retention over, not swept yet) counts as absent. In a
            # caller's transaction (``stable``) expiry is judged at ``due`` instead of now, so the
            # request does not depend on the publishing moment and a retry with the same
            # ClientRequestToken is the identical request DynamoDB expects.
            "ConditionExpression": FREE,
            "ExpressionAttributeValues": values(now=due if stable else now_ms),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def _key(self, event_id: str) -> dict[str, Any]:
        return marshal(outbox_key(self._ns, event_id, status="", due_ms=0).primary)

    # -- publishing ------------------------------------------------------------------------------

    def publish(self, events: Sequence[Event], now_ms: int) -> dict[str, EventRecord | None]:
        puts = [self._put(event, now_ms) for event in events]
        if len(puts) == 1:
            # One event: a plain conditional PutItem (half the write cost of a transaction).
            put = puts[0]
            try:
                self._table.call(
                    "put_item",
                    Item=put["Item"],
                    ConditionExpression=put["ConditionExpression"],
                    ExpressionAttributeValues=put["ExpressionAttributeValues"],
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ConditionFailedError as failed:
                return {events[0].id: EventRecord.from_item(failed.item, now_ms)}
            return {}
        check_transaction_items([{"Put": p} for p in puts])  # 4 MB: refused before sending
        try:
            self._table.call("transact_write_items", TransactItems=[{"Put": p} for p in puts])
        except TransactionCancelledError as cancelled:
            clashes: dict[str, EventRecord | None] = {}
            for event, reason in zip(events, cancelled.reasons, strict=False):
                if reason.get("Code") == "ConditionalCheckFailed":
                    raw = reason.get("Item")
                    clashes[event.id] = (
                        EventRecord.from_item(unmarshal(raw), now_ms) if raw else None
                    )
            if not clashes:
                raise
            return clashes
        return {}

    def transaction_entry(self, event: Event, now_ms: int) -> dict[str, Any]:
        return {"Put": self._put(event, now_ms, stable=True)}

    # -- reading ---------------------------------------------------------------------------------

    def get(self, event_id: str, now_ms: int) -> EventRecord | None:
        response = self._table.call("get_item", Key=self._key(event_id), ConsistentRead=True)
        raw = response.get("Item")
        return EventRecord.from_item(unmarshal(raw) if raw else None, now_ms)

    def _query_args(
        self, status: EventStatus, shard: int, due_before_ms: int | None, cursor: Any
    ) -> dict[str, Any]:
        condition = "gsi1pk = :gpk"
        args = {"gpk": outbox_index_pk(self._ns, status.value, shard)}
        if due_before_ms is not None:
            # gsi1sk is "{due:015d}#{id}": everything due at or before now sorts below now + 1.
            condition += " AND gsi1sk < :bound"
            args["bound"] = time_sk_bound(due_before_ms + 1)
        kwargs: dict[str, Any] = {
            "IndexName": "gsi1",
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": values(**args),
        }
        if cursor is not None:
            kwargs["ExclusiveStartKey"] = cursor
        return kwargs

    def query_page(
        self,
        status: EventStatus,
        shard: int,
        *,
        due_before_ms: int | None,
        limit: int,
        cursor: Any = None,
    ) -> tuple[list[EventRecord], Any]:
        page = self._table.call(
            "query", Limit=limit, **self._query_args(status, shard, due_before_ms, cursor)
        )
        records = []
        for raw in page.get("Items", []):
            # The index is eventually consistent: it may still list an event in its old status.
            # Claims re-check the item itself, so a stale entry costs one failed condition.
            record = EventRecord.from_item(unmarshal(raw), 0)
            if record is not None:
                records.append(record)
        return records, page.get("LastEvaluatedKey")

    def count_page(
        self, status: EventStatus, shard: int, *, due_before_ms: int | None, cursor: Any = None
    ) -> tuple[int, Any]:
        page = self._table.call(
            "query", Select="COUNT", **self._query_args(status, shard, due_before_ms, cursor)
        )
        return int(page.get("Count", 0)), page.get("LastEvaluatedKey")

    # -- claim and state changes -------------------------------------------------------------------

    def claim(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> EventRecord | None:
        if seen.status not in (EventStatus.PENDING, EventStatus.IN_FLIGHT):
            return None
        gpk, gsk = self._index(seen.id, EventStatus.IN_FLIGHT, lease_until_ms)
        # Still as we saw it (status and lease token) and due: a pending event whose next attempt
        # has come, or an in-flight one whose lease has run out (its worker died or overran).
        # Two workers racing for it: the first write changes the token/status, the second fails.
        condition = "#status = :expected AND due_ms <= :now AND "
        args: dict[str, Any] = {
            "expected": seen.status.value,
            "now": now_ms,
            "in_flight": EventStatus.IN_FLIGHT.value,
            "token": token,
            "until": lease_until_ms,
            "gpk": gpk,
            "gsk": gsk,
            "zero": 0,
            "one": 1,
        }
        if seen.lease_token is None:
            condition += "attribute_not_exists(lease_token)"
        else:
            condition += "lease_token = :seen"
            args["seen"] = seen.lease_token
        try:
            response = self._table.call(
                "update_item",
                Key=self._key(seen.id),
                ConditionExpression=condition,
                UpdateExpression=(
                    "SET #status = :in_flight, lease_token = :token, due_ms = :until, "
                    "attempts = if_not_exists(attempts, :zero) + :one, gsi1pk = :gpk, "
                    "gsi1sk = :gsk, updated_ms = :now"
                ),
                ExpressionAttributeNames=_NAMES,
                ExpressionAttributeValues=values(**args),
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            # The lease token is this claim's request token: a refusal that shows it is a retry
            # of this very claim whose first response was lost. The claim is ours.
            if failed.item is not None and failed.item.get("lease_token") == token:
                return EventRecord.from_item(failed.item, now_ms)
            return None
        return EventRecord.from_item(unmarshal(response["Attributes"]), now_ms)

    def _if_held(
        self,
        event_id: str,
        token: str,
        update: str,
        names: dict[str, str] | None = None,
        **args: Any,
    ) -> bool:
        try:
            self._table.call(
                "update_item",
                Key=self._key(event_id),
                ConditionExpression=_HOLDS_LEASE,
                UpdateExpression=update,
                ExpressionAttributeNames={**_NAMES, **(names or {})},
                ExpressionAttributeValues=values(
                    in_flight=EventStatus.IN_FLIGHT.value, token=token, **args
                ),
            )
        except ConditionFailedError:
            return False
        return True

    def extend(self, event_id: str, token: str, lease_until_ms: int, now_ms: int) -> bool:
        _, gsk = self._index(event_id, EventStatus.IN_FLIGHT, lease_until_ms)
        return self._if_held(
            event_id,
            token,
            "SET due_ms = :until, gsi1sk = :gsk, updated_ms = :now",
            until=lease_until_ms,
            gsk=gsk,
            now=now_ms,
        )

    def complete(self, event_id: str, token: str, now_ms: int, retention_ms: int | None) -> bool:
        if retention_ms is None:
            try:
                self._table.call(
                    "delete_item",
                    Key=self._key(event_id),
                    ConditionExpression=_HOLDS_LEASE,
                    ExpressionAttributeNames=_NAMES,
                    ExpressionAttributeValues=values(
                        in_flight=EventStatus.IN_FLIGHT.value, token=token
                    ),
                )
            except ConditionFailedError:
                return False
            return True
        expires = now_ms + retention_ms
        return self._if_held(
            event_id,
            token,
            "SET #status = :completed, completed_ms = :now, updated_ms = :now, "
            "expires_at_ms = :exp, #ttl = :ttl REMOVE gsi1pk, gsi1sk, lease_token, due_ms",
            {"#ttl": "ttl"},
            completed=EventStatus.COMPLETED.value,
            now=now_ms,
            exp=expires,
            ttl=math.ceil(expires / 1000),
        )

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
        gpk, gsk = self._index(event_id, EventStatus.PENDING, due_ms)
        update = (
            "SET #status = :pending, due_ms = :due, gsi1pk = :gpk, gsi1sk = :gsk, updated_ms = :now"
        )
        args: dict[str, Any] = {
            "pending": EventStatus.PENDING.value,
            "due": due_ms,
            "gpk": gpk,
            "gsk": gsk,
            "now": now_ms,
        }
        if error is not None:
            update += ", last_error = :err"
            args["err"] = error
        if not count_attempt:
            update += ", attempts = attempts - :one"
            args["one"] = 1
        return self._if_held(event_id, token, update + " REMOVE lease_token", **args)

    def fail(self, event_id: str, token: str, error: str, now_ms: int) -> bool:
        gpk, gsk = self._index(event_id, EventStatus.FAILED, now_ms)
        return self._if_held(
            event_id,
            token,
            "SET #status = :failed, due_ms = :now, gsi1pk = :gpk, gsi1sk = :gsk, "
            "updated_ms = :now, failed_ms = :now, last_error = :err REMOVE lease_token",
            failed=EventStatus.FAILED.value,
            now=now_ms,
            gpk=gpk,
            gsk=gsk,
            err=error,
        )

    def retry_failed(self, event_id: str, now_ms: int) -> RetryOutcome:
        gpk, gsk = self._index(event_id, EventStatus.PENDING, now_ms)
        try:
            self._table.call(
                "update_item",
                Key=self._key(event_id),
                # Never creates: an unknown id fails attribute_exists; only failed events move.
                ConditionExpression="attribute_exists(pk) AND #status = :failed",
                UpdateExpression=(
                    "SET #status = :pending, attempts = :zero, due_ms = :now, gsi1pk = :gpk, "
                    "gsi1sk = :gsk, updated_ms = :now, manual_retries = "
                    "if_not_exists(manual_retries, :zero) + :one"
                ),
                ExpressionAttributeNames=_NAMES,
                ExpressionAttributeValues=values(
                    failed=EventStatus.FAILED.value,
                    pending=EventStatus.PENDING.value,
                    zero=0,
                    one=1,
                    now=now_ms,
                    gpk=gpk,
                    gsk=gsk,
                ),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            return (
                "not_found" if EventRecord.from_item(failed.item, now_ms) is None else "not_failed"
            )
        return "retried"

    # -- stream images (issue 15: the stream relay) -----------------------------------------------

    def stream_record(self, image: Mapping[str, Any], now_ms: int) -> EventRecord | None:
        """The event a DynamoDB stream image (DynamoDB JSON, as Lambda delivers it) holds if it
        is an outbox event of this namespace, else None. No request: it reads what the stream
        carried, and the relay's claim re-checks the item itself."""
        raw_id = image.get("event_id")
        event_id = raw_id.get("S") if isinstance(raw_id, Mapping) else None
        if not isinstance(event_id, str):
            return None
        try:
            key = self._key(event_id)
        except InvalidKeyError:
            return None
        if image.get("pk") != key["pk"] or image.get("sk") != key["sk"]:
            return None  # another namespace, or not an outbox item
        return EventRecord.from_item(unmarshal(image), now_ms)
