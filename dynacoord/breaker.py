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

With ``policy=FailureRate(...)`` the read is the same; a closed call's outcome is counted in
memory, and each process sends one counting write per ``flush_interval`` while it holds a
failure or the window is near a decision, otherwise one per ``success_flush_interval`` (half the
window by default), plus one at once after a failure that could trip, and the trip's
conditional write, whatever its call rate.

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

The failure-rate policy (``policy=FailureRate(...)``) replaces only the closed state's counting:
the breaker opens when, over the last ``window`` seconds, at least ``minimum_calls`` calls were
made and at least ``threshold`` of them failed (a call slower than ``slow_call_seconds`` is a
failure). Writing every call would cost one write per call, so each process adds its calls up
in time buckets (``window / buckets`` wide) and writes them in one counting write per
``flush_interval`` (and at once on a failure that, by the window this process last saw, could
trip the breaker). The item keeps one count pair per bucket of the window (``c:{gen}:{bucket}``,
``f:{gen}:{bucket}``), so a write's size does not grow with the call rate or the number of
processes. ``gen`` (``wgen`` on the item) is the window's generation: every trip and reset starts
a new one, and a flush is written only into the generation it was counted in, so counts made
before a trip never land in the window that starts when the breaker closes again::

    P: 40 calls in gen 3 (not written yet) ... Q trips (gen 4), trial, close
    P: flush gen 3 -> refused (the stored gen is 4): the counts are dropped, not added to gen 4

What it trades: a trip can come up to one ``flush_interval`` late (another process's failures
not written yet), or early by the successes other processes have not written yet (up to one
``success_flush_interval`` of theirs while the window is far from a decision, one
``flush_interval`` near it); a process that dies loses at most that much of its counts.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypedDict, TypeVar

from typing_extensions import Unpack

from . import keys
from ._breaker_window import (
    BreakerWindow,
    FailureRate,
    WindowWrite,
    _LocalWindow,
    stale_window_names,
    window_field,
    window_from_fields,
)
from ._clock import Clock, SystemClock, now_ms
from ._compat import Record, StrEnum
from ._items import member_reader
from ._validate import check_bool, check_int, option_names, options_with, ttl_to_ms
from .errors import CircuitOpenError, InvalidValueError
from .metrics import NO_SCOPE, MetricsScope

__all__ = [
    "DEFAULT_FAILURE_THRESHOLD",
    "BreakerOptions",
    "BreakerRecord",
    "BreakerStatus",
    "BreakerStore",
    "BreakerWindow",
    "CircuitBreaker",
    "FailureRate",
    "StartTrialResult",
    "State",
    "WindowWrite",
    "stale_window_names",
    "window_field",
    "window_from_fields",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

TransitionCallback = Callable[[str, "State", "State"], None]


class BreakerState(StrEnum):
    """Breaker states (values are the strings stored in the table; ``str()`` gives the value)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


#: the name used in this module; the class is named as the package exports it, so that it
#: prints as ``BreakerState`` (members pickle by either name)
State = BreakerState


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
    #: the failure-rate window's generation (``wgen``): every trip and reset starts a new one
    window_gen: int = 0

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
            int(get("wgen", 0)),
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
        unconditionally (an operator's ``trip``). Starts a new window generation (``wgen + 1``);
        the record returned holds the generation before it.
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
        late outcome would be applied to that trial's round. Like ``trip``, it starts a new
        window generation (``wgen + 1``).
        """
        ...

    def add_window(
        self,
        name: str,
        now_ms: int,
        gen: int,
        counts: Mapping[int, tuple[int, int]],
        oldest: int,
        *,
        write: WindowWrite | None = None,
    ) -> BreakerWindow | None:
        """Add ``counts`` (bucket -> (calls, failures)) to the window of generation ``gen``,
        only while the breaker is closed (or absent) in that generation, and drop the stored
        counts of other generations and of buckets before ``oldest``; the window after the write
        (None: refused). A counting write: a retry whose first answer was lost adds once.

        ``write`` names who sends it: its slot and token (``write.take(now_ms, window_ms)``,
        the store's own window) are the same at every send of one write, so a send after one
        whose call raised finds its token and answers the window as stored, adding nothing
        (the breaker gives the slot back; the store never does). Without it, a slot is leased
        for the call alone."""
        ...

    def trip_window(self, name: str, now_ms: int, gen: int) -> BreakerRecord | None:
        """Open the breaker if it is closed in window generation ``gen`` (a new generation
        starts); the record as it was, or None if refused (of many callers that saw the same
        window cross the threshold, exactly one trips it)."""
        ...


#: consecutive failures that open a breaker made without ``failure_threshold`` (and no policy)
DEFAULT_FAILURE_THRESHOLD = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class BreakerOptions:
    """How a breaker trips and recovers (see :class:`CircuitBreaker` for what each does).
    Checked when made: a wrong value raises at once, naming the option.

    ``backend.breaker(name, failure_threshold=3)`` and
    ``backend.breaker(name, BreakerOptions(failure_threshold=3))`` are the same breaker. The
    options are not stored with the breaker's state: give every process the same ones."""

    #: consecutive failures (since the last success) that open it; None: 5, or, with
    #: ``policy``, the failure rate decides (a number beside a policy is refused)
    failure_threshold: int | None = None
    #: seconds open before a trial call is let through; also how long a trial slot is held
    reset_timeout: float = 30.0
    #: trial successes needed to close it
    success_threshold: int = 1
    #: trial calls let through at once while half-open
    half_open_max_calls: int = 1
    #: exception classes re-raised without counting as failures (one class or a tuple; kept
    #: as a tuple)
    ignore: type[BaseException] | tuple[type[BaseException], ...] = ()
    #: the read that admits a call is strongly consistent (DynamoDB: twice the price)
    consistent_reads: bool = False
    #: seconds (0-60) a closed state seen by this process admits calls without a read; 0: off
    state_cache: float = 0.0
    #: trip on the failure rate over a sliding window instead (:class:`FailureRate`)
    policy: FailureRate | None = None

    def __post_init__(self) -> None:
        policy = self.policy
        if policy is not None and not isinstance(policy, FailureRate):
            raise TypeError(f"policy must be a FailureRate or None, got {policy!r}")
        if policy is not None and self.failure_threshold is not None:
            raise InvalidValueError(
                "failure_threshold counts consecutive failures; with policy=FailureRate(...) "
                "the breaker trips on the failure rate: give one of them"
            )
        if self.failure_threshold is not None:
            check_int(self.failure_threshold, "failure_threshold", minimum=1)
        ttl_to_ms(self.reset_timeout, "reset_timeout")
        check_int(self.success_threshold, "success_threshold", minimum=1)
        check_int(self.half_open_max_calls, "half_open_max_calls", minimum=1)
        ignore = self.ignore
        ignored = ignore if isinstance(ignore, tuple) else (ignore,)
        for exc_type in ignored:
            if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
                raise TypeError(f"ignore must hold exception classes, got {exc_type!r}")
        state_cache = self.state_cache
        if not isinstance(state_cache, int | float) or not 0 <= state_cache <= 60:
            raise InvalidValueError(f"state_cache must be 0..60 seconds, got {state_cache!r}")
        # kept in one form each (frozen: set once, here)
        object.__setattr__(self, "ignore", ignored)
        check_bool(self.consistent_reads, "consistent_reads")
        object.__setattr__(self, "state_cache", float(state_cache))

    @classmethod
    def of(
        cls, base: BreakerOptions | None = None, /, **values: Unpack[BreakerOptionValues]
    ) -> BreakerOptions:
        """``base`` (or the defaults) with ``values`` in place of its own; an unknown name is
        refused with the list of known ones."""
        return options_with(cls, base, values, what="breaker")

    @property
    def failures_to_trip(self) -> int:
        """The consecutive failures that open the breaker (consecutive-failure policy)."""
        threshold = self.failure_threshold
        return DEFAULT_FAILURE_THRESHOLD if threshold is None else threshold

    @property
    def ignored(self) -> tuple[type[BaseException], ...]:
        """``ignore`` as the tuple it is kept as."""
        ignore = self.ignore
        return ignore if isinstance(ignore, tuple) else (ignore,)


#: every breaker option's name, in declaration order
OPTION_NAMES = option_names(BreakerOptions)


class BreakerOptionValues(TypedDict, total=False):
    """:class:`BreakerOptions` by name, for the keyword shorthand
    (``backend.breaker(name, failure_threshold=3)``); mypy checks each name and type."""

    failure_threshold: int | None
    reset_timeout: float
    success_threshold: int
    half_open_max_calls: int
    ignore: type[BaseException] | tuple[type[BaseException], ...]
    consistent_reads: bool
    state_cache: float
    policy: FailureRate | None


class _Ticket(Record):
    """Why a call was let through: as a closed call (and the failures seen) or as a trial.
    (A tuple: made on every protected call, and cheaper to make than a dataclass.)
    With a FailureRate policy: the window generation the call was let through in, and its
    start (monotonic seconds; 0 without ``slow_call_seconds``)."""

    trial_round: int | None
    failures_seen: int = 0
    window_gen: int = 0
    started: float = 0.0


class CircuitBreaker:
    """A circuit breaker named ``name``, shared through the store. ``backend.breaker(name)``.

    Its tuning is ``options`` (a :class:`BreakerOptions`) with ``option_values`` in place of its
    own, by name (``failure_threshold=3, reset_timeout=10``: each name of
    :class:`BreakerOptions`); an unknown name is refused. The other parameters wire it in: the
    store, ``on_transition``, the clock, the namespace and the metrics scope.

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

    It opens after ``failure_threshold`` (default 5) consecutive failures, or, with
    ``policy=FailureRate(...)``, on the failure rate over a sliding window (see
    :class:`FailureRate`; ``failure_threshold`` is then not given). With FailureRate, call
    :meth:`flush` where a process may stop for a while; ``status().failures`` stays 0 (the
    window's counts are spread over the item's buckets and the processes' memory).
    """

    def __init__(
        self,
        store: BreakerStore,
        name: str,
        options: BreakerOptions | None = None,
        *,
        on_transition: TransitionCallback | None = None,
        clock: Clock | None = None,
        namespace: str = "default",
        metrics: MetricsScope | None = None,
        **option_values: Unpack[BreakerOptionValues],
    ) -> None:
        keys.breaker_key(namespace, name)  # empty, not a str, or too long: InvalidKeyError now
        options = BreakerOptions.of(options, **option_values)
        if on_transition is not None and not callable(on_transition):
            raise TypeError("on_transition must be callable or None")
        self.name: str = name
        self.namespace = namespace
        #: what this breaker was made with (its tuning; the attributes below are read from it)
        self.options = options
        #: None: the consecutive-failure policy (``failure_threshold``)
        self.policy = options.policy
        self.failure_threshold = options.failures_to_trip
        self._reset_ms = ttl_to_ms(options.reset_timeout, "reset_timeout")
        self.success_threshold = options.success_threshold
        self.half_open_max_calls = options.half_open_max_calls
        self.ignore: tuple[type[BaseException], ...] = options.ignored
        self.on_transition = on_transition
        self.clock: Clock = clock or SystemClock()
        self._store = store
        self._local = threading.local()
        self._metrics = metrics if metrics is not None else NO_SCOPE
        #: the read that admits a call: eventually consistent by default (see _admit)
        self.consistent_reads = options.consistent_reads
        self.state_cache = float(options.state_cache)
        #: (monotonic deadline, failures) of the last closed state seen, when state_cache > 0
        self._cached_closed: tuple[float, int] | None = None
        self._cache_lock = threading.Lock()
        #: bumped by every drop of the cached closed state: a read or write sent before a drop
        #: must not cache what it saw (its answer may predate the trip that caused the drop)
        self._cache_gen = 0
        self._window = None if self.policy is None else _LocalWindow(self.clock.monotonic())

    @property
    def reset_timeout(self) -> float:
        """Seconds an open breaker waits before letting a trial call through."""
        return self._reset_ms / 1000

    def __repr__(self) -> str:
        trips = (
            f"failure_threshold={self.failure_threshold}"
            if self.policy is None
            else f"policy={self.policy!r}"
        )
        return f"CircuitBreaker(name={self.name!r}, {trips}, reset_timeout={self.reset_timeout})"

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
                if self._window is not None:
                    return self._rate_ticket(None)
                return _Ticket(None, cached[1])
            self._drop_cached()
        gen = self._cache_gen
        record = self._store.get(self.name, consistent=self.consistent_reads)
        if self._window is not None:
            with self._window.lock:
                self._window.adopt(record.window_gen)
        # At most a few rounds: each failed conditional write returns the state that beat it.
        for _ in range(3):
            now = now_ms(self.clock)
            cutoff = now - self._reset_ms
            if record.state is State.CLOSED:
                if self._window is None and record.failures >= self.failure_threshold:
                    # The failure that reached the threshold was counted but its caller got an
                    # error before the trip (a write applied and then raised): trip it now.
                    self._drop_cached()
                    if self._store.trip(self.name, now, self.failure_threshold) is not None:
                        self._transition(State.CLOSED, State.OPEN)
                    record = self._store.get(self.name)
                    continue
                self._seen_closed(record, gen)
                if self._window is not None:
                    return self._rate_ticket(None)
                return _Ticket(None, record.failures)
            self._drop_cached()
            if record.state is State.OPEN:
                if record.opened_at_ms is not None and record.opened_at_ms > cutoff:
                    raise self._rejected(record, now)
                started = self._store.start_trial(self.name, now, cutoff)
                if started.won is not None:
                    self._transition(State.OPEN, State.HALF_OPEN)
                    return self._rate_ticket(started.won.trial_round)
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
                    return self._rate_ticket(started.won.trial_round)
                record = started.current or self._store.get(self.name)
                continue
            if record.trial_calls >= self.half_open_max_calls:
                raise self._rejected(record, now)
            joined = self._store.join_trial(
                self.name, record.trial_round, now, cutoff, self.half_open_max_calls
            )
            if joined is not None:
                return self._rate_ticket(joined.trial_round)
            record = self._store.get(self.name)
        raise self._rejected(record, now_ms(self.clock))

    def _rate_ticket(self, trial_round: int | None) -> _Ticket:
        """The ticket of a call let through (a trial's with the consecutive policy too): with
        a FailureRate policy, the window generation and, for slow calls, the start time."""
        window = self._window
        if window is None:
            return _Ticket(trial_round)
        policy = self.policy
        started = 0.0
        if policy is not None and policy.slow_call_seconds is not None:
            started = self.clock.monotonic()
        return _Ticket(trial_round, 0, window.gen, started)

    def _seen_closed(self, record: BreakerRecord, gen: int) -> None:
        """Keep a closed state for ``state_cache`` seconds (nothing when it is 0), unless the
        cache was dropped since the request that saw it was sent (``gen``): another thread of
        this process may have tripped the breaker meanwhile."""
        if self.state_cache > 0:
            with self._cache_lock:
                if gen == self._cache_gen:
                    deadline = self.clock.monotonic() + self.state_cache
                    self._cached_closed = (deadline, record.failures)

    def _drop_cached(self) -> None:
        with self._cache_lock:
            self._cache_gen += 1
            self._cached_closed = None

    def _on_success(self, ticket: _Ticket) -> None:
        if ticket.trial_round is None:
            if self._window is not None:
                self._count_call(False, ticket.window_gen)
            elif ticket.failures_seen > 0:
                self._store.reset_failures(self.name, now_ms(self.clock))
                with self._cache_lock:  # one read: another thread may drop it meanwhile
                    cached = self._cached_closed
                    if cached is not None:
                        self._cached_closed = (cached[0], 0)
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
            if self._window is not None:
                self._count_call(True, ticket.window_gen)
            else:
                self._count_failure(now)
            return
        if self._store.reopen(self.name, ticket.trial_round, now):
            self._transition(State.HALF_OPEN, State.OPEN)
        else:
            logger.debug("breaker %r: failure of stale trial round ignored", self.name)

    def _count_failure(self, now: int) -> None:
        gen = self._cache_gen
        record = self._store.record_failure(self.name, now)
        if record is None:  # not closed any more: read the state on the next call
            self._drop_cached()
            return
        if record.failures < self.failure_threshold:
            self._seen_closed(record, gen)
            return
        self._drop_cached()
        # Many callers may see the threshold at once; the conditional trip lets one of them win.
        if self._store.trip(self.name, now, self.failure_threshold) is not None:
            self._transition(State.CLOSED, State.OPEN)

    def _finish(self, ticket: _Ticket, exc: BaseException | None) -> None:
        if exc is None or isinstance(exc, self.ignore):
            if self._window is not None and self._slow(ticket):
                self._on_failure(ticket)
            else:
                self._on_success(ticket)
        elif isinstance(exc, Exception):
            self._on_failure(ticket)
        # BaseException (KeyboardInterrupt, SystemExit): not an answer from the dependency; a
        # trial slot taken by this call is freed by its lease.

    def _slow(self, ticket: _Ticket) -> bool:
        """Whether the call took longer than the policy's ``slow_call_seconds``."""
        policy = self.policy
        if policy is None or policy.slow_call_seconds is None:
            return False
        return self.clock.monotonic() - ticket.started > policy.slow_call_seconds

    # -- the failure-rate policy ----------------------------------------------------------------

    def _count_call(self, failed: bool, gen: int | None) -> None:
        """Count one closed call of window generation ``gen`` (None: the current one) in this
        process, and write the counts when they are due (see FailureRate)."""
        window = self._window
        policy = self.policy
        assert window is not None and policy is not None
        now = now_ms(self.clock)
        bucket = now // policy.bucket_ms
        with window.lock:
            if gen is not None and gen != window.gen:
                return  # let through before a trip or reset this process has seen since
            counts = window.pending.get(bucket)
            if counts is None:
                counts = window.pending[bucket] = [0, 0]
            counts[0] += 1
            if failed:
                counts[1] += 1
            since = self.clock.monotonic() - window.flushed_at
            due = (
                policy.flush_interval == 0
                or since >= policy.success_interval
                or (failed and policy.trips(*self._seen_totals(window, now)))  # could trip: at once
                or (since >= policy.flush_interval and self._worth_writing(window, now))
            )
        if due:
            self.flush()

    def _seen_totals(self, window: _LocalWindow, now: int) -> tuple[int, int]:
        """(calls, failures) of the window this process last saw with its own counts added
        (lock held)."""
        policy = self.policy
        assert policy is not None
        oldest = now // policy.bucket_ms - policy.buckets + 1
        calls, failures = (0, 0) if window.seen is None else window.seen.totals(oldest)
        for bucket, (c, f) in window.pending.items():
            if bucket >= oldest:
                calls += c
                failures += f
        return calls, failures

    def _worth_writing(self, window: _LocalWindow, now: int) -> bool:
        """Whether this process's unwritten counts are due at ``flush_interval`` (lock held): a
        failure (the fleet sees it within the interval), or a window near a decision (its
        successes then matter). Successes far from a decision wait for
        ``success_interval``."""
        policy = self.policy
        assert policy is not None
        if any(f for _, f in window.pending.values()):
            return True
        return policy.near(*self._seen_totals(window, now))

    def flush(self) -> None:
        """Write the calls this process counted and has not written yet (FailureRate policy;
        nothing otherwise), and trip the breaker if the stored window then crosses the
        threshold. Calls are written every ``flush_interval`` as they end; call this where a
        process may stop for a while (the end of a Lambda invocation, a shutdown).

        A write whose call raised may have applied: it is kept as it was (its counts, slot and
        token) and the next flush sends it again first, so the store adds its counts once
        whether or not the first applied (the calls counted since go in a write of their own).
        Past its token's time (the client's retry window) it can no longer be recognised and
        its counts are dropped rather than risk counting them twice."""
        window = self._window
        policy = self.policy
        if window is None or policy is None:
            return
        now = now_ms(self.clock)
        oldest = now // policy.bucket_ms - policy.buckets + 1
        with window.lock:
            batch, window.pending = window.pending, {}
            unanswered, window.unanswered = window.unanswered, None
            gen = window.gen
            window.flushed_at = self.clock.monotonic()
        stored: BreakerWindow | None = None
        if unanswered is not None:
            # A write whose call raised may have applied: send the same counts again under the
            # same slot and token (the store recognises them), before and apart from the counts
            # made since, so that they are added once either way.
            old_counts, write = unanswered
            old_counts = {b: c for b, c in old_counts.items() if b >= oldest}
            if not old_counts or not write.recognised_at(now):
                # aged out of the window, or too late to be recognised: given up rather than
                # risk counting them twice (a process that dies loses as much)
                write.release()
            else:
                try:
                    stored = self._write_window(now, gen, old_counts, oldest, write)
                except BaseException:
                    self._keep_unanswered(gen, batch, unanswered)
                    raise
                if stored is None:
                    return
        counts = {b: (c, f) for b, (c, f) in batch.items() if b >= oldest}
        if counts:
            write = WindowWrite()
            try:
                stored = self._write_window(now, gen, counts, oldest, write)
            except BaseException:
                self._keep_unanswered(gen, {}, (counts, write))
                raise
            if stored is None:
                return
        if stored is None:
            return
        if policy.trips(*stored.totals(oldest)):
            self._drop_cached()
            # every process whose write crossed the threshold tries; the generation lets one win
            if self._store.trip_window(self.name, now, gen) is not None:
                self._transition(State.CLOSED, State.OPEN)

    def _write_window(
        self,
        now: int,
        gen: int,
        counts: dict[int, tuple[int, int]],
        oldest: int,
        write: WindowWrite,
    ) -> BreakerWindow | None:
        """One window write of ``counts`` sent by ``write`` (see :meth:`flush`); the stored window
        (None: refused, the window is gone). Raises what the store raised, ``write``'s slot
        still leased: the write may have applied."""
        window = self._window
        assert window is not None
        stored = self._store.add_window(self.name, now, gen, counts, oldest, write=write)
        write.release()  # answered: its slot may carry other writes now
        if stored is None:
            # Not closed, or another generation: the counts belong to a window that is gone;
            # read the state on the next call.
            self._drop_cached()
            with window.lock:
                if window.gen == gen:
                    window.seen = None
            return None
        with window.lock:
            if window.gen == gen:
                window.seen = stored
        return stored

    def _keep_unanswered(
        self,
        gen: int,
        batch: dict[int, list[int]],
        unanswered: tuple[dict[int, tuple[int, int]], WindowWrite],
    ) -> None:
        """A window write raised: keep it to be sent again as it was (it may have applied), and
        the counts not sent yet (``batch``) for the next flush, unless the generation moved on."""
        window = self._window
        assert window is not None
        with window.lock:
            if window.gen != gen:
                unanswered[1].release()  # a window that is gone: nothing to recognise
                return
            for bucket, (c, f) in batch.items():
                pending = window.pending.setdefault(bucket, [0, 0])
                pending[0] += c
                pending[1] += f
            window.unanswered = unanswered

    # -- public API -----------------------------------------------------------------------------

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)`` through the breaker and return its result."""
        ticket = self._admit()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._finish(ticket, exc)
            raise
        if self._window is None:
            self._on_success(ticket)  # what _finish does without an exception
        else:
            self._finish(ticket, None)  # a slow call is a failure
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
        """Count one failure by hand (closed state only; trips at the threshold). With a
        FailureRate policy: one failed call in the window."""
        if self._window is not None:
            self._count_call(True, None)
            return
        self._count_failure(now_ms(self.clock))

    def record_success(self) -> None:
        """Reset the failure count by hand (closed state only). With a FailureRate policy:
        one successful call in the window."""
        if self._window is not None:
            self._count_call(False, None)
            return
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
        if self._window is not None:
            self._drop_cached()
            if old is not None:  # a new generation: what was counted before is gone
                with self._window.lock:
                    self._window.adopt(old.window_gen + 1)
        if old is not None:
            self._transition(old.state, State.CLOSED)

    def trip(self) -> None:
        """Open the breaker now, whatever its state, with a fresh ``reset_timeout``."""
        self._drop_cached()
        old = self._store.trip(self.name, now_ms(self.clock), None)
        if self._window is not None:
            with self._window.lock:  # a new generation (absent before: generation 0)
                self._window.adopt((0 if old is None else old.window_gen) + 1)
        self._transition(State.CLOSED if old is None else old.state, State.OPEN)
