"""A lock released early by a holder in another process reaches its waiter promptly, and the
wait costs reads, not refused writes (a refused conditional write is billed a write unit on
DynamoDB; a consistent read of a lock item is one read unit, a fifth of the price)."""

from __future__ import annotations

import threading
import time
from typing import Any

from dynacoord.locks import Locks
from tests.conftest import CountingStore, needs_atomic_store


def test_a_waiter_gets_a_lock_released_early_in_another_process_promptly(make_backend: Any) -> None:
    """The holder (another process: a second Locks, no in-process hand-off) takes the lock for
    30 s and releases it after 1.5 s; the waiter has it within backoff_max + a request of the
    release, not at the holder's expiry. Meanwhile it asked the store with reads."""
    needs_atomic_store(make_backend)
    backend = make_backend()
    holder_side = Locks(backend.locks._store)
    store = CountingStore(backend.locks._store)
    waiter_side = Locks(store)  # type: ignore[arg-type]
    held = holder_side.acquire("slow-holder", ttl=30)
    assert held is not None
    got: list[tuple[float, Any]] = []

    def wait() -> None:
        lease = waiter_side.acquire("slow-holder", ttl=5, timeout=15)
        got.append((time.monotonic(), lease))

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(1.5)  # past the waiter's first backoff steps
    writes_while_held = store.calls.get("try_acquire", 0)
    reads_while_held = store.calls.get("get", 0)
    released_at = time.monotonic()
    assert held.release() is True
    thread.join(20)
    [(when, lease)] = got
    assert lease is not None and lease.fence > held.fence
    assert when - released_at <= waiter_side.backoff_max + 0.5, when - released_at
    # one refused write to learn who holds it, then reads until the lock is seen free
    assert writes_while_held == 1, store.calls
    assert reads_while_held >= 2, store.calls
