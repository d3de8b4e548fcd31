"""The outbox store on the single table.

Item: ``pk=OUTBOX#{ns}#{event_id}``, ``sk=EVENT``, ``event_id``, ``event_type``, ``payload`` and
``metadata`` (codec JSON text), ``event_group``, ``occurred_at_ms``, ``status``, ``attempts``,
``due_ms``, ``lease_token`` (only while claimed), ``last_error``, ``updated_ms``, ``seq`` for an
ordered event, ``finished_by`` (the lease token whose outcome was written last) and
``retried_by`` (the token of the last ``outbox.retry``; an ordered group's gate carries the
token of the last ``retry(group=...)`` transaction too): a write sent again after its answer was
lost finds its own token and recognises itself.

Index: ``gsi1pk=OUTBOX#{ns}#{status}#{shard}``, ``gsi1sk={due_ms:015d}#{event_id}`` for pending,
in_flight and failed; completed events drop both (they leave the index) and get ``expires_at_ms``
and ``ttl`` (the retention). ``due_ms`` is the next attempt time (pending), the lease expiry
(in_flight) or the failure time (failed), so "due pending events" and "in-flight events whose
lease ran out" are the same range query: ``gsi1sk < {now + 1:015d}``.

Every state change after the claim is conditional on ``status = in_flight AND lease_token = :mine``:
a worker whose lease ran out and was taken over cannot change the event any more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from ...errors import (
    NotSupportedError,
    TransactionCancelledError,
    ValueTooLargeError,
)
from ...keys import (
    Kind,
    outbox_index_pk,
    time_sk_bound,
    validate_key,
)
from ...outbox import (
    ORDERED_RECHECK_MS,
    Event,
    EventRecord,
    EventStatus,
    Outcome,
    RetryOutcome,
)
from ...outbox._claimable import claimable_stretches
from ...outbox._gates import by_group as ordered_by_group
from ...outbox._race import race_rounds
from ._batch import Answers, BatchWriter, Entry
from ._limits import (
    MAX_TRANSACTION_BYTES,
    MAX_TRANSACTION_ITEMS,
    check_transaction_items,
)
from ._marshal import marshal, unmarshal, values
from ._outbox_items import OutboxItems, event_record
from ._outbox_requests import NAMES, OutboxRequests, still_as_seen
from ._outbox_stream import StreamDeliveryStore
from ._table import FREE, ConditionFailedError, DynamoTable

__all__ = ["DynamoDBOutboxStore"]

logger = logging.getLogger(__name__)

#: An upper bound on the bytes of one number-valued expression value (name and number).
_EXPRESSION_VALUE_BOUND = 64
#: Transaction cancellation codes worth sending the request again for.
_RETRY_CODES = ("ConditionalCheckFailed", "TransactionConflict")
#: How the backoff waits (a module attribute, so a test can replace it).
_sleep = time.sleep
#: At most this many events of one ordered group are claimed in one batch (the group's gate and
#: its events' outcomes must fit one transaction).
_MAX_STRETCH = 50
#: At most this many events of a group move in one ``retry(group=...)`` transaction (with the
#: group's gate: 100 items, the TransactWriteItems limit).
_REDRIVE_CHUNK = MAX_TRANSACTION_ITEMS - 1


class DynamoDBOutboxStore(StreamDeliveryStore):
    """The outbox on the single table (see the module docstring); what the stream relay needs
    besides is in its base, :class:`~._outbox_stream.StreamDeliveryStore`."""

    def __init__(self, table: DynamoTable, namespace: str, *, shards: int = 1) -> None:
        self._table = table
        self._ns = namespace
        self._own_shards = shards
        self._recorded_shards: int | None = None  # the namespace's count, once read
        self._shards_written = shards <= 1  # one shard needs no record: every worker reads it
        self._items = OutboxItems(namespace, shards)
        self._requests = OutboxRequests(table.name, self._items)
        self._batch = BatchWriter(
            table,
            probe_key=marshal({"pk": f"{Kind.OUTBOX.value}#{namespace}#~", "sk": "PARTIQL-PROBE"}),
        )

    # -- the namespace's shard count ----------------------------------------------------------------
    # Publishers record the most shards they use on one item; workers read it and poll that many,
    # so a publisher with more shards than a worker can never strand events.

    @property
    def shards(self) -> int:
        if self._recorded_shards is None:
            return self.refresh_shards()
        return max(self._own_shards, self._recorded_shards)

    def refresh_shards(self) -> int:
        response = self._table.call("get_item", Key=self._items.meta_key(), ConsistentRead=True)
        raw = response.get("Item")
        self._recorded_shards = int(unmarshal(raw)["shards"]) if raw else 0
        return max(self._own_shards, self._recorded_shards)

    def _record_shards(self) -> None:
        """Once per store: make the namespace's recorded shard count at least this store's.

        Called before every write that places an index entry (a publish, a claim, an outcome, a
        lease extension, a retry, a postpone): an entry on a shard beyond the recorded count is
        on a partition no reader with fewer shards polls, so a worker configured with more
        shards than the namespace's publishers would strand the events it claims and dies with,
        gives back or fails. No request when the count read already covers
        this store's (the count never goes down)."""
        if self._shards_written:
            return
        if self._recorded_shards is not None and self._recorded_shards >= self._own_shards:
            self._shards_written = True
            return
        with contextlib.suppress(ConditionFailedError):  # already as many or more
            self._table.call(
                "update_item",
                Key=self._items.meta_key(),
                UpdateExpression="SET shards = :n",
                ConditionExpression="attribute_not_exists(shards) OR shards < :n",
                ExpressionAttributeValues=values(n=self._own_shards),
            )
        self._shards_written = True

    # -- items -----------------------------------------------------------------------------------

    def _put(
        self, event: Event, now_ms: int, *, stable: bool = False, seq: int | None = None
    ) -> dict[str, Any]:
        put, _ = self._put_and_bound(event, now_ms, stable=stable, seq=seq)
        return put

    def _put_and_bound(
        self, event: Event, now_ms: int, *, stable: bool = False, seq: int | None = None
    ) -> tuple[dict[str, Any], int]:
        item, bound = self._items.item(event, now_ms, seq)
        return {
            "TableName": self._table.name,
            "Item": item,
            # An expired completed event (retention over, not swept yet) counts as absent. In a
            # caller's transaction (``stable``) expiry is judged at ``due`` instead of now, so the
            # request does not depend on the publishing moment and a retry with the same
            # ClientRequestToken is the identical request DynamoDB expects.
            "ConditionExpression": FREE,
            "ExpressionAttributeValues": {
                ":now": {"N": item["due_ms"]["N"] if stable else str(now_ms)}
            },
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }, bound + _EXPRESSION_VALUE_BOUND  # the item's bound, plus ":now" (a number)

    def _key(self, event_id: str) -> dict[str, Any]:
        """The key of event ``event_id``'s item."""
        return self._items.key(event_id)

    # -- publishing ------------------------------------------------------------------------------

    def publish(self, events: Sequence[Event], now_ms: int) -> dict[str, EventRecord | None]:
        self._record_shards()
        if len(events) == 1 and not events[0].ordered:
            return self._publish_one(events[0], now_ms)
        if any(event.ordered for event in events):
            return self._publish_ordered(events, now_ms)
        puts = []
        bounds = 0
        for event in events:
            put, bound = self._put_and_bound(event, now_ms)
            puts.append({"Put": put})
            bounds += bound
        # 4 MB of item data at most: checked exactly only when the bounds do not prove it.
        return self._write_puts(events, puts, now_ms, checked=bounds <= MAX_TRANSACTION_BYTES)

    def _publish_one(self, event: Event, now_ms: int) -> dict[str, EventRecord | None]:
        """One unordered event: a plain conditional PutItem (half the write cost of a
        transaction), the Put of :meth:`_put_and_bound`."""
        item, _ = self._items.item(event, now_ms)
        try:
            self._table.put_free(item, now_ms)
        except ConditionFailedError as failed:
            return {event.id: event_record(failed.raw, now_ms)}
        return {}

    def _write_puts(
        self,
        events: Sequence[Event],
        items: list[dict[str, Any]],
        now_ms: int,
        *,
        checked: bool = False,
    ) -> dict[str, EventRecord | None]:
        """One transaction whose first ``len(events)`` items put ``events``; the clashing ids
        with their stored records if a put's condition failed (then nothing was written)."""
        if not checked:
            check_transaction_items(items)  # 4 MB: refused before sending
        try:
            self._table.call("transact_write_items", TransactItems=items)
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

    def _publish_ordered(
        self, events: Sequence[Event], now_ms: int
    ) -> dict[str, EventRecord | None]:
        # Each ordered event takes the next place in its group: read the groups' gates, then
        # write the events with their places and the gates' new counts in one transaction,
        # conditional on the counts read (a racing publisher makes us read again).
        groups = sorted({e.group for e in events if e.ordered and e.group is not None})
        for group in groups:
            validate_key(group, "event group")
        # Lost the race for a gate: apart from the other losers before reading again.
        for _ in race_rounds(_sleep):
            published = {group: self._gate(group).get("published", 0) for group in groups}
            places = dict(published)
            seqs: list[int | None] = []
            for event in events:
                if event.ordered and event.group is not None:
                    places[event.group] += 1
                    seqs.append(places[event.group])
                else:
                    seqs.append(None)
            items: list[dict[str, Any]] = [
                {"Put": self._put(event, now_ms, seq=seq)}
                for event, seq in zip(events, seqs, strict=True)
            ]
            for group in groups:
                items.append(
                    {
                        "Update": self._requests.gate_publish(
                            group, published[group], places[group], now_ms
                        )
                    }
                )
            try:
                return self._write_puts(events, items, now_ms)
            except TransactionCancelledError as cancelled:
                gates = cancelled.reasons[len(events) :]
                if not any(r.get("Code") in _RETRY_CODES for r in gates) and not any(
                    r.get("Code") == "TransactionConflict" for r in cancelled.reasons
                ):
                    raise
        raise TransactionCancelledError(
            f"ordered publish: the groups {groups!r} kept changing under racing publishers; "
            "nothing was written, publish again",
            reasons=[],
        )

    def _gate(self, group: str) -> dict[str, Any]:
        response = self._table.call(
            "get_item", Key=self._items.gate_key(group), ConsistentRead=True
        )
        raw = response.get("Item")
        return unmarshal(raw) if raw else {}

    def transaction_entry(self, event: Event, now_ms: int) -> tuple[dict[str, Any], int]:
        if event.ordered:
            raise NotSupportedError(
                "an ordered event takes its place in its group when published: publish it with "
                "backend.outbox.publish() (one transaction with the group's gate), not inside "
                "backend.transaction()"
            )
        if not self._shards_written:
            self._record_shards()
        put, bound = self._put_and_bound(event, now_ms, stable=True)
        return {"Put": put}, bound

    # -- reading ---------------------------------------------------------------------------------

    def get(self, event_id: str, now_ms: int) -> EventRecord | None:
        return event_record(self._table.get_raw(self._items.key(event_id)), now_ms)

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
            record = event_record(raw, 0)
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
        if seen.seq is not None:
            # An ordered event is claimed with its group's gate (a transaction).
            claimed = self.claim_many([seen], [token], lease_until_ms, now_ms)
            return claimed[0] if claimed else None
        return self._claim_one(seen, token, lease_until_ms, now_ms)

    def _claim_one(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> EventRecord | None:
        """One unordered event, one conditional UpdateItem. Written, the event is as seen with
        the claim's changes (its condition held the item as seen), as a batch's claims are."""
        if seen.status not in (EventStatus.PENDING, EventStatus.IN_FLIGHT):
            return None
        self._record_shards()
        # The claim of a batch (still as seen: status, lease token, attempts; and due), sent
        # alone as the plain update it is, answering the claimed item.
        op = dict(self._requests.claim(seen, token, lease_until_ms, now_ms))
        op.pop("TableName")
        try:
            self._table.call("update_item", **op)
        except ConditionFailedError as failed:
            # The lease token is this claim's request token: a refusal that shows it is a retry
            # of this very claim whose first response was lost. The claim is ours.
            if failed.item is not None and failed.item.get("lease_token") == token:
                return EventRecord.from_item(failed.item, now_ms)
            return None
        except ValueTooLargeError as too_large:
            self._fail_unclaimable(seen, str(too_large), now_ms)
            return None
        return _as_claimed(seen, token, lease_until_ms)

    def _fail_unclaimable(self, seen: EventRecord, message: str, now_ms: int) -> None:
        """Store ``seen`` as failed when the store refuses to claim it for its own item (it
        fills the item limit: written by hand, or by a writer that left no room for delivery).
        Left pending it would take a place in every poll and never be delivered. The write
        keeps the item's size (a shorter status, no error text) when even a short error does
        not fit; conditional on the event still being as seen. An ordered event is left where
        it is (failing it must move its group's gate): its group waits, and the log says why."""
        if seen.seq is not None:
            logger.error(
                "outbox: ordered event %r cannot be claimed (%s); its group %r waits: remove "
                "or shrink the item, then `dynacoord outbox retry`",
                seen.id,
                message,
                seen.event.group,
            )
            return
        gpk, gsk = self._items.record_index(seen.event, EventStatus.FAILED, now_ms)
        condition, args = still_as_seen(seen, now_ms)
        args.update(failed=EventStatus.FAILED.value, gpk=gpk, gsk=gsk)
        error = f"not deliverable: the store refused to claim it ({message[:300]})"
        short = "too large to claim"
        failed = "SET #status = :failed, due_ms = :now, gsi1pk = :gpk, gsi1sk = :gsk"
        # the longest write that fits: the whole story, a short one, or the status alone
        updates: tuple[tuple[str, dict[str, Any]], ...] = (
            (failed + ", updated_ms = :now, failed_ms = :now, last_error = :err", {"err": error}),
            (failed + ", last_error = :err", {"err": short}),
            (failed, {}),
        )
        for update, extra in updates:
            try:
                self._table.call(
                    "update_item",
                    Key=self._items.key(seen.id),
                    ConditionExpression=condition,
                    UpdateExpression=update + (" REMOVE lease_token" if seen.lease_token else ""),
                    ExpressionAttributeNames=NAMES,
                    ExpressionAttributeValues=values(**args, **extra),
                )
            except ConditionFailedError:
                return  # moved meanwhile: whoever moved it has it
            except ValueTooLargeError:
                continue
            logger.error("outbox: event %r marked failed: %s", seen.id, error)
            return
        logger.error("outbox: event %r cannot be claimed nor marked failed: %s", seen.id, message)

    # -- batches ----------------------------------------------------------------------------------

    def claim_many(
        self, seen: Sequence[EventRecord], tokens: Sequence[str], lease_until_ms: int, now_ms: int
    ) -> list[EventRecord]:
        self._record_shards()
        # Of each ordered group, the stretch of consecutive places from the smallest one seen
        # (events after a gap are left as they are: the next poll looks again).
        stretches = _Stretches({}, {})
        for group, stretch in claimable_stretches(seen).items():
            stretches.starts[group] = stretch.start
            stretches.by_group[group] = stretch.members[:_MAX_STRETCH]
        members = {r.id for group_members in stretches.by_group.values() for r in group_members}
        claimable: list[tuple[EventRecord, str]] = []
        ids: set[str] = set()
        for record, token in zip(seen, tokens, strict=True):
            # An event seen twice (the index lags a move) is claimed once: a transaction may
            # not name one item twice.
            if record.id not in ids and (record.seq is None or record.id in members):
                ids.add(record.id)
                claimable.append((record, token))
        if len(claimable) == 1 and claimable[0][0].seq is None:
            record, token = claimable[0]
            got = self._claim_one(record, token, lease_until_ms, now_ms)
            return [] if got is None else [got]
        # Items: one claim per event, one gate check per ordered group, a group's with its stretch.
        entries: list[Entry] = []
        for record, token in claimable:
            entries.append(
                Entry(
                    {"Update": self._requests.claim(record, token, lease_until_ms, now_ms)},
                    record=record,
                    token=token,
                    tie=_group_tie(record),
                )
            )
        for group, start in stretches.starts.items():
            entries.append(
                Entry(
                    {
                        "ConditionCheck": {
                            "TableName": self._table.name,
                            "Key": self._items.gate_key(group),
                            "ConditionExpression": "next_seq >= :start",
                            "ExpressionAttributeValues": values(start=start),
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                        }
                    },
                    group=group,
                    tie=group,
                )
            )
        claimed: dict[str, EventRecord] = {}
        blocked: dict[str, dict[str, Any]] = {}  # group -> its gate as the refusal showed it

        contended: set[str] = set()  # ordered groups of which someone else holds a member

        def refused(entry: Entry, item: dict[str, Any] | None) -> None:
            if entry.group is not None:
                blocked[entry.group] = item or {}
            elif item is not None and item.get("lease_token") == entry.token:
                # A retry of this very claim whose first response was lost: the claim is ours.
                record = EventRecord.from_item(item, now_ms)
                if record is not None:
                    claimed[record.id] = record
            else:
                group = entry.tie
                if group is not None:
                    # A member of the stretch is someone else's: claiming the rest could deliver a
                    # later event before it. The group waits for the next poll.
                    contended.add(group)

        def written(entry: Entry) -> None:
            if entry.record is not None:
                claimed[entry.record.id] = _as_claimed(entry.record, entry.token, lease_until_ms)

        def still_wanted(entry: Entry) -> bool:
            # A group whose gate or member refused is not claimed at all, not in a later round.
            group = entry.tie
            return group not in blocked and group not in contended

        unclaimable: list[tuple[EventRecord, str]] = []

        def rejected(entry: Entry, message: str) -> None:
            # The store refused the claim for the event's own item (too large to take the
            # claim's attributes): that event's answer, never the batch's.
            if entry.record is not None:
                unclaimable.append((entry.record, message))
            group = entry.tie
            if group is not None:
                contended.add(group)  # its group waits: the event keeps its place

        answers = Answers(refused, written, rejected, still_wanted)
        try:
            self._batch.write(entries, answers, must_write=False)
        except BaseException:
            # A later transaction of the batch raised (throttling, a network error, an
            # interrupt): the earlier ones' claims hold events no worker will handle. Give them
            # back, due now and their attempt not counted, then raise; otherwise they would wait
            # a whole lease with an attempt counted.
            if claimed:
                back = [
                    Outcome(record, "pending", due_ms=now_ms, count_attempt=False)
                    for record in claimed.values()
                ]
                try:
                    self.finish_many(back, now_ms, None)
                except Exception:
                    logger.exception(
                        "outbox claim: %d claimed event(s) not given back after a failed "
                        "batch; they are claimed again after their lease",
                        len(back),
                    )
            raise
        for record, message in unclaimable:
            self._fail_unclaimable(record, message, now_ms)
        for group, gate in blocked.items():
            # The group's head is not done: the stretch waits; move it out of the way for a while.
            due = max(now_ms + ORDERED_RECHECK_MS, int(gate.get("retry_due_ms", 0)))
            for record in stretches.by_group[group]:
                claimed.pop(record.id, None)
                self._postpone(record, due, now_ms)
        for group in contended - set(blocked):
            # Members written in an earlier round than the refusal stay claimed only if they
            # come before every refused member: give back the whole stretch instead (rare).
            for record in stretches.by_group[group]:
                got = claimed.pop(record.id, None)
                if got is not None:
                    self.finish_many(
                        [Outcome(got, "pending", due_ms=now_ms, count_attempt=False)], now_ms, None
                    )
        return [claimed[r.id] for r, _ in claimable if r.id in claimed]

    def _postpone(self, seen: EventRecord, due_ms: int, now_ms: int) -> None:
        """Move ``seen``, held back by its group's gate, out of the due queue's way until
        ``due_ms``: a pending event is pushed back; an in-flight one whose lease ran out (its
        worker died or overran) goes back to pending, its counted attempts kept. Left in flight,
        blocked followers found by the expired-lease scan would stay at the front of the
        in-flight queue, and a scan full of them would find nothing else, poll after poll."""
        self._record_shards()
        gpk, gsk = self._items.record_index(seen.event, EventStatus.PENDING, due_ms)
        args: dict[str, Any] = {
            "pending": EventStatus.PENDING.value,
            "now": now_ms,
            "due": due_ms,
            "gpk": gpk,
            "gsk": gsk,
        }
        update = "SET #status = :pending, due_ms = :due, gsi1pk = :gpk, gsi1sk = :gsk"
        if seen.status is EventStatus.IN_FLIGHT and seen.lease_token is not None:
            # Still held by the claim we saw, and that claim's lease is over: no worker can
            # finish it any more (every outcome needs the token this removes).
            condition = "#status = :in_flight AND lease_token = :seen AND due_ms <= :now"
            args.update(in_flight=EventStatus.IN_FLIGHT.value, seen=seen.lease_token)
            update += " REMOVE lease_token"
        else:
            condition = (
                "#status = :pending AND attribute_not_exists(lease_token) AND due_ms <= :now"
            )
        with contextlib.suppress(ConditionFailedError):  # claimed or moved meanwhile
            self._table.call(
                "update_item",
                Key=self._items.key(seen.id),
                ConditionExpression=condition,
                UpdateExpression=update,
                ExpressionAttributeNames=NAMES,
                ExpressionAttributeValues=values(**args),
            )

    def _statements_supported(self) -> bool:
        return self._batch.statements_supported()

    def finish_many(
        self,
        outcomes: Sequence[Outcome],
        now_ms: int,
        retention_ms: int | None,
        _shrunk: bool = False,
    ) -> list[bool]:
        self._record_shards()
        results: dict[int, bool] = {}
        entries: list[Entry] = []
        for index, outcome in enumerate(outcomes):
            entries.append(
                Entry(
                    self._requests.outcome(outcome, now_ms, retention_ms),
                    record=outcome.record,
                    token=outcome.token,
                    index=index,
                    tie=_group_tie(outcome.record),
                )
            )
        by_group = ordered_by_group(outcomes)
        gates: dict[str, Entry] = {}
        for group, members in by_group.items():
            gate_op = self._requests.gate_finish(group, members)
            if gate_op is not None:
                gates[group] = Entry({"Update": gate_op}, group=group, tie=group)
                entries.append(gates[group])
        # Indexes of the outcomes refused (not our own write): their group's gate must not move
        # past them. A group's items travel in one transaction, so a refusal cancels the gate
        # move too and the rest is sent again: with a gate move computed from the rest.
        lost: set[int] = set()

        def refused(entry: Entry, item: dict[str, Any] | None) -> None:
            if entry.index is None:
                return  # a gate the group had already moved past: nothing to move
            if item is None:
                # Gone: completed and deleted (retention None) by this very outcome whose first
                # response was lost, or by whoever took it over; either way it is done.
                results[entry.index] = retention_ms is None
            else:
                results[entry.index] = item.get("finished_by") == entry.token
            if not results[entry.index]:
                lost.add(entry.index)

        def written(entry: Entry) -> None:
            if entry.index is not None:
                results[entry.index] = True

        def still_wanted(entry: Entry) -> bool:
            group = entry.group
            if entry.index is not None or group is None or not lost:
                return True
            # The gate of a group whose outcome was refused: moved only by the outcomes that
            # are written (as Redis and MongoDB do), never past the refused one.
            kept = [o for i, o in enumerate(outcomes) if i not in lost]
            members = [
                o for o in kept if o.record.seq is not None and o.record.event.group == group
            ]
            gate_op = self._requests.gate_finish(group, members) if members else None
            if gate_op is None:
                return False
            entry.item = {"Update": gate_op}
            return True

        too_large: list[int] = []

        def rejected(entry: Entry, message: str) -> None:
            # The outcome's own item refused it (too large for its error text, say): written
            # again below with a short error; a gate is never refused so.
            if entry.index is not None:
                too_large.append(entry.index)

        # Only a gate can stop being wanted (see still_wanted): without one, no question.
        self._batch.write(
            entries, Answers(refused, written, rejected, still_wanted if gates else None)
        )
        if too_large and not _shrunk:
            short = [
                dataclasses.replace(outcomes[i], error=(outcomes[i].error or "")[:200] or None)
                for i in too_large
            ]
            for i, ok in zip(
                too_large, self.finish_many(short, now_ms, retention_ms, True), strict=True
            ):
                results[i] = ok
        elif too_large:
            logger.error("outbox: %d outcome(s) refused by the store as too large", len(too_large))
        return [results.get(i, False) for i in range(len(outcomes))]

    def extend_many(
        self, held: Sequence[EventRecord], lease_until_ms: int, now_ms: int
    ) -> list[bool]:
        self._record_shards()
        results: dict[int, bool] = {}
        entries = []
        for index, record in enumerate(held):
            op = self._requests.extend(record, lease_until_ms, now_ms)
            entries.append(
                Entry({"Update": op}, record=record, token=record.lease_token or "", index=index)
            )

        def refused(entry: Entry, item: dict[str, Any] | None) -> None:
            assert entry.index is not None
            # A retry whose first attempt applied shows our own token and lease: still ours.
            results[entry.index] = (
                item is not None
                and item.get("lease_token") == entry.token
                and item.get("status") == EventStatus.IN_FLIGHT.value
            )

        def written(entry: Entry) -> None:
            assert entry.index is not None
            results[entry.index] = True

        def rejected(entry: Entry, message: str) -> None:
            assert entry.index is not None
            results[entry.index] = False  # not extended: the worker does not start it

        self._batch.write(entries, Answers(refused, written, rejected))
        return [results.get(i, False) for i in range(len(held))]

    def retry_failed(self, event_id: str, now_ms: int, token: str) -> RetryOutcome:
        self._record_shards()
        gpk, gsk = self._items.index(event_id, EventStatus.PENDING, now_ms)
        # Sharded, an ordered event goes back to its group's partition, which only the stored
        # item names: the first try moves an unordered event (one request), and its refusal shows
        # an ordered one's group for a second try. One shard: any failed event, at once.
        sharded = self._own_shards > 1
        outcome = self._retry_failed(event_id, now_ms, token, gpk, gsk, None if sharded else "")
        if isinstance(outcome, str):
            return outcome
        group_pk = self._items.index_pk(outcome, EventStatus.PENDING)
        retried = self._retry_failed(event_id, now_ms, token, group_pk, gsk, outcome.group)
        return retried if isinstance(retried, str) else "not_failed"  # its group changed: never

    def _retry_failed(
        self,
        event_id: str,
        now_ms: int,
        token: str,
        gpk: str,
        gsk: str,
        group: str | None,
    ) -> RetryOutcome | Event:
        """One try of :meth:`retry_failed` into partition ``gpk``. ``group``: "" moves any failed
        event; None only an unordered one, answering an ordered one with its event (for its
        group); a group name only an ordered event of that group."""
        # once per retry: its re-sent write after a lost answer must not move the event again
        # if it failed again in between
        condition = (
            "attribute_exists(pk) AND #status = :failed AND "
            "(attribute_not_exists(retried_by) OR retried_by <> :token)"
        )
        extra: dict[str, Any] = {}
        if group is None:
            condition += " AND attribute_not_exists(seq)"
        elif group:
            condition += " AND attribute_exists(seq) AND event_group = :group"
            extra["group"] = group
        try:
            self._table.call(
                "update_item",
                Key=self._items.key(event_id),
                # Never creates: an unknown id fails attribute_exists; only failed events move.
                ConditionExpression=condition,
                UpdateExpression=(
                    "SET #status = :pending, attempts = :zero, due_ms = :now, gsi1pk = :gpk, "
                    "gsi1sk = :gsk, updated_ms = :now, retried_by = :token, manual_retries = "
                    "if_not_exists(manual_retries, :zero) + :one"
                ),
                ExpressionAttributeNames=NAMES,
                ExpressionAttributeValues=values(
                    failed=EventStatus.FAILED.value,
                    pending=EventStatus.PENDING.value,
                    zero=0,
                    one=1,
                    now=now_ms,
                    gpk=gpk,
                    gsk=gsk,
                    token=token,
                    **extra,
                ),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            if failed.item is not None and failed.item.get("retried_by") == token:
                return "retried"  # this very retry, applied, its answer lost
            record = EventRecord.from_item(failed.item, now_ms)
            if record is None:
                return "not_found"
            if group is None and record.status is EventStatus.FAILED and record.event.ordered:
                return record.event
            return "not_failed"
        return "retried"

    # -- redriving an ordered group's failed events ------------------------------------------------

    def retry_group(
        self, group: str, records: Sequence[EventRecord], now_ms: int, token: str
    ) -> list[str]:
        """Each chunk of up to 99 events is one transaction with the group's gate (100 items),
        retried when a racing publisher moved the gate, as an ordered publish is; a later chunk
        takes its places after the earlier one's."""
        validate_key(group, "event group")
        self._record_shards()
        mine = [r for r in records if r.seq is not None and r.event.group == group]
        moved: list[str] = []
        for number, start in enumerate(range(0, len(mine), _REDRIVE_CHUNK)):
            chunk = mine[start : start + _REDRIVE_CHUNK]
            # a token per chunk: the gate carries it, and a later chunk's refusal must not take
            # the earlier chunk's token on the gate for its own
            moved.extend(self._redrive(group, chunk, now_ms, f"{token}.{number}"))
        return moved

    def _redrive(self, group: str, chunk: list[EventRecord], now_ms: int, token: str) -> list[str]:
        left = list(chunk)  # never empty: a chunk holds one event at least
        for _ in race_rounds(_sleep):  # as an ordered publish that lost a gate race
            seen = int(self._gate(group).get("published", 0))
            items: list[dict[str, Any]] = [
                {"Update": self._requests.redrive(record, seen + n, now_ms, token)}
                for n, record in enumerate(left, start=1)
            ]
            gate = self._requests.gate_publish(group, seen, seen + len(left), now_ms)
            gate["UpdateExpression"] += ", retried_by = :token"
            gate["ExpressionAttributeValues"] = {
                **gate["ExpressionAttributeValues"],
                **values(token=token),
            }
            gate["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
            items.append({"Update": gate})
            try:
                self._table.call("transact_write_items", TransactItems=items)
            except TransactionCancelledError as cancelled:
                reasons = cancelled.reasons
                if len(reasons) != len(items):
                    raise
                olds = [
                    unmarshal(reason["Item"]) if reason.get("Item") else None for reason in reasons
                ]
                if any(old is not None and old.get("retried_by") == token for old in olds):
                    # This very transaction, applied, its answer lost (the client sent it
                    # again): all of it was written, each event once.
                    return [r.id for r in left]
                refused = {
                    record.id
                    for record, reason in zip(left, reasons, strict=False)
                    if reason.get("Code") == "ConditionalCheckFailed"
                }
                raced = any(r.get("Code") in _RETRY_CODES for r in reasons[len(left) :]) or any(
                    r.get("Code") == "TransactionConflict" for r in reasons
                )
                if not refused and not raced:
                    raise
                # Moved by someone else meanwhile (no longer failed at the place read): left
                # out; the rest again, with the gate read again.
                left = [r for r in left if r.id not in refused]
                if not left:
                    return []
                continue
            return [r.id for r in left]
        raise TransactionCancelledError(
            f"retry of group {group!r}: the group kept changing under racing publishers; "
            f"{len(left)} events were not moved, retry again",
            reasons=[],
        )


@dataclasses.dataclass(slots=True)
class _Stretches:
    starts: dict[str, int]  # group -> first place of its claimable stretch
    by_group: dict[str, list[EventRecord]]  # group -> its stretch's records


def _as_claimed(seen: EventRecord, token: str, lease_until_ms: int) -> EventRecord:
    attempts = seen.attempts + 1
    return dataclasses.replace(
        seen,
        event=seen.event.with_attempt(attempts),
        status=EventStatus.IN_FLIGHT,
        attempts=attempts,
        due_at_ms=lease_until_ms,
        lease_token=token,
    )


def _group_tie(record: EventRecord) -> str | None:
    """Items of one ordered group (its events and its gate) go in one transaction."""
    return record.event.group if record.seq is not None else None
