"""The event model: :class:`Event` (what a publisher writes), :class:`EventRecord` (an event
and its delivery state as stored) and the stored fields every backend shares."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import codec, keys
from .._compat import StrEnum
from .._items import is_live, member_reader, optional_int, optional_str
from .._validate import (
    check_int,
    check_utf8,
)
from ..errors import (
    InvalidValueError,
    ValueTooLargeError,
)

__all__ = [
    "DELIVERY_ROOM",
    "MAX_OCCURRED_AT",
    "Event",
    "EventRecord",
    "EventStatus",
    "check_event_size",
    "order_key",
    "pending_fields",
]

#: Bytes a stored event keeps free under its store's item limit for what delivery writes on it
#: later: the lease token, times, the outcome's token and up to 2,000 bytes of ``last_error``.
#: ``publish`` refuses an event whose item leaves less (``ValueTooLargeError``): filled to the
#: limit, its first claim would be refused by the store, and it could never be delivered.
DELIVERY_ROOM = 4 * 1024


def check_event_size(item: Mapping[str, Any], *, key: str) -> None:
    """Refuse (``ValueTooLargeError``, before anything is written) an event whose stored item
    leaves less than :data:`DELIVERY_ROOM` bytes under the item limit: the same limit on every
    backend, so an event fits every backend."""
    size = codec.estimate_item_size(item)
    room = codec.DYNAMODB_ITEM_LIMIT - DELIVERY_ROOM
    if size > room:
        raise ValueTooLargeError(
            f"event {key!r}: its stored item would be {size} bytes; an event may take at most "
            f"{room} of the {codec.DYNAMODB_ITEM_LIMIT}-byte item limit, keeping "
            f"{DELIVERY_ROOM} bytes for what delivery writes on it (lease, times, last_error); "
            "store large payloads elsewhere (for example S3) and publish a reference",
            size=size,
            limit=room,
            key=key,
        )


#: ``Event.occurred_at`` is epoch seconds in ``[0, MAX_OCCURRED_AT)``: 10000-01-01T00:00:00Z.
MAX_OCCURRED_AT = 253402300800


class EventStatus(StrEnum):
    """Where an event is in its life."""

    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    COMPLETED = "completed"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True, init=False)
class Event:
    """One outbox event. ``Event(type, payload, *, id=None, occurred_at=None, metadata=None,
    group=None)``.

    ``id`` defaults to a random UUID (hex) and identifies the event everywhere (store key, relay
    deduplication id): a retried publish of the same event is recognised by it. ``occurred_at``
    (epoch seconds, from 0 to before :data:`MAX_OCCURRED_AT`, the year 10000) defaults to now. ``payload`` and ``metadata`` are any values the codec stores
    (JSON-compatible, plus bytes and Decimal); both are delivered as they went in. ``group`` is an
    ordering/partition hint for relays (the SQS FIFO message group, e.g. an aggregate id). With
    ``ordered=True`` (needs a ``group``) the outbox itself keeps the group's order: no event of
    the group is delivered while an earlier ordered event of it is pending or in flight (see the
    outbox docs for the cost). ``attempt`` is set by the worker on delivery: 1 on the first
    delivery, 2 on the first retry, ...
    """

    type: str
    payload: Any
    id: str
    occurred_at: float
    metadata: Mapping[str, Any]
    group: str | None
    attempt: int = field(default=0, compare=False)
    ordered: bool = False

    def __init__(
        self,
        type: str,
        payload: Any = None,
        *,
        id: str | None = None,
        occurred_at: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        group: str | None = None,
        attempt: int = 0,
        ordered: bool = False,
    ) -> None:
        if not isinstance(type, str) or not type:
            raise InvalidValueError(f"event type must be a non-empty str, got {type!r}")
        check_utf8(type, "event type")
        event_id = new_event_id() if id is None else keys.validate_key(id, "event id")
        if occurred_at is None:
            occurred = time.time()
        else:
            if isinstance(occurred_at, bool) or not isinstance(occurred_at, (int, float)):
                raise TypeError(
                    f"occurred_at must be epoch seconds (int or float), got "
                    f"{occurred_at.__class__.__name__}"
                )
            # 0 to the end of year 9999 UTC: what a datetime (and so every relay) can carry and
            # what fits the 15-digit millisecond sort keys; 1e300 would overflow every backend.
            if not 0 <= occurred_at < MAX_OCCURRED_AT:
                shown = (
                    repr(occurred_at)
                    if isinstance(occurred_at, float) or occurred_at.bit_length() < 128
                    else f"an int of {occurred_at.bit_length()} bits"
                )
                raise InvalidValueError(
                    f"occurred_at must be epoch seconds from 0 to before {MAX_OCCURRED_AT} "
                    f"(year 10000), got {shown}"
                )
            occurred = float(occurred_at)
        if metadata is None:
            meta: dict[str, Any] = {}
        elif isinstance(metadata, Mapping):
            meta = dict(metadata)
        else:
            raise InvalidValueError(
                f"event metadata must be a mapping, got {metadata.__class__.__name__}"
            )
        if group is not None and (not isinstance(group, str) or not group):
            raise InvalidValueError(f"event group must be a non-empty str or None, got {group!r}")
        if group is not None:
            check_utf8(group, "event group")
        check_int(attempt, "attempt", minimum=0)
        if not isinstance(ordered, bool):
            raise InvalidValueError(f"ordered must be a bool, got {ordered!r}")
        if ordered and group is None:
            raise InvalidValueError(
                "an ordered event needs a group: order is kept among the events of one group"
            )
        # Refuse values that cannot be stored now, not when the worker reads them back.
        codec.encode(payload)
        if meta:
            codec.encode(meta)
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "id", event_id)
        object.__setattr__(self, "occurred_at", occurred)
        object.__setattr__(self, "metadata", meta)
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "ordered", ordered)

    @classmethod
    def _restore(
        cls,
        *,
        type: str,
        payload: Any,
        id: str,
        occurred_at: float,
        metadata: Mapping[str, Any],
        group: str | None,
        attempt: int,
        ordered: bool = False,
    ) -> Event:
        """Rebuild a stored event without re-validating it (it was validated when published)."""
        return _new_event(type, payload, id, occurred_at, dict(metadata), group, attempt, ordered)

    def with_attempt(self, attempt: int) -> Event:
        """A copy with ``attempt`` set (what a handler receives)."""
        return Event._restore(
            type=self.type,
            payload=self.payload,
            id=self.id,
            occurred_at=self.occurred_at,
            metadata=self.metadata,
            group=self.group,
            attempt=attempt,
            ordered=self.ordered,
        )

    @property
    def occurred_at_ms(self) -> int:
        return int(self.occurred_at * 1000)

    def same_content(self, other: Event) -> bool:
        """True if ``other`` is this event published again (same id, type, payload, metadata,
        group; ``occurred_at`` and ``attempt`` are not compared)."""
        return (
            self.id == other.id
            and self.type == other.type
            and self.group == other.group
            and self.ordered == other.ordered
            and codec.encode(self.payload) == codec.encode(other.payload)
            and codec.encode(dict(self.metadata)) == codec.encode(dict(other.metadata))
        )

    def to_message(self) -> dict[str, Any]:
        """The envelope relays send: id, type, occurred_at, group, payload, metadata."""
        return {
            "id": self.id,
            "type": self.type,
            "occurred_at": self.occurred_at,
            "group": self.group,
            "payload": self.payload,
            "metadata": dict(self.metadata),
        }


def _new_event(
    type: str,
    payload: Any,
    id: str,
    occurred_at: float,
    metadata: dict[str, Any],
    group: str | None,
    attempt: int,
    ordered: bool,
) -> Event:
    """An Event of these fields as stored, not validated again (it was when published): its
    fields set as the dataclass's own ``__init__`` sets a frozen instance's. Every event read
    (a get, a claimed batch) makes one."""
    event = object.__new__(Event)
    for name, value in (
        ("type", type),
        ("payload", payload),
        ("id", id),
        ("occurred_at", occurred_at),
        ("metadata", metadata),
        ("group", group),
        ("attempt", attempt),
        ("ordered", ordered),
    ):
        object.__setattr__(event, name, value)
    return event


@dataclass(frozen=True, slots=True)
class EventRecord:
    """A stored event with its delivery state (what ``get``/``failed``/``pending`` return).

    ``due_at_ms`` means: next attempt time (pending), lease expiry (in_flight), failure time
    (failed), completion time (completed).
    """

    event: Event
    status: EventStatus
    attempts: int
    due_at_ms: int
    lease_token: str | None = None
    last_error: str | None = None
    updated_at_ms: int | None = None
    #: an ordered event's place in its group (1, 2, ...); None for unordered events
    seq: int | None = None
    #: the event's id, kept as a field (read for every held event, many times a delivery)
    id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", self.event.id)

    @property
    def type(self) -> str:
        return self.event.type

    @property
    def due_at(self) -> float:
        return self.due_at_ms / 1000

    @classmethod
    def from_item(cls, item: Mapping[str, Any] | None, now_ms: int) -> EventRecord | None:
        """The record a stored event holds (the same field names on every backend), or None if
        there is no event or it expired (a completed event past its retention)."""
        if not item or "event_id" not in item or not is_live(item, now_ms):
            return None
        metadata = item.get("metadata")
        attempts = int(item.get("attempts", 0))
        event = Event._restore(
            type=str(item["event_type"]),
            payload=codec.decode(str(item["payload"])),
            id=str(item["event_id"]),
            occurred_at=int(item["occurred_at_ms"]) / 1000,
            metadata=codec.decode(str(metadata)) if metadata is not None else {},
            group=optional_str(item, "event_group"),
            attempt=attempts,
            ordered="seq" in item,
        )
        due = item.get("due_ms", item.get("completed_ms", 0))
        return cls(
            event=event,
            status=_status(item["status"]),
            attempts=attempts,
            due_at_ms=int(due),
            lease_token=str(item["lease_token"]) if item.get("lease_token") else None,
            last_error=str(item["last_error"]) if item.get("last_error") else None,
            updated_at_ms=optional_int(item, "updated_ms"),
            seq=optional_int(item, "seq"),
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (used by the CLI)."""
        return {
            "id": self.event.id,
            "type": self.event.type,
            "status": self.status.value,
            "attempts": self.attempts,
            "due_at": self.due_at,
            "occurred_at": self.event.occurred_at,
            "group": self.event.group,
            "ordered": self.event.ordered,
            "seq": self.seq,
            "last_error": self.last_error,
            "payload": self.event.payload,
            "metadata": dict(self.event.metadata),
        }


_PENDING = EventStatus.PENDING.value
_status = member_reader(EventStatus)


def new_record(
    event: Event,
    status: EventStatus,
    attempts: int,
    due_at_ms: int,
    lease_token: str | None,
    last_error: str | None,
    updated_at_ms: int | None,
    seq: int | None,
) -> EventRecord:
    """``EventRecord(...)`` of every field, given by position (the stores make one per event
    read)."""
    return EventRecord(
        event, status, attempts, due_at_ms, lease_token, last_error, updated_at_ms, seq
    )


def pending_fields(event: Event, due_ms: int, seq: int | None = None) -> dict[str, Any]:
    """The stored fields (keys aside) of a newly published event, pending and due at ``due_ms``:
    the same field names on every backend, read back by :meth:`EventRecord.from_item`. ``seq``
    is an ordered event's place in its group, assigned by the store when publishing."""
    fields: dict[str, Any] = {
        "event_id": event.id,
        "event_type": event.type,
        "payload": codec.encode(event.payload),
        "occurred_at_ms": event.occurred_at_ms,
        "status": _PENDING,
        "attempts": 0,
        "due_ms": due_ms,
    }
    if event.metadata:
        fields["metadata"] = codec.encode(dict(event.metadata))
    if event.group is not None:
        fields["event_group"] = event.group
    if event.ordered:
        assert seq is not None, "the store assigns an ordered event its place in the group"
        fields["seq"] = seq
    return fields


def new_event_id() -> str:
    """A random UUID (version 4) as 32 hex digits, as ``uuid.uuid4().hex`` gives it, made
    straight from ``os.urandom`` (uuid4 builds a UUID object first, at several times the cost:
    this runs for every event made without an id and every claim's lease token)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
    return raw.hex()


def order_key(event: Event) -> str:
    """What an event's index shard is chosen by: the group for ordered events (a group's events
    share one queue, so one worker sees them together), else the event id."""
    if event.ordered:
        assert event.group is not None
        return event.group
    return event.id
