"""A FailureRate breaker at a real fleet (issues 49 section 3 and 50; docs/breaker.md, "A
churning fleet").

Breaker items have no TTL: the state must outlive every process. So the writer slots its window
writes leave (one per call in flight, dynacoord._writers) must go with whoever writes next once
their calls can no longer retry, as a counter's do (tests/contract/test_counting_fleet.py),
or one-shot processes (cron jobs, CLI calls, Lambda environments reclaimed) grow the item for
good. Each simulated process (tests/slot_pools.Process) has its own slot pool and memory.
"""

from __future__ import annotations

from typing import Any

from dynacoord import FailureRate, ManualClock
from dynacoord._writers import PRUNE_AT
from dynacoord.keys import breaker_key
from tests.slot_pools import Process


def breaker_slots(backend: Any, kind: str, name: str) -> int:
    """How many writer slots the breaker ``name``'s stored item holds."""
    ident = breaker_key(backend.namespace, name)
    if kind in ("redis", "redis_cluster"):
        return int(backend.client.hlen(f"{{{ident.pk}}}|rq"))
    if kind in ("mongo", "mongodb"):
        doc = backend.coll.collection.find_one(ident.primary) or {}
        return len(doc.get("w") or {})
    item = backend.table.get_raw({"pk": {"S": ident.pk}, "sk": {"S": ident.sk}})
    return sum(1 for field in item or {} if field.startswith("w:"))


def test_one_shot_processes_flushing_a_failure_rate_breaker_leave_one_window_of_slots(
    make_backend,
) -> None:
    """300 processes that each make one call and flush it (a cron job's breaker), 40 per retry
    window: each slot is dropped by whoever writes after its window. Before (DynamoDB): the
    window write kept its own copy of the counting steps, which drops only what the table
    session remembered, so a process that wrote once never dropped anything: 300 slots
    (12 KB) on an item that never expires."""
    kind = getattr(make_backend, "kind", "")
    clock = ManualClock()
    backend = make_backend(clock=clock)
    table = getattr(backend, "table", None)
    window_s = (getattr(table, "count_window_ms", None) or 600_000) / 1000
    policy = FailureRate(minimum_calls=1000, window=60.0, flush_interval=0)
    per_window, writers = 40, 300
    for _ in range(writers):
        breaker = backend.breaker("cron", policy=policy)  # one per process
        Process(table).run(breaker.call, lambda: None)
        clock.advance(window_s / per_window)
    slack = 4 * PRUNE_AT if kind in ("dynamodb", "moto") else PRUNE_AT
    assert breaker_slots(backend, kind, "cron") <= per_window + slack + 1
    status = backend.breaker("cron", policy=policy).status()
    assert status.state.value == "closed"
