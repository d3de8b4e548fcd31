"""Leader election with terms, on the lock store.

Policy lives here (campaign with backoff, the local deadline, the renewal and the watchdog); the
store is the :class:`~dynacoord.locks.LockStore` every backend already has, at the lock key
``leader:{name}``. A term is the lock's fence: every election of a name gets a term strictly
above every earlier one, and every store rule of locks (one holder, expiry by the caller's clock,
owner- and fence-checked extend and release) is the election's rule.

The local deadline. A candidate reads its monotonic clock (``t0``) and then its wall clock
(``now``) *before* it sends an acquire or a renewal; when the store grants the lease until
``expires_at``, the candidate leads until ``t0 + (expires_at - now) - margin`` on its monotonic
clock. The lease began after ``t0`` and no other candidate sees it expire before ``expires_at``
by its own wall clock, so with ``margin`` at least the largest clock difference between hosts
no other candidate can be elected before this deadline::

    A sends renewal (t0) ........... (answer lost, or hangs) ........ deadline: on_lost(7)
              store: A holds term 7 until expires_at ..................... | B may acquire
                                                              margin  |<-->|

Races each rule closes:

* a renewal that hangs or keeps failing: ``is_leader`` compares the clock with the deadline on
  every call, and a watchdog thread (not the renewal thread, which may be stuck in the call)
  fires ``on_lost`` at the deadline;
* two renewals of one term applied out of order (an older one after a newer one would shorten
  the lease the newer one promised): renewals of one leader are sent one at a time;
* an old leader's ``step_down`` after a takeover: the release is conditioned on the owner *and*
  the term it held (the lock store's release), so it never touches the newer leader's item;
* an acquire whose answer was lost or raised (maybe applied): the next campaign finds the item
  held by its own owner and adopts it (one owner-and-fence-checked extend); an item of a term
  this object already ended (lost while its renewals hung, then renewed late) is released first,
  so a new election always gets a new, larger term.

A request the client gave up on is assumed not to be applied later than the next one sent
(DESIGN.md's "applied, then raised"): a renewal delivered after a newer one could shorten the
lease by the time between them.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import weakref
from collections.abc import Callable

from . import keys
from ._clock import Clock, SystemClock, now_ms
from ._compat import Record
from ._validate import check_bool, check_str, non_negative_seconds, ttl_to_ms
from .errors import ConfigurationError
from .locks import LockInfo, LockStore, default_owner
from .metrics import NO_SCOPE, MetricsScope

__all__ = ["LEADER_KEY_PREFIX", "Leader", "LeaderInfo", "leader_key"]

logger = logging.getLogger(__name__)

#: the lock key of the leader ``name`` is ``LEADER_KEY_PREFIX + name`` (its item ``LOCK#{ns}#leader:{name}``)
LEADER_KEY_PREFIX = "leader:"
#: how often the watchdog and the renewal look at a clock that is not the system clock (a
#: ManualClock moves only when told, so a real timer cannot be set on it)
_POLL = 0.01
#: the shortest wait before a renewal that failed is tried again (seconds)
_MIN_RETRY = 0.01
#: ended terms whose item this object may still have to release (the store holds one at a time)
_KEEP_ENDED = 4


#: every live Leader of this process, for a forked child to make them its own
_candidates: weakref.WeakSet[Leader] = weakref.WeakSet()


def _after_fork_in_child() -> None:  # pragma: no cover - runs in a forked child
    for candidate in list(_candidates):
        candidate._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def leader_key(name: str) -> str:
    """The lock key of the leader ``name``."""
    return LEADER_KEY_PREFIX + keys.validate_key(name, "leader name")


class LeaderInfo(Record):
    """Who leads ``name`` as the store shows it."""

    name: str
    owner: str
    term: int
    expires_at_ms: int

    @property
    def expires_at(self) -> float:
        """The end of the leader's lease as epoch seconds (by the clock of who wrote it)."""
        return self.expires_at_ms / 1000


class _Term:
    """One election won: its fence, its local deadline (monotonic) and whether it is over."""

    __slots__ = ("deadline", "elected_at", "fence", "over", "stop", "token")

    def __init__(self, fence: int, deadline: float, elected_at: float) -> None:
        self.fence = fence
        self.deadline = deadline
        self.elected_at = elected_at
        self.over = False
        self.stop = threading.Event()
        # the token of this term's release: its retry after a raised call is recognised
        self.token = os.urandom(8).hex()


Callback = Callable[[int], None]


class Leader:
    """One candidate for the leadership of ``name``. Reached as ``backend.leader(name, ttl=...)``.

    ``campaign()`` blocks until this candidate is elected (or ``timeout`` passes); while it
    leads, a background thread renews the term every ``renew_interval`` seconds and a watchdog
    ends it at its local deadline. ``is_leader`` is True only before that deadline; ``term`` is
    the term of the latest election (the lock's fence: hand it to the resources the leader
    writes, like a lock's fence). ``on_elected(term)`` runs in the campaigning thread once
    elected; ``on_lost(term)`` runs in the watchdog's thread (or the renewal's, when the store
    refuses a renewal) when a term ends without ``step_down()``.

    Waiting: a campaign that finds another leader reads the item (one consistent read) and backs
    off exponentially with full jitter from ``backoff_initial`` to ``backoff_max`` seconds, never
    sleeping past the leader's expiry it saw; it writes only when the read shows the seat free.
    """

    #: first retry delay and cap of a campaign's exponential backoff (seconds). A waiting
    #: candidate reads about once per ``backoff_max / 2`` (full jitter); it wakes at the
    #: leader's expiry whatever the backoff, so the cap only bounds how late it sees a step-down
    backoff_initial = 0.05
    backoff_max = 2.0

    def __init__(
        self,
        store: LockStore,
        name: str,
        *,
        ttl: float,
        owner: str | None = None,
        margin: float | None = None,
        renew_interval: float | None = None,
        on_elected: Callback | None = None,
        on_lost: Callback | None = None,
        clock: Clock | None = None,
        metrics: MetricsScope | None = None,
    ) -> None:
        self._key = leader_key(name)
        self.name = name
        self.ttl_ms = ttl_to_ms(ttl)
        ttl_s = self.ttl_ms / 1000
        self.margin = (
            min(1.0, ttl_s / 4) if margin is None else non_negative_seconds(margin, "margin")
        )
        if self.margin >= ttl_s:
            raise ConfigurationError(
                f"leader margin ({self.margin}s) must be shorter than the ttl ({ttl_s}s): the "
                "margin is taken off every lease, and a leader would never lead"
            )
        if renew_interval is None:
            self.renew_interval = min(ttl_s / 3, (ttl_s - self.margin) / 2)
        else:
            self.renew_interval = non_negative_seconds(renew_interval, "renew_interval")
            if not 0 < self.renew_interval < ttl_s - self.margin:
                raise ConfigurationError(
                    f"renew_interval ({self.renew_interval}s) must be above 0 and below ttl - "
                    f"margin ({ttl_s - self.margin:g}s): a renewal after the deadline comes too late"
                )
        for callback, what in ((on_elected, "on_elected"), (on_lost, "on_lost")):
            if callback is not None and not callable(callback):
                raise TypeError(f"{what} must be callable or None, got {type(callback).__name__}")
        self.owner = default_owner() if owner is None else check_str(owner, "owner")
        self._owner_given = owner is not None
        self.on_elected = on_elected
        self.on_lost = on_lost
        self._store = store
        self.clock: Clock = clock or SystemClock()
        self._real_clock = isinstance(self.clock, SystemClock)
        self._metrics = metrics if metrics is not None else NO_SCOPE
        self._cond = threading.Condition(threading.Lock())
        self._current: _Term | None = None
        self._term: int | None = None
        # fences of ended terms whose item may still be in the store -> their release token
        self._ended: dict[int, str] = {}
        # renewals one at a time: two in flight could apply out of order and shorten the lease
        self._renew_lock = threading.Lock()
        # campaigns one at a time: two threads' attempts would both win the one term (the
        # second adopting the first's item as its own) and run it twice
        self._campaign_lock = threading.Lock()
        _candidates.add(self)

    def _forked(self) -> None:
        """In a forked child: the parent's term, its ended terms and (unless ``owner`` was
        given) its owner are the parent's. A child keeping the owner would adopt the parent's
        item as its own acquire applied (a campaign whose call raised, or the term the parent
        leads): two leaders of one term. The child campaigns as a candidate of its own; its
        locks are new (a thread of the parent may have held them at the fork)."""
        if not self._owner_given:
            self.owner = default_owner()
        self._cond = threading.Condition(threading.Lock())
        self._renew_lock = threading.Lock()
        self._campaign_lock = threading.Lock()
        self._current = None  # no thread of the child renews or watches it
        self._term = None
        self._ended = {}

    # -- state ------------------------------------------------------------------------------

    @property
    def ttl(self) -> float:
        """The lease of each term and renewal, in seconds."""
        return self.ttl_ms / 1000

    @property
    def is_leader(self) -> bool:
        """True while this candidate leads: elected, not stepped down, not lost, and its local
        deadline (the lease as granted, minus ``margin``, from before the request) not passed."""
        term = self._current
        return term is not None and not term.over and self.clock.monotonic() < term.deadline

    @property
    def term(self) -> int | None:
        """The term of this candidate's latest election (kept after it ended; None before the
        first). Check :attr:`is_leader` to know whether it still leads."""
        return self._term

    @property
    def deadline(self) -> float | None:
        """The local deadline of the term led now, on ``clock.monotonic()``; None if not leading."""
        term = self._current
        return None if term is None or term.over else term.deadline

    def leader(self) -> LeaderInfo | None:
        """Who leads now as the store shows it (one consistent read), whoever it is."""
        info = self._store.get(self._key, now_ms(self.clock))
        return None if info is None else self._info(info)

    def _info(self, info: LockInfo) -> LeaderInfo:
        return LeaderInfo(self.name, info.owner, info.fence, info.expires_at_ms)

    # -- campaign ---------------------------------------------------------------------------

    def campaign(self, timeout: float | None = None, *, heartbeat: bool = True) -> bool:
        """Block until elected (True) or ``timeout`` seconds pass (False; None: no limit).

        True at once when already leading. One attempt is one conditional write; while someone
        else leads, one consistent read per backoff (see the class). With ``heartbeat`` the term
        is renewed in the background; without, call :meth:`renew` before :attr:`deadline`.
        A store error raises; the next campaign recognises an acquire that had applied.
        """
        wait = None if timeout is None else non_negative_seconds(timeout, "timeout")
        check_bool(heartbeat, "heartbeat")
        start = self.clock.monotonic()
        if not self._campaign_lock.acquire(timeout=-1 if wait is None else wait):
            return self.is_leader  # another thread of this candidate campaigned all along
        try:
            return self._campaign(start, wait, heartbeat)
        finally:
            self._campaign_lock.release()

    def _campaign(self, start: float, wait: float | None, heartbeat: bool) -> bool:
        self._end_if_due()
        if self.is_leader:
            return True
        until = None if wait is None else start + wait
        delay = self.backoff_initial
        holder: LockInfo | None = None  # the other leader at the last look; None: try to write
        while True:
            if holder is None:
                term, holder = self._attempt()
                if term is not None:
                    self._elected(term, heartbeat, start)
                    return True
            else:
                holder = self._store.get(self._key, now_ms(self.clock))
                if holder is None:
                    continue  # free: write at once
            remaining = None if until is None else until - self.clock.monotonic()
            if remaining is not None and remaining <= 0:
                self._metrics.count("LeaderNotElected")
                return False
            # full jitter: candidates refused together retry apart
            sleep = random.uniform(0, delay)
            if holder is not None:
                # never sleep past the leader's expiry as seen: the seat is free then
                until_expiry = max(0.0, (holder.expires_at_ms - now_ms(self.clock)) / 1000)
                sleep = min(sleep, until_expiry + 0.001)
            if remaining is not None:
                sleep = min(sleep, remaining)
            self.clock.sleep(sleep)
            delay = min(self.backoff_max, delay * 2)

    def _attempt(self) -> tuple[_Term | None, LockInfo | None]:
        """One election attempt: (the term won, None) or (None, the other leader if known).
        One conditional write; two and a release when an ended term of ours is in the way."""
        for _ in range(2):
            started = self.clock.monotonic()  # before the request: the lease begins after it
            now = now_ms(self.clock)
            result = self._store.try_acquire(self._key, self.owner, self.ttl_ms, now)
            info = result.acquired
            if info is not None:
                break
            holder = result.holder
            if holder is None or holder.owner != self.owner:
                return None, holder
            token = self._ended.get(holder.fence)
            if token is not None:
                # a term of ours that ended here (lost while its renewals hung, renewed late):
                # free it, so that this election is a new term, not the ended one again
                self._release(holder.fence, token)
                continue
            # our own acquire, applied while its answer was lost or raised: adopt it, with a
            # deadline measured from this request
            started = self.clock.monotonic()
            now = now_ms(self.clock)
            info = self._store.extend(self._key, self.owner, holder.fence, self.ttl_ms, now)
            if info is None:
                return None, None
            break
        else:
            return None, None
        deadline = started + (info.expires_at_ms - now) / 1000 - self.margin
        if deadline <= self.clock.monotonic():
            # the answer came after the deadline it grants: never lead on it, free it
            self._remember_ended(info.fence, os.urandom(8).hex())
            self._release_ended()
            return None, None
        return _Term(info.fence, deadline, self.clock.monotonic()), None

    def _elected(self, term: _Term, heartbeat: bool, start: float) -> None:
        with self._cond:
            self._current = term
            self._term = term.fence
        threading.Thread(
            target=self._watch,
            args=(term,),
            name=f"dynacoord-leader-watch-{self.name}",
            daemon=True,
        ).start()
        if heartbeat:
            threading.Thread(
                target=self._keep, args=(term,), name=f"dynacoord-leader-{self.name}", daemon=True
            ).start()
        self._metrics.count("LeaderElected")
        if self._metrics.enabled:
            self._metrics.milliseconds("LeaderWait", (self.clock.monotonic() - start) * 1000)
        logger.info("leader %r elected: %r (term %d)", self.name, self.owner, term.fence)
        if self.on_elected is not None:
            try:
                self.on_elected(term.fence)
            except Exception:
                logger.exception("on_elected callback of leader %r raised", self.name)

    # -- renewal and the watchdog -------------------------------------------------------------

    def renew(self) -> bool:
        """Renew the term led now (one owner-and-term-checked extend). True: the deadline moved
        on; False: not leading, or the store refused (the term is lost: ``on_lost`` runs).
        A store error raises and changes nothing (the deadline stays where it was)."""
        term = self._current
        if term is None:
            return False
        return self._renew(term)

    def _renew(self, term: _Term) -> bool:
        with self._renew_lock:
            if self._end_if_due() is term or term.over:
                return False  # past its deadline: over, whatever the store would say now
            started = self.clock.monotonic()  # before the request: the lease begins after it
            now = now_ms(self.clock)
            info = self._store.extend(self._key, self.owner, term.fence, self.ttl_ms, now)
            with self._cond:
                if term.over:
                    late = info is not None
                    lost = False
                elif info is None:
                    late = False
                    lost = self._end(term)
                else:
                    late = lost = False
                    term.deadline = max(
                        term.deadline, started + (info.expires_at_ms - now) / 1000 - self.margin
                    )
                    self._cond.notify_all()
        if late:
            # renewed after the term had ended here: give the seat back now rather than at expiry
            self._release_ended()
            return False
        if lost:
            self._lost(term, "a renewal found it taken or expired")
            return False
        if info is not None:
            self._age(term)
        return info is not None

    def _keep(self, term: _Term) -> None:
        """The renewal thread of one term."""
        wait = self.renew_interval
        while not self._pause(term, wait):
            try:
                if not self._renew(term):
                    return
            except Exception:  # a failed renewal is tried again sooner; the watchdog keeps time
                self._metrics.count("LeaderRenewFailed")
                logger.warning("renewal of leader %r failed", self.name, exc_info=True)
                remaining = term.deadline - self.clock.monotonic()
                wait = max(_MIN_RETRY, min(self.renew_interval, remaining / 2))
                continue
            wait = self.renew_interval

    def _pause(self, term: _Term, seconds: float) -> bool:
        """Wait ``seconds`` on the clock; True when the term ended meanwhile."""
        if self._real_clock:
            return term.stop.wait(seconds)
        until = self.clock.monotonic() + seconds
        while not term.stop.wait(_POLL):
            if self.clock.monotonic() >= until:
                return False
        return True

    def _watch(self, term: _Term) -> None:
        """The watchdog of one term: ends it at its deadline, whatever the renewal is doing."""
        with self._cond:
            while not term.over:
                remaining = term.deadline - self.clock.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining if self._real_clock else min(remaining, _POLL))
            if term.over:
                return
            self._end(term)
        self._lost(term, "no renewal succeeded before its deadline")

    def _end_if_due(self) -> _Term | None:
        """End the current term if its deadline passed before the watchdog saw it (the
        watchdog may lag); the term ended, its ``on_lost`` called."""
        with self._cond:
            term = self._current
            if term is None or self.clock.monotonic() < term.deadline or not self._end(term):
                return None
        self._lost(term, "no renewal succeeded before its deadline")
        return term

    def _end(self, term: _Term) -> bool:
        """End ``term`` (under ``_cond``); False when it had ended already."""
        if term.over:
            return False
        term.over = True
        term.stop.set()
        if self._current is term:
            self._current = None
        self._remember_ended(term.fence, term.token)
        self._cond.notify_all()
        return True

    def _remember_ended(self, fence: int, token: str) -> None:
        self._ended.setdefault(fence, token)
        while len(self._ended) > _KEEP_ENDED:
            del self._ended[min(self._ended)]

    def _lost(self, term: _Term, why: str) -> None:
        self._metrics.count("LeaderLost")
        self._age(term)
        logger.warning("leader %r: %r lost term %d (%s)", self.name, self.owner, term.fence, why)
        if self.on_lost is not None:
            try:
                self.on_lost(term.fence)
            except Exception:
                logger.exception("on_lost callback of leader %r raised", self.name)

    def _age(self, term: _Term) -> None:
        """Report how long ``term`` has been led (dynacoord.metrics' ``LeaderAge``)."""
        if self._metrics.enabled:
            age = (self.clock.monotonic() - term.elected_at) * 1000
            self._metrics.milliseconds("LeaderAge", age)

    # -- stepping down ----------------------------------------------------------------------

    def step_down(self) -> bool:
        """Stop leading now and free the seat (``on_lost`` is not called for a term led until
        now: you asked for it; it is for a term whose deadline had passed).

        ``is_leader`` is False from the start of the call. The release is conditioned on this
        candidate's owner and term, so an old leader's step-down never frees a newer leader's
        item. True when it freed an item of this candidate's (the term it led, or one that ended
        here while the store still held it); False when there was none (not leading, or the term
        had been taken or had expired). A release that raised is sent again (recognised if it
        had applied) by the next ``step_down`` or ``campaign``.
        """
        self._end_if_due()  # a term past its deadline was lost, not given up: on_lost runs
        with self._cond:
            term = self._current
            if term is not None:
                self._end(term)
        if term is not None:
            self._metrics.count("LeaderSteppedDown")
            self._age(term)
            logger.info("leader %r: %r steps down (term %d)", self.name, self.owner, term.fence)
        return bool(self._release_ended())

    def _release_ended(self) -> set[int]:
        """Release every ended term's item still to release; the fences the store freed."""
        with self._cond:
            pending = sorted(self._ended.items())
        freed: set[int] = set()
        for fence, token in pending:
            if self._release(fence, token):
                freed.add(fence)
        return freed

    def _release(self, fence: int, token: str) -> bool:
        ok = self._store.release(self._key, self.owner, fence, now_ms(self.clock), token=token)
        with self._cond:  # answered (freed, or found lost): nothing left to release for it
            self._ended.pop(fence, None)
        return ok

    def __repr__(self) -> str:
        return (
            f"Leader(name={self.name!r}, owner={self.owner!r}, term={self._term}, "
            f"is_leader={self.is_leader})"
        )
