"""Blocking acquires by threads of one process are served first come, first served, and hand the
lock on at release without polling the store (every backend)."""

from __future__ import annotations

import threading
import time

from dynacoord import ManualClock
from dynacoord.locks import Locks
from tests.conftest import needs_atomic_store


def _queued(locks: Locks, key: str, n: int) -> None:
    """Wait until ``n`` threads of this process wait for ``key``."""
    if not hasattr(locks, "_queues"):  # a design without a queue: give the thread time to ask
        time.sleep(0.3)
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        queue = locks._queues.get(key)
        if queue is not None and len(queue.tickets) >= n:
            return
        time.sleep(0.005)
    raise AssertionError(f"{n} waiters never queued for {key!r}")


def test_waiters_are_served_in_arrival_order_and_a_releaser_goes_last(make_backend):
    needs_atomic_store(make_backend)
    locks = make_backend().locks
    order: list[str] = []
    first = locks.acquire("fifo", ttl=10)
    assert first is not None

    def waiter(name: str) -> None:
        lease = locks.acquire("fifo", ttl=10, timeout=20)
        assert lease is not None
        order.append(name)
        lease.release()

    threads = []
    for i, name in enumerate(("b", "c", "d")):
        t = threading.Thread(target=waiter, args=(name,))
        t.start()
        threads.append(t)
        _queued(locks, "fifo", i + 1)
    first.release()
    # The releasing thread asks again at once: it queues behind everyone already waiting.
    again = locks.acquire("fifo", ttl=10, timeout=20)
    assert again is not None
    order.append("a")
    again.release()
    for t in threads:
        t.join(30)
    assert order == ["b", "c", "d", "a"]
    assert "fifo" not in getattr(locks, "_queues", {})  # nothing left behind


def test_waiters_do_not_poll_the_store_while_a_thread_here_holds_the_lock(make_backend):
    needs_atomic_store(make_backend)
    locks = make_backend().locks
    attempts = 0
    store = locks._store
    real = store.try_acquire

    def counting(*args, **kwargs):
        nonlocal attempts
        attempts += 1
        return real(*args, **kwargs)

    store.try_acquire = counting  # type: ignore[method-assign]
    holder = locks.acquire("quiet", ttl=10)
    assert holder is not None
    got: list[int] = []

    def waiter() -> None:
        lease = locks.acquire("quiet", ttl=10, timeout=20)
        assert lease is not None
        got.append(lease.fence)
        lease.release()

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for t in threads:
        t.start()
    _queued(locks, "quiet", 4)
    before = attempts
    time.sleep(1.0)  # polling with backoff would ask several times a second per waiter
    during = attempts - before
    holder.release()
    for t in threads:
        t.join(30)
    assert during <= 1, during
    assert len(got) == 4 and got == sorted(got) and got[0] > holder.fence


def test_a_waiter_does_not_sleep_past_the_holders_expiry(make_backend):
    # Another "process" holds the lock with a short TTL and never releases: the waiter gets it
    # right after the expiry instead of at its next backoff step or at its deadline.
    needs_atomic_store(make_backend)
    backend = make_backend()
    other = Locks(backend.locks._store)  # a second Locks: no hand-off between the two
    assert other.acquire("dead", ttl=0.6) is not None
    start = time.monotonic()
    lease = backend.locks.acquire("dead", ttl=5, timeout=30)
    waited = time.monotonic() - start
    assert lease is not None
    assert waited < 5, waited


def test_with_a_manual_clock_a_blocking_acquire_still_polls_on_that_clock(make_backend):
    clock = ManualClock()
    locks = make_backend(clock=clock).locks
    held = locks.acquire("manual", ttl=5)
    assert held is not None
    assert locks.acquire("manual", ttl=5, timeout=2) is None  # sleeps on the manual clock
    lease = locks.acquire("manual", ttl=5, timeout=10)  # the holder expires within the wait
    assert lease is not None and lease.fence > held.fence
