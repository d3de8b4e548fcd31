"""The delivery side: :class:`OutboxWorker` claims due events, runs handlers and records the
outcome, all conditional on its lease token (see the package docstring for the races)."""

from __future__ import annotations

import itertools
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from .._clock import Clock, now_ms
from ..metrics import NO_SCOPE, MetricsScope
from .delivery import MAX_ERROR_BYTES, ClaimedBatch, Delivery, Handler, claim_token, first_to_run
from .event import EventRecord, EventStatus, new_event_id
from .options import DEFAULT_RETENTION_SECONDS, DeliveryHooks, MissingHandlerPolicy, WorkerOptions
from .store import OutboxStore

__all__ = [
    "DEFAULT_RETENTION_SECONDS",
    "MAX_ERROR_BYTES",
    "Handler",
    "MissingHandlerPolicy",
    "OutboxWorker",
    "WorkerGroup",
    "WorkerOptions",
]

logger = logging.getLogger(__name__)


_ZOMBIE_TURN = -1  # the turn key of the expired-lease scan (shards are 0, 1, ...)


class WorkerGroup:
    """The workers that deliver from one store in this process: their shard spread and their
    turns at its queues. Each :class:`~dynacoord.outbox.Outbox` has one, and the workers it
    makes join it.

    Worker i of a group starts on shard (offset + i) % shards: the workers of one process
    spread over the shards, and processes spread by their random offsets.

    Its workers take turns to poll and claim from the same home shard: the claim takes the
    events out of the due queue before the next worker reads it, so threads of one process
    never claim over each other (measured on Redis, which has one queue: a fifth of the polls
    of 4 threads came back empty without it)."""

    def __init__(self) -> None:
        self.offset = random.randrange(1 << 16)
        self._numbers = itertools.count()
        self._turns: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()
        _groups.add(self)

    def _forked(self) -> None:
        """In a forked child: new turns. A thread of the parent may have held one across its poll
        when the process forked; the child has no such thread to let it go, and every worker the
        child makes would block on its first poll."""
        self._turns = {}
        self._guard = threading.Lock()

    def join(self) -> int:
        """The number of a new worker of the group (0, 1, ...)."""
        return next(self._numbers)

    def turn(self, shard: int) -> threading.Lock:
        """The turn at ``shard``'s queue (``_ZOMBIE_TURN``: at the expired-lease scan)."""
        with self._guard:
            return self._turns.setdefault(shard, threading.Lock())


#: every WorkerGroup of the process (made new in a forked child)
_groups: weakref.WeakSet[WorkerGroup] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for group in list(_groups):
        group._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class OutboxWorker:
    """Delivers due events to handlers. Made by :meth:`Outbox.worker`.

    ``handlers`` maps an event type to a callable taking the :class:`Event` (key ``"*"`` catches
    every other type), or is one callable for every type. A handler that returns normally
    completes the event; one that raises schedules a retry after
    ``min(max_backoff, backoff * 2**(attempt-1))`` seconds (equal jitter: between half and all of
    it), and after ``max_attempts`` attempts the event is ``failed`` (listed by
    ``outbox.failed()``, never deleted).

    ``on_missing_handler`` decides about an event whose type has no handler: ``"leave"``
    (default) leaves it to a worker that has its handler (given back unhandled, no attempt
    counted, due again after one lease, a warning in the log); ``"fail"`` marks it failed at
    once with an explaining ``last_error``; ``"retry"`` treats it like a
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

    The options are a :class:`WorkerOptions` (``options``). Hooks (``hooks``, a
    :class:`~dynacoord.outbox.options.DeliveryHooks`), each called with the event, their
    exceptions logged and never raised: ``on_delivered(event)`` after a completion is stored,
    ``on_error(event, exc)`` when a handler raises (every attempt), ``on_failed(event)`` after
    the event is stored as failed. What it claims is run by its :attr:`delivery` engine, which
    the stream relay shares.

    One worker runs its events one after another; run several workers (threads, processes,
    Lambdas) for parallelism. A worker is not meant to be shared between threads.
    """

    def __init__(
        self,
        store: OutboxStore,
        handlers: Handler | Mapping[str, Handler],
        *,
        clock: Clock,
        options: WorkerOptions | None = None,
        hooks: DeliveryHooks | None = None,
        name: str | None = None,
        metrics: MetricsScope | None = None,
        group: WorkerGroup | None = None,
    ) -> None:
        options = WorkerOptions() if options is None else WorkerOptions.of(options)
        hooks = DeliveryHooks() if hooks is None else hooks
        if not isinstance(hooks, DeliveryHooks):
            raise TypeError(f"hooks must be a DeliveryHooks, got {type(hooks).__name__}")
        self.options = options
        self.clock = clock
        self.name = name or f"outbox-worker-{new_event_id()[:8]}"
        #: the delivery engine: runs what this worker claims, and keeps its counters
        self.delivery = Delivery(
            store,
            handlers,
            options=options,
            hooks=hooks,
            clock=clock,
            metrics=metrics if metrics is not None else NO_SCOPE,
            name=self.name,
        )
        self._store = store
        self.batch_size = options.batch_size
        self.lease_ms = options.lease_ms
        self.retention_ms = options.retention_ms
        self.poll_interval = options.poll_interval
        self.leave_new_ms = options.leave_new_ms
        # A plain flag, not a threading.Event: stop() may run in a signal handler, and Event.set()
        # there can deadlock on the lock the interrupted main thread holds inside Event.wait().
        self._stop_requested = False
        self._external_stop: threading.Event | None = None
        # The workers it takes turns with (its Outbox's), and its place among them; a worker
        # made alone is a group of one.
        self._group = WorkerGroup() if group is None else group
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

    # -- counters (since the worker was made) ----------------------------------------------------

    @property
    def delivered(self) -> int:
        return self.delivery.delivered

    @property
    def retried(self) -> int:
        return self.delivery.retried

    @property
    def failed(self) -> int:
        return self.delivery.failed

    @property
    def lost(self) -> int:
        return self.delivery.lost

    @property
    def store(self) -> OutboxStore:
        """The outbox store this worker delivers from."""
        return self._store

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
        if self.options.batch_claim:
            handled = 0
            for _ in range(2):  # expired leases first (each alone), then the due queue
                turns: list[threading.Lock] = []
                try:
                    candidates = self._poll(turns)
                    expired = bool(candidates) and candidates[0].status is EventStatus.IN_FLIGHT
                    claimed = [] if expired or not candidates else self._claim_batch(candidates)
                    if candidates and not expired and not claimed:
                        self._shard_skew += 1
                finally:
                    for turn in turns:
                        turn.release()
                if not expired:
                    if claimed:
                        handled += ClaimedBatch(self.delivery, claimed).run(
                            keep_going, lambda: self.stopping
                        )
                    return handled
                handled += self._deliver_alone(candidates, keep_going)
                if (
                    len(candidates) >= self.batch_size
                    or self.stopping
                    or (keep_going is not None and not keep_going())
                ):
                    return handled
            return handled
        candidates = self._poll()
        if not candidates:
            return 0
        # Workers polling together see the same oldest events; a shuffled order spreads them.
        random.shuffle(candidates)
        return self._deliver_alone(candidates, keep_going)

    def _deliver_alone(
        self, candidates: list[EventRecord], keep_going: Callable[[], bool] | None
    ) -> int:
        """Claim and deliver ``candidates`` one at a time (each claim holds one event, its
        outcome stored before the next claim). An expired lease (its holder died or froze
        without an outcome) is re-claimed under a marked token
        (:func:`~.delivery.reclaim_token`): whatever kills the process from here on is that
        event's own doing, which the attempt counting relies on (a poison event fails alone)."""
        handled = 0
        for seen in candidates:
            if self.stopping or (keep_going is not None and not keep_going()):
                break
            token = claim_token(seen)  # its handler runs at once: a sure claim
            now = now_ms(self.clock)
            record = self._store.claim(seen, token, now + self.lease_ms, now)
            if record is None:
                continue  # someone else claimed it first, or it is not due any more
            self.delivery.deliver(record, token)
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
            if found and turns is not None:
                # Expired leases are claimed alone, one at a time (a batch one of them killed
                # must not charge the others again): the due queue waits for the next poll.
                return found
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
        # A lease token: the same random 128-bit form as an event id; the claim of the event that
        # runs first is sure (its handler runs at once, see delivery.claim_token): a poison event
        # first in its batch is charged its first death too. The others may wait behind it.
        first = first_to_run(candidates)
        tokens = [claim_token() if c is first else new_event_id() for c in candidates]
        now = now_ms(self.clock)
        return self._store.claim_many(candidates, tokens, now + self.lease_ms, now)

    def __repr__(self) -> str:
        return f"OutboxWorker(name={self.name!r}, batch_size={self.batch_size})"
