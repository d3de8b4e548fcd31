"""Distributed locks with fencing tokens.

Policy lives here (owner ids, deadlines, backoff with jitter, heartbeats); a backend supplies a
:class:`LockStore` whose methods are one round trip each.

Fencing: every successful acquisition of a key gets a ``fence`` strictly greater than every fence
handed out before for that key. Give it to the resource you protect and have the resource refuse
writes carrying a smaller fence than it has seen: a holder that was paused past its TTL (GC pause,
frozen Lambda) then cannot clobber the work of the next holder::

    A acquires (fence 7) ...... paused ...................... A writes with fence 7 -> refused
                         lease expires, B acquires (fence 8), B writes with fence 8 -> accepted
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from . import keys
from ._clock import Clock, SystemClock, now_ms
from ._validate import check_bool, check_str, non_negative_seconds, ttl_to_ms
from .errors import LockNotAcquiredError

__all__ = ["AcquireResult", "Lease", "LockInfo", "LockStore", "Locks", "default_owner"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LockInfo:
    """A snapshot of a held lock."""

    key: str
    owner: str
    fence: int
    expires_at_ms: int

    @property
    def expires_at(self) -> float:
        """Expiry as epoch seconds."""
        return self.expires_at_ms / 1000


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """What one acquisition attempt returned: the new lock, or who holds it now."""

    acquired: LockInfo | None
    holder: LockInfo | None = None


class LockStore(Protocol):
    """Storage for locks. Every method is one request to the store.

    ``now_ms`` is passed in (rather than read by the store) so that expiry is decided by the
    caller's injected clock, identically on every backend.
    """

    def try_acquire(self, key: str, owner: str, ttl_ms: int, now_ms: int) -> AcquireResult:
        """Take the lock if it is free or expired, with a fence above every earlier fence.

        When it is held by someone (including ``owner``), return the current holder.
        """
        ...

    def extend(self, key: str, owner: str, fence: int, ttl_ms: int, now_ms: int) -> LockInfo | None:
        """Push the expiry to ``now + ttl`` if (owner, fence) still holds an unexpired lock."""
        ...

    def release(self, key: str, owner: str, fence: int, now_ms: int) -> bool:
        """Free the lock if (owner, fence) still holds it; False if it was lost."""
        ...

    def force_release(self, key: str, now_ms: int) -> bool:
        """Free the lock whoever holds it; True if a live lock was freed."""
        ...

    def get(self, key: str, now_ms: int) -> LockInfo | None:
        """The current unexpired holder, read consistently."""
        ...


def default_owner() -> str:
    """A unique owner id that still tells a human where the lock came from."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:12]}"


class Lease:
    """A held lock. Returned by :meth:`Locks.acquire`; usable as a context manager.

    ``lost`` becomes True once an extend or heartbeat finds the lock gone (expired and possibly
    taken by another owner). Calling code that protects a resource should pass ``fence`` along.
    """

    def __init__(self, locks: Locks, info: LockInfo, ttl_ms: int) -> None:
        self._locks = locks
        self._mutex = threading.Lock()
        self.key = info.key
        self.owner = info.owner
        self.fence = info.fence
        self.expires_at_ms = info.expires_at_ms
        self.ttl_ms = ttl_ms
        self.lost = False
        self.released = False

    @property
    def expires_at(self) -> float:
        """Expiry as epoch seconds (as last confirmed by the store)."""
        return self.expires_at_ms / 1000

    @property
    def ttl(self) -> float:
        """The TTL in seconds used for acquisition and, by default, for extensions."""
        return self.ttl_ms / 1000

    def extend(self, ttl: float | None = None) -> bool:
        """Reset the expiry to now + ``ttl`` (default: the acquisition TTL).

        Returns False, and marks the lease lost, when the lock is no longer held by this lease.
        """
        ttl_ms = self.ttl_ms if ttl is None else ttl_to_ms(ttl)
        with self._mutex:
            if self.lost or self.released:
                return False
            info = self._locks._store.extend(
                self.key, self.owner, self.fence, ttl_ms, now_ms(self._locks.clock)
            )
            if info is None:
                self.lost = True
                logger.warning("lock %r lost by %r (fence %d)", self.key, self.owner, self.fence)
                return False
            self.expires_at_ms = info.expires_at_ms
            return True

    def release(self) -> bool:
        """Free the lock. False if it had already been lost; never frees another owner's lock."""
        with self._mutex:
            if self.released:
                return False
            self.released = True
            if self.lost:
                return False
            ok = self._locks._store.release(
                self.key, self.owner, self.fence, now_ms(self._locks.clock)
            )
            if not ok:
                self.lost = True
                logger.warning("release of lock %r by %r found it lost", self.key, self.owner)
            return ok

    def is_held(self) -> bool:
        """Ask the store whether this lease still holds the lock (one consistent read)."""
        if self.lost or self.released:
            return False
        info = self._locks._store.get(self.key, now_ms(self._locks.clock))
        return info is not None and info.owner == self.owner and info.fence == self.fence

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"Lease(key={self.key!r}, owner={self.owner!r}, fence={self.fence}, "
            f"expires_at_ms={self.expires_at_ms}, lost={self.lost})"
        )


class _Heartbeat(threading.Thread):
    """Extends a lease every ``interval`` seconds until stopped or the lease is lost."""

    def __init__(
        self, lease: Lease, interval: float, on_lost: Callable[[Lease], None] | None
    ) -> None:
        super().__init__(name=f"dynacoord-heartbeat-{lease.key}", daemon=True)
        self._lease = lease
        self._interval = interval
        self._on_lost = on_lost
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            try:
                ok = self._lease.extend()
            except (
                Exception
            ):  # a transient error must not kill the heartbeat; the next try may work
                logger.exception("heartbeat for lock %r failed", self._lease.key)
                continue
            if not ok:
                if self._lease.released:
                    return
                if self._on_lost is not None:
                    try:
                        self._on_lost(self._lease)
                    except Exception:
                        logger.exception("on_lost callback for lock %r raised", self._lease.key)
                return

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join()


class Locks:
    """Distributed locks over a :class:`LockStore`. Reached as ``backend.locks``."""

    #: first retry delay and cap of the exponential backoff of a blocking acquire (seconds)
    backoff_initial = 0.02
    backoff_max = 1.0

    def __init__(self, store: LockStore, *, clock: Clock | None = None) -> None:
        self._store = store
        self.clock: Clock = clock or SystemClock()

    def acquire(
        self,
        key: str,
        ttl: float,
        *,
        owner: str | None = None,
        timeout: float = 0.0,
    ) -> Lease | None:
        """Acquire ``key`` for ``ttl`` seconds (millisecond precision).

        With ``timeout=0`` this is one attempt (one conditional write). With ``timeout > 0`` it
        retries with exponential backoff and full jitter until the deadline, then returns None.
        An ``owner`` that already holds the lock gets it back with the same fence and a fresh TTL.
        """
        keys.validate_key(key, "lock key")
        ttl_ms = ttl_to_ms(ttl)
        wait = non_negative_seconds(timeout, "timeout")
        owner = default_owner() if owner is None else check_str(owner, "owner")
        deadline = self.clock.monotonic() + wait
        delay = self.backoff_initial
        while True:
            lease = self._attempt(key, owner, ttl_ms)
            if lease is not None:
                return lease
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return None
            # Full jitter: contenders that failed together do not retry together.
            self.clock.sleep(min(remaining, random.uniform(0, delay)))
            delay = min(self.backoff_max, delay * 2)

    def _attempt(self, key: str, owner: str, ttl_ms: int) -> Lease | None:
        now = now_ms(self.clock)
        result = self._store.try_acquire(key, owner, ttl_ms, now)
        if result.acquired is not None:
            logger.debug("lock %r acquired by %r (fence %d)", key, owner, result.acquired.fence)
            return Lease(self, result.acquired, ttl_ms)
        holder = result.holder
        if holder is not None and holder.owner == owner:
            # Same owner again (or our own earlier write whose response was lost and retried):
            # keep the fence, refresh the TTL.
            info = self._store.extend(key, owner, holder.fence, ttl_ms, now)
            if info is not None:
                return Lease(self, info, ttl_ms)
        return None

    @contextmanager
    def hold(
        self,
        key: str,
        ttl: float,
        *,
        owner: str | None = None,
        timeout: float = 10.0,
        heartbeat: bool = True,
        on_lost: Callable[[Lease], None] | None = None,
    ) -> Iterator[Lease]:
        """Hold ``key`` for the duration of a ``with`` block.

        Raises :class:`LockNotAcquiredError` if the lock cannot be had within ``timeout``. With
        ``heartbeat`` the lease is renewed in a background thread every ``ttl/3``; if a renewal
        finds the lock lost, ``lease.lost`` becomes True and ``on_lost(lease)`` is called (the
        block is not interrupted: check ``lease.lost`` or rely on the fence). Released on exit.
        """
        check_bool(heartbeat, "heartbeat")
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be callable or None, got {type(on_lost).__name__}")
        lease = self.acquire(key, ttl, owner=owner, timeout=timeout)
        if lease is None:
            holder = self._store.get(key, now_ms(self.clock))
            raise LockNotAcquiredError(
                f"lock {key!r} not acquired within {timeout}s"
                + (f" (held by {holder.owner!r} until {holder.expires_at:.3f})" if holder else ""),
                key=key,
                owner=holder.owner if holder else None,
                expires_at=holder.expires_at if holder else None,
            )
        try:
            if heartbeat:
                with self.keep_alive(lease, on_lost=on_lost):
                    yield lease
            else:
                yield lease
        finally:
            lease.release()

    @contextmanager
    def keep_alive(
        self, lease: Lease, *, on_lost: Callable[[Lease], None] | None = None
    ) -> Iterator[Lease]:
        """Renew an acquired ``lease`` every ``ttl/3`` in a background thread during the block.

        For code that acquires without blocking (``timeout=0``) and must not lose the lock to an
        overrunning step; it does not release the lease on exit. If a renewal finds the lock
        lost, ``lease.lost`` becomes True and ``on_lost(lease)`` is called.
        """
        beat = _Heartbeat(lease, lease.ttl / 3, on_lost)
        beat.start()
        try:
            yield lease
        finally:
            beat.stop()

    def force_release(self, key: str) -> bool:
        """Free ``key`` whoever holds it (operator action). True if a live lock was freed."""
        keys.validate_key(key, "lock key")
        return self._store.force_release(key, now_ms(self.clock))

    def get(self, key: str) -> LockInfo | None:
        """The current holder of ``key``, or None if it is free (expired counts as free)."""
        keys.validate_key(key, "lock key")
        return self._store.get(key, now_ms(self.clock))

    def locked(self, key: str) -> bool:
        """True if someone holds ``key`` now."""
        return self.get(key) is not None
