"""The delivery side: :class:`OutboxWorker` claims due events, runs handlers and records the
outcome, all conditional on its lease token (see the package docstring for the races)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .. import tracing as _tracing
from .._clock import Clock, now_ms
from .._validate import (
    check_bool,
    check_int,
    non_negative_seconds,
    ttl_to_ms,
)
from ..errors import (
    ConfigurationError,
)
from ..metrics import NO_SCOPE, MetricsScope
from ._decide import (
    CLAIMED_TOO_OFTEN,
    NO_HANDLER,
    SUCCEEDED,
    MissingHandlerPolicy,
    Result,
    decide,
    no_handler_error,
    raised,
)
from .event import Event, EventRecord, EventStatus, new_event_id
from .store import OutboxStore, Outcome

__all__ = ["DEFAULT_RETENTION_SECONDS", "Handler", "MissingHandlerPolicy", "OutboxWorker"]

logger = logging.getLogger(__name__)

#: ``last_error`` is cut to this many bytes (UTF-8): part of the room a stored event keeps for
#: delivery (:data:`~dynacoord.outbox.event.DELIVERY_ROOM`).
MAX_ERROR_BYTES = 2000
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600

Handler = Callable[[Event], Any]


def _error_text(exc: BaseException) -> str:
    # A handler's message may hold lone surrogates (bytes decoded with surrogateescape); escape
    # them, or the store write that records the failure would itself fail.
    data = f"{type(exc).__name__}: {exc}".encode("utf-8", "backslashreplace")
    if len(data) <= MAX_ERROR_BYTES:
        return data.decode("utf-8")
    # cut on a character boundary ("ignore" drops a character the cut split)
    return data[: MAX_ERROR_BYTES - 3].decode("utf-8", "ignore") + "..."


class _LeaseKeeper(threading.Thread):
    """One per worker while it holds claims: every ``interval`` seconds, extends (in one store
    call) the leases of the events it holds that were claimed or extended more than half a beat
    ago, so fast batches cost no extension at all.

    An event is held from its claim until its outcome is *stored*, not merely decided: a handled
    event whose outcome waits for the batch's end (behind a slow handler) keeps its lease, so
    nobody else delivers it again."""

    def __init__(self, worker: OutboxWorker, interval: float) -> None:
        super().__init__(name=f"dynacoord-outbox-lease-{worker.name}", daemon=True)
        self._worker = worker
        self._interval = interval
        self._done = threading.Event()
        self._lock = threading.Lock()
        #: event id -> (record as claimed, when its lease ends as stored, ms)
        self._held: dict[str, tuple[EventRecord, int]] = {}
        #: held events whose outcome is being written: a refused extension is that write's doing
        self._closing: set[str] = set()
        #: held events delivered without a claim (the stream relay's): event id -> the event as
        #: read (pending, unclaimed). When its lease wants extending the keeper claims it under
        #: the token its delivery carries: from then on it is held as any claimed event.
        self._unclaimed: dict[str, EventRecord] = {}
        #: event id -> the record as claimed by the keeper (of the events held unclaimed)
        self.claimed: dict[str, EventRecord] = {}
        self.lost: set[str] = set()

    def hold(self, records: Sequence[EventRecord], at_ms: int) -> None:
        with self._lock:
            for record in records:
                # The lease the claim wrote (computed before the claim was sent: a slow claim
                # leaves less of it), else one from now.
                until = record.due_at_ms or at_ms + self._worker.lease_ms
                self._held[record.id] = (record, until)

    def hold_unclaimed(self, seen: EventRecord, record: EventRecord, until_ms: int) -> None:
        """Hold ``record``, delivered without a claim until ``until_ms`` (the end of the
        relay's implicit lease); ``seen`` is the event as read, which the claim checks."""
        with self._lock:
            self._held[record.id] = (record, until_ms)
            self._unclaimed[record.id] = seen

    def closing(self, event_ids: Iterable[str]) -> None:
        """The outcomes of these events are being written: keep them alive meanwhile, and take
        a refused extension for the outcome's own write, not a lost lease."""
        with self._lock:
            self._closing.update(event_ids)

    def release(self, event_ids: Iterable[str]) -> None:
        with self._lock:
            for event_id in event_ids:
                self._held.pop(event_id, None)
                self._closing.discard(event_id)

    def lease_until(self, event_id: str) -> int | None:
        """When the lease of a held event ends as far as this keeper knows (None: lost)."""
        with self._lock:
            held = self._held.get(event_id)
        return None if held is None else held[1]

    def run(self) -> None:
        while not self._done.wait(self._interval):
            self.beat()

    def beat(self) -> None:
        """One beat: extend, in one store call, the held leases moved half a beat ago or more."""
        worker = self._worker
        # Half a beat, not a whole one: a late wake-up must not skip a claim's turn.
        threshold = worker.lease_ms - int(self._interval * 1000) // 2
        now = now_ms(worker.clock)
        with self._lock:
            due = [rec for rec, until in self._held.values() if until - now <= threshold]
            claims = [(self._unclaimed[r.id], r) for r in due if r.id in self._unclaimed]
            due = [r for r in due if r.id not in self._unclaimed]
        if claims:
            self._claim(claims, now)
        if not due:
            return
        until = now + worker.lease_ms
        try:
            kept = worker._store.extend_many(due, until, now)
        except Exception:  # transient: the next beat may work, the leases still have time
            logger.exception("%s: extending %d lease(s) failed", worker.name, len(due))
            return
        with self._lock:
            for record, ok in zip(due, kept, strict=True):
                if record.id not in self._held:
                    continue
                if ok:
                    self._held[record.id] = (record, until)
                elif record.id in self._closing:
                    pass  # its outcome was stored first: still held until the worker says so
                else:
                    self._held.pop(record.id, None)
                    self.lost.add(record.id)
                    logger.warning(
                        "%s: event %r: lease lost while held (another worker may deliver it)",
                        worker.name,
                        record.id,
                    )

    def _claim(self, claims: list[tuple[EventRecord, EventRecord]], now: int) -> None:
        """Claim events held without a claim (``(as read, as delivered)`` pairs), each under
        its delivery's token: a handler running longer than a beat keeps its event as a worker
        does, and the relay's outcome is written under the claim."""
        worker = self._worker
        until = now + worker.lease_ms
        try:
            got = worker._store.claim_many(
                [seen for seen, _ in claims],
                [record.lease_token or "" for _, record in claims],
                until,
                now,
            )
        except Exception:  # transient: the next beat asks again, the lease still has time
            logger.exception("%s: claiming %d relayed event(s) failed", worker.name, len(claims))
            return
        claimed = {record.id: record for record in got}
        with self._lock:
            for _, record in claims:
                self._unclaimed.pop(record.id, None)
                if record.id not in self._held:
                    continue
                if record.id in claimed:
                    self._held[record.id] = (claimed[record.id], until)
                    self.claimed[record.id] = claimed[record.id]
                else:
                    self._held.pop(record.id, None)
                    self.lost.add(record.id)
                    logger.warning(
                        "%s: event %r: taken by another worker while its handler ran",
                        worker.name,
                        record.id,
                    )

    @property
    def interval_ms(self) -> int:
        return int(self._interval * 1000)

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join()


_ZOMBIE_TURN = -1  # the turn key of the expired-lease scan (shards are 0, 1, ...)


class _WorkerGroup:
    """The workers of this process that deliver from one store: their shard spread and their
    turns at its queues.

    Worker i of a group starts on shard (offset + i) % shards: the workers of one process
    spread over the shards, and processes spread by their random offsets.

    Its workers take turns to poll and claim from the same home shard: the claim takes the
    events out of the due queue before the next worker reads it, so threads of one process
    never claim over each other (measured on Redis, which has one queue: a fifth of the polls
    of 4 threads came back empty without it). ``shared_turns=False``: a fresh lock at each
    ask, so no turn is shared (the group of stores that cannot be weakly referenced)."""

    def __init__(self, *, shared_turns: bool = True) -> None:
        self.offset = random.randrange(1 << 16)
        self._numbers = itertools.count()
        self._shared_turns = shared_turns
        self._turns: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()

    def join(self) -> int:
        """The number of a new worker of the group (0, 1, ...)."""
        return next(self._numbers)

    def turn(self, shard: int) -> threading.Lock:
        """The turn at ``shard``'s queue (``_ZOMBIE_TURN``: at the expired-lease scan)."""
        if not self._shared_turns:
            return threading.Lock()
        with self._guard:
            return self._turns.setdefault(shard, threading.Lock())


# One group per store (held while the store lives), so that every worker made on a store, by
# any Outbox or thread of the process, takes its turns with the others.
_groups: weakref.WeakKeyDictionary[Any, _WorkerGroup] = weakref.WeakKeyDictionary()
_groups_guard = threading.Lock()
# Stores that cannot be weakly referenced share this one: its numbers spread them, no turns.
_UNSHARED = _WorkerGroup(shared_turns=False)


def _group_of(store: Any) -> _WorkerGroup:
    with _groups_guard:
        try:
            group = _groups.get(store)
            if group is None:
                group = _groups[store] = _WorkerGroup()
        except TypeError:  # a store that cannot be weakly referenced
            return _UNSHARED
        return group


class OutboxWorker:
    """Delivers due events to handlers. Made by :meth:`Outbox.worker`.

    ``handlers`` maps an event type to a callable taking the :class:`Event` (key ``"*"`` catches
    every other type), or is one callable for every type. A handler that returns normally
    completes the event; one that raises schedules a retry after
    ``min(max_backoff, backoff * 2**(attempt-1))`` seconds (equal jitter: between half and all of
    it), and after ``max_attempts`` attempts the event is ``failed`` (listed by
    ``outbox.failed()``, never deleted).

    ``on_missing_handler`` decides about an event whose type has no handler: ``"fail"`` (default)
    marks it failed at once with an explaining ``last_error``; ``"retry"`` treats it like a
    handler error (backoff, then failed: for rolling deployments where a newer worker knows the
    type); ``"skip"`` completes it without delivery, with a warning in the log.

    Completed events are kept ``retention`` seconds (then DynamoDB's TTL removes them), or
    deleted at once with ``retention=None``.

    **Batches** (``batch_claim=True``, the default): one poll claims up to ``batch_size`` due
    events in one store request, the handlers run one event at a time in order, and the outcomes
    of the batch are written together in one request (sooner when a third of the lease has
    passed since the first unwritten outcome). A crash mid-batch loses nothing: events whose
    outcome was not written are claimed again after their lease. ``batch_claim=False`` claims
    and completes one event per request (the same write units per event, more requests).

    ``leave_new_for`` (seconds): unordered pending events with no attempt yet are not claimed
    until they have been due that long: they belong to the stream relay meanwhile
    (``sweep_handler`` sets it to the lease).

    Hooks, each called with the event, their exceptions logged and never raised:
    ``on_delivered(event)`` after a completion is stored, ``on_error(event, exc)`` when a
    handler raises (every attempt), ``on_failed(event)`` after the event is stored as failed.

    One worker runs its events one after another; run several workers (threads, processes,
    Lambdas) for parallelism. A worker is not meant to be shared between threads.
    """

    def __init__(
        self,
        store: OutboxStore,
        handlers: Handler | Mapping[str, Handler],
        *,
        clock: Clock,
        batch_size: int = 25,
        lease: float = 30.0,
        max_attempts: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        poll_interval: float = 1.0,
        on_missing_handler: MissingHandlerPolicy = "fail",
        retention: float | None = DEFAULT_RETENTION_SECONDS,
        heartbeat: bool = True,
        name: str | None = None,
        metrics: MetricsScope | None = None,
        batch_claim: bool = True,
        on_delivered: Callable[[Event], Any] | None = None,
        on_error: Callable[[Event, Exception], Any] | None = None,
        on_failed: Callable[[Event], Any] | None = None,
        leave_new_for: float = 0.0,
        _group: _WorkerGroup | None = None,
    ) -> None:
        if isinstance(handlers, Mapping):
            for event_type, handler in handlers.items():
                if not isinstance(event_type, str) or not event_type:
                    raise ConfigurationError(
                        f"handler keys must be event types (non-empty str), got {event_type!r}"
                    )
                if not callable(handler):
                    raise ConfigurationError(f"handler for {event_type!r} is not callable")
            self._handlers: Mapping[str, Handler] | None = dict(handlers)
            self._handler: Handler | None = None
        elif callable(handlers):
            self._handlers = None
            self._handler = handlers
        else:
            raise ConfigurationError(
                f"handlers must be a callable or a mapping of event type to callable, got "
                f"{type(handlers).__name__}"
            )
        if on_missing_handler not in ("fail", "retry", "skip"):
            raise ConfigurationError(
                f"on_missing_handler must be 'fail', 'retry' or 'skip', got {on_missing_handler!r}"
            )
        for hook_name, hook in (
            ("on_delivered", on_delivered),
            ("on_error", on_error),
            ("on_failed", on_failed),
        ):
            if hook is not None and not callable(hook):
                raise ConfigurationError(f"{hook_name} must be callable, got {type(hook).__name__}")
        self._store = store
        self.clock = clock
        self.batch_size = check_int(batch_size, "batch_size", minimum=1, maximum=1000)
        self.lease_ms = ttl_to_ms(lease, "lease")
        self.max_attempts = check_int(max_attempts, "max_attempts", minimum=1)
        self.backoff = non_negative_seconds(backoff, "backoff")
        self.max_backoff = non_negative_seconds(max_backoff, "max_backoff")
        self.poll_interval = non_negative_seconds(poll_interval, "poll_interval")
        self.on_missing_handler: MissingHandlerPolicy = on_missing_handler
        self.retention_ms = None if retention is None else ttl_to_ms(retention, "retention")
        self.heartbeat = check_bool(heartbeat, "heartbeat")
        self.batch_claim = check_bool(batch_claim, "batch_claim")
        self.leave_new_ms = int(non_negative_seconds(leave_new_for, "leave_new_for") * 1000)
        self.on_delivered = on_delivered
        self.on_error = on_error
        self.on_failed = on_failed
        self.name = name or f"outbox-worker-{new_event_id()[:8]}"
        # A plain flag, not a threading.Event: stop() may run in a signal handler, and Event.set()
        # there can deadlock on the lock the interrupted main thread holds inside Event.wait().
        self._stop_requested = False
        self._external_stop: threading.Event | None = None
        # The workers it takes turns with, and its place among them (internal: by default the
        # group of every worker of this process on the same store).
        self._group = _group_of(store) if _group is None else _group
        self._number = self._group.join()
        self._shards = 0  # read from the store at the first poll
        self._next_zombie_scan_ms = 0
        # Added to the home shard after a poll that found events but claimed none (all taken,
        # or waiting behind their group's head): the next poll starts at the next shard. Without
        # it, a blocked ordered event that is due again at every poll on the home shard (it is
        # postponed by a second at a time) kept a batch_size=1 worker from ever reading the
        # shard where the group's head waits, when publishers with different shard counts had
        # put the group's events on two shards.
        self._shard_skew = 0
        #: running totals since the worker was made
        self.delivered = 0
        self.retried = 0
        self.failed = 0
        self.lost = 0
        self._metrics = metrics if metrics is not None else NO_SCOPE

    # -- loop -----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: the event being handled is finished, no new one is claimed
        (events of the batch not started yet are given back, due at once).

        Safe to call from a signal handler or another thread (it only sets a flag; a waiting
        :meth:`run` notices it within 50 ms). A stopped worker stays stopped.
        """
        self._stop_requested = True

    @property
    def stopping(self) -> bool:
        external = self._external_stop
        return self._stop_requested or (external is not None and external.is_set())

    def run(self, stop_event: threading.Event | None = None) -> None:
        """Poll and deliver until :meth:`stop` is called or ``stop_event`` is set.

        Sleeps ``poll_interval`` between polls that found nothing. Installs no signal handlers;
        for SIGTERM (containers, ECS) do it yourself::

            signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop())
            worker.run()
        """
        self._external_stop = stop_event
        logger.info("%s: started", self.name)
        try:
            while not self.stopping:
                try:
                    handled = self.run_once()
                except Exception:  # a store outage must not end the loop; botocore retried
                    logger.exception("%s: poll failed", self.name)
                    handled = 0
                if handled == 0:
                    self._wait(self.poll_interval)
        finally:
            self._external_stop = None
            logger.info("%s: stopped", self.name)

    def _wait(self, seconds: float) -> None:
        # Short slices so that a stop() from a signal handler (a plain flag) is seen promptly.
        deadline = time.monotonic() + seconds
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            external = self._external_stop
            if external is None:
                time.sleep(min(remaining, 0.05))
            else:
                external.wait(min(remaining, 0.05))

    def run_once(self, *, keep_going: Callable[[], bool] | None = None) -> int:
        """One poll: claim and handle up to ``batch_size`` due events; return how many were
        handled (successfully or not). For Lambda / cron: call it once per invocation.

        ``keep_going`` is asked before each event; once it returns False nothing more is
        claimed or started (the event in hand is finished; claimed events not started are given
        back). In Lambda, stop while a whole lease still fits::

            worker.run_once(keep_going=lambda: context.get_remaining_time_in_millis() > 35_000)
        """
        if keep_going is not None and not callable(keep_going):
            raise TypeError(f"keep_going must be callable, got {type(keep_going).__name__}")
        if keep_going is not None and not keep_going():
            return 0
        if self.batch_claim:
            turns: list[threading.Lock] = []
            try:
                candidates = self._poll(turns)
                claimed = self._claim_batch(candidates) if candidates else []
                if candidates and not claimed:
                    self._shard_skew += 1
            finally:
                for turn in turns:
                    turn.release()
            return self._run_batch(claimed, keep_going) if claimed else 0
        candidates = self._poll()
        if not candidates:
            return 0
        handled = 0
        # Workers polling together see the same oldest events; a shuffled order spreads them.
        random.shuffle(candidates)
        for seen in candidates:
            if self.stopping or (keep_going is not None and not keep_going()):
                break
            token = new_event_id()  # a lease token: the same random 128-bit form
            now = now_ms(self.clock)
            record = self._store.claim(seen, token, now + self.lease_ms, now)
            if record is None:
                continue  # someone else claimed it first, or it is not due any more
            self._process(record, token)
            handled += 1
        if not handled:
            self._shard_skew += 1  # see __init__
        return handled

    # -- polling ----------------------------------------------------------------------------------

    def _poll(self, turns: list[threading.Lock] | None = None) -> list[EventRecord]:
        """Due events, the worker's own shard first. With ``turns``, the queue of each shard read
        is taken in turn with the other workers of this process (its own waiting, others only if
        free) and the turns are appended, for the caller to release after its claim."""
        now = now_ms(self.clock)
        found: list[EventRecord] = []
        if now >= self._next_zombie_scan_ms or self._shards == 0:
            # Expired leases (a worker died or overran) and the namespace's shard count, at most
            # every lease/2: a zombie waits at most half a lease longer, and a poll costs one
            # query instead of one per shard and status. A scan that fills a batch looks again
            # at the next poll (a dead worker's whole batch is drained at once). Workers of one
            # process take turns to scan, so they do not claim the same zombies.
            if turns is not None:
                scan_turn = self._group.turn(_ZOMBIE_TURN)
                scan_turn.acquire()
                turns.append(scan_turn)
            self._shards = max(1, self._store.refresh_shards())
            for shard in range(self._shards):
                found.extend(self._query(EventStatus.IN_FLIGHT, shard, now, found))
                if len(found) >= self.batch_size:
                    break
            full = len(found) >= self.batch_size
            self._next_zombie_scan_ms = 0 if full else now + max(1, self.lease_ms // 2)
            if full:
                return found
        shards = self._shards
        home = (self._group.offset + self._number + self._shard_skew) % shards
        # The worker's own shard first; the next ones only while its own has fewer due events
        # than a batch, so busy workers of one process never race for the same queue head.
        for i in range(shards):
            shard = (home + i) % shards
            if turns is not None:
                turn = self._group.turn(shard)
                if not turn.acquire(blocking=i == 0):
                    continue  # a sibling is claiming from that queue right now
                turns.append(turn)
            found.extend(self._due(shard, now, found))
            if len(found) >= self.batch_size:
                break
        return found

    def _due(self, shard: int, now: int, found: list[EventRecord]) -> list[EventRecord]:
        """The due pending events of ``shard`` this worker may claim, up to a batch with
        ``found``. With ``leave_new_for``, new unordered events (no attempt yet) are the stream
        relay's for that long after they became due (it delivers them without a claim, see
        outbox.stream): the events old enough are read first, from their own range of the
        queue, so young ones filling the queue's head never hide them; then, while the batch
        has room, the young ones that are not new (due retries, ordered events: the relay
        claims those as everyone does)."""
        if not self.leave_new_ms:
            return self._query(EventStatus.PENDING, shard, now, found)
        before = now - self.leave_new_ms
        old = self._query(EventStatus.PENDING, shard, before, found)
        if len(found) + len(old) >= self.batch_size:
            return old
        # The old ones sort first in the queue: read past them (they are read again) into the
        # young range.
        known = {r.id for r in found} | {r.id for r in old}
        more = self._query(EventStatus.PENDING, shard, now, found, extra=len(old))
        return old + [
            r
            for r in more
            if r.id not in known
            and (r.status is not EventStatus.PENDING or r.attempts or r.seq is not None)
        ]

    def _query(
        self,
        status: EventStatus,
        shard: int,
        now: int,
        found: list[EventRecord],
        *,
        extra: int = 0,
    ) -> list[EventRecord]:
        """Up to a batch (with ``found``), plus ``extra``, of ``shard``'s events in ``status``
        due at ``now`` or before."""
        page_records: list[EventRecord] = []
        cursor: Any = None
        wanted = self.batch_size + extra
        while len(found) + len(page_records) < wanted:
            page, cursor = self._store.query_page(
                status,
                shard,
                due_before_ms=now,
                limit=wanted - len(found) - len(page_records),
                cursor=cursor,
            )
            page_records.extend(page)
            if cursor is None:
                break
        return page_records

    # -- a batch ---------------------------------------------------------------------------------

    def _claim_batch(self, candidates: list[EventRecord]) -> list[EventRecord]:
        if self.stopping:
            return []
        tokens = [new_event_id() for _ in candidates]
        now = now_ms(self.clock)
        return _in_group_order(self._store.claim_many(candidates, tokens, now + self.lease_ms, now))

    def _run_batch(self, claimed: list[EventRecord], keep_going: Callable[[], bool] | None) -> int:
        now = now_ms(self.clock)
        keeper = self._new_keeper()
        if keeper is not None:
            keeper.hold(claimed, now)
            keeper.start()
        outcomes: list[Outcome] = []
        settled: set[str] = set()  # events with an outcome (stored or not), or skipped
        current: EventRecord | None = None  # the event whose handler runs
        flush_by = now + self.lease_ms // 3
        held_back: dict[str, int] = {}  # ordered group -> due of its unfinished head
        # ordered groups whose head failed for good in this batch, that failure not stored yet
        failed_unstored: set[str] = set()
        handled = 0
        try:
            for index, record in enumerate(claimed):
                group = record.event.group if record.seq is not None else None
                if group is not None and group in held_back:
                    # An earlier event of its group is not done: give this one back, due with it.
                    outcomes.append(
                        Outcome(record, "pending", due_ms=held_back[group], count_attempt=False)
                    )
                    settled.add(record.id)
                    continue
                if self.stopping or (keep_going is not None and not keep_going()):
                    now = now_ms(self.clock)
                    outcomes.extend(
                        Outcome(r, "pending", due_ms=now, count_attempt=False)
                        for r in claimed[index:]
                        if r.id not in settled
                    )
                    settled.update(r.id for r in claimed[index:])
                    break
                if group is not None and group in failed_unstored:
                    # Its group's head failed for good: store that before the next place runs
                    # (else a worker dying here leaves the head to a next attempt that would
                    # come after this event's delivery).
                    stored = self._finish(outcomes, keeper)
                    for outcome, ok in zip(outcomes, stored, strict=True):
                        head_group = outcome.record.event.group
                        if not ok and outcome.kind == "failed" and head_group is not None:
                            held_back[head_group] = now_ms(self.clock)  # someone else has it
                    outcomes = []
                    failed_unstored.clear()
                    flush_by = now_ms(self.clock) + self.lease_ms // 3
                    if group in held_back:
                        outcomes.append(
                            Outcome(record, "pending", due_ms=held_back[group], count_attempt=False)
                        )
                        settled.add(record.id)
                        continue
                if not self._still_held(record, keeper):
                    settled.add(record.id)
                    if group is not None:
                        # Its place may still be undelivered (another worker has it, or it went
                        # back to pending): the rest of its group waits behind it.
                        held_back[group] = now_ms(self.clock)
                    continue
                current = record
                outcome = self._handle(record)
                current = None
                handled += 1
                outcomes.append(outcome)
                settled.add(record.id)
                if group is not None and outcome.kind == "pending":
                    held_back[group] = outcome.due_ms
                elif group is not None and outcome.kind == "failed":
                    failed_unstored.add(group)
                if now_ms(self.clock) >= flush_by and index + 1 < len(claimed):
                    self._finish(outcomes, keeper)
                    outcomes = []
                    failed_unstored.clear()
                    flush_by = now_ms(self.clock) + self.lease_ms // 3
            # Stored while the keeper still runs: a slow write must not let the leases lapse.
            self._finish(outcomes, keeper)
            outcomes = []
        except BaseException:
            # KeyboardInterrupt / SystemExit mid-batch (or a store error storing outcomes):
            # store what is done (so it is not delivered again) and give back what was not
            # started; the event whose handler was interrupted is claimed again after its lease.
            back = now_ms(self.clock)
            outcomes.extend(
                Outcome(r, "pending", due_ms=back, count_attempt=False)
                for r in claimed
                if r.id not in settled and r is not current
            )
            try:
                self._finish(outcomes, keeper)
            except Exception:
                logger.exception("%s: outcomes not stored while stopping", self.name)
            raise
        finally:
            if keeper is not None:
                keeper.stop()
        return handled

    def _still_held(self, record: EventRecord, keeper: _LeaseKeeper | None) -> bool:
        """Whether the worker's lease on ``record`` still holds now, before its handler runs."""
        until = record.due_at_ms if keeper is None else keeper.lease_until(record.id)
        if until is not None and now_ms(self.clock) < until:
            return True
        # Its lease ran out before its turn (a frozen process, a stalled batch, a claim whose
        # answer came late): another worker may be delivering it already; do not run it twice.
        self.lost += 1
        logger.warning(
            "%s: event %r not handled: its lease ran out before its turn", self.name, record.id
        )
        return False

    def _finish(self, outcomes: Sequence[Outcome], keeper: _LeaseKeeper | None) -> list[bool]:
        """Store ``outcomes``; one bool each: False where the lease had been lost."""
        if not outcomes:
            return []
        ids = [o.record.id for o in outcomes]
        if keeper is not None:
            keeper.closing(ids)  # still extended while the outcomes are written
        written = self._store.finish_many(outcomes, now_ms(self.clock), self.retention_ms)
        if keeper is not None:
            keeper.release(ids)
        for outcome, ok in zip(outcomes, written, strict=True):
            self._record(outcome, ok)
        return written

    def _new_keeper(self) -> _LeaseKeeper | None:
        """The lease keeper of one batch (not started), or None without ``heartbeat``."""
        return _LeaseKeeper(self, self.lease_ms / 3000) if self.heartbeat else None

    # -- delivery steps, for engines that deliver outside a poll (the stream relay) ---------------

    @property
    def store(self) -> OutboxStore:
        """The outbox store this worker delivers from."""
        return self._store

    def deliver(self, record: EventRecord, token: str) -> None:
        """Handle one event claimed under ``token`` and store its outcome at once, its lease kept
        alive meanwhile (as a poll does for a batch of one)."""
        self._process(record, token)

    def handle(self, record: EventRecord) -> Outcome:
        """Run ``record``'s handler (its attempts counted as in ``record``) and decide the
        outcome; nothing is written."""
        return self._handle(record)

    def store_outcomes(self, outcomes: Sequence[Outcome]) -> list[bool]:
        """Store ``outcomes`` of claimed events (each under its claim) and count them; one bool
        each, False where the claim had been taken over."""
        return self._finish(outcomes, None)

    def count(self, outcome: Outcome, stored: bool) -> None:
        """Count an outcome stored (or refused: ``stored`` False) elsewhere, and call the
        hooks."""
        self._record(outcome, stored)

    def lease_keeper(self) -> _LeaseKeeper | None:
        """A lease keeper of this worker's (not started), or None without ``heartbeat``."""
        return self._new_keeper()

    # -- one event --------------------------------------------------------------------------------

    def _handler_for(self, event_type: str) -> Handler | None:
        if self._handler is not None:
            return self._handler
        assert self._handlers is not None
        return self._handlers.get(event_type) or self._handlers.get("*")

    def _process(self, record: EventRecord, token: str) -> None:
        """Handle one claimed event and store its outcome at once (the per-event design; the
        stream relay uses it)."""
        if record.lease_token != token:
            record = dataclasses.replace(record, lease_token=token)
        keeper = self._new_keeper()
        if keeper is not None:
            keeper.hold([record], now_ms(self.clock))
            keeper.start()
        try:
            if not self._still_held(record, keeper):
                return
            outcome = self._handle(record)
            self._finish([outcome], keeper)
        finally:
            if keeper is not None:
                keeper.stop()

    def _handle(self, record: EventRecord) -> Outcome:
        """Run the event's handler; return the outcome to store (nothing is written here)."""
        event = record.event.with_attempt(record.attempts)
        if record.status is EventStatus.IN_FLIGHT and record.attempts > 1:
            logger.debug("%s: event %r attempt %d", self.name, event.id, record.attempts)
        if record.attempts > self.max_attempts:
            # Every earlier claim ended without an outcome (see decide): not run again.
            return self._decide(record, CLAIMED_TOO_OFTEN)
        handler = self._handler_for(event.type)
        if handler is None:
            self._log_missing_handler(record)
            return self._decide(record, NO_HANDLER)
        try:
            if _tracing.spanning:  # in a span linked to the publisher's (dynacoord.tracing)
                _tracing.run_handler(handler, event)
            else:
                handler(event)
        except Exception as exc:
            logger.warning(
                "%s: handler for event %r (%s) failed on attempt %d: %s",
                self.name,
                event.id,
                event.type,
                record.attempts,
                _error_text(exc),
            )
            self._hook("on_error", self.on_error, event, exc)
            return self._decide(record, raised(_error_text(exc)))
        return self._decide(record, SUCCEEDED)

    def _decide(self, record: EventRecord, result: Result) -> Outcome:
        return decide(
            record,
            result,
            max_attempts=self.max_attempts,
            backoff=self.backoff,
            max_backoff=self.max_backoff,
            missing_policy=self.on_missing_handler,
            now_ms=now_ms(self.clock),
            jitter=random.uniform,
        )

    def _log_missing_handler(self, record: EventRecord) -> None:
        error = no_handler_error(record)
        policy = self.on_missing_handler
        if policy == "skip":
            logger.warning("%s: event %r skipped: %s", self.name, record.id, error)
        elif policy == "retry":
            logger.warning("%s: event %r: %s (will retry)", self.name, record.id, error)
        else:
            logger.error("%s: event %r marked failed: %s", self.name, record.id, error)

    def _record(self, outcome: Outcome, ok: bool) -> None:
        """Count a stored (or refused) outcome and call the hooks."""
        record = outcome.record
        event = record.event.with_attempt(record.attempts)
        if not ok:
            self.lost += 1
            logger.warning(
                "%s: event %r: its lease had been taken over before the outcome (%s) was "
                "stored; the new claimant owns it now (it may be delivered again)",
                self.name,
                record.id,
                outcome.kind,
            )
            return
        if outcome.kind == "completed":
            if outcome.error is not None:
                return  # skipped (no handler): not a delivery
            self.delivered += 1
            self._metrics.count("OutboxDelivered")
            self._metrics.milliseconds(
                "OutboxDeliveryLatency", now_ms(self.clock) - event.occurred_at * 1000
            )
            self._hook("on_delivered", self.on_delivered, event)
        elif outcome.kind == "failed":
            self.failed += 1
            self._metrics.count("OutboxFailed")
            logger.error(
                "%s: event %r (%s) failed after %d attempts: %s",
                self.name,
                record.id,
                record.type,
                record.attempts,
                outcome.error,
            )
            self._hook("on_failed", self.on_failed, event)
        elif outcome.count_attempt:
            self.retried += 1
            self._metrics.count("OutboxRetried")

    def _hook(self, name: str, hook: Callable[..., Any] | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:
            logger.exception("%s: %s hook raised (ignored)", self.name, name)

    def __repr__(self) -> str:
        return f"OutboxWorker(name={self.name!r}, batch_size={self.batch_size})"


def _in_group_order(records: list[EventRecord]) -> list[EventRecord]:
    """``records`` with the events of each ordered group in their group order (each group keeps
    the positions its events had), everything else where it was."""
    groups: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        if record.seq is not None and record.event.group is not None:
            groups.setdefault(record.event.group, []).append(index)
    if not any(len(positions) > 1 for positions in groups.values()):
        return records
    ordered = list(records)
    for positions in groups.values():
        members = sorted((records[i] for i in positions), key=lambda r: r.seq or 0)
        for position, record in zip(positions, members, strict=True):
            ordered[position] = record
    return ordered
