"""Injectable clocks.

Wall-clock time (``time()``) decides expiry, because expiry instants are shared with other
processes through the store. Monotonic time (``monotonic()``) measures waits and deadlines inside
one process, so a wall-clock jump never makes a blocking call wait forever or return early.
"""

from __future__ import annotations

import threading
import time as _time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock", "now_ms"]


@runtime_checkable
class Clock(Protocol):
    """What dynacoord needs to know about time."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes backwards."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds``."""
        ...


class SystemClock:
    """The real clock."""

    # the functions themselves, not methods that call them: a Python frame less on every call
    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


#: Where a ``ManualClock`` starts by default: 2100-01-01T00:00:00Z. It lies in the real future on
#: purpose: DynamoDB's TTL (and DynamoDB Local's TTL job) compares the stored epoch-seconds ``ttl``
#: with the real clock, so a manual clock in the past would let it delete items the manual clock
#: still sees as live.
MANUAL_CLOCK_START = 4_102_444_800.0


class ManualClock:
    """A clock that only moves when told to (tests, simulations).

    ``sleep`` advances the clock instead of blocking, so code with deadlines and backoff runs
    instantly and deterministically. Thread-safe. Starts at ``MANUAL_CLOCK_START`` (year 2100)
    unless told otherwise; a start in the past is safe only where no real TTL sweeps the table.
    """

    def __init__(self, start: float = MANUAL_CLOCK_START) -> None:
        self._now = float(start)
        self._mono = 0.0
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("a ManualClock only moves forward")
        with self._lock:
            self._now += seconds
            self._mono += seconds

    def set(self, epoch_seconds: float) -> None:
        """Jump the wall clock (the monotonic clock is unaffected, as with a real NTP step)."""
        with self._lock:
            self._now = float(epoch_seconds)

    def __repr__(self) -> str:
        return f"ManualClock({self._now!r})"


def now_ms(clock: Clock) -> int:
    """The clock's wall time in integer epoch milliseconds."""
    return int(clock.time() * 1000)
