"""A counting write costs the same at any traffic (DESIGN.md section 1; issue 29).

Counters, ``cache.incr`` and the breaker's counts recognise their own applied write by one slot
per call in flight (dynacoord._writers), not by a list of recent tokens: the item holds one slot
per call in flight per process that wrote it within the window, whatever the rate. Units are counted by AWS's rules from the requests sent and the
items' sizes (bench/_units.py), with a ManualClock advancing 1/rate s per call, so the table
holds what a real run at that rate leaves.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from bench._units import UnitMeter, item_size, write_units
from dynacoord import ManualClock
from dynacoord._writers import PRUNE_AT
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.testing import unique_name
from tests.slot_pools import Process

# -- the unit rules themselves ------------------------------------------------------------------


def test_item_size_follows_the_aws_rules() -> None:
    item = {
        "pk": {"S": "abc"},  # 2 + 3
        "n": {"N": "12345"},  # 1 + (5 + 1) // 2 + 1 = 1 + 4
        "big": {"N": "-100"},  # 3 + 1 digit: 1 + 1
        "ss": {"SS": ["ab", "c"]},  # 2 + 3
        "m": {"M": {"a": {"BOOL": True}}},  # 1 + 3 + 1 + 1
        "l": {"L": [{"S": "xy"}]},  # 1 + 3 + 1 + 2
    }
    assert item_size(item) == 5 + 5 + 5 + 5 + 6 + 7
    assert write_units(0, 1024) == 1
    assert write_units(1025, 10) == 2
    assert write_units(10, 10, transaction=True) == 2


# -- WCU per increment at a sustained rate --------------------------------------------------------


def _metered(client: Any, table: str, clock: ManualClock) -> tuple[DynamoDBBackend, UnitMeter]:
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("wc"), clock=clock)
    return backend, UnitMeter(client, client, table)


def _wcu_per_call(meter: UnitMeter, clock: ManualClock, rate: float, calls: int, op: Any) -> float:
    """Run ``op`` ``calls`` times, the clock advancing 1/rate s per call; the WCU per call of the
    second half (steady state: the first half covers more than a window at the lowest rate)."""
    half = calls // 2
    for i in range(calls):
        if i == half:
            start_wcu, start_requests = meter.wcu, sum(meter.requests.values())
        op()
        clock.advance(1 / rate)
    requests = sum(meter.requests.values()) - start_requests
    assert requests == 2 * (calls - half) or requests == calls - half  # no hidden extra writes
    return (meter.wcu - start_wcu) / (calls - half)


# 1,500 calls at 10/s: 150 s, past two windows of the previous design's token sets; at the
# higher rates one writer's slot settles within a few calls, and 300 keep make test's budget.
@pytest.mark.parametrize(("rate", "calls"), [(10, 1500), (100, 400), (1000, 300)])
def test_an_increment_costs_at_most_2_wcu_at_any_rate(moto_table, rate, calls) -> None:
    client, table = moto_table
    clock = ManualClock()
    backend, meter = _metered(client, table, clock)
    counters = backend.counters
    try:
        wcu = _wcu_per_call(meter, clock, rate, calls, lambda: counters.increment("hot"))
    finally:
        meter.close()
    assert wcu <= 2, f"{wcu} WCU per increment at {rate}/s"
    assert meter.requests["UpdateItem"] == calls
    assert counters.get("hot") == calls


@pytest.mark.parametrize("rate", [10, 1000])
def test_cache_incr_costs_at_most_2_wcu_on_table_and_index(moto_table, rate) -> None:
    client, table = moto_table
    clock = ManualClock()
    backend, meter = _metered(client, table, clock)
    cache = backend.cache()
    try:
        start_index = meter.index_wcu
        wcu = _wcu_per_call(meter, clock, rate, 600, lambda: cache.incr("hot"))
        index = (meter.index_wcu - start_index) / 600
    finally:
        meter.close()
    assert wcu <= 2 and index <= 2, (wcu, index)
    assert cache.get("hot") == 600


def test_a_breaker_failure_costs_at_most_2_wcu_and_the_item_stays_small(moto_table) -> None:
    client, table = moto_table
    clock = ManualClock()
    backend, meter = _metered(client, table, clock)
    breaker = backend.breaker("svc", failure_threshold=10**9, reset_timeout=60)
    try:
        wcu = _wcu_per_call(meter, clock, 100, 1000, breaker.record_failure)
    finally:
        meter.close()
    assert wcu <= 2
    assert max(meter.sizes.values()) < 1024


def test_the_counter_item_keeps_its_size_on_dynamodb_local(ddb_table) -> None:
    """The size proof on Amazon's own emulator: 900 increments at 10/s (90 s, past one window)
    leave an item of a few dozen bytes, 1 WCU each."""
    client, table = ddb_table
    clock = ManualClock()
    backend, meter = _metered(client, table, clock)
    counters = backend.counters
    try:
        wcu = _wcu_per_call(meter, clock, 10, 900, lambda: counters.increment("hot"))
    finally:
        meter.close()
    assert wcu == 1
    (size,) = meter.sizes.values()
    assert size < 128, size


# -- many writers: the slots of writers gone quiet are dropped ------------------------------------


def _slots(client: Any, table: str, pk: str) -> dict[str, Any]:
    item = client.get_item(
        TableName=table, Key={"pk": {"S": pk}, "sk": {"S": "COUNTER"}}, ConsistentRead=True
    )["Item"]
    return {k: v for k, v in item.items() if k.startswith("w:")}


def _window_s(backend: DynamoDBBackend) -> float:
    return backend.table.count_window_ms / 1000


def test_slots_of_quiet_writers_are_dropped(ddb_table) -> None:
    client, table = ddb_table
    clock = ManualClock()
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("wc"), clock=clock)
    counters = backend.counters
    writers = 3 * PRUNE_AT

    def write() -> None:
        for _ in range(3):
            counters.increment("many")

    for _ in range(writers):
        Process().run(write)
    pk = f"COUNTER#{backend.namespace}#many"
    assert len(_slots(client, table, pk)) == writers  # one slot per process, not per write
    clock.advance(_window_s(backend) + 1)
    counters.increment("many")  # sees the stale slots
    counters.increment("many")  # drops 16 of them (a bounded number per write)
    counters.increment("many")  # and the rest
    assert len(_slots(client, table, pk)) == 1
    assert counters.get("many") == 3 * writers + 3


def test_a_writer_that_came_back_keeps_its_slot(ddb_table) -> None:
    """A stale slot is dropped only while it holds the token seen: a slot leased and written
    again in between is kept (its retry may still come), and the dropping write is sent again.
    The writer that comes back may be the process that saw its slot stale: it must not drop its
    own slot in the write that sets it (DynamoDB refused that request before)."""
    client, table = ddb_table
    clock = ManualClock()
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("wc"), clock=clock)
    counters = backend.counters
    processes = [Process() for _ in range(PRUNE_AT + 1)]
    for process in processes:
        process.run(counters.increment, "k")
    pk = f"COUNTER#{backend.namespace}#k"
    observer = processes[-1]
    # any writer but the observer (whose own slot it never sees stale)
    back = next(n for n in _slots(client, table, pk) if n != f"w:{observer._pool.process}0")
    # what the observer saw is its process's memory (dynacoord._writers.remember), which the
    # writer coming back does not share
    assert back in {name for name, _, _ in observer._pool.seen[pk]}
    clock.advance(_window_s(backend) + 1)  # every slot the observer saw is stale now
    for process in processes:
        if f"w:{process._pool.process}0" == back:
            process.run(counters.increment, "k")  # comes back after its slot turned stale
    observer.run(counters.increment, "k")  # its drop is refused for that slot: sent again
    observer.run(counters.increment, "k")  # drops the stale slots its last answer showed
    after = _slots(client, table, pk)
    assert counters.get("k") == len(processes) + 1 + 2
    # the observer's slot and the one that came back (rewritten since it was seen, so kept)
    assert set(after) == {back, f"w:{observer._pool.process}0"}, sorted(after)


# -- the recognition still matters ---------------------------------------------------------------


def _disable_recognition(lossy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make counting writes forget their writer slot's token (the condition/filter that refuses
    a retry of an applied write)."""
    if lossy.kind == "dynamodb":
        from dynacoord.backends.dynamodb import _counting

        monkeypatch.setattr(
            _counting.CountingToken,
            "condition",
            "(attribute_not_exists(#rqw) OR attribute_exists(#rqw))",
        )
    elif lossy.kind in ("redis", "redis_cluster"):
        from dynacoord.backends.redis import counters

        monkeypatch.setattr(
            counters,
            "_ADD",
            counters._ADD.replace("if seen(KEYS[2], ARGV[5]) then return reply(1) end", ""),
        )
    else:
        from dynacoord.backends.mongo import _collection

        monkeypatch.setattr(_collection.CountingToken, "unapplied", property(lambda self: {}))


def test_without_the_writer_slot_a_lost_response_counts_twice(lossy, monkeypatch) -> None:
    counters = lossy.backend().counters
    counters.increment("n", 10)
    _disable_recognition(lossy, monkeypatch)
    lossy.lose_next()
    counters.increment("n")
    assert lossy.lost == 1
    assert counters.get("n") == 12  # counted twice: the slot is what makes it 11


def test_a_lost_response_counts_once_after_many_other_writers(lossy) -> None:
    """Exactness does not depend on traffic: other writers' increments in the gap before the
    retry (the previous MongoDB design kept the last 128 tokens) do not push the token out."""
    counters = lossy.backend().counters
    others = [threading.Thread(target=lambda: [counters.increment("n") for _ in range(200)])]
    lossy.lose_next(then=lambda: [t.start() or t.join() for t in others])
    assert counters.increment("n") in (1, 201)
    assert lossy.lost == 1
    assert counters.get("n") == 201
