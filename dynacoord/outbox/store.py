"""The storage protocol a backend implements for the outbox (the fewest requests each method's
semantics allow), and the small result types of the management calls."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .event import Event, EventRecord, EventStatus

__all__ = [
    "ORDERED_RECHECK_MS",
    "OutboxStats",
    "OutboxStore",
    "Outcome",
    "OutcomeKind",
    "RetryOutcome",
    "RetryReport",
    "TransactionEntries",
]

RetryOutcome = Literal["retried", "not_found", "not_failed"]
#: what a worker decided for an event it holds (see :class:`Outcome`)
OutcomeKind = Literal["completed", "pending", "failed"]

#: An ordered event whose group's head is still undelivered is not claimable; a claim that finds
#: it so postpones it by this much (or to the head's retry time, when later), so that it does not
#: crowd the head of the due queue while it waits.
ORDERED_RECHECK_MS = 1000


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a worker decided for one event it holds, written by :meth:`OutboxStore.finish_many`.

    ``kind``: ``"completed"`` (delivered), ``"pending"`` (back to pending, due at ``due_ms``;
    ``count_attempt=False`` gives the claim's attempt back: released unhandled) or ``"failed"``.
    ``record`` is the event as claimed; its ``lease_token`` is the claim that must still hold it.
    ``uncounted``: attempts stored by earlier claims that do not count (a re-claim's, see
    :func:`~dynacoord.outbox.delivery.counted_attempts`), given back too when it goes back to
    pending.
    """

    record: EventRecord
    kind: OutcomeKind
    due_ms: int = 0
    error: str | None = None
    count_attempt: bool = True
    uncounted: int = 0

    @property
    def attempts_back(self) -> int:
        """How many stored attempts a pending outcome takes back (0 for the others)."""
        if self.kind != "pending":
            return 0
        return self.uncounted + (0 if self.count_attempt else 1)

    @property
    def token(self) -> str:
        token = self.record.lease_token
        assert token is not None, "an outcome is written for a claimed event"
        return token


class TransactionEntries(Protocol):
    """What ``Outbox.publish(tx=...)`` needs of a transaction: a way to add prepared entries
    (a label ``(what is done, to what)`` for messages, the event id, the backend's entry, an
    upper bound on its bytes or None), and a way to act once it has committed. The DynamoDB
    backend's ``Transaction`` is one."""

    def _add_entries(
        self, entries: list[tuple[tuple[str, str], str | None, Any, int | None]]
    ) -> None: ...

    def _add_entry(
        self, label: tuple[str, str], event_id: str | None, entry: Any, bound: int
    ) -> None:
        """One entry, with a bound (what publishing a single event adds)."""

    def _on_commit(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once the transaction has committed."""


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """Event counts by status, and how far delivery lags. ``due`` is the part of ``pending``
    whose next attempt time has come.

    ``oldest_due_age``: seconds since the oldest due pending event became due (for a first
    attempt, since it was published): the delivery lag of the backlog; None when nothing is due.
    ``expired_lease_age``: seconds since the earliest lease of an in-flight event ran out, None
    while every lease holds: a worker died or froze holding it and no worker has recovered it
    yet (a live worker does within half a lease). The age of a healthy in-flight event says
    nothing; an expired lease does.

    Completed events are not counted: they leave the listing index, and counting them would need
    a table scan.
    """

    pending: int
    due: int
    in_flight: int
    failed: int
    oldest_due_age: float | None = None
    expired_lease_age: float | None = None

    def as_dict(self) -> dict[str, int | float | None]:
        return {
            "pending": self.pending,
            "due": self.due,
            "in_flight": self.in_flight,
            "failed": self.failed,
            "oldest_due_age": self.oldest_due_age,
            "expired_lease_age": self.expired_lease_age,
        }


@dataclass(frozen=True, slots=True)
class RetryReport:
    """What :meth:`Outbox.retry_report` did with each id."""

    retried: list[str]
    not_found: list[str]
    not_failed: list[str]


class OutboxStore(Protocol):
    """Storage for outbox events. A method sends the fewest requests its semantics allow: one
    for a single-event call or a query page; the batch calls (``claim_many``, ``finish_many``,
    ``extend_many``) one per batch where the store takes the batch whole (a Redis script, a
    MongoDB bulk write), on DynamoDB one per 25 statements or 100 transaction items plus the
    rounds that send again what came back throttled or conflicting; an ordered publish reads its
    groups' gates and tries again when racing publishers moved them.

    ``now_ms`` is passed in so that time is decided by the caller's injected clock. Index queries
    return ``(records, cursor)``; pass the cursor back for the next page, None means no more.
    """

    @property
    def shards(self) -> int:
        """How many index partitions each status is spread over: the most any publisher of the
        namespace has used (read from the store), never fewer than this store's own setting."""
        ...

    def refresh_shards(self) -> int:
        """Read the namespace's shard count from the store again (a publisher with more shards
        may have started since) and return it. One request, or none where shards are fixed."""
        ...

    def publish(self, events: Sequence[Event], now_ms: int) -> dict[str, EventRecord | None]:
        """Store ``events`` as pending and due now, all or nothing.

        Returns ``{}`` when written. If some ids are already stored, nothing is written and the
        result maps each clashing id to its stored record (None if the store could not say).
        """
        ...

    def transaction_entry(self, event: Event, now_ms: int) -> tuple[Any, int]:
        """The backend's transaction entry that stores ``event`` as pending (no request), and an
        upper bound on the bytes it adds to the transaction."""
        ...

    def get(self, event_id: str, now_ms: int) -> EventRecord | None:
        """The stored event, read consistently; completed events past retention are absent."""
        ...

    def query_page(
        self,
        status: EventStatus,
        shard: int,
        *,
        due_before_ms: int | None,
        limit: int,
        cursor: Any = None,
    ) -> tuple[list[EventRecord], Any]:
        """One page of the index of ``status`` in ``shard``, oldest due first, optionally only
        events with ``due_at_ms <= due_before_ms``."""
        ...

    def count_page(
        self, status: EventStatus, shard: int, *, due_before_ms: int | None, cursor: Any = None
    ) -> tuple[int, Any]:
        """How many events one page of that index holds."""
        ...

    def claim(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> EventRecord | None:
        """Make the event in_flight under ``token`` if it is still as ``seen`` (same status and
        lease token) and due; count the attempt. None if someone else got it first."""
        ...

    def claim_many(
        self, seen: Sequence[EventRecord], tokens: Sequence[str], lease_until_ms: int, now_ms: int
    ) -> list[EventRecord]:
        """Claim each of ``seen`` as :meth:`claim` would, ``tokens[i]`` for ``seen[i]``, in as few
        requests as the store allows (one where it can); return the claimed records (in_flight,
        their token, the attempt counted). Events someone else got, that are no longer due, or
        that wait behind their ordered group's head (those are postponed) are left out. One
        contended event never costs the others their claim.

        Ordered events (``record.seq`` set): of each group only the run of consecutive sequence
        numbers starting at the group's next undelivered one (or a retried event the group has
        already moved past) is claimable."""
        ...

    def finish_many(
        self, outcomes: Sequence[Outcome], now_ms: int, retention_ms: int | None
    ) -> list[bool]:
        """Write each outcome while its claim (``outcome.token``) still holds the event, in as
        few requests as the store allows; one bool per outcome: False where the lease had been
        lost, True also for a write of this very outcome whose answer was lost. A completed
        event is kept ``retention_ms`` (deleted when None); a failed one is kept forever. A
        completed or failed ordered event lets its group's next event go."""
        ...

    def extend_many(
        self, held: Sequence[EventRecord], lease_until_ms: int, now_ms: int
    ) -> list[bool]:
        """Move the lease expiry of each claimed record while its token holds it."""
        ...

    def retry_failed(self, event_id: str, now_ms: int, token: str) -> RetryOutcome:
        """Move an existing failed event back to pending with its attempts reset; never creates.
        ``token`` (random, one per retry) is stored with the move, so that a write of this very
        retry whose answer was lost is recognised: "retried", not "not_failed"."""
        ...

    def retry_group(
        self, group: str, records: Sequence[EventRecord], now_ms: int, token: str
    ) -> list[str]:
        """Move ``records`` (failed ordered events of ``group``, in their old place order) back
        to pending at the group's tail: each takes the group's next place from its publish
        counter, as an ordered publish would, in the order given; attempts reset, due now.
        Each moves only while it is still failed in ``group`` at the place it had; the others
        are left out. All or nothing where the store allows (DynamoDB: one transaction of up
        to 99 events and the gate, then the next 99 after them). Returns the ids moved, in
        their new order. ``token`` (random, one per call) is stored on every moved event, so
        that a move sent again after its answer was lost is recognised (reported moved, never
        moved twice, also when the event failed again in between)."""
        ...
