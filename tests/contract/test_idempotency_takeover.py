"""A call whose claim was taken over can neither complete nor release the claim that took it.

The claim of a call that overran its lease (a crash, a frozen Lambda) may be taken over by the
next call with the same key. While that second call runs, the record is IN_PROGRESS again, with
the second call's token: the first call coming back must not store its result over it (the
second call's result would be lost and a replay would return the stale one) nor delete it (a
third call would then run beside the second).
"""

from __future__ import annotations

from dynacoord import ManualClock
from dynacoord.idempotency import IdempotencyStatus


def test_a_late_call_cannot_complete_or_release_the_claim_that_took_its_key(make_backend) -> None:
    clock = ManualClock()
    idem = make_backend(clock=clock).idempotency
    first = idem.try_claim("order-7", lease=10)
    assert first.claimed
    clock.advance(10.001)  # the first call overran its lease
    second = idem.try_claim("order-7", lease=10)
    assert second.claimed, "the key is taken over"
    assert idem.complete(first.claim, "stale") is False
    assert idem.release(first.claim) is False
    record = idem.get("order-7")
    assert record is not None and record.status is IdempotencyStatus.IN_PROGRESS
    assert not idem.try_claim("order-7", lease=10).claimed, "the second call still holds it"
    assert idem.complete(second.claim, "fresh") is True
    completed = idem.get("order-7")
    assert completed is not None and completed.completed
    assert idem.try_claim("order-7", lease=10).claimed is False
