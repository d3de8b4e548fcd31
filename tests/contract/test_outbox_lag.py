"""Outbox lag: ``stats()`` reports the age of the oldest due pending event and of the earliest
expired lease (one one-item index query per shard and status, no scan), and the metrics
listener gets both."""

from __future__ import annotations

from typing import Any

from dynacoord import ManualClock
from dynacoord.outbox import Event
from dynacoord.outbox.event import new_event_id
from tests.test_metrics import Recorder


def test_stats_report_the_lag_of_the_backlog_and_of_expired_leases(make_backend: Any) -> None:
    clock = ManualClock()
    recorder = Recorder()
    backend = make_backend(clock=clock, metrics=recorder)
    outbox = backend.outbox
    stats = outbox.stats()
    assert (stats.oldest_due_age, stats.expired_lease_age) == (None, None)
    # an event is due when it occurred: on the manual clock's time here
    outbox.publish(
        [
            Event("t", 1, id="first", occurred_at=clock.time()),
            Event("t", 2, id="second", occurred_at=clock.time()),
        ]
    )
    clock.advance(5)
    outbox.publish(Event("t", 3, id="third", occurred_at=clock.time()))
    stats = outbox.stats()
    assert stats.oldest_due_age == 5.0 and stats.expired_lease_age is None
    # A worker claims "first" and dies: its lease (3 s) runs out 2 s before the next look.
    store = outbox._store
    [seen] = [r for r in outbox.pending() if r.id == "first"]
    now = int(clock.time() * 1000)
    assert store.claim(seen, new_event_id(), now + 3000, now) is not None
    clock.advance(5)
    stats = outbox.stats()
    assert stats.oldest_due_age == 10.0  # "second", due since the first publish
    assert stats.expired_lease_age == 2.0
    assert (stats.pending, stats.in_flight) == (2, 1)
    assert stats.as_dict()["expired_lease_age"] == 2.0
    ages = {p[0]: p[1] for p in recorder.points if p[0].startswith("Outbox") and "Age" in p[0]}
    assert ages == {"OutboxOldestDueAge": 10_000, "OutboxExpiredLeaseAge": 2_000}, ages
