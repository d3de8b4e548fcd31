"""Worker-level cases of issue 28 (the outbox under failure), on every contract backend.

Each was found by an adversarial script and is now also a step sequence of the fault model
(tests/reliability/test_model_delivery.py); these cases pin the exact history. The lease keeper
is beaten by the test (``beat()``), on a manual clock, instead of its thread.
"""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.outbox import Event, EventStatus
from dynacoord.outbox.delivery import LeaseKeeper
from dynacoord.outbox.worker import OutboxWorker
from tests.outbox_helpers import drain

LEASE = 3.0


class ManualKeeper(LeaseKeeper):
    """A lease keeper whose beats the test calls (no thread)."""

    def _wake(self) -> None:
        pass

    def _rest(self) -> None:
        return None


def manual_keepers(worker: OutboxWorker) -> list[ManualKeeper]:
    """Give ``worker`` a keeper the test beats (one for the worker's life, as its own is);
    returns it in a list."""
    keeper = ManualKeeper(worker.delivery, worker.lease_ms / 3000)
    worker.delivery.keeper = keeper
    return [keeper]


def one_shard(make_backend: Any) -> dict[str, Any]:
    return {"shards": 1} if make_backend.kind in ("moto", "dynamodb") else {}


def test_a_slow_handler_never_lets_a_finished_events_lease_run_out(make_backend: Any) -> None:
    """Case 3: a batch [e1 fast, e2 slow (7 s with a 3 s lease)]: e1's outcome waits for the
    batch's end, and its lease must be kept meanwhile, or another worker delivers it again."""
    clock = ManualClock()
    backend = make_backend(clock=clock, **one_shard(make_backend))
    outbox = backend.outbox
    outbox.publish([Event("t", 1, id="e1"), Event("t", 2, id="e2")])
    delivered: list[str] = []
    other = outbox.worker(lambda e: delivered.append(f"other:{e.id}"), lease=LEASE)

    def handler(event: Event) -> None:
        delivered.append(event.id)
        if event.id == "e2":
            for _ in range(14):  # 7 s, the keeper beating as its thread would
                clock.advance(0.5)
                keepers[-1].beat()
                other.run_once()  # another worker polls meanwhile

    worker = outbox.worker(handler, lease=LEASE, batch_size=25)
    keepers = manual_keepers(worker)
    assert worker.run_once() == 2
    assert delivered == ["e1", "e2"], delivered
    assert outbox.get("e1").status is EventStatus.COMPLETED  # type: ignore[union-attr]


def test_a_follower_waits_for_a_head_its_worker_lost_while_frozen(make_backend: Any) -> None:
    """Case 2: worker A claims [x, head, follower] and freezes past its lease; B takes the head
    over and its handler fails (the head is pending again); A resumes, its keeper keeps x and the
    follower but not the head. A must not deliver the follower before the head."""
    clock = ManualClock()
    backend = make_backend(clock=clock, **one_shard(make_backend))
    outbox = backend.outbox
    outbox.publish(Event("t", 0, id="a-x"))
    clock.advance(0.001)
    outbox.publish(
        [
            Event("t", 1, id="b-head", group="acct", ordered=True),
            Event("t", 2, id="c-follower", group="acct", ordered=True),
        ]
    )
    seen: list[str] = []

    def failing(event: Event) -> None:
        seen.append(f"B:{event.id}")
        raise RuntimeError("downstream refused")

    worker_b = outbox.worker(failing, lease=LEASE, batch_size=2, backoff=0.5, max_backoff=0.5)

    def handler(event: Event) -> None:
        seen.append(f"A:{event.id}")
        if event.id == "a-x":
            clock.advance(LEASE + 0.5)  # frozen: no keeper beat
            assert worker_b.run_once() == 2  # takes x and the head over, fails both
            keepers[-1].beat()  # A resumes: its keeper wakes first

    worker_a = outbox.worker(handler, lease=LEASE, batch_size=25)
    keepers = manual_keepers(worker_a)
    worker_a.run_once()
    assert seen[:3] == ["A:a-x", "B:a-x", "B:b-head"], seen
    assert "A:c-follower" not in seen, seen
    follower = outbox.get("c-follower")
    assert follower is not None and follower.status is EventStatus.PENDING
    assert follower.attempts == 0  # given back unhandled
    # Once the head is delivered, the follower goes.
    clock.advance(2)
    delivered: list[str] = []
    drain(outbox.worker(lambda e: delivered.append(e.id), lease=LEASE), clock=clock)
    assert [i for i in delivered if i != "a-x"] == ["b-head", "c-follower"], delivered


def test_an_interrupt_after_a_flush_gives_back_only_what_was_not_started(
    make_backend: Any,
) -> None:
    """Case 6: after a mid-batch flush, a KeyboardInterrupt in e3's handler leaves e3 in flight
    (claimed again after its lease, its attempt counted) and gives back e4, not e3."""
    clock = ManualClock()
    backend = make_backend(clock=clock, **one_shard(make_backend))
    outbox = backend.outbox
    ids = ["e1", "e2", "e3", "e4"]
    for event_id in ids:
        outbox.publish(Event("t", event_id, id=event_id))
        clock.advance(0.001)

    def handler(event: Event) -> None:
        if event.id == "e2":
            clock.advance(LEASE / 3 + 0.1)  # past flush_by: e1 and e2 are stored after it
        if event.id == "e3":
            raise KeyboardInterrupt

    worker = outbox.worker(handler, lease=LEASE, batch_size=25, heartbeat=False)
    with pytest.raises(KeyboardInterrupt):
        worker.run_once()
    status = {i: (r.status, r.attempts) for i in ids if (r := outbox.get(i)) is not None}
    assert status == {
        "e1": (EventStatus.COMPLETED, 1),
        "e2": (EventStatus.COMPLETED, 1),
        "e3": (EventStatus.IN_FLIGHT, 1),
        "e4": (EventStatus.PENDING, 0),
    }, status


def test_a_blocked_follower_on_the_home_shard_does_not_starve_its_head(ddb_table: Any) -> None:
    """Found by the fault model: publishers with 8 and 4 shards put an ordered group's head and
    follower on two shards. A batch_size=1 worker whose home shard holds the follower found it
    due at every poll (it is postponed a second at a time), claimed nothing, and never read the
    head's shard: the group never moved. A poll that claims nothing starts the next one at the
    next shard."""
    from dynacoord.keys import shard_of
    from tests.conftest import _dynamodb_factory

    client, table = ddb_table
    group = next(
        f"acct-{i}" for i in range(100) if shard_of(f"acct-{i}", 8) != shard_of(f"acct-{i}", 4)
    )
    clock = ManualClock()
    make = _dynamodb_factory(client, table)
    wide = make(clock=clock, shards=8)
    narrow = make(clock=clock, shards=4, namespace=wide.namespace)
    wide.outbox.publish(
        Event("t", 1, id="head", group=group, ordered=True, occurred_at=clock.time())
    )
    narrow.outbox.publish(
        Event("t", 2, id="follower", group=group, ordered=True, occurred_at=clock.time() - 1)
    )
    delivered: list[str] = []
    worker = make(clock=clock, shards=1, namespace=wide.namespace).outbox.worker(
        lambda e: delivered.append(e.id), batch_size=1, lease=LEASE, heartbeat=False
    )
    worker._shards = worker._store.refresh_shards()  # 8, as its first poll reads
    # Its home is shard 0, where its own postpone (one shard of its own) puts the follower.
    worker._shard_skew = (0 - worker._group.offset - worker._number) % 8
    for _ in range(20):
        worker.run_once()
        clock.advance(LEASE)
        if delivered == ["head", "follower"]:
            break
    assert delivered == ["head", "follower"], delivered
