"""A circuit breaker whose state is shared by every process through the store.

Policy lives here (the state machine, thresholds, trial accounting, callbacks, the decorator and
context manager); a backend supplies a :class:`BreakerStore` whose methods are one request each.

States and transitions (each transition is one conditional write, so exactly one process makes it
and only that process calls ``on_transition``)::

    closed --(failures reach failure_threshold)--> open
    open --(reset_timeout elapsed, a caller wins the trial slot)--> half_open
    half_open --(success_threshold trial successes)--> closed   (failure count reset to 0)
    half_open --(a trial fails)--> open                         (fresh reset_timeout)

Request costs of one protected call:

* closed: one eventually consistent read (0.5 RCU on DynamoDB for an item under 4 KB; the
  breaker's item stays under 1 KB), or nothing while ``state_cache`` holds a closed state seen
  less than that many seconds ago in this process. A success writes nothing, except one write to reset the
  failure count when the read showed earlier failures (so isolated failures spread over time do
  not add up to a trip: the count is "failures since the last success"). A failure costs one
  atomic ``ADD`` (plus one conditional write by the single caller that trips the breaker).
* open, before ``reset_timeout``: one read, then :class:`CircuitOpenError` (the call is not made).
* the trial: one read + one conditional write to win a slot, then one write for the outcome (two
  when ``success_threshold > 1`` and the last needed success closes the breaker).

Counting is atomic (``ADD`` with the new value returned), never read-modify-write, so concurrent
failures are never lost.

Trial slots have a lease. A caller that wins a half-open slot and then never reports (its process
crashed, its Lambda froze) would otherwise hold the slot forever and wedge the breaker in
half_open. So a slot is only held for ``reset_timeout`` after it was taken: after that, the next
caller starts a new trial round (a new ``trial_round`` number), and a late report from the old
round is ignored because every outcome write is conditional on the round it belongs to::

    A wins trial (round 7) .... crashed, never reports
                         ... reset_timeout later: B starts round 8, succeeds -> closed
    A's process comes back and reports a failure for round 7 -> condition fails, ignored

``reset`` keeps ``trial_round`` (the stored item is closed in place, never deleted), so the same
holds across an operator's reset: a trial from before it never shares a round with one after it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple, Protocol, TypeVar

from . import keys
from ._clock import Clock, SystemClock, now_ms
from ._compat import StrEnum
from ._items import member_reader
from ._validate import check_int, ttl_to_ms
from .errors import CircuitOpenError
from .metrics import NO_SCOPE, MetricsScope

__all__ = [
    "BreakerRecord",
    "BreakerStatus",
    "BreakerStore",
    "CircuitBreaker",
    "StartTrialResult",
    "State",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

TransitionCallback = Callable[[str, "State", "State"], None]


class State(StrEnum):
    """Breaker states (values are the strings stored in the table; ``str()`` gives the value)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


#: the metric counted when a breaker enters each state (dynacoord.metrics)
_TRANSITION_METRICS = {
    State.CLOSED: "BreakerClosed",
    State.OPEN: "BreakerOpened",
    State.HALF_OPEN: "BreakerHalfOpened",
}


_state = member_reader(State)
#: the stored value of a closed breaker (an enum member's ``.value`` is a descriptor call)
_CLOSED = State.CLOSED.value


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    """The stored state of one breaker. An absent item is ``BreakerRecord()`` (closed, 0)."""

    state: State = State.CLOSED
    failures: int = 0
    successes: int = 0
    opened_at_ms: int | None = None
    trial_calls: int = 0
    trial_round: int = 0
    trial_started_ms: int | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Any] | None) -> BreakerRecord:
        """The record a stored item holds (the same field names on every backend); an absent
        item is closed with no failures."""
        if not item:
            return cls()
        # positional, and optional_int's rule inline: this runs on every protected call
        get = item.get
        opened_at_ms = get("opened_at_ms")
        trial_started_ms = get("trial_started_ms")
        return cls(
            _state(get("state", _CLOSED)),
            int(get("failures", 0)),
            int(get("successes", 0)),
            None if opened_at_ms is None else int(opened_at_ms),
            int(get("trial_calls", 0)),
            int(get("trial_round", 0)),
            None if trial_started_ms is None else int(trial_started_ms),
        )


@dataclass(frozen=True, slots=True)
class StartTrialResult:
    """Outcome of :meth:`BreakerStore.start_trial`: the new record if won, else the current one."""

    won: BreakerRecord | None
    current: BreakerRecord | None = None


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    """What :meth:`CircuitBreaker.status` reports (the stored state, read consistently)."""

    name: str
    state: State
    failures: int
    opened_at: float | None
    #: seconds until a trial call may be let through (0: now); None when closed
    retry_after: float | None
    successes: int = 0
    trial_calls: int = 0


class BreakerStore(Protocol):
    """Storage for breakers. Every method is one request to the store.

    Records returned by the write methods are the stored state right after the write.
    """

    def get(self, name: str, *, consistent: bool = True) -> BreakerRecord:
        """The stored record (absent: a closed record with no failures), read consistently
        unless ``consistent`` is False (DynamoDB: an eventually consistent read, half the price;
        stores whose reads are always consistent ignore it)."""
        ...

    def record_failure(self, name: str, now_ms: int) -> BreakerRecord | None:
        """Atomically add one failure while closed; None if the breaker is not closed."""
        ...

    def reset_failures(self, name: str, now_ms: int) -> bool:
        """Set the failure count to 0 if the breaker is still closed."""
        ...

    def trip(self, name: str, now_ms: int, min_failures: int | None) -> BreakerRecord | None:
        """Open the breaker (``opened_at = now``) and return the record as it was before.

        With ``min_failures``: only if it is closed with at least that many failures (so that of
        many callers that all saw the threshold, exactly one trips it); None if not. Without:
        unconditionally (an operator's ``trip``).
        """
        ...

    def start_trial(self, name: str, now_ms: int, cutoff_ms: int) -> StartTrialResult:
        """Begin a new half-open round with one trial call taken by the caller.

        Only if open with ``opened_at <= cutoff`` or half-open with the last trial slot taken at
        or before ``cutoff`` (its lease ran out). Increments ``trial_round``.
        """
        ...

    def join_trial(
        self, name: str, trial_round: int, now_ms: int, cutoff_ms: int, max_calls: int
    ) -> BreakerRecord | None:
        """Take one more trial slot of round ``trial_round`` if fewer than ``max_calls`` are
        taken and the round's lease is still running; None if not."""
        ...

    def trial_success(self, name: str, trial_round: int, now_ms: int) -> BreakerRecord | None:
        """Count one success of round ``trial_round`` and free its slot; None if stale."""
        ...

    def close(self, name: str, trial_round: int, now_ms: int) -> bool:
        """half_open (round ``trial_round``) -> closed with no failures; False if stale."""
        ...

    def reopen(self, name: str, trial_round: int, now_ms: int) -> bool:
        """half_open (round ``trial_round``) -> open with ``opened_at = now``; False if stale."""
        ...

    def reset(self, name: str, now_ms: int) -> BreakerRecord | None:
        """Close the breaker with no failures; return the record as it was (None if absent).

        ``trial_round`` is kept, never restarted (so the item is updated, not deleted): a trial
        in flight across the reset must not share its round number with a later trial, or its
        late outcome would be applied to that trial's round.
        """
        ...


class _Ticket(NamedTuple):
    """Why a call was let through: as a closed call (and the failures seen) or as a trial.
    (A NamedTuple: made on every protected call, and cheaper to make than a dataclass.)"""

    trial_round: int | None
    failures_seen: int = 0


class CircuitBreaker:
    """A circuit breaker named ``name``, shared through the store. ``backend.breaker(name)``.

    Use it as ``breaker.call(fn, *args, **kwargs)``, as ``with breaker:`` or as a decorator
    ``@breaker``. Exceptions that are instances of ``ignore`` do not count as failures (they count
    as a success: the dependency answered) and are re-raised. :class:`CircuitOpenError` is raised
    instead of making the call while the breaker is open, or half-open with every trial slot
    taken. ``on_transition(name, old, new)`` is called in the process that made a transition
    (exceptions from it are logged, not raised).

    ``consistent_reads`` (default False): the read that admits a call is eventually consistent
    (half the price of a consistent one on DynamoDB, and DAX can serve it); every transition
    stays a conditional write, so this only changes how soon a call sees another process's
    transition (see :meth:`_admit`). ``state_cache`` (seconds, default 0: off): a closed state
    seen by this process admits calls without any read for that long; a trip by another
    process then reaches this one up to that much later. Failure counts, trial slots and trial
    successes are exact across the fleet either way (each is an atomic write that recognises
    its own retry).
    """

    def __init__(
        self,
        store: BreakerStore,
        name: str,
        *,
        failure_threshold: int = 5,
        reset_timeout: float = 30.0,
        success_threshold: int = 1,
        half_open_max_calls: int = 1,
        ignore: type[BaseException] | tuple[type[BaseException], ...] = (),
        on_transition: TransitionCallback | None = None,
        clock: Clock | None = None,
        namespace: str = "default",
        metrics: MetricsScope | None = None,
        consistent_reads: bool = False,
        state_cache: float = 0.0,
    ) -> None:
        keys.breaker_key(namespace, name)  # empty, not a str, or too long: InvalidKeyError now
        self.name: str = name
        self.namespace = namespace
        self.failure_threshold = check_int(failure_threshold, "failure_threshold", minimum=1)
        self._reset_ms = ttl_to_ms(reset_timeout, "reset_timeout")
        self.success_threshold = check_int(success_threshold, "success_threshold", minimum=1)
        self.half_open_max_calls = check_int(half_open_max_calls, "half_open_max_calls", minimum=1)
        ignored = ignore if isinstance(ignore, tuple) else (ignore,)
        for exc_type in ignored:
            if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
                raise TypeError(f"ignore must hold exception classes, got {exc_type!r}")
        self.ignore: tuple[type[BaseException], ...] = ignored
        if on_transition is not None and not callable(on_transition):
            raise TypeError("on_transition must be callable or None")
        self.on_transition = on_transition
        self.clock: Clock = clock or SystemClock()
        self._store = store
        self._local = threading.local()
        self._metrics = metrics if metrics is not None else NO_SCOPE
        #: the read that admits a call: eventually consistent by default (see _admit)
        self.consistent_reads = bool(consistent_reads)
        if not isinstance(state_cache, int | float) or not 0 <= state_cache <= 60:
            raise ValueError(f"state_cache must be 0..60 seconds, got {state_cache!r}")
        self.state_cache = float(state_cache)
        #: (monotonic deadline, failures) of the last closed state seen, when state_cache > 0
        self._cached_closed: tuple[float, int] | None = None

    @property
    def reset_timeout(self) -> float:
        """Seconds an open breaker waits before letting a trial call through."""
        return self._reset_ms / 1000

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker(name={self.name!r}, failure_threshold={self.failure_threshold}, "
            f"reset_timeout={self.reset_timeout})"
        )

    # -- transitions ----------------------------------------------------------------------------

    def _transition(self, old: State, new: State) -> None:
        if old is new:
            return
        logger.info("circuit breaker %r: %s -> %s", self.name, old, new)
        self._metrics.count(_TRANSITION_METRICS[new])
        if self.on_transition is not None:
            try:
                self.on_transition(self.name, old, new)
            except Exception:
                logger.exception("on_transition callback of breaker %r raised", self.name)

    def _rejected(self, record: BreakerRecord, now: int) -> CircuitOpenError:
        """The error refusing a call (counted as BreakerRejected, dynacoord.metrics)."""
        self._metrics.count("BreakerRejected")
        return self._open_error(record, now)

    def _open_error(self, record: BreakerRecord, now: int) -> CircuitOpenError:
        if record.state is State.HALF_OPEN and record.trial_started_ms is not None:
            # Every slot is taken: the earliest a new one can open is when this round's lease ends.
            until = record.trial_started_ms + self._reset_ms
            what = "half-open with every trial slot taken"
        else:
            until = (record.opened_at_ms or now) + self._reset_ms
            what = "open"
        retry_after = max(0.0, (until - now) / 1000)
        opened_at = None if record.opened_at_ms is None else record.opened_at_ms / 1000
        return CircuitOpenError(
            f"circuit breaker {self.name!r} is {what}; retry in {retry_after:.3f}s",
            name=self.name,
            retry_after=retry_after,
            opened_at=opened_at,
        )

    def _admit(self) -> _Ticket:
        """Decide whether a call may go ahead (raises CircuitOpenError if not).

        The read that decides is eventually consistent unless ``consistent_reads``: it only
        decides whether to *try*; every transition is a conditional write on the stored state,
        so a stale read never makes two processes win one transition or lets a trial slot be
        taken twice. What a stale read can do (DynamoDB: replication lag, typically well under
        a second): let a call through just after another process tripped the breaker, or reject
        one just after it closed. With ``state_cache`` a closed state seen by this process is
        reused for that many seconds without a read: a trip by another process then reaches
        this one up to ``state_cache`` seconds (plus the lag) late, and this process's own
        failures keep being counted meanwhile (each failure is a write that sees the state).
        """
        cached = self._cached_closed
        if cached is not None:
            if self.clock.monotonic() < cached[0]:
                return _Ticket(None, cached[1])
            self._cached_closed = None
        record = self._store.get(self.name, consistent=self.consistent_reads)
        # At most a few rounds: each failed conditional write returns the state that beat it.
        for _ in range(3):
            now = now_ms(self.clock)
            cutoff = now - self._reset_ms
            if record.state is State.CLOSED:
                self._seen_closed(record)
                return _Ticket(None, record.failures)
            self._cached_closed = None
            if record.state is State.OPEN:
                if record.opened_at_ms is not None and record.opened_at_ms > cutoff:
                    raise self._rejected(record, now)
                started = self._store.start_trial(self.name, now, cutoff)
                if started.won is not None:
                    self._transition(State.OPEN, State.HALF_OPEN)
                    return _Ticket(started.won.trial_round)
                record = started.current or self._store.get(self.name)
                continue
            # half_open
            if record.trial_started_ms is None or record.trial_started_ms <= cutoff:
                # The round's lease ran out (a trial caller never reported): start a new round.
                started = self._store.start_trial(self.name, now, cutoff)
                if started.won is not None:
                    logger.warning(
                        "circuit breaker %r: trial round %d expired unreported; round %d started",
                        self.name,
                        record.trial_round,
                        started.won.trial_round,
                    )
                    return _Ticket(started.won.trial_round)
                record = started.current or self._store.get(self.name)
                continue
            if record.trial_calls >= self.half_open_max_calls:
                raise self._rejected(record, now)
            joined = self._store.join_trial(
                self.name, record.trial_round, now, cutoff, self.half_open_max_calls
            )
            if joined is not None:
                return _Ticket(joined.trial_round)
            record = self._store.get(self.name)
        raise self._rejected(record, now_ms(self.clock))

    def _seen_closed(self, record: BreakerRecord) -> None:
        """Keep a closed state for ``state_cache`` seconds (nothing when it is 0)."""
        if self.state_cache > 0:
            self._cached_closed = (self.clock.monotonic() + self.state_cache, record.failures)

    def _on_success(self, ticket: _Ticket) -> None:
        if ticket.trial_round is None:
            if ticket.failures_seen > 0:
                self._store.reset_failures(self.name, now_ms(self.clock))
                if self._cached_closed is not None:
                    self._cached_closed = (self._cached_closed[0], 0)
            return
        now = now_ms(self.clock)
        if self.success_threshold > 1:
            record = self._store.trial_success(self.name, ticket.trial_round, now)
            if record is None or record.successes < self.success_threshold:
                return
        if self._store.close(self.name, ticket.trial_round, now):
            self._transition(State.HALF_OPEN, State.CLOSED)
        else:
            logger.debug("breaker %r: success of stale trial round ignored", self.name)

    def _on_failure(self, ticket: _Ticket) -> None:
        now = now_ms(self.clock)
        if ticket.trial_round is None:
            self._count_failure(now)
            return
        if self._store.reopen(self.name, ticket.trial_round, now):
            self._transition(State.HALF_OPEN, State.OPEN)
        else:
            logger.debug("breaker %r: failure of stale trial round ignored", self.name)

    def _count_failure(self, now: int) -> None:
        record = self._store.record_failure(self.name, now)
        if record is None:  # not closed any more: read the state on the next call
            self._cached_closed = None
            return
        if record.failures < self.failure_threshold:
            self._seen_closed(record)
            return
        self._cached_closed = None
        # Many callers may see the threshold at once; the conditional trip lets one of them win.
        if self._store.trip(self.name, now, self.failure_threshold) is not None:
            self._transition(State.CLOSED, State.OPEN)

    def _finish(self, ticket: _Ticket, exc: BaseException | None) -> None:
        if exc is None or isinstance(exc, self.ignore):
            self._on_success(ticket)
        elif isinstance(exc, Exception):
            self._on_failure(ticket)
        # BaseException (KeyboardInterrupt, SystemExit): not an answer from the dependency; a
        # trial slot taken by this call is freed by its lease.

    # -- public API -----------------------------------------------------------------------------

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)`` through the breaker and return its result."""
        ticket = self._admit()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._finish(ticket, exc)
            raise
        self._on_success(ticket)  # what _finish does without an exception
        return result

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        """Decorator: every call of ``fn`` goes through :meth:`call`."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return self.call(fn, *args, **kwargs)

        return wrapper

    def __enter__(self) -> CircuitBreaker:
        ticket = self._admit()
        stack: list[_Ticket] = self._local.__dict__.setdefault("tickets", [])
        stack.append(ticket)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        ticket: _Ticket = self._local.tickets.pop()
        self._finish(ticket, exc)

    def record_failure(self) -> None:
        """Count one failure by hand (closed state only; trips at the threshold)."""
        self._count_failure(now_ms(self.clock))

    def record_success(self) -> None:
        """Reset the failure count by hand (closed state only)."""
        self._store.reset_failures(self.name, now_ms(self.clock))

    def status(self) -> BreakerStatus:
        """The stored state (one consistent read).

        ``state`` is what is stored: an open breaker whose ``reset_timeout`` has passed still
        reports ``open`` (with ``retry_after == 0``) until a call takes the trial slot.
        """
        record = self._store.get(self.name)
        now = now_ms(self.clock)
        retry_after: float | None = None
        if record.state is State.HALF_OPEN and record.trial_calls < self.half_open_max_calls:
            retry_after = 0.0  # a trial slot is free now
        elif record.state is not State.CLOSED:
            retry_after = self._open_error(record, now).retry_after
        return BreakerStatus(
            name=self.name,
            state=record.state,
            failures=record.failures,
            opened_at=None if record.opened_at_ms is None else record.opened_at_ms / 1000,
            retry_after=retry_after,
            successes=record.successes,
            trial_calls=record.trial_calls,
        )

    @property
    def state(self) -> State:
        """The stored state (one consistent read)."""
        return self._store.get(self.name).state

    def reset(self) -> None:
        """Close the breaker and forget its failures (operator action).

        A trial call still in flight from before the reset has its outcome ignored, also after
        the breaker trips again and a new trial starts (its round number is never reused).
        """
        old = self._store.reset(self.name, now_ms(self.clock))
        if old is not None:
            self._transition(old.state, State.CLOSED)

    def trip(self) -> None:
        """Open the breaker now, whatever its state, with a fresh ``reset_timeout``."""
        self._cached_closed = None
        old = self._store.trip(self.name, now_ms(self.clock), None)
        self._transition(State.CLOSED if old is None else old.state, State.OPEN)
