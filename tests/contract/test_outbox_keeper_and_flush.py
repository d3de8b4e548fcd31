"""The lease keeper's beat and a batch's flush come at the same moment by design (both a third
of the lease after the batch starts): the beat extended every event handled and waiting for
that flush, and those extensions were refused (the outcome first) or wasted (the outcome right
after): issue 49's load observation, "with a 30 s lease, 21 of the keeper's batched extensions
were refused". An event whose outcome is decided is now extended only once its lease is within
one and a half beats of its end (the flush stores it before then, or a slow handler after it
holds the flush up and the next beat extends it in time)."""

from __future__ import annotations

from typing import Any

from dynacoord import ManualClock
from dynacoord.outbox import Event, EventStatus
from dynacoord.outbox.delivery import LeaseKeeper

LEASE = 3.0


class CountingKeeper(LeaseKeeper):
    """A keeper the test beats (no thread), counting the leases each beat asks to extend."""

    extended: list[list[str]]

    def _wake(self) -> None:
        pass

    def _rest(self) -> None:
        return None


def test_a_handled_events_lease_is_not_extended_while_its_flush_is_due(make_backend: Any) -> None:
    clock = ManualClock()
    shards = {"shards": 1} if make_backend.kind in ("moto", "dynamodb") else {}
    outbox = make_backend(clock=clock, **shards).outbox
    outbox.publish([Event("t", i, id=f"e{i}", occurred_at=clock.time()) for i in (1, 2, 3)])
    asked: list[list[str]] = []

    def handler(event: Event) -> None:
        if event.id == "e2":  # a slow handler: e1's outcome waits for the flush after it
            for _ in range(3):
                clock.advance(LEASE / 3)
                keeper.beat()

    worker = outbox.worker(handler, lease=LEASE, batch_size=25)
    keeper = CountingKeeper(worker.delivery, worker.lease_ms / 3000)
    worker.delivery.keeper = keeper
    extend_many = worker.delivery.store.extend_many

    def counted(held: Any, until: int, now: int) -> list[bool]:
        asked.append(sorted(r.id for r in held))
        return extend_many(held, until, now)  # type: ignore[no-any-return]

    worker.delivery.store = type(
        "S",
        (),
        {
            "__getattr__": lambda s, n: getattr(outbox._store, n),
            "extend_many": staticmethod(counted),
        },
    )()
    assert worker.run_once() == 3
    # The first beat: e1 (handled, its lease two beats from its end) is not extended; the next
    # one, e1's flush still held up by e2, extends it before its lease ends.
    assert asked[0] == ["e2", "e3"], asked
    assert "e1" in asked[1], asked
    assert worker.lost == 0
    assert all(outbox.get(i).status is EventStatus.COMPLETED for i in ("e1", "e2", "e3"))


def test_a_claim_that_took_most_of_the_lease_is_extended_at_once(make_backend: Any) -> None:
    """A claim's lease end is set before the claim is sent: a slow claim (a loaded store,
    throttled statements sent again) leaves less of it. The keeper's first beat came a whole
    interval (a third of the lease) after the hold whatever was left, so a batch whose claim took
    more than two thirds of the lease was taken over by other workers' expired-lease scans
    before its first extension (issue 49: "with a 6 s lease ... 18 of 25 events logged 'lease
    ran out before its turn'"). The keeper now beats as soon as a held lease has less than a
    beat and a half left. Its real thread runs here, on a manual clock: the claim "takes" 55 s
    of a 60 s lease; the extension must come long before the 20 s interval."""
    import threading
    import time

    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish(Event("t", 1, id="e1", occurred_at=clock.time()))
    store = outbox._store
    claim_many = store.claim_many

    def slow_claim_many(*args: Any) -> Any:
        got = claim_many(*args)
        clock.advance(55)  # the claim's answer came 55 s after its lease end was set
        return got

    extended = threading.Event()
    claimed_until: list[int] = []

    def handler(event: Event) -> None:
        record = outbox.get("e1")
        claimed_until.append(record.due_at_ms)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if outbox.get("e1").due_at_ms > claimed_until[0]:
                extended.set()
                return
            time.sleep(0.05)

    worker = outbox.worker(handler, lease=60, batch_size=25)
    worker._store = worker.delivery.store = type(
        "SlowClaims",
        (),
        {
            "__getattr__": lambda s, n: getattr(store, n),
            "claim_many": staticmethod(slow_claim_many),
        },
    )()
    assert worker.run_once() == 1
    assert extended.is_set(), "the keeper did not extend a lease with 5 s of 60 left"
    assert outbox.get("e1").status is EventStatus.COMPLETED
