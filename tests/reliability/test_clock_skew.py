"""Two clients whose clocks disagree by up to ±2 s share locks, idempotency claims and outbox
leases. Runs on every contract backend.

The safety margin (documented in the README's Guarantees section): expiry is decided by the clock
of whoever looks, so a client whose clock runs ``s`` seconds ahead sees a lease end ``s`` seconds
early. A holder is therefore only safe while

    holder_now < expires_at - skew_margin        (skew_margin >= the largest clock difference)

and must stop, or extend, before that. Within that window no other client considers the lease
free, whatever the sign of the skew (tested below at -2, -1, 0, +1, +2 s with a 2 s margin). Beyond
it, the fence is what protects the resource: the next holder's fence is larger, and the late
holder's extend/release/complete are refused.
"""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import MANUAL_CLOCK_START as START
from dynacoord import ManualClock
from dynacoord._clock import now_ms
from dynacoord.outbox import Event, EventStatus

MARGIN_MS = 2000
SKEWS = [-2.0, -1.0, 0.0, 1.0, 2.0]
STEP = 0.25


class OffsetClock:
    """A view of a shared ManualClock that is ``offset`` seconds off (a skewed host clock)."""

    def __init__(self, base: ManualClock, offset: float) -> None:
        self.base = base
        self.offset = offset

    def time(self) -> float:
        return self.base.time() + self.offset

    def monotonic(self) -> float:
        return self.base.monotonic()

    def sleep(self, seconds: float) -> None:
        self.base.sleep(seconds)


def _pair(make_backend: Any, skew: float) -> tuple[ManualClock, Any, Any]:
    true = ManualClock(START)
    a = make_backend(clock=OffsetClock(true, 0.0))
    b = make_backend(clock=OffsetClock(true, skew), namespace=a.namespace)
    return true, a, b


@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("ttl", [4.0])
def test_lock_is_never_free_for_the_other_client_within_the_margin(make_backend, skew, ttl):
    true, a, b = _pair(make_backend, skew)
    lease = a.locks.acquire("job", ttl=ttl, owner="a")
    assert lease is not None
    safe_until = lease.expires_at_ms - MARGIN_MS
    taken = None
    while taken is None:
        holder_view_safe = now_ms(a.clock) < safe_until
        taken = b.locks.acquire("job", ttl=ttl, owner="b")
        if holder_view_safe:
            assert taken is None, f"b took the lock while a was safe (skew {skew}s)"
            assert b.locks.get("job").owner == "a"
        true.advance(STEP)
        assert true.time() < START + ttl + 10, "b never got the lock"
    # b got it: its fence is larger, and a's late writes are refused.
    assert taken.fence > lease.fence
    assert lease.extend() is False and lease.lost
    assert lease.release() is False
    assert b.locks.get("job").owner == "b"


def test_without_the_margin_a_fast_clock_takes_the_lock_early(make_backend):
    """Why the margin exists: with b's clock 2 s ahead, b sees a's 3 s lease end after 1 s of
    true time, while a (by its own clock) still holds it for 2 s more."""
    true, a, b = _pair(make_backend, 2.0)
    lease = a.locks.acquire("early", ttl=3, owner="a")
    true.advance(1.0)
    assert now_ms(a.clock) < lease.expires_at_ms  # a's raw view: still held
    taken = b.locks.acquire("early", ttl=3, owner="b")
    assert taken is not None and taken.fence > lease.fence  # the fence protects from here on


@pytest.mark.parametrize("skew", SKEWS)
def test_idempotency_claim_is_never_free_for_the_other_client_within_the_margin(make_backend, skew):
    true, a, b = _pair(make_backend, skew)
    mine = a.idempotency.try_claim("order-1", lease=5)
    assert mine.claim is not None
    safe_until = mine.claim.expires_at_ms - MARGIN_MS
    theirs = None
    while theirs is None or theirs.claim is None:
        holder_view_safe = now_ms(a.clock) < safe_until
        theirs = b.idempotency.try_claim("order-1", lease=5)
        if holder_view_safe:
            assert theirs.claim is None, f"b claimed while a was safe (skew {skew}s)"
        true.advance(STEP)
        assert true.time() < START + 15, "b never got the key"
    # a's late completion must not overwrite b's claim.
    assert a.idempotency.complete(mine.claim, "late") is False
    assert b.idempotency.complete(theirs.claim, "b's") is True
    assert a.idempotency.get("order-1").result == "b's"


@pytest.mark.parametrize("skew", SKEWS)
def test_outbox_lease_is_never_taken_by_the_other_worker_within_the_margin(make_backend, skew):
    true, a, b = _pair(make_backend, skew)
    event = Event("job", {"n": 1})
    a.outbox.publish(event)
    lease_s = 5.0
    b_got: list[Any] = []
    b_worker = b.outbox.worker(b_got.append, lease=lease_s, heartbeat=False, backoff=0)
    trace: list[tuple[bool, int]] = []

    def a_handler(_: Event) -> None:
        safe_until = now_ms(a.clock) + int(lease_s * 1000) - MARGIN_MS
        while not b_got:
            holder_view_safe = now_ms(a.clock) < safe_until
            took = b_worker.run_once()
            trace.append((holder_view_safe, took))
            if holder_view_safe:
                assert took == 0, f"b claimed a's event while a was safe (skew {skew}s)"
            true.advance(STEP)
            assert len(trace) < 100, "b never recovered the event"

    a_worker = a.outbox.worker(a_handler, lease=lease_s, heartbeat=False, backoff=0)
    assert a_worker.run_once() == 1
    assert [e.attempt for e in b_got] == [2]
    assert any(safe for safe, _ in trace), "the safe window was never exercised"
    # a's completion came after b's claim: it was refused, b's delivery stands.
    assert a_worker.delivered == 0 and a_worker.lost == 1
    assert a.outbox.get(event.id).status is EventStatus.COMPLETED
