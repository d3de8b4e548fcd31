"""A leased counting semaphore: at most ``limit`` permits held at once, each for a TTL.

Policy lives here (permit tokens, deadlines, backoff with jitter, background renewal); a backend
supplies a :class:`SemaphoreStore` whose methods are one request each.

The store keeps one item per semaphore holding a map of *slots*, one per permit: its token, owner,
fence and expiry. A slot is free when it is gone or its expiry has passed (``expires_at_ms <= now``
by the caller's clock); a release sets the expiry to the release time and marks the slot
released. An acquire adds a slot only while fewer than ``limit`` slots are taken, and drops the
expired ones it saw, so the map never holds more than ``limit`` entries: its size is bounded by the
limit, never by the traffic. Races each condition closes:

* two acquirers that read the same free slot: on DynamoDB and MongoDB the write is conditioned on
  the item's revision as read (every acquire bumps it), so only one of them applies; Redis runs
  the check and the write in one script.
* an acquirer that saw a slot expired while its holder, with a slower clock, renewed it: the
  write drops that slot only on the condition that it is still expired, else it is refused.
* a dead holder: nobody renews its slot, and once its expiry passes every acquirer counts it free.
* a lost answer (applied, re-sent by the client's retry, or applied and raised): the slot is keyed
  by the permit's token, chosen once per :meth:`Semaphore.acquire` and kept for the next call
  when the write raised, so a refusal or a read that shows the token means "applied".

Fencing: each permit gets a ``fence`` strictly above every fence handed out before for that
semaphore (an acquire sets the item's fence to the one it read plus one; a new item starts from
``now_ms * 1000 + 1``, after the old one sat a grace past every expiry before it was removed).
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from . import keys
from ._clock import Clock, SystemClock, now_ms
from ._compat import Record
from ._validate import check_bool, check_str, non_negative_seconds, ttl_to_ms
from .errors import ConfigurationError, InvalidValueError, SemaphoreFullError
from .locks import default_owner
from .metrics import NO_SCOPE, MetricsScope

__all__ = [
    "MAX_LIMIT",
    "MAX_OWNER_BYTES",
    "MAX_PERMIT_TTL",
    "PRUNE_PER_WRITE",
    "AcquireAttempt",
    "AcquirePlan",
    "Permit",
    "PermitInfo",
    "Semaphore",
    "SemaphoreSlot",
    "SemaphoreState",
    "SemaphoreStore",
    "StoredSemaphore",
    "plan_acquire",
]

logger = logging.getLogger(__name__)

#: the largest ``limit``: a held slot takes at most ~240 bytes (a 200-byte owner) and a released
#: one ~50, with at most ``limit`` of each, so a full item stays under 300 KB (293 KB with the
#: longest name and owners, by AWS's size rules), below DynamoDB's 400 KB item limit
MAX_LIMIT = 1000
#: the longest owner id (UTF-8 bytes) a slot stores
MAX_OWNER_BYTES = 200
#: expired slots one acquire drops at most (on DynamoDB each is a clause of the condition, whose
#: length is limited to 4 KB); one is enough to make room
PRUNE_PER_WRITE = 16
#: the longest permit TTL (seconds): the item's own garbage-collection time is set this far (plus
#: a grace) past every write, so it is never removed while a permit in it is live
MAX_PERMIT_TTL = 24 * 3600


class PermitInfo(Record):
    """A snapshot of one held permit."""

    name: str
    owner: str
    fence: int
    expires_at_ms: int
    token: str

    @property
    def expires_at(self) -> float:
        """Expiry as epoch seconds."""
        return self.expires_at_ms / 1000


class StoredSemaphore(Record):
    """What :meth:`Semaphore.state` read: the permits held then, oldest fence first, and the
    last fence handed out (the limit is not stored: each caller gives its own)."""

    holders: tuple[PermitInfo, ...]
    last_fence: int


class SemaphoreSlot(Record):
    """One entry of the stored map, live or not (what the stores read and write)."""

    token: str
    owner: str
    fence: int
    expires_at_ms: int
    released: bool = False


class SemaphoreState(Record):
    """The stored item as one read (or a refusal) showed it.

    ``revision`` is None when there is no item; ``fence`` is the last fence handed out.
    """

    revision: int | None
    fence: int
    slots: tuple[SemaphoreSlot, ...] = ()

    def taken(self, now_ms: int) -> int:
        """The slots not free at ``now_ms`` (a slot is free once its expiry has passed)."""
        return sum(1 for slot in self.slots if slot.expires_at_ms > now_ms)

    def live(self, name: str, now_ms: int) -> tuple[PermitInfo, ...]:
        """The permits held at ``now_ms``, oldest fence first."""
        return tuple(
            PermitInfo(name, s.owner, s.fence, s.expires_at_ms, s.token)
            for s in sorted(self.slots, key=lambda s: s.fence)
            if s.expires_at_ms > now_ms and not s.released
        )

    def slot(self, token: str) -> SemaphoreSlot | None:
        for slot in self.slots:
            if slot.token == token:
                return slot
        return None

    def permit(self, name: str, token: str, now_ms: int) -> PermitInfo | None:
        """The permit of the slot ``token`` if this state shows it held at ``now_ms``."""
        slot = self.slot(token)
        if slot is None or slot.released or slot.expires_at_ms <= now_ms:
            return None
        return PermitInfo(name, slot.owner, slot.fence, slot.expires_at_ms, token)


class AcquireAttempt(Record):
    """What one acquisition attempt returned.

    ``permit``: the permit taken (or found taken by this very token: an earlier attempt applied).
    ``state``: the item as the refusal showed it, or after the write; None when unknown.
    ``conflict``: refused because the item changed since ``seen`` (try again with ``state``),
    not because every slot is taken.
    """

    permit: PermitInfo | None
    state: SemaphoreState | None = None
    conflict: bool = False


class AcquirePlan(Record):
    """What an acquire based on a read writes: its fence, the expired slots it drops (each on
    the condition that it is still expired) and the released ones it drops (final: no condition)."""

    fence: int
    drop_expired: tuple[str, ...]
    drop_released: tuple[str, ...]


def plan_acquire(
    seen: SemaphoreState, token: str, limit: int, now_ms: int, keep_released_ms: int
) -> AcquirePlan | None:
    """The write of an acquire of ``token`` based on ``seen``, or None when no slot is free.

    For the stores that decide in the client (DynamoDB, MongoDB) and condition their write on
    ``seen``'s revision; Redis does the same in its script. A slot is taken while it is neither
    released nor expired (``expires_at_ms <= now`` is free); an expired slot this write does not
    drop still counts as taken, so the held slots never exceed ``limit``. Released slots stay
    ``keep_released_ms`` (the client's retry window) so that a release whose answer was lost
    recognises itself; with at most ``limit`` of them kept (the oldest go first), the map never
    holds more than ``2 * limit`` entries, whatever the traffic.
    """
    taken = 0
    expired: list[str] = []
    released: list[SemaphoreSlot] = []
    for slot in seen.slots:
        if slot.token == token:
            continue  # this permit's own old slot: the write replaces it
        if slot.released:
            released.append(slot)
        elif slot.expires_at_ms <= now_ms:
            expired.append(slot.token)
        else:
            taken += 1
    drop_expired = expired[:PRUNE_PER_WRITE]
    taken += len(expired) - len(drop_expired)
    if taken >= limit:
        return None
    released.sort(key=lambda slot: slot.expires_at_ms)  # released first, dropped first
    old = sum(1 for s in released if s.expires_at_ms <= now_ms - keep_released_ms)
    dropped = min(old, PRUNE_PER_WRITE)
    while taken + len(released) - dropped + 1 > 2 * limit:  # too many kept: the oldest go
        dropped += 1
    fence = seen.fence + 1 if seen.revision is not None else now_ms * 1000 + 1
    drop_released = tuple(s.token for s in released[:dropped])
    return AcquirePlan(fence, tuple(drop_expired), drop_released)


class SemaphoreStore(Protocol):
    """Storage for semaphores. Every method is at most one request to the store (each says).

    ``now_ms`` is passed in so that expiry is decided by the caller's injected clock.
    """

    #: whether :meth:`try_acquire` needs the item as read (it conditions its write on it); a
    #: store that checks and writes in one step on the server says False and gets no read
    reads_first: bool

    def read(self, name: str, now_ms: int) -> SemaphoreState:
        """The stored item, read consistently (one read)."""
        ...

    def try_acquire(
        self,
        name: str,
        token: str,
        owner: str,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        seen: SemaphoreState,
    ) -> AcquireAttempt:
        """Add the slot ``token`` if fewer than ``limit`` slots are taken, dropping expired ones.

        ``seen`` is the item as last read; a store that conditions its write on it refuses with
        ``conflict=True`` when the item changed. A slot already keyed by ``token`` (this very
        permit, applied earlier) is returned as the permit, unless it ended.
        """
        ...

    def extend(self, name: str, token: str, fence: int, ttl_ms: int, now_ms: int) -> int | None:
        """Push the slot's expiry to ``now + ttl`` while it is held; the new expiry, or None."""
        ...

    def release(self, name: str, token: str, fence: int, now_ms: int) -> bool:
        """Free the slot while it is held; True also when this permit's release had applied."""
        ...


#: conflicts in a row an acquire out of time (non-blocking, or past its deadline) retries at once
_MAX_CONFLICTS = 5
#: what a store that does not read first gets as ``seen``
_UNREAD = SemaphoreState(None, 0)


def new_token() -> str:
    """A permit token (96 random bits): the slot's key, unique per permit."""
    return os.urandom(12).hex()


class Permit:
    """A held permit. Returned by :meth:`Semaphore.acquire`; usable as a context manager.

    ``lost`` becomes True once an extend (or the background renewal) finds the permit gone
    (expired, and possibly its slot given to another). Pass ``fence`` to the resource you guard.
    """

    def __init__(self, semaphore: Semaphore, info: PermitInfo, ttl_ms: int) -> None:
        self._semaphore = semaphore
        self._mutex = threading.Lock()
        self.name = info.name
        self.owner = info.owner
        self.fence = info.fence
        self.token = info.token
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
        """Reset the expiry to now + ``ttl`` (default: the acquisition TTL). One request.

        False, and the permit marked lost, once the permit is no longer held.
        """
        ttl_ms = self.ttl_ms if ttl is None else self._semaphore._permit_ttl_ms(ttl)
        sem = self._semaphore
        with self._mutex:
            if self.lost or self.released:
                return False
            expires = sem._store.extend(
                self.name, self.token, self.fence, ttl_ms, now_ms(sem.clock)
            )
            if expires is not None:
                self.expires_at_ms = expires
                return True
            self.lost = True
        sem._metrics.count("PermitLost")
        logger.warning(
            "permit of semaphore %r lost by %r (fence %d)", self.name, self.owner, self.fence
        )
        return False

    def release(self) -> bool:
        """Give the permit back. One request. False if it had been lost (expired); never frees
        another permit. If the call raises, the permit stays unreleased and the next call sends
        the release again (it recognises one that had applied)."""
        sem = self._semaphore
        with self._mutex:
            if self.released or self.lost:
                return False
            ok = sem._store.release(self.name, self.token, self.fence, now_ms(sem.clock))
            # marked only once answered: a release that raised unsent is sent again next time
            self.released = True
            if not ok:
                self.lost = True
        if not ok:
            sem._metrics.count("PermitLost")
            logger.warning(
                "release of a permit of semaphore %r by %r found it lost", self.name, self.owner
            )
        return ok

    def is_held(self) -> bool:
        """Ask the store whether this permit is still held (one consistent read)."""
        if self.lost or self.released:
            return False
        sem = self._semaphore
        state = sem._store.read(self.name, now_ms(sem.clock))
        return any(p.token == self.token for p in state.live(self.name, now_ms(sem.clock)))

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"Permit(name={self.name!r}, owner={self.owner!r}, fence={self.fence}, "
            f"expires_at_ms={self.expires_at_ms}, lost={self.lost})"
        )


class _Renewal(threading.Thread):
    """Extends a permit every ``interval`` seconds until stopped or the permit is lost."""

    def __init__(
        self, permit: Permit, interval: float, on_lost: Callable[[Permit], None] | None
    ) -> None:
        super().__init__(name=f"dynacoord-permit-{permit.name}", daemon=True)
        self._permit = permit
        self._interval = interval
        self._on_lost = on_lost
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            try:
                ok = self._permit.extend()
            except Exception:  # a transient error must not end the renewal; the next may work
                logger.exception("renewal of a permit of semaphore %r failed", self._permit.name)
                continue
            if not ok:
                if not self._permit.released and self._on_lost is not None:
                    try:
                        self._on_lost(self._permit)
                    except Exception:
                        logger.exception(
                            "on_lost callback of semaphore %r raised", self._permit.name
                        )
                return

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join()


class Semaphore:
    """A counting semaphore named ``name`` over a :class:`SemaphoreStore`: at most ``limit``
    permits held at once, each for ``ttl`` seconds unless renewed. Reached as
    ``backend.semaphore(name, limit=N, ttl=seconds)``.

    Every process using one semaphore must give it the same ``limit`` (each acquire checks the
    limit its caller gave).

    Waiting: a blocked acquire reads the item (one consistent read) and backs off exponentially
    with full jitter from ``backoff_initial`` to ``backoff_max`` seconds, never sleeping past the
    earliest expiry it saw; it writes only when the read shows a free slot. A waiter therefore
    costs at most one read per ``backoff_max`` once its backoff has grown. Waiters are not
    ordered: whoever writes first after a slot frees takes it (no fairness promised).
    """

    #: first retry delay and cap of the exponential backoff of a blocking acquire (seconds)
    backoff_initial = 0.02
    backoff_max = 1.0

    def __init__(
        self,
        store: SemaphoreStore,
        name: str,
        *,
        limit: int,
        ttl: float,
        clock: Clock | None = None,
        metrics: MetricsScope | None = None,
    ) -> None:
        keys.validate_key(name, "semaphore name")
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, got {type(limit).__name__}")
        if not 1 <= limit <= MAX_LIMIT:
            raise ConfigurationError(
                f"semaphore limit must be between 1 and {MAX_LIMIT}, got {limit}: the holders "
                f"of one semaphore live in one item, which must stay under 400 KB (for more "
                f"permits, split them over several semaphores)"
            )
        self._store = store
        self.name = name
        self.limit = limit
        self.ttl_ms = self._permit_ttl_ms(ttl)
        self.clock: Clock = clock or SystemClock()
        self._metrics = metrics if metrics is not None else NO_SCOPE
        # the item as last seen (a read, a refusal or our own write): a hint, never trusted
        # for the decision (every write is conditioned on what it was based on)
        self._seen: SemaphoreState | None = None
        # tokens of acquires whose write raised (maybe applied), by owner: the owner's next
        # acquire sends the same token, so it finds its own slot instead of taking a second one;
        # and the process they belong to (a forked child's are its parent's)
        self._unanswered: dict[str | None, tuple[str, str]] = {}
        self._unanswered_lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def ttl(self) -> float:
        """The default permit TTL in seconds."""
        return self.ttl_ms / 1000

    @staticmethod
    def _permit_ttl_ms(ttl: float) -> int:
        ttl_ms = ttl_to_ms(ttl)
        if ttl_ms > MAX_PERMIT_TTL * 1000:
            raise ConfigurationError(
                f"permit ttl must be at most {MAX_PERMIT_TTL} seconds (a day), got {ttl!r}: "
                "renew a long-held permit (hold() does) instead"
            )
        return ttl_ms

    def acquire(
        self,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        owner: str | None = None,
        ttl: float | None = None,
    ) -> Permit:
        """Take a permit for ``ttl`` seconds (default: the semaphore's).

        ``blocking=False``: one attempt. Otherwise wait until a permit frees or ``timeout``
        seconds pass (None: no limit). Raises :class:`~dynacoord.SemaphoreFullError` (with the
        holders seen) when no permit was had. One attempt is one conditional write (a script on
        Redis), preceded by one consistent read when this object has not seen the item yet.

        If the store call raises (the write may have applied), the next ``acquire`` with the
        same ``owner`` sends the same permit token and finds its own slot if it did.
        """
        check_bool(blocking, "blocking")
        if timeout is not None:
            if not blocking:
                raise ValueError("a timeout cannot be given to a non-blocking acquire")
            wait: float | None = non_negative_seconds(timeout, "timeout")
        else:
            wait = None if blocking else 0.0
        ttl_ms = self.ttl_ms if ttl is None else self._permit_ttl_ms(ttl)
        if owner is not None:
            check_str(owner, "owner")
            if len(owner.encode("utf-8", "surrogatepass")) > MAX_OWNER_BYTES:
                raise InvalidValueError(
                    f"owner is too long: at most {MAX_OWNER_BYTES} bytes of UTF-8 (it is stored "
                    "in the semaphore's item beside every other holder)"
                )
        asked = owner
        pending = None
        if self._unanswered:  # rare: the pid is looked at only then
            with self._unanswered_lock:
                self._forget_parents()
                pending = self._unanswered.pop(asked, None)
        token, owner = pending if pending is not None else (new_token(), owner or default_owner())
        start = self.clock.monotonic()
        deadline = None if wait is None else start + wait
        delay = self.backoff_initial
        conflicts = 0
        # the item as this object last saw it, maybe long ago: good enough to try a write (it
        # is conditioned on it), not to refuse; a refusal it decided is checked by a read
        cached = self._seen is not None
        while True:
            seen = self._seen
            if seen is None:
                if self._store.reads_first:
                    seen = self._seen = self._store.read(self.name, now_ms(self.clock))
                else:
                    seen = _UNREAD
            try:
                attempt = self._store.try_acquire(
                    self.name, token, owner, self.limit, ttl_ms, now_ms(self.clock), seen
                )
            except BaseException:
                # maybe applied: the owner's next acquire sends this token again
                with self._unanswered_lock:
                    self._forget_parents()
                    self._unanswered[asked] = (token, owner)
                self._seen = None
                raise
            self._seen = attempt.state
            if attempt.permit is not None:
                self._metrics.count("PermitAcquired")
                if self._metrics.enabled:
                    self._metrics.milliseconds(
                        "PermitWait", (self.clock.monotonic() - start) * 1000
                    )
                logger.debug(
                    "permit of semaphore %r taken by %r (fence %d)",
                    self.name,
                    owner,
                    attempt.permit.fence,
                )
                return Permit(self, attempt.permit, ttl_ms)
            remaining = None if deadline is None else deadline - self.clock.monotonic()
            out_of_time = remaining is not None and remaining <= 0
            if attempt.conflict and out_of_time and conflicts < _MAX_CONFLICTS:
                # The item changed under us (another acquire applied) and there is no time left
                # to wait: try again at once with what the refusal showed, after a jitter that
                # doubles with each conflict in a row, so that a non-blocking acquire is not
                # refused while a permit is free. A waiter instead backs off like for a full
                # semaphore and reads again: the losers of one race would mostly race again,
                # and a refused write costs five times a read (measured in docs/semaphore.md).
                self.clock.sleep(random.uniform(0, self.backoff_initial * 2**conflicts))
                conflicts += 1
                continue
            conflicts = 0
            if cached:
                cached = False
                self._seen = None
                continue
            if remaining is not None and remaining <= 0:
                return self._full(attempt.state)
            sleep = random.uniform(0, delay)  # full jitter: refused together, retry apart
            state = attempt.state
            if state is not None and state.slots:
                # never sleep past the earliest expiry seen: that slot is free then
                now = now_ms(self.clock)
                ends = [s.expires_at_ms for s in state.slots if s.expires_at_ms > now]
                if ends:
                    sleep = min(sleep, (min(ends) - now) / 1000 + 0.001)
            if remaining is not None:
                sleep = min(sleep, remaining)
            self.clock.sleep(sleep)
            delay = min(self.backoff_max, delay * 2)
            self._seen = None  # look again (a release elsewhere shows only in a fresh read)

    def _forget_parents(self) -> None:
        """In a forked child, drop the parent's raised acquires (``_unanswered_lock`` held): the
        parent may send their tokens again itself, and a child sending one too would be told the
        parent's slot is its permit (two holders of one permit). The child's owner is its own."""
        if self._pid != os.getpid():
            self._unanswered.clear()
            self._pid = os.getpid()

    def _full(self, state: SemaphoreState | None) -> Permit:
        self._metrics.count("SemaphoreFull")
        now = now_ms(self.clock)
        holders = state.live(self.name, now) if state is not None else ()
        raise SemaphoreFullError(
            f"semaphore {self.name!r}: all {self.limit} permits are held",
            name=self.name,
            limit=self.limit,
            holders=holders,
        )

    @contextmanager
    def hold(
        self,
        *,
        ttl: float | None = None,
        owner: str | None = None,
        timeout: float | None = 10.0,
        heartbeat: bool = True,
        on_lost: Callable[[Permit], None] | None = None,
    ) -> Iterator[Permit]:
        """Hold a permit for the duration of a ``with`` block.

        Raises :class:`~dynacoord.SemaphoreFullError` if none is had within ``timeout``. With
        ``heartbeat`` the permit is renewed in a background thread every ``ttl/3``; if a renewal
        finds it lost, ``permit.lost`` becomes True and ``on_lost(permit)`` is called (the block
        is not interrupted: check ``permit.lost`` or rely on the fence). Released on exit.
        """
        check_bool(heartbeat, "heartbeat")
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be callable or None, got {type(on_lost).__name__}")
        permit = self.acquire(timeout=timeout, owner=owner, ttl=ttl)
        renewal = _Renewal(permit, permit.ttl / 3, on_lost) if heartbeat else None
        if renewal is not None:
            renewal.start()
        try:
            yield permit
        finally:
            if renewal is not None:
                renewal.stop()
            permit.release()

    def holders(self) -> list[PermitInfo]:
        """The permits held now, oldest fence first (one consistent read)."""
        now = now_ms(self.clock)
        state = self._store.read(self.name, now)
        self._seen = state
        return list(state.live(self.name, now))

    def state(self) -> StoredSemaphore | None:
        """The stored item (one consistent read): its live holders and last fence, or None
        when there is no item (never acquired, or removed a day after its last permit's
        expiry), which :meth:`holders` cannot tell from a semaphore with no holder now."""
        now = now_ms(self.clock)
        state = self._store.read(self.name, now)
        self._seen = state
        if state.revision is None:
            return None
        return StoredSemaphore(state.live(self.name, now), state.fence)

    def available(self) -> int:
        """How many permits are free now (one consistent read)."""
        return self.limit - min(self.limit, len(self.holders()))

    def __repr__(self) -> str:
        return f"Semaphore(name={self.name!r}, limit={self.limit}, ttl={self.ttl})"
