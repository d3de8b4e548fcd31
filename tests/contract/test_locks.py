"""Lock contract: every backend must pass these unchanged."""

from __future__ import annotations

import threading
import time

import pytest

from dynacoord import InvalidKeyError, LockNotAcquiredError, ManualClock
from tests.conftest import needs_atomic_store


def test_acquire_release_and_get(make_backend):
    locks = make_backend().locks
    lease = locks.acquire("job", ttl=5, owner="a")
    assert lease is not None
    assert lease.owner == "a" and lease.key == "job"
    info = locks.get("job")
    assert info is not None and info.owner == "a" and info.fence == lease.fence
    assert locks.locked("job")
    assert lease.is_held()
    assert lease.release() is True
    assert locks.get("job") is None
    assert lease.release() is False  # second release reports nothing to release


def test_two_owners_racing_exactly_one_wins(make_backend):
    needs_atomic_store(make_backend)
    locks = make_backend().locks
    barrier = threading.Barrier(2)
    results = {}

    def contend(owner):
        barrier.wait()
        results[owner] = locks.acquire("race", ttl=10, owner=owner)

    threads = [threading.Thread(target=contend, args=(o,)) for o in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o, lease in results.items() if lease is not None]
    assert len(winners) == 1
    assert locks.get("race").owner == winners[0]


def test_fences_strictly_increase_across_acquisitions(make_backend):
    locks = make_backend().locks
    fences = []
    for i in range(5):
        lease = locks.acquire("f", ttl=5, owner=f"o{i}")
        assert lease is not None
        fences.append(lease.fence)
        assert lease.release()
    assert fences == sorted(fences) and len(set(fences)) == 5


def test_expiry_after_ttl_ms_scale(make_backend):
    clock = ManualClock()
    locks = make_backend(clock=clock).locks
    lease = locks.acquire("exp", ttl=0.25, owner="a")
    assert lease is not None
    clock.advance(0.249)
    assert locks.acquire("exp", ttl=1, owner="b") is None
    clock.advance(0.002)
    assert locks.get("exp") is None
    taken = locks.acquire("exp", ttl=1, owner="b")
    assert taken is not None and taken.fence > lease.fence
    # The first holder lost it: release reports it and does not free b's lock.
    assert lease.release() is False
    assert lease.lost
    assert locks.get("exp").owner == "b"


def test_extend_moves_expiry_and_fails_once_lost(make_backend):
    clock = ManualClock()
    locks = make_backend(clock=clock).locks
    lease = locks.acquire("ext", ttl=1, owner="a")
    clock.advance(0.8)
    assert lease.extend(1) is True
    clock.advance(0.8)
    assert locks.get("ext").owner == "a"  # would have expired without the extend
    clock.advance(0.3)
    assert lease.extend() is False
    assert lease.lost


def test_same_owner_reacquire_keeps_fence(make_backend):
    clock = ManualClock()
    locks = make_backend(clock=clock).locks
    first = locks.acquire("re", ttl=1, owner="me")
    clock.advance(0.5)
    again = locks.acquire("re", ttl=1, owner="me")
    assert again is not None and again.fence == first.fence
    assert again.expires_at_ms == first.expires_at_ms + 500


def test_fence_keeps_growing_after_the_item_is_gone(make_backend):
    # Simulates the TTL sweeper: a new backend in a fresh namespace has no item, and time moved on.
    clock = ManualClock()
    backend = make_backend(clock=clock)
    lease = backend.locks.acquire("swept", ttl=1, owner="a")
    ns = backend.namespace
    later = ManualClock(clock.time() + 2)
    other_ns = make_backend(clock=later, namespace=ns + "x")
    fresh = other_ns.locks.acquire("swept", ttl=1, owner="b")
    assert fresh.fence > lease.fence


def test_a_released_or_expired_lock_keeps_its_fence_until_long_after(make_backend):
    """Release and expiry keep the item (and its fence) for the grace period, so the next owner
    continues from it instead of restarting from the clock."""
    clock = ManualClock()
    locks = make_backend(clock=clock).locks
    first = locks.acquire("kept", ttl=1, owner="a")
    assert first.release()
    clock.advance(1800)  # half an hour after the release: well inside the default 1 h grace
    second = locks.acquire("kept", ttl=1, owner="b")
    assert second.fence == first.fence + 1
    clock.advance(1800)  # second expired half an hour ago without a release
    third = locks.acquire("kept", ttl=1, owner="c")
    assert third.fence == second.fence + 1


def test_release_of_lost_lock_never_deletes_the_new_owners(make_backend):
    clock = ManualClock()
    locks = make_backend(clock=clock).locks
    old = locks.acquire("k", ttl=1, owner="a")
    clock.advance(1.5)
    new = locks.acquire("k", ttl=10, owner="b")
    assert new is not None
    assert old.release() is False
    assert locks.get("k").owner == "b"


def test_force_release(make_backend):
    locks = make_backend().locks
    assert locks.force_release("nothing") is False
    lease = locks.acquire("fr", ttl=30, owner="a")
    assert locks.force_release("fr") is True
    assert locks.get("fr") is None
    nxt = locks.acquire("fr", ttl=30, owner="b")
    assert nxt is not None and nxt.fence > lease.fence
    assert lease.release() is False


def test_blocking_acquire_waits_for_release(make_backend):
    locks = make_backend().locks
    lease = locks.acquire("wait", ttl=10, owner="a")
    timer = threading.Timer(0.3, lease.release)
    timer.start()
    started = time.monotonic()
    got = locks.acquire("wait", ttl=10, owner="b", timeout=5)
    timer.join()
    assert got is not None and got.owner == "b"
    assert time.monotonic() - started >= 0.25


def test_blocking_acquire_times_out(make_backend):
    clock = ManualClock()
    locks = make_backend(clock=clock).locks
    locks.acquire("busy", ttl=100, owner="a")
    start = clock.monotonic()
    assert locks.acquire("busy", ttl=1, owner="b", timeout=2) is None
    assert clock.monotonic() - start == pytest.approx(2, abs=0.01)


def test_hold_context_releases_and_raises_when_taken(make_backend):
    locks = make_backend().locks
    with locks.hold("h", ttl=5, owner="a") as lease:
        assert locks.get("h").owner == "a"
        with pytest.raises(LockNotAcquiredError) as err:
            with locks.hold("h", ttl=5, owner="b", timeout=0):
                pass
        assert err.value.key == "h" and err.value.owner == "a"
    assert locks.get("h") is None
    assert lease.released


def test_heartbeat_keeps_lock_past_ttl(make_backend):
    locks = make_backend().locks
    # TTL 1.2 s renewed every 0.4 s: 0.8 s of slack for a loaded machine, and 2.5 s of work
    # outlives the TTL twice over.
    with locks.hold("hb", ttl=1.2, owner="a") as lease:
        time.sleep(2.5)
        assert not lease.lost
        assert locks.get("hb").owner == "a"
        assert locks.acquire("hb", ttl=1, owner="b") is None
    assert locks.get("hb") is None


def test_keep_alive_renews_an_acquired_lease_without_releasing_it(make_backend):
    locks = make_backend().locks
    lease = locks.acquire("ka", ttl=1.2, owner="a")
    assert lease is not None
    with locks.keep_alive(lease) as kept:
        assert kept is lease
        time.sleep(2.5)  # twice the TTL: only the renewals keep it
        assert not lease.lost and locks.get("ka").owner == "a"
    assert locks.get("ka").owner == "a"  # still held after the block: the caller releases
    assert lease.release()
    assert locks.get("ka") is None


def test_heartbeat_reports_loss(make_backend):
    locks = make_backend().locks
    lost = threading.Event()
    with locks.hold("lost", ttl=0.6, owner="a", on_lost=lambda lease: lost.set()) as lease:
        locks.force_release("lost")
        assert locks.acquire("lost", ttl=30, owner="b") is not None
        assert lost.wait(3)
        assert lease.lost
    assert locks.get("lost").owner == "b"  # exiting did not free b's lock


def test_namespaces_isolate(make_backend):
    one = make_backend(namespace="tenant-one-x")
    two = make_backend(namespace="tenant-two-x")
    a = one.locks.acquire("shared", ttl=5, owner="a")
    b = two.locks.acquire("shared", ttl=5, owner="b")
    assert a is not None and b is not None
    a.release()
    b.release()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"key": "", "ttl": 1}, InvalidKeyError),
        ({"key": "x" * 3000, "ttl": 1}, InvalidKeyError),
        ({"key": 5, "ttl": 1}, InvalidKeyError),
        ({"key": "k", "ttl": 0}, ValueError),
        ({"key": "k", "ttl": -1}, ValueError),
        ({"key": "k", "ttl": float("nan")}, ValueError),
        ({"key": "k", "ttl": float("inf")}, ValueError),
        ({"key": "k", "ttl": "5"}, TypeError),
        ({"key": "k", "ttl": 1, "timeout": -1}, ValueError),
        ({"key": "k", "ttl": 1, "owner": ""}, ValueError),
    ],
)
def test_bad_input_raises_and_writes_nothing(make_backend, kwargs, error):
    locks = make_backend().locks
    kwargs = dict(kwargs)
    key = kwargs.pop("key")
    ttl = kwargs.pop("ttl")
    with pytest.raises(error):
        locks.acquire(key, ttl, **kwargs)
    if isinstance(key, str) and 0 < len(key) < 100:
        assert locks.get(key) is None
