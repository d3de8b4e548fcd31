"""Semaphore contract: every backend must pass these unchanged (docs/semaphore.md)."""

from __future__ import annotations

import threading
import time

import pytest
from botocore.exceptions import EndpointConnectionError

from dynacoord import (
    ConfigurationError,
    InvalidKeyError,
    InvalidValueError,
    ManualClock,
    SemaphoreFullError,
)
from dynacoord.errors import BackendError
from tests.conftest import needs_atomic_store

#: what a caller sees when the client gave up: botocore's own error, or the backend's wrapper
RAISED = (EndpointConnectionError, BackendError)


def _tokens(sem):
    return sorted(p.token for p in sem.holders())


def test_acquire_up_to_the_limit_then_full(make_backend):
    sem = make_backend().semaphore("pool", limit=2, ttl=30)
    a = sem.acquire(owner="a", blocking=False)
    b = sem.acquire(owner="b", blocking=False)
    assert {p.owner for p in sem.holders()} == {"a", "b"}
    assert sem.available() == 0
    with pytest.raises(SemaphoreFullError) as full:
        sem.acquire(owner="c", blocking=False)
    assert full.value.name == "pool" and full.value.limit == 2
    assert {p.owner for p in full.value.holders} == {"a", "b"}
    assert a.release() is True
    assert a.release() is False  # a second release has nothing to free
    c = sem.acquire(owner="c", blocking=False)
    assert {p.owner for p in sem.holders()} == {"b", "c"}
    assert b.is_held() and c.is_held() and not a.is_held()
    assert b.release() and c.release()
    assert sem.holders() == [] and sem.available() == 2


def test_the_limit_holds_for_many_threads(make_backend):
    needs_atomic_store(make_backend)
    backend = make_backend()
    limit, threads, rounds = 3, 8, 3
    inside = 0
    most = 0
    fences: list[int] = []
    guard = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def worker(i: int) -> None:
        nonlocal inside, most
        sem = backend.semaphore("many", limit=limit, ttl=30)  # one object per thread
        try:
            start.wait()
            for _ in range(rounds):
                permit = sem.acquire(owner=f"w{i}", timeout=60)
                with guard:
                    inside += 1
                    most = max(most, inside)
                    fences.append(permit.fence)
                    # the store never shows more than the limit while we hold one
                    assert inside <= limit
                time.sleep(0.01)
                with guard:
                    inside -= 1
                assert permit.release() is True
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    assert most <= limit
    assert len(fences) == threads * rounds and len(set(fences)) == len(fences)
    assert backend.semaphore("many", limit=limit, ttl=30).holders() == []


def test_a_dead_holders_permit_comes_back_within_its_ttl(make_backend):
    clock = ManualClock()
    sem = make_backend(clock=clock).semaphore("dead", limit=1, ttl=5)
    dead = sem.acquire(owner="dead")
    with pytest.raises(SemaphoreFullError):
        sem.acquire(owner="b", blocking=False)
    clock.advance(4.999)
    with pytest.raises(SemaphoreFullError):
        sem.acquire(owner="b", blocking=False)
    clock.advance(0.001)  # expires_at_ms <= now: free
    taken = sem.acquire(owner="b", blocking=False)
    assert taken.fence > dead.fence
    assert [p.owner for p in sem.holders()] == ["b"]


def test_a_lost_permit_reports_it_and_never_frees_another(make_backend):
    clock = ManualClock()
    sem = make_backend(clock=clock).semaphore("lost", limit=1, ttl=1)
    old = sem.acquire(owner="a")
    clock.advance(1.5)
    new = sem.acquire(owner="b", blocking=False)
    assert old.extend() is False and old.lost
    assert old.release() is False
    assert [p.token for p in sem.holders()] == [new.token]
    # expired but not yet taken by anyone: still lost, and reported so
    clock.advance(1.5)
    assert new.release() is False and new.lost
    assert sem.holders() == []


def test_fences_strictly_increase(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    sem = backend.semaphore("fence", limit=2, ttl=5)
    fences = []
    for i in range(4):
        permit = sem.acquire(owner=f"o{i}")
        fences.append(permit.fence)
        if i % 2:
            permit.release()
        else:
            clock.advance(6)  # left to expire
    assert fences == sorted(fences) and len(set(fences)) == 4
    # The item gone (as after DynamoDB's sweeper, long after the last expiry): a fresh
    # namespace at a later time starts above every fence handed out.
    later = make_backend(clock=ManualClock(clock.time() + 2), namespace=backend.namespace + "x")
    assert later.semaphore("fence", limit=2, ttl=5).acquire().fence > fences[-1]


def test_extend_and_hold_renew_past_the_ttl(make_backend):
    sem = make_backend().semaphore("hold", limit=1, ttl=1.2)
    # TTL 1.2 s renewed every 0.4 s: 2.5 s of work outlives the TTL twice over
    with sem.hold(owner="a") as permit:
        time.sleep(2.5)
        assert not permit.lost
        assert [p.owner for p in sem.holders()] == ["a"]
        with pytest.raises(SemaphoreFullError) as full:
            with sem.hold(owner="b", timeout=0):
                pass
        assert [p.owner for p in full.value.holders] == ["a"]
    assert permit.released and sem.holders() == []


def test_extend_moves_the_expiry(make_backend):
    clock = ManualClock()
    sem = make_backend(clock=clock).semaphore("ext", limit=1, ttl=2)
    permit = sem.acquire(owner="a")
    first = permit.expires_at_ms
    clock.advance(1)
    assert permit.extend(5) is True and permit.expires_at_ms == first + 4000
    clock.advance(4)  # past the first expiry, inside the extended one
    assert [p.owner for p in sem.holders()] == ["a"]
    with pytest.raises(SemaphoreFullError):
        sem.acquire(owner="b", blocking=False)


def test_blocking_acquire_waits_for_a_release(make_backend):
    sem = make_backend().semaphore("wait", limit=1, ttl=10)
    held = sem.acquire(owner="a")
    timer = threading.Timer(0.3, held.release)
    timer.start()
    started = time.monotonic()
    got = sem.acquire(owner="b", timeout=5)
    timer.join()
    assert got.owner == "b"
    assert time.monotonic() - started >= 0.25


def test_blocking_acquire_times_out(make_backend):
    clock = ManualClock()
    sem = make_backend(clock=clock).semaphore("busy", limit=1, ttl=100)
    sem.acquire(owner="a")
    start = clock.monotonic()
    with pytest.raises(SemaphoreFullError):
        sem.acquire(owner="b", timeout=2)
    assert clock.monotonic() - start == pytest.approx(2, abs=0.01)


def test_a_blocked_acquire_takes_an_expiring_slot(make_backend):
    clock = ManualClock()
    sem = make_backend(clock=clock).semaphore("exp", limit=1, ttl=3)
    sem.acquire(owner="a")
    start = clock.monotonic()
    got = sem.acquire(owner="b", timeout=10)
    assert got.owner == "b"
    # taken once the dead slot expired, not at the deadline (waits never sleep past an expiry)
    assert 3 <= clock.monotonic() - start < 4


def test_two_acquires_decided_from_one_read_take_one_slot(make_backend):
    # Both objects read the semaphore with its one permit free; the first takes it, the second
    # writes from the same (now stale) read: its write must be refused, not add a second holder.
    clock = ManualClock()
    backend = make_backend(clock=clock)
    first = backend.semaphore("one-read", limit=1, ttl=30)
    second = backend.semaphore("one-read", limit=1, ttl=30)
    assert first.acquire(owner="setup").release()  # the item exists: both writes are updates
    assert first.holders() == [] and second.holders() == []  # each has read it free
    taken = first.acquire(owner="a", blocking=False)
    with pytest.raises(SemaphoreFullError) as full:
        second.acquire(owner="b", blocking=False)
    assert [p.token for p in full.value.holders] == [taken.token]
    assert [p.owner for p in second.holders()] == ["a"]


def test_a_slot_renewed_by_a_slower_clock_is_not_dropped(make_backend):
    # The fast process (2 s ahead) reads the slow one's permit expired; the slow one renews it
    # (live at its own clock, and now at the fast one's too); the fast one's write, decided from
    # its read, must not drop the renewed permit.
    slow_clock = ManualClock()
    fast_clock = ManualClock(slow_clock.time() + 2)
    slow = make_backend(clock=slow_clock)
    fast = make_backend(clock=fast_clock, namespace=slow.namespace)
    slow_sem = slow.semaphore("skew", limit=1, ttl=3)
    fast_sem = fast.semaphore("skew", limit=1, ttl=3)
    held = slow_sem.acquire(owner="slow")
    for clock in (slow_clock, fast_clock):
        clock.advance(1.5)
    assert fast_sem.holders() == []  # expired at the fast clock: read as free
    assert held.extend(3) is True  # live at the slow clock: renewed until slow + 3 s
    with pytest.raises(SemaphoreFullError):
        fast_sem.acquire(owner="fast", blocking=False)
    assert [p.owner for p in slow_sem.holders()] == ["slow"]
    assert held.release() is True


def test_namespaces_isolate(make_backend):
    one = make_backend(namespace="tenant-one-s")
    two = make_backend(namespace="tenant-two-s")
    a = one.semaphore("shared", limit=1, ttl=5).acquire(blocking=False)
    b = two.semaphore("shared", limit=1, ttl=5).acquire(blocking=False)
    assert a.release() and b.release()


# -- lost responses ------------------------------------------------------------------------------

WRITE = {"dynamodb": "UpdateItem", "redis": "EVALSHA", "mongo": "find_one_and_update"}


def test_an_acquire_whose_answer_was_lost_holds_one_slot(lossy):
    sem = lossy.backend().semaphore("lost-acq", limit=1, ttl=30)
    sem.holders()  # the item exists: the acquire is an update on every backend
    first = sem.acquire(owner="a")
    first.release()
    lossy.lose_next(operation=WRITE[lossy.kind])
    permit = sem.acquire(owner="b", blocking=False)  # refused by its own retry, recognised
    assert lossy.lost == 1
    assert _tokens(sem) == [permit.token]
    assert permit.release() is True
    assert sem.holders() == []


def test_a_release_whose_answer_was_lost_reports_it_and_frees_only_its_own(lossy):
    sem = lossy.backend().semaphore("lost-rel", limit=1, ttl=30)
    permit = sem.acquire(owner="a")
    op = {"dynamodb": "UpdateItem", "redis": "EVALSHA", "mongo": "update_one"}[lossy.kind]
    other = sem.__class__(sem._store, sem.name, limit=1, ttl=30)
    taken = []
    # in the gap before the retry, another process takes the freed slot: the retry must not
    # free it, and the release still answers True
    lossy.lose_next(
        operation=op, then=lambda: taken.append(other.acquire(owner="b", blocking=False))
    )
    assert permit.release() is True
    assert lossy.lost == 1
    assert [p.owner for p in sem.holders()] == ["b"] == [p.owner for p in taken]


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_an_acquire_that_raised_is_recognised_by_the_next(lossy, applied):
    sem = lossy.backend().semaphore("raised", limit=1, ttl=30)
    sem.holders()
    real = sem._store.try_acquire

    def raising(*args, **kwargs):
        sem._store.try_acquire = real  # once
        lossy.raise_next(applied=applied)
        return real(*args, **kwargs)

    sem._store.try_acquire = raising
    with pytest.raises(RAISED):
        sem.acquire(owner="me", blocking=False)
    # limit 1: a slot leaked by the raised write would leave the semaphore full
    permit = sem.acquire(owner="me", blocking=False)
    assert _tokens(sem) == [permit.token]
    assert permit.release() is True
    assert sem.holders() == []


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_a_release_that_raised_is_sent_again_by_the_next(lossy, applied):
    sem = lossy.backend().semaphore("raised-rel", limit=1, ttl=30)
    permit = sem.acquire(owner="me")
    real = sem._store.release

    def raising(*args, **kwargs):
        sem._store.release = real  # once
        lossy.raise_next(applied=applied)
        return real(*args, **kwargs)

    sem._store.release = raising
    with pytest.raises(RAISED):
        permit.release()
    assert permit.release() is True  # its own applied release, or sent now
    assert sem.holders() == []


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": "", "limit": 1, "ttl": 1}, InvalidKeyError),
        ({"name": 5, "limit": 1, "ttl": 1}, InvalidKeyError),
        ({"name": "x" * 3000, "limit": 1, "ttl": 1}, InvalidKeyError),
        ({"name": "s", "limit": 0, "ttl": 1}, ConfigurationError),
        ({"name": "s", "limit": 1001, "ttl": 1}, ConfigurationError),
        ({"name": "s", "limit": "3", "ttl": 1}, TypeError),
        ({"name": "s", "limit": True, "ttl": 1}, TypeError),
        ({"name": "s", "limit": 1, "ttl": 0}, ValueError),
        ({"name": "s", "limit": 1, "ttl": float("nan")}, ValueError),
        ({"name": "s", "limit": 1, "ttl": "5"}, TypeError),
        ({"name": "s", "limit": 1, "ttl": 86401}, ConfigurationError),
    ],
)
def test_bad_settings_are_refused(make_backend, kwargs, error):
    with pytest.raises(error):
        make_backend().semaphore(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"owner": ""}, ValueError),
        ({"owner": 5}, TypeError),
        ({"owner": "x" * 257}, InvalidValueError),
        ({"timeout": -1}, ValueError),
        ({"timeout": 1, "blocking": False}, ValueError),
        ({"blocking": "no"}, TypeError),
        ({"ttl": -1}, ValueError),
        ({"ttl": 86401}, ConfigurationError),
    ],
)
def test_bad_acquire_input_raises_and_writes_nothing(make_backend, kwargs, error):
    sem = make_backend().semaphore("bad", limit=1, ttl=5)
    with pytest.raises(error):
        sem.acquire(**kwargs)
    assert sem.holders() == []


def test_metrics_name_what_happened(make_backend):
    from tests.test_metrics import Recorder

    clock = ManualClock()
    recorder = Recorder()
    sem = make_backend(metrics=recorder, clock=clock).semaphore("m", limit=1, ttl=1)
    held = sem.acquire(owner="a")
    with pytest.raises(SemaphoreFullError):
        sem.acquire(owner="b", timeout=0.5)
    clock.advance(1)
    assert held.release() is False  # expired: lost
    names = recorder.names("semaphore")
    assert names.count("PermitAcquired") == 1 and names.count("PermitWait") == 1
    assert names.count("SemaphoreFull") == 1 and names.count("PermitLost") == 1
