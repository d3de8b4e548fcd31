"""The delivery engine that the polling worker and the stream relay share: :class:`Delivery` runs
a held event (handler lookup, :func:`~._decide.decide`, the counters, metrics and hooks) and
stores outcomes; :class:`ClaimedBatch` runs a claimed batch (group order, held-back groups,
flushes, give-backs; one event is a batch of one); :class:`LeaseKeeper` keeps the leases of
what a worker holds, one per worker for its whole life."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .. import tracing as _tracing
from .._clock import Clock, now_ms
from ..errors import ConfigurationError
from ..metrics import MetricsScope
from ._decide import CLAIMED_TOO_OFTEN, NO_HANDLER, SUCCEEDED, Result, decide, no_handler_error
from ._decide import raised as handler_raised
from .event import Event, EventRecord, EventStatus, new_event_id
from .options import DeliveryHooks, WorkerOptions
from .store import OutboxStore, Outcome

__all__ = [
    "MAX_ERROR_BYTES",
    "ClaimedBatch",
    "Delivery",
    "Handler",
    "LeaseKeeper",
    "claim_token",
    "counted_attempts",
    "first_to_run",
]

logger = logging.getLogger(__name__)

#: ``last_error`` is cut to this many bytes (UTF-8): part of the room a stored event keeps for
#: delivery (:data:`~dynacoord.outbox.event.DELIVERY_ROOM`).
MAX_ERROR_BYTES = 2000

Handler = Callable[[Event], Any]


def error_text(exc: BaseException) -> str:
    """A handler's error as stored in ``last_error``: at most :data:`MAX_ERROR_BYTES`."""
    # A handler's message may hold lone surrogates (bytes decoded with surrogateescape); escape
    # them, or the store write that records the failure would itself fail.
    data = f"{type(exc).__name__}: {exc}".encode("utf-8", "backslashreplace")
    if len(data) <= MAX_ERROR_BYTES:
        return data.decode("utf-8")
    # cut on a character boundary ("ignore" drops a character the cut split)
    return data[: MAX_ERROR_BYTES - 3].decode("utf-8", "ignore") + "..."


#: Lease tokens are random hex digits (:func:`~.event.new_event_id`) with, on some claims, a first
#: character that says what the claim was (it costs no byte, and stores compare tokens whole):
#: ``SURE_MARK``: a claim of an event whose handler runs at once (a claim of one event, or of the
#: first of a batch to run: a claim that ends without an outcome ended in that event's own handler); ``RECLAIM_MARK``: as sure, and the stored attempts
#: hold one claim that does not count (see :func:`counted_attempts`). Other tokens (a batch's
#: claims, the stream relay's) are not sure: their event may have waited behind a batchmate.
SURE_MARK = "s"
RECLAIM_MARK = "r"


def claim_token(seen: EventRecord | None = None) -> str:
    """A lease token for a claim of one event whose handler runs at once: ``seen`` is the event
    as read (None: a pending event). An expired lease held by a claim that was not sure is
    re-claimed with one attempt not counted (:data:`RECLAIM_MARK`); others are sure."""
    mark = SURE_MARK
    if seen is not None and seen.status is EventStatus.IN_FLIGHT:
        held_by = seen.lease_token or ""
        if not held_by.startswith(SURE_MARK):  # not sure, or a re-claim (its attempt not counted)
            mark = RECLAIM_MARK
    return mark + new_event_id()[1:]


def counted_attempts(record: EventRecord) -> int:
    """The attempts of a claimed event that count towards ``max_attempts``: its handler's starts
    as far as the store can tell.

    Every claim counts an attempt when it is written. A claim of a batch that ended without an
    outcome (its process was killed) may never have started its event's handler: a batchmate of
    the event that killed the process. So an expired lease is re-claimed *alone*, and run at
    once, and when the claim that held it was not sure (a batch's) the re-claim does not count
    that claim's attempt (its own counts instead): a poison event's batchmates are not charged,
    and a poison event, re-claimed alone, is charged one attempt per death in its own handler.
    The first event of a batch to run is claimed sure (:func:`first_to_run`), so a poison event
    that ran first is charged its first death too and fails after exactly ``max_attempts``
    starts; one that ran after a batchmate may start once more (nothing in the store tells
    which of a dead batch's events was running without a write per handler start). A re-claim's
    outcome gives the uncounted attempt back to the store."""
    token = record.lease_token
    if token is not None and token.startswith(RECLAIM_MARK) and record.attempts > 1:
        return record.attempts - 1
    return record.attempts


def _is_async(handler: object) -> bool:
    """Whether calling ``handler`` makes a coroutine (or an async generator) instead of running
    it: an ``async def`` (also inside ``functools.partial``), or an object whose ``__call__``
    is one. A class is called to make an instance: it is not async."""
    if inspect.iscoroutinefunction(handler) or inspect.isasyncgenfunction(handler):
        return True
    if isinstance(handler, type) or inspect.isroutine(handler):
        return False
    # The type's __call__ (what calling an instance runs): every callable object has one.
    call = type(handler).__call__
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def _check_sync(handler: object, what: str) -> None:
    if _is_async(handler):
        raise ConfigurationError(
            f"{what} is async ({handler!r}): the worker calls handlers synchronously, so its "
            "coroutine would never run and the event would be stored as delivered. Give a "
            "plain function (for async code: def handler(event): asyncio.run(send(event)))"
        )


def _handler_table(
    handlers: Handler | Mapping[str, Handler],
) -> tuple[Handler | None, dict[str, Handler] | None]:
    """(one handler for every type, None) or (None, the handlers by event type), checked: an
    async handler is refused (see :func:`_is_async`)."""
    if isinstance(handlers, Mapping):
        for event_type, handler in handlers.items():
            if not isinstance(event_type, str) or not event_type:
                raise ConfigurationError(
                    f"handler keys must be event types (non-empty str), got {event_type!r}"
                )
            if not callable(handler):
                raise ConfigurationError(f"handler for {event_type!r} is not callable")
            _check_sync(handler, f"the handler for {event_type!r}")
        return None, dict(handlers)
    if callable(handlers):
        _check_sync(handlers, "the handler")
        return handlers, None
    raise ConfigurationError(
        "handlers must be a callable or a mapping of event type to callable, got "
        f"{type(handlers).__name__}"
    )


class Delivery:
    """One worker's delivery of held events: runs handlers, decides outcomes, stores them under
    the claims, and counts what came of them (``delivered``, ``retried``, ``failed``, ``lost``
    since it was made). The worker's polls and the stream relay both deliver through it."""

    def __init__(
        self,
        store: OutboxStore,
        handlers: Handler | Mapping[str, Handler],
        *,
        options: WorkerOptions,
        hooks: DeliveryHooks,
        clock: Clock,
        metrics: MetricsScope,
        name: str,
    ) -> None:
        self._handler, self._handlers = _handler_table(handlers)
        self.store = store
        self.options = options
        self.hooks = hooks
        self.clock = clock
        self.name = name
        self._metrics = metrics
        self.lease_ms = options.lease_ms
        self.retention_ms = options.retention_ms
        #: the worker's lease keeper (None without ``heartbeat``)
        self.keeper: LeaseKeeper | None = (
            LeaseKeeper(self, self.lease_ms / 3000) if options.heartbeat else None
        )
        self.delivered = 0
        self.retried = 0
        self.failed = 0
        self.lost = 0

    # -- one held event ---------------------------------------------------------------------------

    def handler_for(self, event_type: str) -> Handler | None:
        if self._handler is not None:
            return self._handler
        assert self._handlers is not None
        return self._handlers.get(event_type) or self._handlers.get("*")

    def handle(self, record: EventRecord) -> Outcome:
        """Run ``record``'s handler (its attempts counted as in ``record``, see
        :func:`counted_attempts`) and decide the outcome; nothing is written."""
        attempts = counted_attempts(record)
        if attempts != record.attempts:
            # A re-claim: its outcome is decided on the attempts that count, and gives the
            # dead claim's attempt back (stored with it) if the event goes back to pending.
            # Its handler still sees the claim's number (``event.attempt``: how many times it
            # was claimed, the dead claim included).
            counted = dataclasses.replace(record, attempts=attempts)
            outcome = self._handle(counted, record.attempts)
            if outcome.kind == "pending":
                # given back with the dead claim's attempt, whether its own counts or not (a
                # worker without its handler leaves it uncounted)
                outcome = dataclasses.replace(outcome, uncounted=record.attempts - attempts)
            return outcome
        return self._handle(record, attempts)

    def _handle(self, record: EventRecord, claim_number: int) -> Outcome:
        attempts = record.attempts
        event = record.event.with_attempt(claim_number)
        if record.status is EventStatus.IN_FLIGHT and attempts > 1:
            logger.debug("%s: event %r attempt %d", self.name, event.id, attempts)
        if attempts > self.options.max_attempts:
            # Every earlier claim ended without an outcome (see decide): not run again.
            return self._decide(record, CLAIMED_TOO_OFTEN)
        handler = self.handler_for(event.type)
        if handler is None:
            self._log_missing_handler(record)
            return self._decide(record, NO_HANDLER)
        try:
            if _tracing.spanning:  # in a span linked to the publisher's (dynacoord.tracing)
                _tracing.run_handler(handler, event)
            else:
                handler(event)
        except Exception as exc:
            text = error_text(exc)
            logger.warning(
                "%s: handler for event %r (%s) failed on attempt %d: %s",
                self.name,
                event.id,
                event.type,
                record.attempts,
                text,
            )
            if self.hooks.on_error is not None:
                self._hook("on_error", self.hooks.on_error, event, exc)
            return self._decide(record, handler_raised(text))
        return self._decide(record, SUCCEEDED)

    def _decide(self, record: EventRecord, result: Result) -> Outcome:
        return decide(
            record, result, self.options, now_ms=now_ms(self.clock), jitter=random.uniform
        )

    def _log_missing_handler(self, record: EventRecord) -> None:
        error = no_handler_error(record)
        policy = self.options.on_missing_handler
        if policy == "leave":
            logger.warning(
                "%s: event %r left for a worker that has its handler: %s (due again in %d s)",
                self.name,
                record.id,
                error,
                self.options.lease_ms // 1000,
            )
        elif policy == "skip":
            logger.warning("%s: event %r skipped: %s", self.name, record.id, error)
        elif policy == "retry":
            logger.warning("%s: event %r: %s (will retry)", self.name, record.id, error)
        else:
            logger.error("%s: event %r marked failed: %s", self.name, record.id, error)

    def leaves(self, record: EventRecord) -> bool:
        """Whether ``record`` is left alone here (no handler for its type, and the policy is
        ``"leave"``): the stream relay then writes nothing, and the sweeper has it later."""
        if self.options.on_missing_handler != "leave" or self.handler_for(record.type) is not None:
            return False
        self._log_missing_handler(record)
        return True

    def still_held(self, record: EventRecord) -> bool:
        """Whether the lease on ``record`` still holds now, before its handler runs."""
        keeper = self.keeper
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

    def deliver(self, record: EventRecord, token: str) -> None:
        """Handle one event claimed under ``token`` and store its outcome at once, its lease kept
        alive meanwhile: a batch of one."""
        if record.lease_token != token:
            record = dataclasses.replace(record, lease_token=token)
        ClaimedBatch(self, [record]).run()

    # -- outcomes --------------------------------------------------------------------------------

    def store_outcomes(
        self, outcomes: Sequence[Outcome], counted_lost: Iterable[str] = ()
    ) -> list[bool]:
        """Store ``outcomes`` of claimed events (each under its claim) and count them; one bool
        each, False where the claim had been taken over. Their leases are kept while the
        outcomes are written, and let go after. A refusal of an event of ``counted_lost`` is
        not counted again."""
        if not outcomes:
            return []
        ids = [o.record.id for o in outcomes]
        keeper = self.keeper
        if keeper is not None:
            keeper.closing(ids)  # still extended while the outcomes are written
        # Not let go when the write raises: the caller may try again under the same leases.
        written = self.store.finish_many(outcomes, now_ms(self.clock), self.retention_ms)
        if keeper is not None:
            keeper.release(ids)
        quiet = set(counted_lost)
        for outcome, ok in zip(outcomes, written, strict=True):
            if ok or outcome.record.id not in quiet:
                self.count(outcome, ok)
        return written

    def count(self, outcome: Outcome, stored: bool) -> None:
        """Count an outcome stored (or refused: ``stored`` False), and call the hooks."""
        record = outcome.record
        if not stored:
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
            if self._metrics.enabled:  # no clock read for a latency nobody listens to
                self._metrics.count("OutboxDelivered")
                self._metrics.milliseconds(
                    "OutboxDeliveryLatency", now_ms(self.clock) - record.event.occurred_at * 1000
                )
            if self.hooks.on_delivered is not None:
                self._hook("on_delivered", self.hooks.on_delivered, _as_handled(record))
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
            if self.hooks.on_failed is not None:
                self._hook("on_failed", self.hooks.on_failed, _as_handled(record))
        elif outcome.count_attempt:
            self.retried += 1
            self._metrics.count("OutboxRetried")

    def _hook(self, name: str, hook: Callable[..., Any], *args: Any) -> None:
        try:
            hook(*args)
        except Exception:
            logger.exception("%s: %s hook raised (ignored)", self.name, name)


def _as_handled(record: EventRecord) -> Event:
    """The event as its handler saw it (attempt set): made only when a hook wants it."""
    return record.event.with_attempt(record.attempts)


class ClaimedBatch:
    """Events claimed together, run one after another in group order; their outcomes are
    stored together at the end (sooner when a third of the lease has passed since the first
    unstored one). An ordered group's event runs only after the one before it in the batch is
    done; while that one is not, the rest of the group is given back, due with it."""

    def __init__(self, delivery: Delivery, claimed: Sequence[EventRecord]) -> None:
        self.delivery = delivery
        self.records = sure_first(in_group_order(list(claimed)))
        self.handled = 0
        self._outcomes: list[Outcome] = []
        self._settled: set[str] = set()  # events with an outcome (stored or not), or skipped
        #: ordered group -> due of its unfinished head
        self._held_back: dict[str, int] = {}
        #: ordered groups whose head failed for good in this batch, that failure not stored yet
        self._failed_unstored: set[str] = set()
        self._flush_by = 0
        self._flush_failed = False  # the last store of outcomes raised
        #: given back because their lease ran out before their turn (counted as lost already)
        self._ran_out: set[str] = set()

    def run(
        self,
        keep_going: Callable[[], bool] | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> int:
        """Run the batch; return how many handlers ran. ``keep_going`` and ``stopping`` are
        asked before each event: once either says stop, the rest is given back, due at once."""
        delivery = self.delivery
        keeper = delivery.keeper
        now = now_ms(delivery.clock)
        if keeper is not None:
            keeper.hold(self.records, now)
        self._flush_by = now + delivery.lease_ms // 3
        current: EventRecord | None = None  # the event whose handler runs
        try:
            for index, record in enumerate(self.records):
                group = record.event.group if record.seq is not None else None
                if group is not None and group in self._held_back:
                    self._hold_back(record, group)
                    continue
                if stopping() or (keep_going is not None and not keep_going()):
                    self._give_back(self.records[index:])
                    break
                if group is not None and group in self._failed_unstored:
                    # Its group's head failed for good: store that before the next place runs
                    # (else a worker dying here leaves the head to a next attempt that would
                    # come after this event's delivery).
                    self.flush()
                    if group in self._held_back:
                        self._hold_back(record, group)
                        continue
                if not delivery.still_held(record):
                    # Given back unhandled, no attempt counted, if it is still ours (nobody took
                    # it): a sure claim left in flight would be counted as a death in its handler.
                    self._give_back([record])
                    self._ran_out.add(record.id)
                    if group is not None:
                        # Its place may still be undelivered (another worker has it, or it went
                        # back to pending): the rest of its group waits behind it.
                        self._held_back[group] = now_ms(delivery.clock)
                    continue
                current = record
                outcome = delivery.handle(record)
                current = None
                self.handled += 1
                self._outcomes.append(outcome)
                if keeper is not None:
                    keeper.decided(record.id)
                self._settled.add(record.id)
                if group is not None and outcome.kind == "pending":
                    self._held_back[group] = outcome.due_ms
                elif group is not None and outcome.kind == "failed":
                    self._failed_unstored.add(group)
                if now_ms(delivery.clock) >= self._flush_by and index + 1 < len(self.records):
                    self.flush()
            # Stored while the keeper still holds them: a slow write must not let leases lapse.
            self.flush()
        except BaseException:
            # KeyboardInterrupt / SystemExit mid-batch (or a store error storing outcomes):
            # store what is done (so it is not delivered again) and give back what was not
            # started; the event whose handler was interrupted is claimed again after its lease.
            given_back = self._give_back([r for r in self.records if r is not current])
            if given_back or not self._flush_failed:  # not the very write that just failed
                try:
                    self.flush()
                except Exception:
                    logger.exception("%s: outcomes not stored while stopping", delivery.name)
            raise
        finally:
            if keeper is not None:
                keeper.release(r.id for r in self.records)
        return self.handled

    def _hold_back(self, record: EventRecord, group: str) -> None:
        """An earlier event of its group is not done: give this one back, due with it."""
        self._outcomes.append(
            Outcome(record, "pending", due_ms=self._held_back[group], count_attempt=False)
        )
        self._settled.add(record.id)

    def _give_back(self, records: Iterable[EventRecord]) -> int:
        """Give back the events of ``records`` not settled yet: pending, due now, no attempt
        counted. Returns how many."""
        now = now_ms(self.delivery.clock)
        given = 0
        for record in records:
            if record.id not in self._settled:
                # A re-claim gives the dead claim's attempt back too (see counted_attempts).
                uncounted = record.attempts - counted_attempts(record)
                self._outcomes.append(
                    Outcome(record, "pending", due_ms=now, count_attempt=False, uncounted=uncounted)
                )
                self._settled.add(record.id)
                given += 1
        return given

    def flush(self) -> None:
        """Store the outcomes not stored yet. A head's failure that could not be stored means
        someone else has the head: its group is held back from here on."""
        outcomes = self._outcomes
        self._flush_failed = True
        stored = self.delivery.store_outcomes(outcomes, self._ran_out)
        self._flush_failed = False
        self._outcomes = []  # only once stored: after an error they are stored with the give-backs
        for outcome, ok in zip(outcomes, stored, strict=True):
            head_group = outcome.record.event.group
            if not ok and outcome.kind == "failed" and head_group in self._failed_unstored:
                self._held_back[head_group] = now_ms(self.delivery.clock)
        self._failed_unstored.clear()
        self._flush_by = now_ms(self.delivery.clock) + self.delivery.lease_ms // 3


def first_to_run(candidates: Sequence[EventRecord]) -> EventRecord | None:
    """The event of ``candidates`` whose handler a batch claiming them all runs first (None if
    there are none): it is claimed sure (:func:`claim_token`), so that a death before its outcome
    counts as a death in its own handler. A poison event first in its batch is then charged each
    death, and fails after ``max_attempts`` of them, not one more."""
    ordered = in_group_order(list(candidates))
    return ordered[0] if ordered else None


def sure_first(records: list[EventRecord]) -> list[EventRecord]:
    """``records`` (in group order) with the one claimed sure first: whatever the order the claim
    answered in, a sure claim's handler is the batch's first to start, as its token says. It was
    the first of its group among the candidates (:func:`first_to_run`), so its group keeps its
    order."""
    for index, record in enumerate(records):
        if index and (record.lease_token or "").startswith(SURE_MARK):
            return [record, *records[:index], *records[index + 1 :]]
    return records


def in_group_order(records: list[EventRecord]) -> list[EventRecord]:
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


class LeaseKeeper:
    """One per worker for its whole life: every ``interval`` seconds while it holds events,
    extends (in one store call) the leases of those claimed or extended more than half a beat
    ago, so fast batches cost no extension at all. Its thread runs only while something is held
    (it is started by :meth:`hold` and ended, joined, when :meth:`release` lets the last go), so
    an idle worker has no thread.

    An event is held from its claim until its outcome is *stored*, not merely decided: a handled
    event whose outcome waits for the batch's end (behind a slow handler) keeps its lease, so
    nobody else delivers it again."""

    def __init__(self, delivery: Delivery, interval: float) -> None:
        self._delivery = delivery
        self._interval = interval
        self._lock = threading.Lock()
        #: held for a whole beat, store calls included (see take_back)
        self._beating = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        #: event id -> (record as claimed, when its lease ends as stored, ms)
        self._held: dict[str, tuple[EventRecord, int]] = {}
        #: held events whose outcome is being written: a refused extension is that write's doing
        self._closing: set[str] = set()
        #: held events whose outcome is decided, waiting for the batch's flush (see _beat)
        self._decided: set[str] = set()
        #: held events delivered without a claim (the stream relay's): event id -> the event as
        #: read (pending, unclaimed). When its lease wants extending the keeper claims it under
        #: the token its delivery carries: from then on it is held as any claimed event.
        self._unclaimed: dict[str, EventRecord] = {}
        #: event id -> the record as claimed by the keeper (of the events held unclaimed)
        self.claimed: dict[str, EventRecord] = {}
        #: held events whose lease was lost (until released)
        self.lost: set[str] = set()

    @property
    def interval_ms(self) -> int:
        return int(self._interval * 1000)

    def hold(self, records: Sequence[EventRecord], at_ms: int) -> None:
        with self._lock:
            for record in records:
                # The lease the claim wrote (computed before the claim was sent: a slow claim
                # leaves less of it), else one from now.
                until = record.due_at_ms or at_ms + self._delivery.lease_ms
                self._held[record.id] = (record, until)
            self._wake()

    def hold_unclaimed(self, seen: EventRecord, record: EventRecord, until_ms: int) -> None:
        """Hold ``record``, delivered without a claim until ``until_ms`` (the end of the
        relay's implicit lease); ``seen`` is the event as read, which the claim checks."""
        with self._lock:
            self._held[record.id] = (record, until_ms)
            self._unclaimed[record.id] = seen
            self._wake()

    def decided(self, event_id: str) -> None:
        """The outcome of a held event is decided; the batch stores it at its next flush."""
        with self._lock:
            if event_id in self._held:
                self._decided.add(event_id)

    def closing(self, event_ids: Iterable[str]) -> None:
        """The outcomes of these events are being written: keep them alive meanwhile, and take
        a refused extension for the outcome's own write, not a lost lease."""
        with self._lock:
            self._closing.update(event_ids)

    def release(self, event_ids: Iterable[str]) -> None:
        """Let these events go (their outcomes are stored, or they are someone else's)."""
        with self._lock:
            for event_id in event_ids:
                self._held.pop(event_id, None)
                self._closing.discard(event_id)
                self._decided.discard(event_id)
                self._unclaimed.pop(event_id, None)
                self.claimed.pop(event_id, None)
                self.lost.discard(event_id)
            thread = self._rest() if not self._held else None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def take_back(self, event_id: str) -> tuple[bool, EventRecord | None]:
        """Stop holding one event once a beat in flight is done with it: (whether its lease was
        lost, the record as this keeper claimed it if it was held without a claim and the keeper
        claimed it)."""
        with self._beating, self._lock:
            lost = event_id in self.lost
            claimed = self.claimed.get(event_id)
        self.release([event_id])
        return lost, claimed

    def taken(self, event_id: str) -> bool:
        """Whether a held event was claimed by this keeper or lost to another worker (a beat in
        flight may still change that: :meth:`take_back` waits for it)."""
        with self._lock:
            return event_id in self.lost or event_id in self.claimed

    def lease_until(self, event_id: str) -> int | None:
        """When the lease of a held event ends as far as this keeper knows (None: lost)."""
        with self._lock:
            held = self._held.get(event_id)
        return None if held is None else held[1]

    # -- its thread (tests replace these two to beat it themselves) -------------------------------

    def _wake(self) -> None:
        """Start the thread if none runs (called holding the lock)."""
        if self._thread is not None:
            return
        done = self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(done,),
            name=f"dynacoord-outbox-lease-{self._delivery.name}",
            daemon=True,
        )
        self._thread.start()

    def _rest(self) -> threading.Thread | None:
        """End the thread, now that nothing is held (called holding the lock); returns it for
        the caller to join outside the lock."""
        thread, self._thread = self._thread, None
        self._done.set()
        return thread

    def _run(self, done: threading.Event) -> None:
        while not done.wait(self._next_wait()):
            self.beat()

    def _next_wait(self) -> float:
        """Seconds to the next beat: one interval, sooner when a held lease would have less than
        a beat left by then. A claim's lease end is set before the claim is sent, so a slow claim
        (a loaded store, statements sent again) leaves less of it; a first beat a whole interval
        after the hold let other workers take such a batch over before it was extended. Never
        sooner than a twentieth of the interval (50 ms at least): an extension that keeps
        failing is not sent in a loop."""
        floor = max(0.05, self._interval / 20)
        with self._lock:
            ends = [until for _, until in self._held.values()]
        if not ends:
            return self._interval
        left_ms = min(ends) - now_ms(self._delivery.clock) - 2 * self.interval_ms
        return max(floor, min(self._interval, left_ms / 1000))

    # -- a beat -----------------------------------------------------------------------------------

    def beat(self) -> None:
        """One beat: extend, in one store call, the held leases moved half a beat ago or more."""
        with self._beating:
            self._beat()

    def _beat(self) -> None:
        delivery = self._delivery
        # Half a beat, not a whole one: a late wake-up must not skip a claim's turn.
        threshold = delivery.lease_ms - self.interval_ms // 2
        # An event whose outcome waits for the batch's flush is extended only once its lease is
        # within a beat and a half of its end: the flush comes a third of a lease after the
        # batch starts, as the first beat does, and extending what it is storing at that moment
        # was a write refused or wasted per event. A flush held up (a slow handler after it)
        # leaves it to the next beat, which still has half a beat's margin if it wakes late.
        decided_threshold = self.interval_ms * 3 // 2
        now = now_ms(delivery.clock)
        with self._lock:
            due = [
                rec
                for rec, until in self._held.values()
                if until - now <= (decided_threshold if rec.id in self._decided else threshold)
            ]
            claims = [(self._unclaimed[r.id], r) for r in due if r.id in self._unclaimed]
            due = [r for r in due if r.id not in self._unclaimed]
        if claims:
            self._claim(claims, now)
        if not due:
            return
        until = now + delivery.lease_ms
        try:
            kept = delivery.store.extend_many(due, until, now)
        except Exception:  # transient: the next beat may work, the leases still have time
            logger.exception("%s: extending %d lease(s) failed", delivery.name, len(due))
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
                    self._lose(record.id, "lease lost while held (another worker may deliver it)")

    def _claim(self, claims: list[tuple[EventRecord, EventRecord]], now: int) -> None:
        """Claim events held without a claim (``(as read, as delivered)`` pairs), each under
        its delivery's token: a handler running longer than a beat keeps its event as a worker
        does, and the relay's outcome is written under the claim."""
        delivery = self._delivery
        until = now + delivery.lease_ms
        try:
            got = delivery.store.claim_many(
                [seen for seen, _ in claims],
                [record.lease_token or "" for _, record in claims],
                until,
                now,
            )
        except Exception:  # transient: the next beat asks again, the lease still has time
            logger.exception("%s: claiming %d relayed event(s) failed", delivery.name, len(claims))
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
                elif record.id in self._closing:
                    pass  # its outcome was written first, or is refused too: the writer knows
                else:
                    self._lose(record.id, "taken by another worker while its handler ran")

    def _lose(self, event_id: str, why: str) -> None:
        """A held event is someone else's now (called holding the lock)."""
        self._held.pop(event_id, None)
        self.lost.add(event_id)
        logger.warning("%s: event %r: %s", self._delivery.name, event_id, why)
