"""Issue 49: an increment that restarts an expired counter is "whoever writes next" too.

A counter's item keeps its counting slots when it expires (a retry of an increment across the
expiry must still find its slot). The increment that restarts it must then drop the slots no
call can retry any more, as any other counting write does: otherwise a counter written by
one-shot processes, then left to expire, keeps every one of their slots through each restart,
past the bound of docs/counters.md (the writers of one window). Cheap: moto and DynamoDB Local.
"""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord._writers import PRUNE_AT
from tests.slot_pools import Process, stored_slots

ONE_SHOT = 40


@pytest.mark.parametrize("make_backend", ["moto", "dynamodb"], indirect=True)
def test_a_restart_after_expiry_drops_the_slots_of_one_shot_writers(make_backend: Any) -> None:
    clock = ManualClock()
    backend = make_backend(clock=clock)
    counters = backend.counters
    for _ in range(ONE_SHOT):
        Process(backend.table).run(lambda: counters.increment("jobs", ttl=5.0))
        clock.advance(0.01)
    assert stored_slots(backend, make_backend.kind, "jobs") == ONE_SHOT
    # past the counter's expiry and every one of those calls' retry window
    clock.advance(backend.table.count_window_ms / 1000 + 10)
    assert counters.get("jobs") is None
    got = Process(backend.table).run(counters.increment, "jobs")
    assert got == 1
    # the restart's own slot, and no more stale ones than a later write may leave
    assert stored_slots(backend, make_backend.kind, "jobs") <= PRUNE_AT + 1
