"""The previous outbox worker design, kept for the benchmark's comparison rows only.

This is the delivery loop as it was before batched claims: every poll queries the in-flight and
pending index of every shard, each event is claimed and completed with its own request, and a
heartbeat thread is started and joined per event. It runs on today's stores through their
``claim`` and, for each outcome and extension, ``finish_many`` / ``extend_many`` of the one
event (the stores' single-event complete, reschedule, fail and extend were folded into those).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Literal

from dynacoord._clock import Clock, now_ms
from dynacoord._validate import (
    check_bool,
    check_int,
    non_negative_seconds,
    ttl_to_ms,
)
from dynacoord.errors import (
    ConfigurationError,
)
from dynacoord.metrics import NO_SCOPE, MetricsScope
from dynacoord.outbox.event import Event, EventRecord, EventStatus
from dynacoord.outbox.store import OutboxStore, Outcome, OutcomeKind

__all__ = ["PreviousOutboxWorker"]

logger = logging.getLogger(__name__)

#: ``last_error`` is cut to this many characters.
MAX_ERROR_CHARS = 2000
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600

Handler = Callable[[Event], Any]
MissingHandlerPolicy = Literal["fail", "retry", "skip"]


def _error_text(exc: BaseException) -> str:
    # A handler's message may hold lone surrogates (bytes decoded with surrogateescape); escape
    # them, or the store write that records the failure would itself fail.
    text = f"{type(exc).__name__}: {exc}".encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


class _LeaseKeeper(threading.Thread):
    """Extends one claim every ``interval`` seconds while its handler runs."""

    def __init__(self, worker: PreviousOutboxWorker, held: EventRecord, interval: float) -> None:
        super().__init__(name=f"dynacoord-outbox-lease-{held.id}", daemon=True)
        self._worker = worker
        self._event_id = held.id
        self._held = held
        self._interval = interval
        self._done = threading.Event()
        self.lost = False

    def run(self) -> None:
        worker = self._worker
        while not self._done.wait(self._interval):
            now = now_ms(worker.clock)
            try:
                [ok] = worker._store.extend_many([self._held], now + worker.lease_ms, now)
            except Exception:  # transient: the next beat may work, the lease still has time
                logger.exception("extending the lease of event %r failed", self._event_id)
                continue
            if not ok:
                self.lost = True
                logger.warning(
                    "event %r: lease lost while its handler runs (another worker may deliver it)",
                    self._event_id,
                )
                return

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join()


class PreviousOutboxWorker:
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
        self.name = name or f"outbox-worker-{uuid.uuid4().hex[:8]}"
        # A plain flag, not a threading.Event: stop() may run in a signal handler, and Event.set()
        # there can deadlock on the lock the interrupted main thread holds inside Event.wait().
        self._stop_requested = False
        self._external_stop: threading.Event | None = None
        #: running totals since the worker was made
        self.delivered = 0
        self.retried = 0
        self.failed = 0
        self.lost = 0
        self._metrics = metrics if metrics is not None else NO_SCOPE

    # -- loop -----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: the event being handled is finished, no new one is claimed.

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

        ``keep_going`` is asked before each claim; once it returns False nothing more is claimed
        (the event in hand is finished). In Lambda, stop while a whole lease still fits::

            worker.run_once(keep_going=lambda: context.get_remaining_time_in_millis() > 35_000)
        """
        if keep_going is not None and not callable(keep_going):
            raise TypeError(f"keep_going must be callable, got {type(keep_going).__name__}")
        if keep_going is not None and not keep_going():
            return 0
        handled = 0
        candidates = self._poll()
        # Workers polling together see the same oldest events; a shuffled order spreads them.
        random.shuffle(candidates)
        for seen in candidates:
            if self.stopping or (keep_going is not None and not keep_going()):
                break
            token = uuid.uuid4().hex
            now = now_ms(self.clock)
            record = self._store.claim(seen, token, now + self.lease_ms, now)
            if record is None:
                continue  # someone else claimed it first, or it is not due any more
            self._process(record, token)
            handled += 1
        return handled

    def _poll(self) -> list[EventRecord]:
        now = now_ms(self.clock)
        shards = self._store.shards
        start = random.randrange(shards)
        found: list[EventRecord] = []
        # Expired leases first: they are older than anything pending.
        for status in (EventStatus.IN_FLIGHT, EventStatus.PENDING):
            for i in range(shards):
                shard = (start + i) % shards
                cursor: Any = None
                while len(found) < self.batch_size:
                    page, cursor = self._store.query_page(
                        status,
                        shard,
                        due_before_ms=now,
                        limit=self.batch_size - len(found),
                        cursor=cursor,
                    )
                    found.extend(page)
                    if cursor is None:
                        break
                if len(found) >= self.batch_size:
                    return found
        return found

    # -- one event --------------------------------------------------------------------------------

    def _handler_for(self, event_type: str) -> Handler | None:
        if self._handler is not None:
            return self._handler
        assert self._handlers is not None
        return self._handlers.get(event_type) or self._handlers.get("*")

    def _process(self, record: EventRecord, token: str) -> None:
        event = record.event.with_attempt(record.attempts)
        if record.status is EventStatus.IN_FLIGHT and record.attempts > 1:
            logger.debug("%s: event %r attempt %d", self.name, event.id, record.attempts)
        if record.attempts > self.max_attempts:
            # Every earlier claim ended without an outcome: the worker was killed, ran out of
            # Lambda time or memory, or overran its lease. Each expired lease counted an attempt;
            # without this check an event that kills its worker would be redelivered forever
            # instead of ending in failed().
            self._failure(
                record,
                token,
                f"claimed {record.attempts} times; the last attempt ended without an outcome "
                "(worker crashed or overran its lease)",
            )
            return
        handler = self._handler_for(event.type)
        if handler is None:
            self._missing_handler(record, token)
            return
        keeper = (
            _LeaseKeeper(self, _held(record, token), self.lease_ms / 3000)
            if self.heartbeat
            else None
        )
        if keeper is not None:
            keeper.start()
        try:
            handler(event)
        except Exception as exc:
            if keeper is not None:
                keeper.stop()
            logger.warning(
                "%s: handler for event %r (%s) failed on attempt %d: %s",
                self.name,
                event.id,
                event.type,
                record.attempts,
                _error_text(exc),
            )
            self._failure(record, token, _error_text(exc))
            return
        except BaseException:
            # KeyboardInterrupt / SystemExit: leave the claim; the lease runs out and any worker
            # recovers the event.
            if keeper is not None:
                keeper.stop()
            raise
        if keeper is not None:
            keeper.stop()
        now = now_ms(self.clock)
        if self._outcome(record, token, "completed", now):
            self.delivered += 1
            self._metrics.count("OutboxDelivered")
            self._metrics.milliseconds("OutboxDeliveryLatency", now - event.occurred_at * 1000)
        else:
            self.lost += 1
            logger.warning(
                "%s: event %r was handled but its lease had been taken over; the new claimant "
                "owns it now (it may be delivered again)",
                self.name,
                event.id,
            )

    def _delay_ms(self, attempt: int) -> int:
        delay = min(self.max_backoff, self.backoff * 2 ** max(0, attempt - 1))
        # Equal jitter: at least half the delay (backoff is kept), the rest spread out.
        jittered = delay / 2 + random.uniform(0, delay / 2)
        return int(jittered * 1000)

    def _failure(self, record: EventRecord, token: str, error: str) -> None:
        now = now_ms(self.clock)
        if record.attempts >= self.max_attempts:
            ok = self._outcome(record, token, "failed", now, error=error)
            if ok:
                self.failed += 1
                self._metrics.count("OutboxFailed")
                logger.error(
                    "%s: event %r (%s) failed after %d attempts: %s",
                    self.name,
                    record.id,
                    record.type,
                    record.attempts,
                    error,
                )
        else:
            due = now + self._delay_ms(record.attempts)
            ok = self._outcome(record, token, "pending", now, due_ms=due, error=error)
            if ok:
                self.retried += 1
                self._metrics.count("OutboxRetried")
        if not ok:
            self.lost += 1
            logger.warning(
                "%s: event %r: lease lost before the failure was recorded", self.name, record.id
            )

    def _missing_handler(self, record: EventRecord, token: str) -> None:
        error = f"no handler for event type {record.type!r}"
        policy = self.on_missing_handler
        if policy == "skip":
            logger.warning("%s: event %r skipped: %s", self.name, record.id, error)
            if not self._outcome(record, token, "completed", now_ms(self.clock)):
                self.lost += 1
            return
        if policy == "retry":
            logger.warning("%s: event %r: %s (will retry)", self.name, record.id, error)
            self._failure(record, token, error)
            return
        logger.error("%s: event %r marked failed: %s", self.name, record.id, error)
        if self._outcome(record, token, "failed", now_ms(self.clock), error=error):
            self.failed += 1
            self._metrics.count("OutboxFailed")
        else:
            self.lost += 1

    def _outcome(
        self,
        record: EventRecord,
        token: str,
        kind: OutcomeKind,
        now: int,
        *,
        due_ms: int = 0,
        error: str | None = None,
    ) -> bool:
        """Store one event's outcome alone (one request), while ``token`` holds it."""
        outcome = Outcome(_held(record, token), kind, due_ms=due_ms, error=error)
        retention = self.retention_ms if kind == "completed" else None
        [written] = self._store.finish_many([outcome], now, retention)
        return written

    def __repr__(self) -> str:
        return f"OutboxWorker(name={self.name!r}, batch_size={self.batch_size})"


def _held(record: EventRecord, token: str) -> EventRecord:
    return record if record.lease_token == token else dataclasses.replace(record, lease_token=token)
