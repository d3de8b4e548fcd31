"""A shared rate limiter: at most ``rate`` calls per ``per`` seconds, ``burst`` at once.

GCRA (the generic cell rate algorithm, a token bucket kept as one number): the store holds one
item per limiter (per shard) with ``tat``, the *theoretical arrival time* in epoch microseconds:
the time at which the bucket would be full again. Each admitted call of ``n`` moves it on by
``n x T`` (``T = per / rate``, the emission interval) from ``max(tat, now)``, and a call is
admitted only while the new ``tat`` stays within ``burst x T`` of ``now``. A refusal writes
nothing and says when the call would be admitted: ``max(tat, now) + n x T - burst x T - now``.

Why at most ``rate x elapsed + burst`` (in calls of ``n = 1``) are admitted in any interval
``[t0, t1]``: ``tat`` never goes down; the first admission at or after ``t0`` starts from a
``tat`` of at least ``t0``, and every admission leaves it at most ``burst x T`` after its own
``now <= t1``; in between, each admission added ``n x T``. So the calls admitted add at most
``t1 - t0 + burst x T`` to it.

Clocks: ``now`` is each caller's :class:`~dynacoord.Clock`. A caller whose clock is ahead by
``s`` may take the calls of the next ``s`` seconds early (everyone else is then refused for
them), one behind by ``s`` may find the bucket ``s`` fuller than it is. With every clock within
``[real - b, real + a]``, at most ``rate x (elapsed + a + b) + burst`` are admitted in any
interval: skew adds ``rate x`` the *spread* between the fastest and the slowest clock, never
more (clocks off by the same amount add nothing).

The write, one conditional request per admitted call (no read first):

* ``idle`` (the bucket is full: no ``tat``, or ``tat <= now``): ``tat = now + n x T``;
* ``busy`` (``now < tat <= now + burst x T - n x T``): ``tat = tat + n x T``, an atomic add, so
  busy callers never conflict with each other.

The caller guesses the case from the ``tat`` it last saw (a lower bound of the stored one:
``tat`` only grows) and a refusal shows the stored ``tat`` (DynamoDB ``ALL_OLD``, Redis decides
in its script, MongoDB reads once), which either refuses the call (no more requests) or tells the
other case. A ``tat`` seen further ahead than the call allows refuses it with no request at all.

Lost answers: every write is a *counting write* (dynacoord._writers): it carries the token of a
writer slot leased for the call, on the condition that the slot does not hold it yet, so a write
re-sent by the client after it applied is refused and recognised ("admitted", counted once). A
write whose call *raised* may have applied: the limiter keeps its slot and token, and the next
``try_acquire`` of the same ``n`` in this process sends them again, so it is recognised as
admitted instead of counted twice (within the client's retry window; past it, not recognised).

Sharding (``shards=K``): K items (each its own partition on DynamoDB), each with ``rate / K``
and ``burst / K``; a call goes to one shard picked at random. The bound holds per shard, so the
sum holds for the whole.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
from typing import Protocol

from . import keys
from ._breaker_window import WindowWrite
from ._clock import Clock, SystemClock
from ._compat import Record
from ._validate import non_negative_seconds
from .errors import ConfigurationError, InvalidValueError, RateLimitedError
from .metrics import NO_SCOPE, MetricsScope

__all__ = [
    "MAX_SHARDS",
    "RateAttempt",
    "RateDecision",
    "RateLimitStore",
    "RateLimiter",
]

logger = logging.getLogger(__name__)

#: the most shards a limiter may have (a look at :meth:`RateLimiter.available` reads each)
MAX_SHARDS = 100
#: microseconds per second: ``tat`` is stored in epoch microseconds, so that ``T = per / rate``
#: stays exact enough for any rate up to a million per second
MICROS = 1_000_000
#: what a waiting acquire sleeps past the wait it was told (seconds): a clock read a microsecond
#: early would otherwise cost one more refused try
_WAKE_MARGIN = 0.001
#: a waiter refused again and again adds a random part to its wait that doubles from one
#: emission interval up to this many: waiters refused together then wake apart
_MAX_SPREAD = 16
#: write attempts of one call: a wrong guess of the case costs one more, a guess made wrong by
#: a racing write one more again; each answer shows the stored ``tat``, so this always decides
_MAX_SENDS = 3


class RateDecision(Record):
    """What :meth:`RateLimiter.try_acquire` answered. True (as a bool) when admitted.

    ``retry_after``: seconds until a call of the same ``n`` would be admitted (0.0 when
    admitted), usable as an HTTP ``Retry-After`` (round it up). ``remaining``: calls of one that
    the limiter (the shard of this call) would admit at once after this one, as far as this call
    saw the store (a hint for ``X-RateLimit-Remaining``).
    """

    admitted: bool
    retry_after: float
    remaining: int

    def __bool__(self) -> bool:
        return self.admitted


class RateAttempt(Record):
    """What one store write returned: ``admitted`` (applied, or found applied earlier by its own
    token), and ``tat``, the stored ``tat`` after the write or as the refusal showed it (None:
    no item, or not known)."""

    admitted: bool
    tat: int | None


class RateLimitStore(Protocol):
    """Storage for rate limiters. Every method is one request to the store (a refused write
    that must tell its own applied write from another's reads once more on MongoDB).

    ``shard`` is None for an unsharded limiter, else the shard's number.
    """

    def admit(
        self,
        name: str,
        shard: int | None,
        cost_us: int,
        limit_us: int,
        now_us: int,
        idle: bool,
        write: WindowWrite,
    ) -> RateAttempt:
        """Move ``tat`` on by ``cost_us`` if ``max(tat, now_us) <= now_us + limit_us``: with
        ``idle`` on the condition that ``tat`` is absent or ``<= now_us`` (``tat = now + cost``),
        else on ``now_us < tat <= now_us + limit_us`` (``tat += cost``); a store that decides on
        the server may ignore ``idle``. The write carries ``write``'s slot and token, on the
        condition that the slot does not hold it yet: a refusal showing it is this write,
        applied earlier (``admitted=True``)."""
        ...

    def read(self, name: str, shard: int | None) -> int | None:
        """The stored ``tat`` (one consistent read), None when there is no item."""
        ...


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ConfigurationError(f"rate limiter {name} must be a positive number, got {value!r}")
    return number


def _count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


class RateLimiter:
    """A rate limiter named ``name`` over a :class:`RateLimitStore`: ``rate`` calls per ``per``
    seconds, up to ``burst`` at once (default: ``rate``, at least 1). Reached as
    ``backend.rate_limiter(name, rate=..., per=..., burst=..., shards=...)``.

    Every process using one limiter must give it the same ``rate``, ``per``, ``burst`` and
    ``shards`` (each call applies the settings its caller gave).
    """

    def __init__(
        self,
        store: RateLimitStore,
        name: str,
        *,
        rate: float,
        per: float = 1.0,
        burst: int | None = None,
        shards: int = 1,
        clock: Clock | None = None,
        metrics: MetricsScope | None = None,
    ) -> None:
        keys.validate_key(name, "rate limiter name")
        self.rate = _positive(rate, "rate")
        self.per = _positive(per, "per")
        if burst is None:
            burst = max(1, math.floor(self.rate))
        self.burst = _count(burst, "burst")
        if self.burst < 1:
            raise ConfigurationError(f"rate limiter burst must be at least 1, got {burst}")
        self.shards = _count(shards, "shards")
        if not 1 <= self.shards <= MAX_SHARDS:
            raise ConfigurationError(
                f"rate limiter shards must be between 1 and {MAX_SHARDS}, got {shards}"
            )
        if self.burst < self.shards:
            raise ConfigurationError(
                f"rate limiter burst ({self.burst}) must be at least shards ({self.shards}): "
                "each shard admits burst / shards at once, which must be at least one call"
            )
        # A shard's emission interval, rounded *up* to a whole microsecond (a shard then admits
        # a hair less than rate / shards, never more), and its tolerance, rounded down.
        self._interval_us = max(1, math.ceil(self.per * MICROS * self.shards / self.rate))
        self._tolerance_us = self.burst * self._interval_us // self.shards
        #: the most calls one try_acquire may ask for
        self.max_n = self._tolerance_us // self._interval_us
        self._store = store
        self.name = name
        self.clock: Clock = clock or SystemClock()
        self._metrics = metrics if metrics is not None else NO_SCOPE
        # the highest tat seen per shard: a lower bound of the stored one (it only grows), so
        # enough to refuse a call without a request, and to guess the case of the write
        self._seen: list[int] = [0] * self.shards
        # writes whose call raised (maybe applied), by n: (shard, the write's slot and token),
        # and the process they belong to
        self._unanswered: dict[int, tuple[int, WindowWrite]] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def interval(self) -> float:
        """Seconds between two calls of one shard at the full rate (``per x shards / rate``)."""
        return self._interval_us / MICROS

    def _check_n(self, n: object) -> int:
        count = _count(n, "n")
        if count < 1:
            raise InvalidValueError(f"n must be at least 1, got {count}")
        if count > self.max_n:
            raise InvalidValueError(
                f"n={count} can never be admitted by rate limiter {self.name!r}: at most "
                f"{self.max_n} at once (burst {self.burst}"
                + (f" over {self.shards} shards" if self.shards > 1 else "")
                + ")"
            )
        return count

    def _now_us(self) -> int:
        return int(self.clock.time() * MICROS)

    def try_acquire(self, n: int = 1) -> RateDecision:
        """Admit ``n`` calls now, or say how long to wait. One conditional write when admitted
        (rarely two or three: see the module docstring); when refused, none if this object saw
        the limiter too full already, else the one refused write.

        If the store call raises, the call may have been admitted: the next ``try_acquire(n)``
        with the same ``n`` in this process recognises it (answers admitted, counted once)."""
        n = self._check_n(n)
        now = self._now_us()
        cost = n * self._interval_us
        limit = self._tolerance_us - cost  # admitted while max(tat, now) <= now + limit
        pending = None
        if self._unanswered:
            with self._lock:
                if self._pid != os.getpid():
                    # a forked child: the raised writes are its parent's, which may send them
                    # again itself (both recognising one applied write would admit twice)
                    self._unanswered.clear()
                    self._pid = os.getpid()
                pending = self._unanswered.pop(n, None)
        if pending is not None and not pending[1].recognised_at(now // 1000):
            pending[1].release()  # past its window: its slot may be gone, it cannot be told
            pending = None
        if pending is not None:
            shard, write = pending
        else:
            shard, write = random.randrange(self.shards), WindowWrite()
        seen = self._seen[shard]
        if seen > now + limit and pending is None:
            write.release()
            return self._refused(seen, now, limit, shard)
        store_shard = shard if self.shards > 1 else None
        idle = seen <= now
        kept = False
        try:
            for _ in range(_MAX_SENDS):
                attempt = self._store.admit(self.name, store_shard, cost, limit, now, idle, write)
                tat = attempt.tat
                if tat is not None and tat > self._seen[shard]:
                    self._seen[shard] = tat
                if attempt.admitted:
                    self._metrics.count("RateAdmitted")
                    after = now if tat is None else tat
                    left = max(0, (now + self._tolerance_us - after) // self._interval_us)
                    return RateDecision(True, 0.0, int(left))
                if tat is not None and tat > now + limit:
                    return self._refused(tat, now, limit, shard)
                # the other case: the bucket was idle (or busy) after all
                idle = tat is None or tat <= now
        except BaseException:
            # maybe applied: the next try_acquire(n) sends the same slot and token again
            with self._lock:
                if self._pid != os.getpid():
                    self._unanswered.clear()
                    self._pid = os.getpid()
                old = self._unanswered.pop(n, None)
                self._unanswered[n] = (shard, write)
            kept = True
            if old is not None:
                old[1].release()
            raise
        finally:
            if not kept:  # answered: no send of this write can come any more
                write.release()
        # not reached in practice: each answer decides the next case (see _MAX_SENDS)
        logger.warning("rate limiter %r: undecided after %d writes", self.name, _MAX_SENDS)
        return self._refused(self._seen[shard], now, limit, shard)

    def _refused(self, tat: int, now: int, limit: int, shard: int) -> RateDecision:
        self._metrics.count("RateLimited")
        wait_us = max(tat - now - limit, 1)
        return RateDecision(False, wait_us / MICROS, 0)

    def acquire(self, n: int = 1, *, timeout: float | None = None) -> RateDecision:
        """Admit ``n`` calls, waiting as long as the limiter says (``retry_after``, never a
        poll in between) up to ``timeout`` seconds (None: as long as it takes). Raises
        :class:`~dynacoord.RateLimitedError` (with the ``retry_after`` last seen) at once when
        the wait would end past the timeout."""
        n = self._check_n(n)
        wait = None if timeout is None else non_negative_seconds(timeout, "timeout")
        deadline = None if wait is None else self.clock.monotonic() + wait
        spread = 0.0
        while True:
            decision = self.try_acquire(n)
            if decision.admitted:
                return decision
            # The first wait is the one told; refused again, another waiter took the call
            # first: waiters told the same wait would all wake at once and all but one be
            # refused, so each adds a random part that doubles with its refusals.
            pause = decision.retry_after + _WAKE_MARGIN + random.uniform(0, spread)
            spread = min(max(2 * spread, self.interval), _MAX_SPREAD * self.interval)
            if deadline is not None and self.clock.monotonic() + decision.retry_after > deadline:
                raise RateLimitedError(
                    f"rate limiter {self.name!r}: {n} call(s) not admitted within the timeout "
                    f"(retry after {decision.retry_after:.3f} s)",
                    name=self.name,
                    retry_after=decision.retry_after,
                )
            self.clock.sleep(pause)

    def available(self) -> int:
        """How many calls of one would be admitted at once now (one consistent read per
        shard; with shards, the sum, though one call gets at most one shard's)."""
        now = self._now_us()
        total = 0
        for shard in range(self.shards):
            tat = self._store.read(self.name, shard if self.shards > 1 else None)
            if tat is not None and tat > self._seen[shard]:
                self._seen[shard] = tat
            after = now if tat is None else max(tat, now)
            total += max(0, (now + self._tolerance_us - after) // self._interval_us)
        return int(total)

    def state(self) -> list[int | None]:
        """What the store keeps, per shard (one consistent read each): GCRA's ``tat``, when
        that shard's bucket is full again, in epoch microseconds; None for a shard with no item
        (it has admitted no call, or its item expired: a full bucket). The rate, period and
        burst are not stored: each caller gives its own."""
        if self.shards == 1:
            return [self._store.read(self.name, None)]
        return [self._store.read(self.name, shard) for shard in range(self.shards)]

    def __repr__(self) -> str:
        return (
            f"RateLimiter(name={self.name!r}, rate={self.rate}, per={self.per}, "
            f"burst={self.burst}, shards={self.shards})"
        )
