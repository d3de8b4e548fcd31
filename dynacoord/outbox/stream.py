"""Serverless delivery: a Lambda handler for the table's DynamoDB stream, and a scheduled sweeper.

``backend.outbox.stream_handler(handlers)`` returns a Lambda handler for DynamoDB Streams events:
the stream relay, "the relay" below (the docs' word; not the SQS/SNS/EventBridge relays of
:mod:`dynacoord.relays`, which may be its handlers). A publish inserts the event item; the stream
hands its new image to the relay within about a second, with no polling cost. By default the relay
delivers a new event with **one write**: it reads the batch's events once (a consistent
``BatchGetItem``), runs the handler of each one still pending with no attempt, and stores the
outcome conditional on the event still being as it read it (pending, unclaimed, the same attempts
and due time). With ``claim=True`` it delivers exactly as a polling worker would: it **claims** the
event (a conditional write with a fresh lease token, kept alive by the heartbeat), runs the handler
and stores the outcome under that token.

The races, and what closes them:

* The relay and the sweeper see the same new event. Without a claim: the relay owns a new
  event for one lease after it became due, and the sweeper's worker leaves new unordered events
  alone that long (``leave_new_for``); the relay starts a handler without a claim only while
  that lease still holds the clock skew to the sweepers, the outcome's write and one heartbeat
  of its lease keeper, which claims the event if the handler is still running then (an event
  with less lease left is claimed before its handler starts), and its outcome is refused once
  anyone else moved the event. With claims: both claim it with a conditional write on its
  status, due time and lease token; one wins.
* Lambda retries a stream batch (the invocation timed out, a record was reported as failed, or a
  batch was bisected): the read (or the claim) shows the events already delivered, and they are
  not delivered again. An event whose handler failed was rescheduled with backoff (an attempt
  counted): the retry leaves it to the sweeper.
* An ordered event (``Event(ordered=True)``) is always claimed, and only when its group's earlier
  events are delivered (the claim checks the group's gate, as a polling worker's does); one that
  waits is left to the sweeper, which delivers the group in order.
* Two relays handed the same records at the same time (not Lambda's way: it runs one batch per
  stream shard at a time) may both run a handler without a claim; ``claim=True`` closes that.
* A handler fails: the outcome is the outbox's own retry (backoff, then ``failed`` after
  ``max_attempts``), stored in the table, so the stream batch is not blocked and nothing is lost;
  a polling pass (the sweeper) picks the event up when it is due again.

``{"batchItemFailures": [...]}`` lists only records whose outcome could not be stored (the store
failed even after botocore's retries): Lambda retries exactly those (and the records after them in
the shard). Records the relay skips (other namespaces, other item kinds, state changes of events
that are not new pending events) are never reported.

The relay stops claiming when the invocation's remaining time no longer holds a whole lease (plus
a second to store the outcome); the events it leaves are pending and due, and the sweeper delivers
them. ``sweep_handler`` is that sweeper: polling passes of the worker (due retries, expired leases,
anything the stream missed or the relay left), for an EventBridge schedule, optionally followed by
``runs.reconcile``.

Only the DynamoDB backend has a stream; other backends raise
:class:`~dynacoord.errors.NotSupportedError`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

from .._clock import now_ms
from .._validate import non_negative_seconds
from ..errors import ConfigurationError, InvalidValueError, NotSupportedError
from .event import EventRecord, EventStatus, new_event_id
from .options import STACK_OPTIONS
from .store import OutboxStore, Outcome
from .worker import OutboxWorker

__all__ = [
    "DEFAULT_CLOCK_SKEW",
    "OUTBOX_OPTIONS",
    "StreamHandler",
    "StreamStore",
    "SweepHandler",
]

logger = logging.getLogger(__name__)

#: The worker options the bundled stack's functions take (``OutboxOptions`` / the environment
#: variable ``DYNACOORD_OUTBOX_OPTIONS``, a JSON object).
OUTBOX_OPTIONS = STACK_OPTIONS

#: Time kept beyond one lease before claiming: storing the outcome needs a request or two.
OUTCOME_MARGIN_MS = 1000
#: The largest clock difference between the relay and the sweepers the relay allows for
#: (seconds; docs/guarantees.md, "Clock skew"): it starts a handler without a claim only while
#: that much more of its lease is left.
DEFAULT_CLOCK_SKEW = 2.0

BatchResponse = dict[str, list[dict[str, str]]]


class StreamStore(OutboxStore, Protocol):
    """What the stream relay needs of a store besides the outbox protocol (the DynamoDB store
    has it): reading a stream image, reading events by id in one request, and storing the
    outcome of an event delivered without a claim."""

    def stream_record(self, image: Mapping[str, Any], now_ms: int) -> EventRecord | None: ...

    def get_many(self, event_ids: Sequence[str], now_ms: int) -> dict[str, EventRecord]: ...

    def settle_unclaimed(
        self,
        settled: Sequence[tuple[EventRecord, Outcome]],
        now_ms: int,
        retention_ms: int | None,
    ) -> list[bool]: ...


_STREAM_METHODS = ("stream_record", "get_many", "settle_unclaimed")


class _Reconciler(Protocol):
    """``backend.runs`` as far as the sweeper uses it."""

    def reconcile(self, older_than: float, handler: Callable[[Any], Any]) -> Any: ...


def _keep_going(context: Any, needed_ms: int) -> Callable[[], bool]:
    """Whether another claim fits in the invocation: its remaining time holds ``needed_ms``."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return lambda: True  # called outside Lambda (tests, scripts): no deadline
    return lambda: int(remaining()) > needed_ms


def _stream_records(event: Any) -> Sequence[Mapping[str, Any]]:
    if not isinstance(event, Mapping) or not isinstance(event.get("Records"), list):
        raise InvalidValueError(
            "not a DynamoDB Streams event: expected a mapping with a 'Records' list, got "
            f"{type(event).__name__}"
        )
    records: list[Mapping[str, Any]] = event["Records"]
    for record in records:
        source = record.get("eventSource") if isinstance(record, Mapping) else None
        if source != "aws:dynamodb":
            # Wired to another source (SQS, Kinesis) by mistake: skipping its records would drop
            # them for good, so refuse the whole batch loudly instead.
            raise InvalidValueError(
                f"not a DynamoDB Streams record (eventSource {source!r}): the stream relay "
                "takes the events of the dynacoord table's stream only"
            )
    return records


class StreamHandler:
    """The Lambda handler made by :meth:`Outbox.stream_handler`: ``handler(event, context)``
    returns ``{"batchItemFailures": [{"itemIdentifier": sequence_number}, ...]}``.

    ``worker`` delivers (its handlers, lease, retries, backoff and max attempts apply); ``store``
    is the outbox store, which must read stream images (the DynamoDB store does). Counters since
    the handler was made: ``delivered``/``retried``/``failed``/``lost`` on :attr:`worker`, and
    ``skipped`` (records that were not new pending events of this namespace), ``not_claimed``
    (claims refused: delivered already, or by someone else), ``left`` (not claimed for lack of
    time) and ``store_errors`` here.
    """

    def __init__(
        self,
        worker: OutboxWorker,
        store: OutboxStore,
        *,
        claim: bool = False,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
    ) -> None:
        if not all(callable(getattr(store, name, None)) for name in _STREAM_METHODS):
            raise NotSupportedError(
                f"stream_handler needs a store with a DynamoDB stream (the DynamoDB backend); "
                f"{type(store).__name__} has none: deliver with a polling worker instead"
            )
        self.worker = worker
        self.claim = claim
        self.clock_skew_ms = int(non_negative_seconds(clock_skew, "clock_skew") * 1000)
        self._store = cast(StreamStore, store)
        self.skipped = 0
        self.not_claimed = 0
        self.left = 0
        self.store_errors = 0

    # -- the records -------------------------------------------------------------------------------

    def candidate(self, record: Mapping[str, Any], now: int) -> EventRecord | None:
        """The event a stream record announces if it is a new pending event of this namespace:
        an INSERT, or a MODIFY that made an event pending with no attempt counted (a failed
        event put back by ``outbox.retry``, or a re-publish over an expired one). None for
        everything else: other item kinds and namespaces, removals, and state changes of events
        under delivery (a rescheduled retry waits for its backoff; the sweeper delivers it)."""
        name = record.get("eventName")
        stream = record.get("dynamodb")
        image = stream.get("NewImage") if isinstance(stream, Mapping) else None
        if name not in ("INSERT", "MODIFY"):
            return None
        if not isinstance(image, Mapping):
            # Skipping would leave every event to the sweeper without a word: say what is wrong.
            view = stream.get("StreamViewType") if isinstance(stream, Mapping) else None
            raise ConfigurationError(
                f"the stream carries no new images (StreamViewType {view!r}): the relay needs "
                "NEW_IMAGE or NEW_AND_OLD_IMAGES"
            )
        try:
            seen = self._store.stream_record(image, now)
        except Exception:
            # An outbox item this code cannot read (written by a newer version?): the polling
            # worker meets the same item; reporting it would only stall the shard.
            logger.exception("stream record %r: unreadable outbox item, skipped", _sequence(record))
            return None
        if seen is None or seen.status.value != "pending" or seen.lease_token is not None:
            return None
        if name == "MODIFY" and seen.attempts != 0:
            return None
        return seen

    # -- the handler ---------------------------------------------------------------------------------

    def __call__(self, event: Any, context: Any = None) -> BatchResponse:
        records = _stream_records(event)
        now = now_ms(self.worker.clock)
        candidates: list[tuple[str, EventRecord]] = []
        for record in records:
            seen = self.candidate(record, now)
            if seen is None:
                self.skipped += 1
                continue
            candidates.append((_sequence(record), seen))
        needed = self.worker.lease_ms + OUTCOME_MARGIN_MS
        keep_going = _keep_going(context, needed)
        failures: list[str] = []
        fresh: dict[str, EventRecord] | None = None
        if not self.claim and any(seen.seq is None for _, seen in candidates):
            try:
                # One consistent read for the batch (read units, no write): a stream batch
                # Lambda retries holds events delivered already, which must not run again.
                fresh = self._store.get_many(
                    [seen.id for _, seen in candidates if seen.seq is None], now
                )
            except Exception:
                self.store_errors += len(candidates)
                logger.exception("%s: events of the stream batch not read", self.worker.name)
                return {"batchItemFailures": [{"itemIdentifier": s} for s, _ in candidates]}
        for index, (sequence, seen) in enumerate(candidates):
            if self.worker.stopping or not keep_going():
                left = len(candidates) - index
                self.left += left
                logger.log(
                    logging.WARNING if index == 0 else logging.INFO,
                    "%s: %d new event(s) left pending for the sweeper: the invocation has no "
                    "time for a lease (%d ms needed)%s",
                    self.worker.name,
                    left,
                    needed,
                    "; is the function's timeout shorter than the lease?" if index == 0 else "",
                )
                break
            try:
                if fresh is None or seen.seq is not None:
                    self._deliver(seen)
                else:
                    self._deliver_unclaimed(seen, fresh.get(seen.id))
            except Exception:
                # The store failed (after botocore's retries): the claim or the outcome is not
                # stored. Lambda retries this record; a retry whose claim is refused is harmless.
                self.store_errors += 1
                logger.exception(
                    "%s: event %r (stream record %s): outcome not stored, reported for a retry",
                    self.worker.name,
                    seen.id,
                    sequence,
                )
                failures.append(sequence)
        return {"batchItemFailures": [{"itemIdentifier": s} for s in failures]}

    def _deliver(self, seen: EventRecord) -> None:
        # The worker's own claim (conditional on the status, due time and lease token seen) and
        # its own processing of a claimed event (handler, heartbeat, outcome under the token).
        # claim_many, not claim: it also checks an ordered event's group gate, so an event whose
        # group's head is not delivered yet is not claimed (it is postponed; the sweeper
        # delivers it in order).
        delivery = self.worker.delivery
        token = new_event_id()
        now = now_ms(delivery.clock)
        claimed = self._store.claim_many([seen], [token], now + delivery.lease_ms, now)
        if not claimed:
            self.not_claimed += 1
            return
        delivery.deliver(claimed[0], token)

    def _deliver_unclaimed(self, seen: EventRecord, current: EventRecord | None) -> None:
        """Deliver a new event with one write: its outcome, stored only while the event is
        still pending and unclaimed as the stream showed it. No claim is needed because a
        polling worker leaves a new event alone for one lease after it became due (the
        sweeper's ``leave_new_for``): that lease is the relay's. The relay runs the handler
        only while it fits in that lease; after it, the event is the sweeper's."""
        delivery = self.worker.delivery
        if (
            current is None
            or current.status.value != "pending"
            or current.lease_token is not None
            or current.attempts != seen.attempts
            or current.due_at_ms != seen.due_at_ms
        ):
            self.not_claimed += 1  # delivered already (a retried stream batch), or taken
            return
        if delivery.leaves(current):  # no handler for its type here: left, nothing written
            return
        lease_end = current.due_at_ms + delivery.lease_ms
        now = now_ms(delivery.clock)
        keeper = delivery.keeper
        # What must be left of the lease when the handler starts: the clock skew to the
        # sweeper (whose clock may run ahead), the outcome's write, and one beat of the keeper,
        # which claims the event if the handler is still running then.
        needed = self.clock_skew_ms + OUTCOME_MARGIN_MS + (keeper.interval_ms if keeper else 0)
        if now + needed > lease_end:
            # The stream came late, or earlier handlers of the batch took the time: not safe
            # without a claim. Claimed (refused if the sweeper has it already), as claim=True.
            logger.info(
                "%s: event %r claimed: %d ms of the relay's lease left, %d needed",
                delivery.name,
                seen.id,
                lease_end - now,
                needed,
            )
            self._deliver(current)
            return
        token = new_event_id()
        record = dataclasses.replace(
            current,
            event=current.event.with_attempt(current.attempts + 1),
            status=EventStatus.IN_FLIGHT,
            attempts=current.attempts + 1,
            lease_token=token,
            due_at_ms=lease_end,
        )
        if keeper is None:
            outcome = delivery.handle(record)
            (ok,) = self._store.settle_unclaimed(
                [(current, outcome)], now_ms(delivery.clock), delivery.retention_ms
            )
            delivery.count(outcome, ok)
            return
        keeper.hold_unclaimed(current, record, lease_end)
        try:
            outcome = delivery.handle(record)
        except BaseException:
            keeper.take_back(record.id)
            raise
        ok = False
        if not keeper.taken(record.id):
            # Still held while the outcome is written: a write slower than what is left of the
            # lease (botocore's retries, a slow network) has the keeper claim the event first,
            # and the outcome then goes under the claim, instead of a sweeper taking it.
            keeper.closing([record.id])
            try:
                (ok,) = self._store.settle_unclaimed(
                    [(current, outcome)], now_ms(delivery.clock), delivery.retention_ms
                )
            finally:
                lost, claimed = keeper.take_back(record.id)
        else:
            lost, claimed = keeper.take_back(record.id)
        if ok:
            delivery.count(outcome, True)
        elif claimed is not None and not lost:
            delivery.store_outcomes([outcome])  # claimed while it ran: stored under the claim
        else:
            delivery.count(outcome, False)  # taken over: the outcome is not ours to store

    def __repr__(self) -> str:
        return f"StreamHandler(worker={self.worker!r}, claim={self.claim})"


def _sequence(record: Mapping[str, Any]) -> str:
    stream = record.get("dynamodb")
    sequence = stream.get("SequenceNumber") if isinstance(stream, Mapping) else None
    if not isinstance(sequence, str) or not sequence:
        raise InvalidValueError("a DynamoDB Streams record without dynamodb.SequenceNumber")
    return sequence


class SweepHandler:
    """The Lambda handler made by :meth:`Outbox.sweep_handler`, for an EventBridge schedule.

    Each invocation runs polling passes of :attr:`worker` (due retries, expired leases, events
    the stream relay missed or left) while a pass finds a full batch and a lease still fits in the
    remaining time, then, with ``reconcile``, one reconcile pass of stalled workflow runs. Returns
    what it did (a JSON-able dict, for the function's log).
    """

    def __init__(
        self,
        worker: OutboxWorker,
        *,
        runs: _Reconciler | None = None,
        stalled_after: float = 300.0,
        on_stalled: Callable[[Any], Any] | None = None,
    ) -> None:
        if (runs is None) != (on_stalled is None):
            raise TypeError("reconciling needs both runs= (backend.runs) and on_stalled=")
        if on_stalled is not None and not callable(on_stalled):
            raise TypeError("on_stalled must be callable")
        self.worker = worker
        self._runs = runs
        self._stalled_after = stalled_after
        self._on_stalled = on_stalled
        # One sweep at a time per handler: its worker is not shared between threads, and what
        # a sweep reports is the change of that worker's counters.
        self._sweeping = threading.Lock()

    def __call__(self, event: Any = None, context: Any = None) -> dict[str, Any]:
        if not self._sweeping.acquire(blocking=False):
            # Invocations run as threads of one process (a thread pool of yours, a threaded
            # server): the sweep already running drains; this one has nothing to add.
            logger.info("%s: a sweep is already running in this process", self.worker.name)
            idle = dict.fromkeys(("passes", "handled", "delivered", "retried", "failed"), 0)
            return {**idle, "lost_leases": 0, "busy": True}
        try:
            return self._sweep(context)
        finally:
            self._sweeping.release()

    def _sweep(self, context: Any) -> dict[str, Any]:
        worker = self.worker
        before = (worker.delivered, worker.retried, worker.failed, worker.lost)
        needed = worker.lease_ms + OUTCOME_MARGIN_MS
        keep_going = _keep_going(context, needed)
        handled = 0
        passes = 0
        if not keep_going():
            logger.warning(
                "%s: no polling pass: the invocation has no time for a lease (%d ms needed); is "
                "the function's timeout shorter than the lease?",
                worker.name,
                needed,
            )
        while keep_going() and not worker.stopping:
            found = worker.run_once(keep_going=keep_going)
            handled += found
            passes += 1
            if found < worker.batch_size:
                break  # the queue is drained (or the rest belongs to other workers now)
        result: dict[str, Any] = {
            "passes": passes,
            "handled": handled,
            "delivered": worker.delivered - before[0],
            "retried": worker.retried - before[1],
            "failed": worker.failed - before[2],
            "lost_leases": worker.lost - before[3],
        }
        if self._runs is not None and self._on_stalled is not None:
            stats = self._runs.reconcile(self._stalled_after, self._on_stalled)
            is_record = dataclasses.is_dataclass(stats) and not isinstance(stats, type)
            result["reconcile"] = dataclasses.asdict(stats) if is_record else stats
        logger.info("%s: sweep %r", worker.name, result)
        return result

    def __repr__(self) -> str:
        return f"SweepHandler(worker={self.worker!r})"
