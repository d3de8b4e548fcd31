"""Stream delivery's store methods: what the stream relay (:mod:`dynacoord.outbox.stream`, the
Lambda handler of the table's stream; not the SQS/SNS/EventBridge relays of
:mod:`dynacoord.relays`) asks of the DynamoDB outbox store beyond a worker's calls (the
``StreamStore`` protocol): reading the event a stream image holds, reading events by id in one
request, and storing the outcome of an event delivered without a claim (one write per event). A
base class of :class:`~.outbox.DynamoDBOutboxStore`, so a store is one object for the stream
relay as for a worker.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import InvalidKeyError
from ...outbox import EventRecord, Outcome
from ._batch import Answers, BatchWriter, Entry
from ._limits import MAX_BATCH_GET_KEYS
from ._outbox_items import OutboxItems, event_record
from ._outbox_requests import OutboxRequests
from ._table import DynamoTable

__all__ = ["StreamDeliveryStore"]

logger = logging.getLogger("dynacoord.backends.dynamodb.outbox")


class StreamDeliveryStore:
    """The stream relay's methods of the DynamoDB outbox store, on its table session, items,
    request builders and batch engine."""

    _table: DynamoTable
    _items: OutboxItems
    _requests: OutboxRequests
    _batch: BatchWriter
    #: the outbox store's outcome writes under a claim
    finish_many: Callable[[Sequence[Outcome], int, int | None], list[bool]]

    def get_many(self, event_ids: Sequence[str], now_ms: int) -> dict[str, EventRecord]:
        """The stored events of ``event_ids``, read consistently, up to 100 a request (read
        units only); absent ids are left out."""
        found: dict[str, EventRecord] = {}
        ids = list(dict.fromkeys(event_ids))
        for start in range(0, len(ids), MAX_BATCH_GET_KEYS):
            chunk = ids[start : start + MAX_BATCH_GET_KEYS]
            keys: list[dict[str, Any]] = [self._items.key(i) for i in chunk]
            rounds = 0
            while keys:
                answer = self._table.call(
                    "batch_get_item",
                    RequestItems={self._table.name: {"Keys": keys, "ConsistentRead": True}},
                )
                for raw in answer.get("Responses", {}).get(self._table.name, []):
                    record = event_record(raw, now_ms)
                    if record is not None:
                        found[record.id] = record
                keys = answer.get("UnprocessedKeys", {}).get(self._table.name, {}).get("Keys", [])
                if keys:
                    rounds += 1  # throttled: back off before asking for the rest
                    time.sleep(min(1.0, 0.01 * 2**rounds) * random.uniform(0.5, 1.0))
        return found

    def settle_unclaimed(
        self,
        settled: Sequence[tuple[EventRecord, Outcome]],
        now_ms: int,
        retention_ms: int | None,
    ) -> list[bool]:
        """Store outcomes of events delivered without a claim (the stream relay's one write per
        event): each ``(seen, outcome)`` only while the event is still as ``seen`` (pending,
        unclaimed, the same attempts and due time), counting the attempt with the outcome. One
        bool each: False where a worker had claimed or finished it meanwhile. Unordered events
        only: an ordered one moves its group's gate, which takes a claim.

        A refusal that shows the outcome's own lease token means the stream relay's lease keeper
        claimed the event under that token (its claim applied though its call may have raised):
        the outcome is then written under that claim, a second request for those events."""
        results: dict[int, bool] = {}
        # refused by the stream relay's own claim: its lease keeper's claim applied though its call
        # raised (the keeper never learnt it), so the outcome goes under that claim
        own_claim: list[int] = []
        entries: list[Entry] = []
        for index, (seen, outcome) in enumerate(settled):
            if seen.seq is not None or not outcome.count_attempt:
                raise ValueError(
                    f"event {seen.id!r}: only an unordered event's counted outcome is stored "
                    "without a claim"
                )
            entries.append(
                Entry(
                    self._requests.unclaimed(seen, outcome, now_ms, retention_ms),
                    record=outcome.record,
                    token=outcome.token,
                    index=index,
                )
            )

        def refused(entry: Entry, item: dict[str, Any] | None) -> None:
            assert entry.index is not None
            if item is None:
                results[entry.index] = retention_ms is None  # deleted by this very write
            elif item.get("lease_token") == entry.token:
                own_claim.append(entry.index)
            else:
                results[entry.index] = item.get("finished_by") == entry.token

        def written(entry: Entry) -> None:
            assert entry.index is not None
            results[entry.index] = True

        def rejected(entry: Entry, message: str) -> None:
            assert entry.index is not None
            logger.error(
                "outbox: event %r: outcome refused by the store: %s",
                entry.record and entry.record.id,
                message,
            )
            results[entry.index] = False

        self._batch.write(entries, Answers(refused, written, rejected))
        if own_claim:
            stored = self.finish_many([settled[i][1] for i in own_claim], now_ms, retention_ms)
            results.update(zip(own_claim, stored, strict=True))
        return [results.get(i, False) for i in range(len(settled))]

    def stream_record(self, image: Mapping[str, Any], now_ms: int) -> EventRecord | None:
        """The event a DynamoDB stream image (DynamoDB JSON, as Lambda delivers it) holds if it
        is an outbox event of this namespace, else None. No request: it reads what the stream
        carried, and the stream relay's claim re-checks the item itself."""
        own = self._table.stream_image(image)  # a table layout's names back in dynacoord's
        if own is None:
            return None  # an item of the application's, not dynacoord's
        image = own
        raw_id = image.get("event_id")
        event_id = raw_id.get("S") if isinstance(raw_id, Mapping) else None
        if not isinstance(event_id, str):
            return None
        try:
            key = self._items.key(event_id)
        except InvalidKeyError:
            return None
        if image.get("pk") != key["pk"] or image.get("sk") != key["sk"]:
            return None  # another namespace, or not an outbox item
        return event_record(image, now_ms)
