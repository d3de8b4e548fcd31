"""Two processes never hold one lock at once, on every path a blocking acquire can take.

Each process here is its own backend object on one namespace (its own ``Locks``: no in-process
hand-off, no shared queue), so a waiter learns of a release only from the store. The case that
matters: a waiter in one process sees, by a consistent read, the lock released early by another,
while a third process acquires it in the same moment. Seeing it free is not having it: only the
conditional write decides, and of the two exactly one may hold the lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from dynacoord.locks import Lease
from tests.conftest import needs_atomic_store


def _live(leases: list[Lease]) -> list[Lease]:
    """The leases that, by their own account, hold the lock now (acquired, not released, not
    lost, not expired)."""
    now_ms = time.time() * 1000
    return [
        lease
        for lease in leases
        if not lease.released and not lease.lost and lease.expires_at_ms > now_ms
    ]


def test_a_lock_released_early_goes_to_one_of_a_waiter_and_a_third_process(
    make_backend: Any,
) -> None:
    needs_atomic_store(make_backend)
    first = make_backend()
    holder, waiter, third = (
        first.locks,
        make_backend(namespace=first.namespace).locks,
        make_backend(namespace=first.namespace).locks,
    )
    for round_ in range(2):
        key = f"shared-{round_}"
        held = holder.acquire(key, ttl=30)
        assert held is not None
        got: list[Lease | None] = []
        waiting = threading.Thread(
            target=lambda key=key, got=got: got.append(waiter.acquire(key, ttl=30, timeout=15))
        )
        waiting.start()
        time.sleep(0.4)  # the waiter has met the holder and now looks with reads
        assert held.release() is True
        waiting.join(20)
        assert not waiting.is_alive()
        [by_waiter] = got
        assert by_waiter is not None, "the waiter gets a lock released early"
        # The third process asks after the waiter has its lease (and any time before it):
        # the lock is the waiter's, not free.
        by_third = third.acquire(key, ttl=30)
        leases = [lease for lease in (by_waiter, by_third) if lease is not None]
        live = _live(leases)
        assert len(live) == 1, f"two holders of {key!r}: {live}"
        assert by_third is None
        # the store agrees with the one lease that thinks it holds the lock
        assert by_waiter.is_held(), by_waiter
        info = third.get(key)
        assert info is not None
        assert (info.owner, info.fence) == (by_waiter.owner, by_waiter.fence)
        assert by_waiter.fence > held.fence
        assert by_waiter.release() is True


def test_a_waiter_that_sees_the_lock_free_still_competes_for_it(make_backend: Any) -> None:
    """The read that says "free" and the write that takes the lock are two requests: a third
    process that takes the lock between them wins, and the waiter goes on waiting (it does not
    hold the lock on the strength of its read)."""
    needs_atomic_store(make_backend)
    first = make_backend()
    holder = first.locks
    waiter = make_backend(namespace=first.namespace).locks
    third = make_backend(namespace=first.namespace).locks
    key = "read-then-write"
    held = holder.acquire(key, ttl=30)
    assert held is not None
    store = waiter._store
    original_get = store.get
    taken: list[Lease | None] = []

    def get_then_lose_the_race(key_: str, now_ms: int) -> Any:
        info = original_get(key_, now_ms)
        if info is None and not taken:
            # the lock was seen free; before this waiter writes, a third process takes it
            taken.append(third.acquire(key, ttl=30))
        return info

    store.get = get_then_lose_the_race  # type: ignore[method-assign]
    got: list[Lease | None] = []
    waiting = threading.Thread(target=lambda: got.append(waiter.acquire(key, ttl=30, timeout=2)))
    waiting.start()
    time.sleep(0.4)
    assert held.release() is True
    waiting.join(10)
    assert not waiting.is_alive()
    [by_third] = taken
    [by_waiter] = got
    assert by_third is not None
    assert by_waiter is None, f"two holders: {by_third} and {by_waiter}"
    info = holder.get(key)
    assert info is not None and (info.owner, info.fence) == (by_third.owner, by_third.fence)
