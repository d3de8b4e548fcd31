"""The outbox's items on the single table: keys, index entries, a new event's item, and the
fast reader of stored items. Pure: no request is sent from here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from zlib import crc32

from ... import codec
from ...keys import (
    MAX_PARTITION_KEY_BYTES,
    MAX_SORT_KEY_BYTES,
    Kind,
    outbox_index_pk,
    outbox_index_sk,
    outbox_key,
    outbox_pk,
    shard_of,
)
from ...outbox import Event, EventRecord, EventStatus, order_key
from ...outbox.event import DELIVERY_ROOM, _new_event, _status, check_event_size, new_record
from ._limits import CHAR_BYTES_BOUND, NUMBER_BYTES_BOUND
from ._marshal import marshal, unmarshal

__all__ = ["EVENT_SK", "OutboxItems", "event_record"]

EVENT_SK = "EVENT"
#: the most bytes a new event's item may take (the rest is delivery's: DELIVERY_ROOM)
_EVENT_ROOM = codec.DYNAMODB_ITEM_LIMIT - DELIVERY_ROOM
_PENDING = EventStatus.PENDING.value
#: the characters of a pending event's item that do not depend on the event: its attribute
#: names, the sort key and the status
_PENDING_CHARS = (
    sum(map(len, ("pk", "sk", "gsi1pk", "gsi1sk", "event_id", "event_type", "payload")))
    + sum(map(len, ("occurred_at_ms", "status", "attempts", "due_ms")))
    + len(EVENT_SK)
    + len(_PENDING)
)


def event_record(raw: Mapping[str, Any] | None, now_ms: int) -> EventRecord | None:
    """``EventRecord.from_item(unmarshal(raw), now_ms)`` read straight from the attribute values
    (no Decimal for each number, no dict of Python values per item). An attribute of another
    type than the store writes takes the general path, which decides (or raises) alike."""
    if not raw or "event_id" not in raw:
        return None
    try:
        get = raw.get
        expires = get("expires_at_ms")
        if expires is not None and int(expires["N"]) <= now_ms:
            return None
        metadata, group, token, error = (
            get("metadata"),
            get("event_group"),
            get("lease_token"),
            get("last_error"),
        )
        updated, seq = get("updated_ms"), get("seq")
        attempts = int(raw["attempts"]["N"]) if "attempts" in raw else 0
        due = get("due_ms") or get("completed_ms")
        event = _new_event(
            raw["event_type"]["S"],
            codec.decode(raw["payload"]["S"]),
            raw["event_id"]["S"],
            int(raw["occurred_at_ms"]["N"]) / 1000,
            codec.decode(metadata["S"]) if metadata is not None else {},
            None if group is None else group["S"],
            attempts,
            seq is not None,
        )
        return new_record(
            event,
            _status(raw["status"]["S"]),
            attempts,
            0 if due is None else int(due["N"]),
            (token["S"] or None) if token is not None else None,
            (error["S"] or None) if error is not None else None,
            None if updated is None else int(updated["N"]),
            None if seq is None else int(seq["N"]),
        )
    except (KeyError, TypeError, ValueError):
        return EventRecord.from_item(unmarshal(raw), now_ms)


class OutboxItems:
    """The keys and items of one namespace's outbox, for a publisher or worker with ``shards``
    shards of the pending queue."""

    def __init__(self, namespace: str, shards: int) -> None:
        self.ns = namespace
        self._own_shards = shards
        self._index_pks: dict[tuple[EventStatus, int], str] = {}  # (status, shard) -> gsi1pk
        # what outbox_pk puts before an event id (taken from it, so the two cannot differ)
        self._pk_prefix = outbox_pk(namespace, "x")[:-1]
        # the pending queue's partition of each shard: where every new event goes
        self._pending_pks = [
            outbox_index_pk(namespace, EventStatus.PENDING.value, shard) for shard in range(shards)
        ]

    def meta_key(self) -> dict[str, Any]:
        # "OUTBOX#ns#" (an empty event id, which no event can have): inside the namespace's
        # dynamodb:LeadingKeys pattern "OUTBOX#ns#*" of the scoped IAM policies.
        return marshal({"pk": f"{Kind.OUTBOX.value}#{self.ns}#", "sk": "SHARDS"})

    def gate_key(self, group: str) -> dict[str, Any]:
        return marshal({"pk": f"{Kind.OUTBOX.value}#{self.ns}#{group}", "sk": "GROUP"})

    def index(self, event_id: str, status: EventStatus, due_ms: int) -> tuple[str, str]:
        k = outbox_key(
            self.ns, event_id, status=status.value, due_ms=due_ms, shards=self._own_shards
        )
        assert k.gsi1pk is not None and k.gsi1sk is not None
        return k.gsi1pk, k.gsi1sk

    def record_index(self, event: Event, status: EventStatus, due_ms: int) -> tuple[str, str]:
        """The index entry of ``event`` in ``status``: its partition and sort key."""
        return self.index_pk(event, status), outbox_index_sk(due_ms, event.id)

    def index_pk(self, event: Event, status: EventStatus) -> str:
        """The gsi1 partition of ``event`` in ``status``: ordered events are sharded by their
        group, so the events of a group share one queue and one worker sees them together."""
        shard = 0 if self._own_shards <= 1 else shard_of(order_key(event), self._own_shards)
        # each partition is built (and its namespace checked) once: a few statuses and shards
        gpk = self._index_pks.get((status, shard))
        if gpk is None:
            gpk = self._index_pks[(status, shard)] = outbox_index_pk(self.ns, status.value, shard)
        return gpk

    def item(self, event: Event, now_ms: int, seq: int | None = None) -> tuple[dict[str, Any], int]:
        """The stored item of a new event, marshalled, and a bound on its size (bytes): 4 a
        character of a name or string, 21 a number (every field is a str or a small int).

        The event is due when it occurred, never later than ``now_ms``: the stored item then
        depends only on the event, not on the moment of publishing, so a retried
        TransactWriteItems with the same ClientRequestToken is the identical request DynamoDB
        recognises. The fields are :func:`pending_fields`' (same names, same order), built here
        straight as attribute values: this runs once per published event."""
        event_id = event.id  # a valid key: an Event checks its id when made
        occurred_ms = int(event.occurred_at * 1000)  # Event.occurred_at_ms
        due_ms = occurred_ms if occurred_ms < now_ms else now_ms
        pk = self._pk_prefix + event_id
        gsk = f"{due_ms:015d}#{event_id}"  # outbox_index_sk's, checked below with the pk
        if not (
            pk.isascii() and len(pk) <= MAX_PARTITION_KEY_BYTES and len(gsk) <= MAX_SORT_KEY_BYTES
        ):
            pk, gsk = outbox_pk(self.ns, event_id), outbox_index_sk(due_ms, event_id)
        shards = self._own_shards
        if shards <= 1:
            gpk = self._pending_pks[0]
        elif event.ordered:
            gpk = self.index_pk(event, EventStatus.PENDING)
        else:
            # shard_of(event_id, shards), the shard _index_pk gives an unordered event
            gpk = self._pending_pks[crc32(event_id.encode("utf-8", "surrogatepass")) % shards]
        event_type = event.type
        payload = codec.encode(event.payload)
        item: dict[str, Any] = {
            "pk": {"S": pk},
            "sk": {"S": EVENT_SK},
            "gsi1pk": {"S": gpk},
            "gsi1sk": {"S": gsk},
            "event_id": {"S": event_id},
            "event_type": {"S": event_type},
            "payload": {"S": payload},
            "occurred_at_ms": {"N": str(occurred_ms)},
            "status": {"S": _PENDING},
            "attempts": {"N": "0"},
            "due_ms": {"N": str(due_ms)},
        }
        chars = (
            _PENDING_CHARS
            + len(pk)
            + len(gpk)
            + len(gsk)
            + len(event_id)
            + len(event_type)
            + len(payload)
        )
        numbers = 3
        if event.metadata:
            metadata = codec.encode(dict(event.metadata))
            item["metadata"] = {"S": metadata}
            chars += len("metadata") + len(metadata)
        group = event.group
        if group is not None:
            item["event_group"] = {"S": group}
            chars += len("event_group") + len(group)
        if event.ordered:
            assert seq is not None, "the store assigns an ordered event its place in the group"
            item["seq"] = {"N": str(seq)}
            numbers += 1
        bound = CHAR_BYTES_BOUND * chars + NUMBER_BYTES_BOUND * numbers
        if bound > _EVENT_ROOM:  # else it fits for certain: no estimate needed
            check_event_size(unmarshal(item), key=event_id)
        return item, bound

    def key(self, event_id: str) -> dict[str, Any]:
        pk = outbox_pk(self.ns, event_id)
        outbox_index_sk(0, event_id)  # refuses an id no event can have, as publishing would
        return {"pk": {"S": pk}, "sk": {"S": EVENT_SK}}
