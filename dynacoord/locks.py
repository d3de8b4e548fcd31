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

import functools
import logging
import os
import random
import socket
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from . import keys
from ._clock import Clock, SystemClock, now_ms
from ._compat import Record
from ._validate import check_bool, check_str, non_negative_seconds, ttl_to_ms
from .errors import LockLostError, LockNotAcquiredError, NotSupportedError
from .metrics import NO_SCOPE, MetricsScope

if TYPE_CHECKING:
    from .fencing import FenceCondition

__all__ = ["AcquireResult", "Lease", "LockInfo", "LockStore", "Locks", "default_owner"]

logger = logging.getLogger(__name__)


class LockInfo(Record):
    """A snapshot of a held lock (a NamedTuple)."""

    key: str
    owner: str
    fence: int
    expires_at_ms: int

    @property
    def expires_at(self) -> float:
        """Expiry as epoch seconds."""
        return self.expires_at_ms / 1000


class AcquireResult(Record):
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

    def release(
        self, key: str, owner: str, fence: int, now_ms: int, token: str | None = None
    ) -> bool:
        """Free the lock if (owner, fence) still holds it; False if it was lost.

        ``token`` (a fresh one when None) is stored with the release: a refusal that shows it
        is a release of this caller's that applied (its answer lost, or its call raised), and
        answers True. A caller that retries a release which raised passes the same token."""
        ...

    def force_release(self, key: str, now_ms: int) -> bool:
        """Free the lock whoever holds it; True if a live lock was freed."""
        ...

    def get(self, key: str, now_ms: int) -> LockInfo | None:
        """The current unexpired holder, read consistently."""
        ...


def default_owner() -> str:
    """A unique owner id that still tells a human where the lock came from."""
    # os.urandom(6).hex() is what uuid.uuid4().hex[:12] was (its first 48 bits are all random)
    # without building a UUID object on every acquire that names no owner
    return f"{_hostname()}:{os.getpid()}:{threading.get_ident()}:{os.urandom(6).hex()}"


@functools.cache
def _hostname() -> str:
    # asked once per process: a system call on every acquire that names no owner otherwise
    return socket.gethostname()


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
        # the token of a release that raised (maybe applied): its retry sends the same one, so
        # the store recognises the release as this lease's own
        self._release_token: str | None = None

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
            if info is not None:
                self.expires_at_ms = info.expires_at_ms
                return True
            self.lost = True
            self._locks._metrics.count("LockLost")
            logger.warning("lock %r lost by %r (fence %d)", self.key, self.owner, self.fence)
        self._locks._released(self)
        return False

    def release(self) -> bool:
        """Free the lock. False if it had already been lost; never frees another owner's lock."""
        try:
            return self._release()
        finally:
            self._locks._released(self)  # the next waiter of this process may go now

    def _release(self) -> bool:
        with self._mutex:
            if self.released:
                return False
            if self.lost and self._release_token is None:
                self.released = True
                return False
            if self._release_token is None:
                self._release_token = os.urandom(8).hex()
            # Released only once the store answered: a call that raised may not have been sent,
            # and the caller's retry must send it (with the same token, so that a release that
            # did apply is recognised as this lease's own rather than reported lost).
            ok = self._locks._store.release(
                self.key,
                self.owner,
                self.fence,
                now_ms(self._locks.clock),
                token=self._release_token,
            )
            self.released = True
            if not ok:
                self.lost = True
                self._locks._metrics.count("LockLost")
                logger.warning("release of lock %r by %r found it lost", self.key, self.owner)
            return ok

    def is_held(self) -> bool:
        """Ask the store whether this lease still holds the lock (one consistent read)."""
        if self.lost or self.released:
            return False
        info = self._locks._store.get(self.key, now_ms(self._locks.clock))
        return info is not None and info.owner == self.owner and info.fence == self.fence

    # -- fencing at the resource (dynacoord/fencing.py, docs/locks.md) ----------------------------

    def guard(self, tx: Any) -> None:
        """Make ``tx`` (a ``backend.transaction()``, DynamoDB) commit only while this lease holds
        the lock: one condition check on the lock item (owner and fence as held, not expired by
        this process's clock as of this call) joins the transaction. If the lock was released,
        expired or taken over when the transaction commits, nothing in it is written (in any
        table) and :class:`~dynacoord.errors.LockLostError` is raised. A lease already known
        lost or released raises it here. The check counts as one of the transaction's items."""
        if self.lost or self.released:
            raise LockLostError(
                f"lease of lock {self.key!r} (owner {self.owner!r}, fence {self.fence}) is "
                f"{'released' if self.released else 'lost'}: the transaction cannot be guarded",
                key=self.key,
                owner=self.owner,
                fence=self.fence,
            )
        store = self._locks._store
        add_guard = getattr(store, "guard", None)
        if add_guard is None:
            raise NotSupportedError(
                f"lease.guard(tx) needs a backend with multi-item transactions (DynamoDB); "
                f"{type(store).__name__} has none: fence the write itself with "
                "lease.fenced_update(key, values) (one atomic write that refuses a smaller fence)"
            )
        add_guard(tx, self.key, self.owner, self.fence, now_ms(self._locks.clock))

    def fenced_update(
        self,
        key: Any,
        values: Mapping[str, Any] | None = None,
        *,
        table: Any = None,
        attr: str = "fence",
    ) -> None:
        """Write the application's item ``key``, refused if it holds a larger fence than this
        lease's: one atomic write that sets ``values`` and stores ``fence`` in ``attr``.

        ``table``: DynamoDB, the table name (None: the backend's own table, for items of
        yours that share it) and ``key`` a dict of key attributes; MongoDB, a collection name
        in the backend's database or a collection (None: the backend's own) and ``key`` an
        equality filter on a unique index (``{"_id": ...}``); Redis, None, and ``key`` the name
        of a hash (``values`` its fields). A refusal raises
        :class:`~dynacoord.errors.FenceRejectedError`; nothing was written. The same or a
        smaller lease's fence already there is overwritten (a holder writes many times; a
        re-sent write applies again)."""
        from .fencing import check_attr

        check_attr(attr)
        store = self._locks._store
        fenced = getattr(store, "fenced_update", None)
        if fenced is None:
            raise NotSupportedError(f"{type(store).__name__} has no fenced writes")
        fenced(table, key, values, attr, self.fence, lock_key=self.key, owner=self.owner)

    def fence_condition(self, attr: str = "fence") -> FenceCondition:
        """The pieces of a write of your own that stores this lease's fence in ``attr`` and is
        refused when the item holds a larger one (:class:`dynacoord.fencing.FenceCondition`:
        a boto3 request, a transaction's update, a MongoDB filter)."""
        from .fencing import FenceCondition

        return FenceCondition(self.fence, attr)

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


class _Waiters:
    """The threads of this process waiting for one key, first come first served, and the lease
    of this process that holds it (if any)."""

    __slots__ = ("cond", "key", "tickets", "users")

    def __init__(self, key: str) -> None:
        self.key = key
        self.cond = threading.Condition(threading.Lock())
        self.tickets: deque[object] = deque()
        self.users = 0


class Locks:
    """Distributed locks over a :class:`LockStore`. Reached as ``backend.locks``."""

    #: first retry delay and cap of the exponential backoff of a blocking acquire (seconds)
    backoff_initial = 0.02
    backoff_max = 1.0
    #: queue blocking acquires of this process per key and hand the lock on at release; False:
    #: every waiter polls the store, which the bench measures against the handoff
    fifo_handoff = True

    def __init__(
        self, store: LockStore, *, clock: Clock | None = None, metrics: MetricsScope | None = None
    ) -> None:
        self._store = store
        self.clock: Clock = clock or SystemClock()
        self._metrics = metrics if metrics is not None else NO_SCOPE
        self._waiters_lock = threading.Lock()
        self._queues: dict[str, _Waiters] = {}
        # The lease of this process that holds each key (weak: a lease dropped without a
        # release must not be kept alive here).
        self._held: weakref.WeakValueDictionary[str, Lease] = weakref.WeakValueDictionary()

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
        retries until the deadline, then returns None: threads of this process waiting for the
        same key queue up first come, first served, and only the head of the queue asks the
        store; a release in this process hands the lock to the next one at once. Against a
        holder elsewhere the head backs off exponentially with full jitter, never sleeping past
        the holder's expiry, and looks with consistent reads (not writes the store would refuse)
        until the lock is free, so an early release elsewhere is seen within ``backoff_max``.
        An ``owner`` that already holds the lock gets it back with the same fence and a fresh TTL.
        """
        keys.validate_key(key, "lock key")
        ttl_ms = ttl_to_ms(ttl)
        wait = non_negative_seconds(timeout, "timeout")
        owner = default_owner() if owner is None else check_str(owner, "owner")
        if wait == 0:
            return self._attempt(key, owner, ttl_ms)[0]
        deadline = self.clock.monotonic() + wait
        # The hand-off waits on a real condition variable: only with the real clock (a manual
        # clock's sleep is how tests move time, and a condition wait would block in real time).
        if not self.fifo_handoff or not isinstance(self.clock, SystemClock):
            return self._waited(self._poll(key, owner, ttl_ms, deadline), deadline - wait)
        queue = self._waiters(key)
        ticket = object()
        with queue.cond:
            queue.tickets.append(ticket)
        try:
            while True:
                if not self._wait_turn(queue, ticket, owner, deadline):
                    return self._waited(None, deadline - wait)
                lease = self._poll(key, owner, ttl_ms, deadline, queue=queue)
                if lease is not None or self.clock.monotonic() >= deadline:
                    return self._waited(lease, deadline - wait)
        finally:
            with queue.cond:
                queue.tickets.remove(ticket)
                queue.cond.notify_all()
            self._forget_waiters(key, queue)

    def _poll(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        deadline: float,
        *,
        queue: _Waiters | None = None,
    ) -> Lease | None:
        """Ask the store until the lock is had, the deadline passes, or (with ``queue``) a
        holder of this process appears (then the caller waits for its release instead)."""
        delay = self.backoff_initial
        holder: LockInfo | None = None  # who held it at the last look; None: try to take it
        while True:
            if holder is None:
                lease, holder = self._attempt(key, owner, ttl_ms)
                if lease is not None:
                    return lease
            else:
                # Held elsewhere: look with a read (one read unit) rather than a write that
                # would be refused (a write unit, five times the price); write once it is free.
                holder = self._store.get(key, now_ms(self.clock))
                if holder is None or holder.owner == owner:
                    holder = None
                    continue
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return None
            if queue is not None and key in self._held:
                return None  # held here: wait for the hand-off, not the store
            sleep = random.uniform(0, delay)  # full jitter: failed together, retry apart
            if holder is not None:
                # Never sleep past the holder's expiry. A holder that released early is seen
                # within backoff_max, however long its TTL.
                until_expiry = max(0.0, (holder.expires_at_ms - now_ms(self.clock)) / 1000)
                sleep = min(sleep, until_expiry + 0.001)
            self.clock.sleep(min(remaining, sleep))
            delay = min(self.backoff_max, delay * 2)

    def _wait_turn(self, queue: _Waiters, ticket: object, owner: str, deadline: float) -> bool:
        """Block until ``ticket`` heads the queue and no lease of this process holds the key
        (or that lease expired); False when the deadline passed first."""
        with queue.cond:
            while True:
                holder = self._held.get(queue.key)
                if holder is not None and (holder.released or holder.lost or holder.owner == owner):
                    holder = None
                wait = deadline - self.clock.monotonic()
                if queue.tickets[0] is ticket:
                    if holder is None:
                        return True
                    left = (holder.expires_at_ms - now_ms(self.clock)) / 1000
                    if left <= 0:
                        return True
                    if wait > 0:  # wake at the holder's expiry, and re-check now and then
                        wait = min(wait, left, self.backoff_max)
                if wait <= 0:
                    return False
                queue.cond.wait(max(0.001, wait))

    def _waiters(self, key: str) -> _Waiters:
        with self._waiters_lock:
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _Waiters(key)
            queue.users += 1
            return queue

    def _forget_waiters(self, key: str, queue: _Waiters) -> None:
        with self._waiters_lock:
            queue.users -= 1
            if queue.users == 0 and self._queues.get(key) is queue:
                del self._queues[key]

    def _released(self, lease: Lease) -> None:
        """A lease of this process ended: wake the next waiter for its key."""
        with self._waiters_lock:
            if self._held.get(lease.key) is lease:
                del self._held[lease.key]
        queue = self._queues.get(lease.key)
        if queue is not None:
            with queue.cond:
                queue.cond.notify_all()

    def _waited(self, lease: Lease | None, start: float) -> Lease | None:
        """Report the end of a blocking acquire (dynacoord.metrics) and return its lease."""
        if self._metrics.enabled:
            if lease is None:
                self._metrics.count("LockNotAcquired")
            else:
                self._metrics.milliseconds("LockWait", (self.clock.monotonic() - start) * 1000)
        return lease

    def _attempt(self, key: str, owner: str, ttl_ms: int) -> tuple[Lease | None, LockInfo | None]:
        """One acquisition attempt: (the lease, None) or (None, who holds the key if known)."""
        now = now_ms(self.clock)
        result = self._store.try_acquire(key, owner, ttl_ms, now)
        if result.acquired is not None:
            self._metrics.count("LockAcquired")
            logger.debug("lock %r acquired by %r (fence %d)", key, owner, result.acquired.fence)
            lease = Lease(self, result.acquired, ttl_ms)
            self._held[key] = lease
            return lease, None
        holder = result.holder
        if holder is not None and holder.owner == owner:
            # Same owner again (or our own earlier write whose response was lost and retried):
            # keep the fence, refresh the TTL.
            info = self._store.extend(key, owner, holder.fence, ttl_ms, now)
            if info is not None:
                self._metrics.count("LockAcquired")
                lease = Lease(self, info, ttl_ms)
                self._held[key] = lease
                return lease, None
        self._metrics.count("LockContended")
        return None, holder

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
