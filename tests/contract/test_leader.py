"""Leader election contract: every backend must pass these unchanged (docs/leader.md).

Every case runs on a ManualClock: the background renewal and the watchdog look at such a clock
every 10 ms (real time), so moving the clock makes their work due, and the test waits for it. One
case runs on the real clock (the watchdog's own timer) and asserts the order of what happened,
never how fast.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from dynacoord import ConfigurationError, InvalidKeyError, InvalidValueError, ManualClock
from dynacoord.leader import leader_key
from dynacoord.metrics import Metrics
from tests.conftest import _dynamodb_factory

#: how long a test waits for something that must happen within a fraction of a second
PATIENCE = 30.0  # real seconds for a background thread; a loaded 2-core CI machine took over 10


class Calls:
    """Records the terms a callback was called with, and wakes a waiter."""

    def __init__(self) -> None:
        self.terms: list[int] = []
        self.event = threading.Event()
        self.during_hang: list[bool] = []

    def __call__(self, term: int) -> None:
        self.terms.append(term)
        self.event.set()


class HangingStore:
    """The leader's lock store, with its renewals (``extend``) made to hang or raise on demand:
    the same on every backend. ``hang()``: the next extend blocks, *before* it is sent, until
    ``release()``, then goes on to the store; ``fail()``: every extend raises until ``heal()``."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._hang = False
        self.hanging = threading.Event()  # an extend is blocked now
        self.unblock = threading.Event()
        self.finished = threading.Event()  # the blocked extend got its answer
        self.failing = False
        self.failures = 0

    def hang(self) -> None:
        self._hang = True

    def fail(self) -> None:
        self.failing = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def extend(self, *args: Any, **kwargs: Any) -> Any:
        if self.failing:
            self.failures += 1
            raise EndpointConnectionError(endpoint_url="https://unreachable.invalid")
        if self._hang:
            self._hang = False
            self.hanging.set()
            self.unblock.wait(PATIENCE)
            try:
                return self._store.extend(*args, **kwargs)
            finally:
                self.finished.set()
        return self._store.extend(*args, **kwargs)


def _pair(make_backend, clock=None, **kwargs):
    backend = make_backend(clock=clock)
    a = backend.leader("svc", ttl=kwargs.pop("ttl", 10), owner="a", **kwargs)
    b = backend.leader("svc", ttl=a.ttl, owner="b", margin=a.margin)
    return backend, a, b


def test_one_candidate_leads_and_the_other_waits(make_backend):
    clock = ManualClock()
    elected = Calls()
    backend = make_backend(clock=clock)
    a = backend.leader("svc", ttl=10, owner="a", on_elected=elected)
    b = backend.leader("svc", ttl=10, owner="b")
    assert a.term is None and not a.is_leader and a.leader() is None
    assert a.campaign(timeout=0, heartbeat=False) is True
    assert a.is_leader and elected.terms == [a.term]
    assert a.campaign(timeout=0, heartbeat=False) is True  # already leading: no new term
    assert elected.terms == [a.term]
    assert b.campaign(timeout=0, heartbeat=False) is False
    assert not b.is_leader and b.term is None
    shown = b.leader()
    assert shown is not None and (shown.owner, shown.term) == ("a", a.term)
    # the item is the lock leader:svc: the lock views show it
    lock = backend.locks.get(leader_key("svc"))
    assert lock is not None and (lock.owner, lock.fence) == ("a", a.term)
    assert a.step_down() is True


def test_terms_strictly_increase(make_backend):
    clock = ManualClock()
    _, a, b = _pair(make_backend, clock)
    terms = []
    for leader in (a, b, a, a, b):
        assert leader.campaign(timeout=0, heartbeat=False)
        terms.append(leader.term)
        assert leader.step_down() is True
    # a takeover after the lease ran out is a new term too
    assert a.campaign(timeout=0, heartbeat=False)
    terms.append(a.term)
    clock.advance(10)
    assert b.campaign(timeout=0, heartbeat=False)
    terms.append(b.term)
    assert terms == sorted(terms) and len(set(terms)) == len(terms)
    b.step_down()


def test_takeover_after_the_leaders_lease_ends(make_backend):
    clock = ManualClock()
    lost = Calls()
    _, a, b = _pair(make_backend, clock, ttl=5, margin=1, on_lost=lost)
    assert a.campaign(timeout=0, heartbeat=False)
    old = a.term
    assert a.deadline == pytest.approx(clock.monotonic() + 4)  # ttl - margin
    clock.advance(2)
    assert a.renew() is True  # the deadline moves to ttl - margin after this request was sent
    clock.advance(3.999)
    assert a.is_leader
    clock.advance(0.001)
    assert not a.is_leader
    assert lost.event.wait(PATIENCE) and lost.terms == [old]  # the watchdog's call
    # the store's lease still runs for the margin: nobody else is elected inside it
    assert b.campaign(timeout=0, heartbeat=False) is False
    clock.advance(0.999)
    assert b.campaign(timeout=0, heartbeat=False) is False
    clock.advance(0.001)
    assert b.campaign(timeout=0, heartbeat=False) is True
    assert b.term is not None and b.term > old
    assert a.renew() is False and not a.is_leader
    assert lost.terms == [old]  # once
    b.step_down()


def test_a_candidate_whose_term_ran_out_is_elected_with_a_new_term(make_backend):
    """Its deadline passed (no renewal) while the store still holds its item for the margin: a
    new campaign frees that item and wins a new, larger term, never the ended one again."""
    clock = ManualClock()
    lost = Calls()
    _, a, _ = _pair(make_backend, clock, ttl=5, margin=1, on_lost=lost)
    assert a.campaign(timeout=0, heartbeat=False)
    old = a.term
    clock.advance(4.5)
    assert not a.is_leader
    assert a.leader() is not None  # the store's lease runs for the margin yet
    assert a.campaign(timeout=0, heartbeat=False)
    assert a.term is not None and old is not None and a.term > old
    assert lost.event.wait(PATIENCE) and lost.terms == [old]
    assert a.step_down() is True


def test_a_waiting_candidate_leads_within_the_ttl_plus_its_backoff(make_backend):
    """The leader dies (nothing renews its term): a blocked campaign leads once the lease ends,
    at most one backoff later, and reads (not writes) while it waits."""
    clock = ManualClock()
    _, a, b = _pair(make_backend, clock, ttl=5, margin=1)
    assert a.campaign(timeout=0, heartbeat=False)
    died = clock.monotonic()
    assert b.campaign(timeout=60, heartbeat=False) is True
    assert b.term is not None and a.term is not None and b.term > a.term
    assert clock.monotonic() - died <= a.ttl + b.backoff_max
    # and one that times out returns False at its timeout, the leader untouched
    start = clock.monotonic()
    assert a.campaign(timeout=2, heartbeat=False) is False
    assert clock.monotonic() - start == pytest.approx(2, abs=0.01)
    assert b.is_leader and not a.is_leader
    b.step_down()


def test_step_down_frees_the_seat_at_once(make_backend):
    clock = ManualClock()
    lost = Calls()
    _, a, b = _pair(make_backend, clock, on_lost=lost)
    assert a.campaign(timeout=0, heartbeat=False)
    assert a.step_down() is True
    assert not a.is_leader and a.leader() is None
    assert a.step_down() is False  # nothing left to free
    assert b.campaign(timeout=0, heartbeat=False) is True
    time.sleep(0.05)  # the watchdog's poll: it must not report a term given up
    assert lost.terms == []
    b.step_down()


def test_an_old_leaders_step_down_after_a_takeover_deletes_nothing(make_backend):
    clock = ManualClock()
    backend, a, b = _pair(make_backend, clock, ttl=5, margin=1)
    assert a.campaign(timeout=0, heartbeat=False)
    clock.advance(5)
    assert b.campaign(timeout=0, heartbeat=False)
    assert a.step_down() is False
    assert b.is_leader and b.renew() is True
    shown = backend.locks.get(leader_key("svc"))
    assert shown is not None and (shown.owner, shown.fence) == ("b", b.term)
    # a renewal the store refuses (an operator freed the seat) ends the term at once
    lost = Calls()
    b.on_lost = lost
    assert backend.locks.force_release(leader_key("svc")) is True
    assert b.renew() is False
    assert not b.is_leader and lost.terms == [b.term]
    assert b.step_down() is False


def _until(condition: Any, what: str) -> None:
    """Wait (real time) for a background thread to do what the manual clock made due."""
    end = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.005)


class SlowStore:
    """The leader's lock store, with each request taking ``seconds`` of the manual clock
    between its sending (the caller read its clocks) and its applying."""

    def __init__(self, store: Any, clock: ManualClock, seconds: float) -> None:
        self._store = store
        self._clock = clock
        self.seconds = seconds

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)

        def slow(*args: Any, **kwargs: Any) -> Any:
            self._clock.advance(self.seconds)
            return attr(*args, **kwargs)

        return slow


def test_a_slow_request_counts_from_before_it_was_sent(make_backend):
    """The lease began when the request left, not when its answer came: a request that took
    1.5 s leaves 1.5 s less of the term (else the leader would lead past the store's lease)."""
    clock = ManualClock()
    _, a, b = _pair(make_backend, clock, ttl=6, margin=1)
    a._store = SlowStore(a._store, clock, 1.5)
    sent = clock.monotonic()
    assert a.campaign(timeout=0, heartbeat=False)
    assert a.deadline == pytest.approx(sent + 5)
    sent = clock.monotonic()
    assert a.renew() is True
    assert a.deadline == pytest.approx(sent + 5)
    clock.advance(5 - 1.5 - 0.001)
    assert a.is_leader
    clock.advance(0.001)
    assert not a.is_leader
    clock.advance(1)  # the margin: the lease as the store granted it is over
    assert b.campaign(timeout=0, heartbeat=False)
    assert b.step_down() is True  # (and its watchdog stops looking at the clock)


def test_the_background_renewal_keeps_the_term_past_its_ttl(make_backend):
    clock = ManualClock()
    _, a, _ = _pair(make_backend, clock, ttl=6, margin=1)  # renewal every 2 s, deadline 5 s
    assert a.campaign(timeout=0)
    term = a.term
    for _ in range(3):
        deadline = a.deadline
        assert deadline is not None
        clock.advance(2.5)
        _until(lambda: a.deadline != deadline, "a renewal")  # noqa: B023 - used at once
    assert clock.monotonic() == 7.5  # past the ttl, led all along
    assert a.is_leader and a.term == term
    assert a.step_down() is True


@pytest.mark.parametrize("fault", ["hang", "fail"])
def test_on_lost_fires_by_the_deadline_when_no_renewal_succeeds(make_backend, fault):
    """Every renewal hangs (blocked before it is sent) or raises: ``on_lost`` comes from the
    watchdog at the local deadline while the hanging renewal is still blocked, never after it
    returns. A renewal that lands after that gives the seat back, so another candidate leads at
    once, with a larger term."""
    clock = ManualClock()
    lost = Calls()
    _, a, b = _pair(make_backend, clock, ttl=6, margin=1, on_lost=lost)
    store = a._store = HangingStore(a._store)
    assert a.campaign(timeout=0)
    term = a.term
    if fault == "hang":
        store.hang()
    else:
        store.fail()
    clock.advance(2.5)  # the renewal is due (every 2 s)
    if fault == "hang":
        assert store.hanging.wait(PATIENCE)
    else:
        _until(lambda: store.failures >= 1, "a failed renewal")
    clock.advance(2.499)
    time.sleep(0.05)  # the watchdog's poll: the deadline (5 s) has not passed
    assert a.is_leader and lost.terms == []
    clock.advance(0.001)
    assert not a.is_leader
    assert lost.event.wait(PATIENCE), "on_lost never fired"
    assert lost.terms == [term]
    if fault == "hang":
        assert not store.finished.is_set()  # fired while the renewal still hung
        store.unblock.set()  # the renewal reaches the store late, and applies
        assert store.finished.wait(PATIENCE)
        # the seat it renewed is given back at once: b leads without waiting for its expiry
        _until(lambda: b.campaign(timeout=0, heartbeat=False), "b elected")
    else:
        assert b.campaign(timeout=0, heartbeat=False) is False  # the store's lease: the margin
        clock.advance(1)
        assert b.campaign(timeout=0, heartbeat=False) is True
    assert b.term is not None and term is not None and b.term > term
    assert lost.terms == [term]
    assert b.step_down() is True


def test_on_lost_fires_on_the_real_clock_while_a_dynamodb_request_hangs(moto_table: Any) -> None:
    """The same on the real clock (the watchdog's timer, not a poll), with the hang where it
    happens: inside botocore, a ``before-send`` hook that blocks until released."""
    client, table = moto_table
    backend = _dynamodb_factory(client, table)()
    lost = Calls()
    a = backend.leader("svc", ttl=2, margin=0.5, on_lost=lost)
    armed = threading.Event()
    hanging = threading.Event()
    unblock = threading.Event()

    def hook(request: Any, **_: Any) -> None:
        if armed.is_set() and "UpdateItem" in str(request.headers.get("X-Amz-Target")):
            armed.clear()
            hanging.set()
            unblock.wait(PATIENCE)

    client.meta.events.register_first("before-send.dynamodb", hook)
    try:
        assert a.campaign(timeout=PATIENCE)
        term = a.term
        armed.set()
        assert hanging.wait(PATIENCE)
        assert lost.event.wait(PATIENCE), "on_lost never fired"
        assert not unblock.is_set() and not a.is_leader and lost.terms == [term]
    finally:
        unblock.set()
        client.meta.events.unregister("before-send.dynamodb", hook)
    a.step_down()


class MeetingStore:
    """The leader's lock store, whose acquires wait (up to a second) for a second acquire to
    be in flight at the same time: two campaigns of one object, interleaved at the store."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._meet = threading.Barrier(2, timeout=1)
        self.together = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def try_acquire(self, *args: Any, **kwargs: Any) -> Any:
        try:
            self._meet.wait()
            self.together += 1
        except threading.BrokenBarrierError:
            pass  # alone: the other campaign was not let in
        return self._store.try_acquire(*args, **kwargs)


def test_two_threads_campaigning_with_one_candidate_win_one_term_once(make_backend):
    clock = ManualClock()
    elected = Calls()
    lost = Calls()
    backend = make_backend(clock=clock)
    a = backend.leader("svc", ttl=5, margin=1, owner="a", on_elected=elected, on_lost=lost)
    store = a._store = MeetingStore(a._store)
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(a.campaign(heartbeat=False)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE)
    assert results == [True, True] and store.together == 0
    assert elected.terms == [a.term]
    clock.advance(4)
    assert lost.event.wait(PATIENCE)
    time.sleep(0.05)  # a second watchdog would report the same term again by now
    assert lost.terms == [a.term]


def test_a_campaign_whose_acquire_raised_is_recognised(lossy):
    """An acquire that applied and raised: the next campaign finds its own item and leads with
    that term (one item, not a second term)."""
    clock = ManualClock()
    backend = lossy.backend(clock=clock)
    a = backend.leader("svc", ttl=10, owner="a")
    op = {"dynamodb": "UpdateItem", "redis": "EVALSHA", "mongo": "find_one_and_update"}
    lossy.raise_next(operation=op[lossy.kind], applied=True)
    with pytest.raises(Exception):  # botocore's, redis-py's or pymongo's own error
        a.campaign(timeout=0, heartbeat=False)
    assert lossy.raised == 1
    held = a.leader()
    assert held is not None and held.owner == "a"
    assert a.campaign(timeout=0, heartbeat=False) is True
    assert a.term == held.term
    assert a.step_down() is True


def test_metrics_name_what_happened(make_backend):
    points: list[tuple[str, float]] = []

    class Sink(Metrics):
        def emit(self, name, value, unit, dimensions):
            if dimensions.get("Primitive") == "leader":  # not the store requests' own
                points.append((name, value))

    clock = ManualClock()
    backend = make_backend(clock=clock, metrics=Sink())
    a = backend.leader("svc", ttl=5, margin=1, owner="a")
    b = backend.leader("svc", ttl=5, margin=1, owner="b")
    assert a.campaign(timeout=0, heartbeat=False)
    clock.advance(2)
    assert a.renew()
    assert not b.campaign(timeout=0, heartbeat=False)
    assert a.step_down()
    names = [name for name, _ in points]
    for name in ("LeaderElected", "LeaderWait", "LeaderAge", "LeaderNotElected"):
        assert name in names
    assert ("LeaderSteppedDown", 1) in points
    ages = [value for name, value in points if name == "LeaderAge"]
    assert ages == [2000, 2000]  # at the renewal and when the term ended


BAD_SETTINGS = [
    ({"ttl": 0}, InvalidValueError),
    ({"ttl": 5, "margin": 5}, ConfigurationError),
    ({"ttl": 5, "margin": -1}, InvalidValueError),
    ({"ttl": 5, "margin": 1, "renew_interval": 4}, ConfigurationError),
    ({"ttl": 5, "renew_interval": 0}, ConfigurationError),
    ({"ttl": 5, "owner": ""}, InvalidValueError),
    ({"ttl": 5, "on_lost": "stop"}, TypeError),
    ({"ttl": 5, "on_elected": 1}, TypeError),
]


def test_bad_settings_names_and_arguments_are_refused(make_backend):
    backend = make_backend()
    for kwargs, error in BAD_SETTINGS:
        with pytest.raises(error):
            backend.leader("svc", **kwargs)
    with pytest.raises(InvalidKeyError):
        backend.leader("", ttl=5)
    with pytest.raises(InvalidKeyError):
        backend.leader("x" * 3000, ttl=5)
    a = backend.leader("svc", ttl=5)
    with pytest.raises(InvalidValueError):
        a.campaign(timeout=-1)
    with pytest.raises(TypeError):
        a.campaign(timeout=0, heartbeat="no")  # type: ignore[arg-type]
    assert a.leader() is None
