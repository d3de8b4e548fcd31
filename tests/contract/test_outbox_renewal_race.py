"""A renewal between another worker's read and its claim (issue 49): worker A holds e1 and is
stalled past its lease (its keeper late); worker B's poll reads e1 in flight with its lease run
out; A's keeper renews the lease; B's claim, from what it read, must be refused: never two
holders both told they hold the event, whatever claim path B takes (an expired lease is claimed
alone; ``batch_claim=False`` claims one event per request too). A's outcome is then stored, and
e1 is delivered once. On every contract backend."""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.outbox import Event, EventStatus
from dynacoord.outbox.delivery import LeaseKeeper
from dynacoord.outbox.worker import OutboxWorker

LEASE = 3.0


class ManualKeeper(LeaseKeeper):
    """A lease keeper whose beats the test calls (no thread)."""

    def _wake(self) -> None:
        pass

    def _rest(self) -> None:
        return None


class RenewedBeforeClaim:
    """B's store: its claims wait until ``renew()`` (A's keeper's beat) has applied."""

    def __init__(self, store: Any, renew: Any) -> None:
        self._store = store
        self._renew = renew
        self.claims = 0

    def _renew_first(self) -> None:
        self.claims += 1
        self._renew()

    def claim(self, *args: Any) -> Any:
        self._renew_first()
        return self._store.claim(*args)

    def claim_many(self, *args: Any) -> Any:
        self._renew_first()
        return self._store.claim_many(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.mark.parametrize("design", [{"batch_size": 25}, {"batch_size": 25, "batch_claim": False}])
def test_a_claim_from_a_read_before_the_holders_renewal_is_refused(
    make_backend: Any, design: dict[str, Any]
) -> None:
    clock = ManualClock()
    shards = {"shards": 1} if make_backend.kind in ("moto", "dynamodb") else {}
    outbox = make_backend(clock=clock, **shards).outbox
    outbox.publish(Event("t", 1, id="e1"))
    runs: list[str] = []

    def b_handler(event: Event) -> None:
        runs.append("B")

    b_store = RenewedBeforeClaim(outbox._store, lambda: keeper.beat())
    b = OutboxWorker(
        b_store, b_handler, clock=clock, options=outbox.worker(print, lease=LEASE, **design).options
    )  # type: ignore[arg-type]

    def a_handler(event: Event) -> None:
        runs.append("A")
        clock.advance(LEASE + 1)  # A stalls: its keeper did not beat, the lease ran out
        b.run_once()  # B reads e1 (lease run out), A's keeper renews, then B claims

    a = outbox.worker(a_handler, lease=LEASE)
    keeper = ManualKeeper(a.delivery, a.lease_ms / 3000)
    a.delivery.keeper = keeper
    assert a.run_once() == 1
    assert b_store.claims >= 1, "B never claimed: the history did not happen"
    assert runs == ["A"], f"two holders ran e1's handler: {runs}"
    assert outbox.get("e1").status is EventStatus.COMPLETED
    assert a.lost == 0
