"""The failure-rate window of a circuit breaker (``policy=FailureRate(...)``).

The policy object; the stored form of the window (one count pair per bucket and generation,
``c:{gen}:{bucket}`` and ``f:{gen}:{bucket}``, so an item's size does not grow with the call rate
or the number of processes) that every backend reads and prunes the same way; and this process's
counts not written yet. :mod:`dynacoord.breaker` holds the state machine that uses them and
re-exports the public names.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._validate import check_int, non_negative_seconds, ttl_to_ms
from ._writers import Slot, lease, release, token_ms
from .errors import InvalidValueError

__all__ = [
    "BreakerWindow",
    "FailureRate",
    "WindowWrite",
    "stale_window_names",
    "window_field",
    "window_from_fields",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class FailureRate:
    """The failure-rate policy: ``CircuitBreaker(..., policy=FailureRate(threshold=0.5))``.

    The breaker opens when, over the last ``window`` seconds, at least ``minimum_calls`` calls
    were made and ``failures / calls >= threshold``. A call that took longer than
    ``slow_call_seconds`` (None: no limit) counts as a failure, also when it succeeded (a trial
    call too). The window moves one bucket (``window / buckets`` seconds) at a time: it holds
    the current bucket and the ``buckets - 1`` before it. Each process writes its counts every
    ``flush_interval`` seconds (0: on every call) while it holds a failure not written yet or
    the window it last saw is near a decision (at least half of ``minimum_calls``, and half of
    ``threshold`` failing), at once after a failure that could trip the breaker by that window,
    and otherwise (successes only, far from a decision) every ``success_flush_interval``
    seconds (None: ``window / 2``, or ``flush_interval`` if that is longer): successes that
    change no decision are not worth a write a second from every process of a fleet.
    """

    threshold: float = 0.5
    minimum_calls: int = 20
    window: float = 60.0
    buckets: int = 10
    slow_call_seconds: float | None = None
    flush_interval: float = 1.0
    success_flush_interval: float | None = None

    def __post_init__(self) -> None:
        threshold = self.threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise TypeError(f"threshold must be a number, got {type(threshold).__name__}")
        if not 0 < threshold <= 1:
            raise InvalidValueError(f"threshold must be > 0 and <= 1, got {threshold!r}")
        check_int(self.minimum_calls, "minimum_calls", minimum=1)
        check_int(self.buckets, "buckets", minimum=1, maximum=60)
        window_ms = ttl_to_ms(self.window, "window")
        if window_ms % self.buckets:
            raise InvalidValueError(
                f"window ({window_ms} ms) must split into {self.buckets} buckets of whole ms"
            )
        if self.slow_call_seconds is not None:
            ttl_to_ms(self.slow_call_seconds, "slow_call_seconds")
        interval = non_negative_seconds(self.flush_interval, "flush_interval")
        if interval >= self.window:
            raise InvalidValueError(
                f"flush_interval must be shorter than the window, got {self.flush_interval!r}"
            )
        if self.success_flush_interval is not None:
            successes = non_negative_seconds(self.success_flush_interval, "success_flush_interval")
            if not interval <= successes < self.window:
                raise InvalidValueError(
                    "success_flush_interval must be at least flush_interval and shorter than "
                    f"the window, got {self.success_flush_interval!r}"
                )

    @property
    def success_interval(self) -> float:
        """How long a process keeps successes that change no decision before writing them."""
        if self.success_flush_interval is not None:
            return float(self.success_flush_interval)
        return max(float(self.flush_interval), self.window / 2)

    def near(self, calls: int, failures: int) -> bool:
        """Whether a window holding ``calls`` and ``failures`` is near a decision: half of
        ``minimum_calls`` made and half of ``threshold`` failing (successes then count)."""
        return 2 * calls >= self.minimum_calls and 2 * failures >= self.threshold * calls

    @property
    def bucket_ms(self) -> int:
        """The width of one bucket in milliseconds."""
        return ttl_to_ms(self.window, "window") // self.buckets

    def trips(self, calls: int, failures: int) -> bool:
        """Whether a window holding ``calls`` calls of which ``failures`` failed opens it."""
        return calls >= self.minimum_calls and failures >= self.threshold * calls


def window_field(kind: str, gen: int, bucket: int) -> str:
    """The stored name of a window count: ``c`` (calls) or ``f`` (failures), e.g. ``c:3:71234``."""
    return f"{kind}:{gen}:{bucket}"


def _parse_field(field: str) -> tuple[str, int, int] | None:
    """(kind, gen, bucket) of a window count's name; None for any other field."""
    if len(field) < 5 or field[0] not in "cf" or field[1] != ":":
        return None
    gen, sep, bucket = field[2:].partition(":")
    if not sep or not gen.isdigit() or not bucket.isdigit():
        return None
    return field[0], int(gen), int(bucket)


@dataclass(frozen=True, slots=True)
class BreakerWindow:
    """The stored failure-rate window of generation ``gen`` after a write: ``(bucket, calls,
    failures)`` per bucket, in bucket order (buckets that aged out may still be there); ``names``
    holds the stored names of every window count seen on the item, of any generation (what a
    store drops once they are stale)."""

    gen: int
    buckets: tuple[tuple[int, int, int], ...] = ()
    names: tuple[str, ...] = ()

    def totals(self, oldest: int) -> tuple[int, int]:
        """(calls, failures) over the buckets from ``oldest`` on."""
        calls = failures = 0
        for bucket, c, f in self.buckets:
            if bucket >= oldest:
                calls += c
                failures += f
        return calls, failures


def window_from_fields(fields: Mapping[str, Any], gen: int) -> BreakerWindow:
    """The window of generation ``gen`` held by a stored item's fields (values: anything
    ``int()`` takes), and the names of all window counts on it."""
    counts: dict[int, list[int]] = {}
    names = []
    for field, value in fields.items():
        parsed = _parse_field(field)
        if parsed is None:
            continue
        names.append(field)
        kind, field_gen, bucket = parsed
        if field_gen != gen:
            continue
        pair = counts.setdefault(bucket, [0, 0])
        pair[0 if kind == "c" else 1] = int(value)
    buckets = tuple((b, c, f) for b, (c, f) in sorted(counts.items()))
    return BreakerWindow(gen, buckets, tuple(sorted(names)))


def stale_window_names(names: tuple[str, ...], gen: int, oldest: int) -> list[str]:
    """The names among ``names`` no window needs any more: another generation, or a bucket
    before ``oldest``."""
    stale = []
    for name in names:
        parsed = _parse_field(name)
        if parsed is not None and (parsed[1] != gen or parsed[2] < oldest):
            stale.append(name)
    return stale


class WindowWrite:
    """Who sent one window write: a writer slot (dynacoord._writers) leased for it on its first
    send and the token it carries. A write whose call raised may have applied; the breaker keeps
    its slot leased (no other call of this process can write that slot in between) and sends the
    same counts again under the same slot and token, which the store recognises as applied
    instead of adding them twice. Stores take the slot with :meth:`take`; the breaker gives it
    back with :meth:`release` once the write is answered (or given up)."""

    __slots__ = ("_slot", "token")

    def __init__(self) -> None:
        self._slot: Slot | None = None
        self.token = 0

    def take(self, now_ms: int, window_ms: int) -> tuple[str, int]:
        """The slot's name and the token of this write: leased at the first send (its client may
        re-send it for up to ``window_ms``), the same ones at every later send."""
        if self._slot is None:
            self._slot, self.token = lease(now_ms, window_ms)
        return self._slot.name, self.token

    def recognised_at(self, now_ms: int) -> bool:
        """Whether a send at ``now_ms`` is still recognised if the first applied: before the
        token's time, stores keep its slot (past it, any writer may drop it as stale)."""
        return self._slot is None or now_ms < token_ms(self.token)

    def release(self) -> None:
        """Give the slot back: the write was answered, or its counts given up."""
        slot, self._slot = self._slot, None
        if slot is not None:
            release(slot)


#: every live _LocalWindow of this process, for a forked child to make them its own
_windows: weakref.WeakSet[_LocalWindow] = weakref.WeakSet()


def _after_fork_in_child() -> None:  # pragma: no cover - runs in a forked child
    for window in list(_windows):
        window.forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _LocalWindow:
    """This process's share of a FailureRate breaker's window: the counts not written yet
    (bucket -> [calls, failures]) of generation ``gen``, the window as this process's last
    write left it (``seen``), when it last wrote (monotonic seconds), and the write whose call
    raised (``unanswered``: its counts and who sent it), sent again before any other."""

    __slots__ = ("__weakref__", "flushed_at", "gen", "lock", "pending", "seen", "unanswered")

    def __init__(self, now: float) -> None:
        self.lock = threading.Lock()
        self.gen = 0
        self.pending: dict[int, list[int]] = {}
        self.seen: BreakerWindow | None = None
        self.flushed_at = now
        self.unanswered: tuple[dict[int, tuple[int, int]], WindowWrite] | None = None
        _windows.add(self)

    def forked(self) -> None:
        """In a forked child: the counts not written yet and the write whose call raised are the
        parent's, which writes them (or sends that write again) itself; the child writing them
        too would count those calls twice (the raised write's slot may carry a newer token of
        the parent's by then, so the store cannot recognise it). The child counts its own calls
        from here. Its lock is new (a parent thread may have held it at the fork)."""
        self.lock = threading.Lock()
        self.pending = {}
        self.unanswered = None  # its slot is the parent's pool's: never given back here

    def adopt(self, gen: int) -> None:
        """Another generation is stored (a trip or reset since): counts of the old one are
        dropped, they belong to a window that is gone. Call with ``lock`` held."""
        if gen != self.gen:
            self.gen = gen
            self.pending = {}
            self.seen = None
            if self.unanswered is not None:
                self.unanswered[1].release()
                self.unanswered = None
