"""Counting at a real fleet: the cost of an increment is set by the writers of one window,
whatever their lifetimes (issues 49 section 3 and 50; docs/counters.md, "A churning fleet").

A counting write keeps one slot per call in flight on the item (dynacoord._writers). Fleets as
they run leave slots of writers that will never write again: Lambda environments reclaimed
after a few minutes, one-shot processes (cron jobs, CLI calls, a fork per task), a burst of
calls. Their slots must be dropped by *whoever writes next* once their calls can no longer
retry, without the drops refusing anyone's write, so that an item holds the slots of one
window's writers and an increment stays within 2 WCU for 120 of them.

Each simulated process here (tests/slot_pools.Process) has its own slot pool and its own
memory of what its writes saw, as a real process has; the clock is a ManualClock; units are
counted by AWS's rules from the items' sizes (bench/_units.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from botocore.config import Config

from bench._units import UnitMeter, item_size
from dynacoord import ManualClock
from dynacoord._writers import PRUNE_AT
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.testing import unique_name
from tests.slot_pools import Process, stored_slots

#: a client whose retries end 70 s after a call starts: 3 x (5 + 5) s + 2 x 20 s of backoff
SHORT_WINDOW = Config(
    connect_timeout=5,
    read_timeout=5,
    retries={"mode": "standard", "total_max_attempts": 3},
    max_pool_connections=64,
)
WINDOW_S = 70


@pytest.fixture()
def fleet(dynamodb_local: Any, ddb_table: Any) -> Iterator[tuple[DynamoDBBackend, UnitMeter]]:
    """A backend on DynamoDB Local with a 70 s retry window and a ManualClock, and a meter of
    its requests."""
    _, table = ddb_table
    client = dynamodb_local.client(config=SHORT_WINDOW)
    clock = ManualClock()
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("fl"), clock=clock)
    assert backend.table.count_window_ms == WINDOW_S * 1000
    meter = UnitMeter(client, dynamodb_local.client(), table)
    try:
        yield backend, meter
    finally:
        meter.close()


def _item(backend: DynamoDBBackend, key: str) -> dict[str, Any]:
    item = backend.client.get_item(
        TableName=backend.table_name,
        Key={"pk": {"S": f"COUNTER#{backend.namespace}#{key}"}, "sk": {"S": "COUNTER"}},
        ConsistentRead=True,
    ).get("Item")
    return item or {}


def _slots(item: dict[str, Any]) -> int:
    return sum(1 for name in item if name.startswith("w:"))


def _clock(backend: DynamoDBBackend) -> ManualClock:
    clock = backend.clock
    assert isinstance(clock, ManualClock)
    return clock


# -- a churning fleet ------------------------------------------------------------------------------


def test_a_churning_fleet_of_120_writers_per_window_keeps_an_increment_within_2_wcu(fleet) -> None:
    """40 environments alive, each replaced 30 s after it started, 4 calls/s spread over them,
    a 70 s window: the item carries the slots of ~120 environments (alive, or gone less than a
    window after their last write). Before: 3 WCU per increment (120 slots of ~19 bytes) plus
    writes refused by another process's drop, each billed and sent again."""
    backend, meter = fleet
    counters = backend.counters
    clock = _clock(backend)
    alive, lifetime, rate, calls = 40, 30.0, 4.0, 1600
    # (process, born at): staggered, so one environment is replaced every lifetime / alive s
    envs = [(Process(backend.table), -i * lifetime / alive) for i in range(alive)]
    last_write: dict[Process, float] = {}  # environment -> when it last wrote
    for i in range(calls):
        now = i / rate
        if i == calls // 2:
            start = meter.usage()
        at = i % alive
        if now - envs[at][1] >= lifetime:
            envs[at] = (Process(backend.table), now)
        last_write[envs[at][0]] = now
        with envs[at][0].active():
            counters.increment("orders")
        clock.advance(1 / rate)
    used = meter.usage()
    measured = calls - calls // 2
    wcu = (used.wcu - start.wcu) / measured
    item = _item(backend, "orders")
    last = (calls - 1) / rate  # the last write: slots of calls that may retry until then
    in_window = sum(1 for at in last_write.values() if at >= last - WINDOW_S)
    assert counters.get("orders") == calls
    assert in_window >= 118, in_window  # the fleet the goal names: ~120 writers per window
    assert in_window - 1 <= _slots(item) <= in_window + 4 * PRUNE_AT, (_slots(item), in_window)
    assert sum(used.refusals.values()) == 0, used.refusals  # no write refused by a drop
    assert wcu <= 2, f"{wcu} WCU per increment, item of {item_size(item)} bytes"


def test_120_environments_that_each_wrote_once_in_the_window_leave_2_wcu(fleet) -> None:
    backend, meter = fleet
    counters = backend.counters
    clock = _clock(backend)
    for _ in range(120):
        Process(backend.table).run(counters.increment, "k")
        clock.advance((WINDOW_S - 5) / 120)
    start = meter.wcu
    Process(backend.table).run(counters.increment, "k")
    # before: 3 WCU (121 slots of ~19 bytes: 2.4 KB)
    assert meter.wcu - start <= 2, item_size(_item(backend, "k"))
    assert counters.get("k") == 121


# -- one-shot writer processes ---------------------------------------------------------------------


def test_one_shot_writers_by_the_thousand_leave_the_item_bounded(fleet) -> None:
    """1,200 processes that each write once, one every 0.7 s (100 per window, 12 windows):
    each slot is dropped by whoever writes after its window. Before: a process that writes
    once never drops what it saw, so every slot stayed (1,200 slots, 23 KB; ~16,000 reach
    DynamoDB's 400 KB and every increment then fails)."""
    backend, _meter = fleet
    counters = backend.counters
    clock = _clock(backend)
    per_window, writers = 100, 1200
    worst = 0
    for i in range(writers):
        Process(backend.table).run(counters.increment, "cron")
        clock.advance(WINDOW_S / per_window)
        if i % 100 == 99:
            worst = max(worst, item_size(_item(backend, "cron")))
    item = _item(backend, "cron")
    assert counters.get("cron") == writers
    # the slots of one window, and at most 4 x PRUNE_AT stale ones waiting for a writer that
    # drops them in its own request; never a KB more for them
    assert _slots(item) <= per_window + 4 * PRUNE_AT + 1, _slots(item)
    assert worst <= 2048, worst


# -- a burst, then one writer ------------------------------------------------------------------


def _burst(counters: Any, calls: int) -> None:
    barrier = threading.Barrier(calls)

    def call() -> None:
        barrier.wait()
        counters.increment("b")

    threads = [threading.Thread(target=call) for _ in range(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_after_a_burst_of_200_calls_the_process_drops_back_to_1_wcu(fleet) -> None:
    """200 calls of one process at once hold 200 slots; once they have returned, none of them
    can be retried any more, and the process's next writes drop them (50 per request, in the
    increment's own request). Before: every later increment cost 4 WCU for the whole window."""
    backend, meter = fleet
    counters = backend.counters
    clock = _clock(backend)
    process = Process(backend.table)
    with process.active():
        _burst(counters, 200)
        for _ in range(4):  # each drops up to 50 of the burst's slots its last answer showed
            clock.advance(1)
            counters.increment("b")
        clock.advance(1)
        start = meter.wcu
        counters.increment("b")
    assert meter.wcu - start == 1, item_size(_item(backend, "b"))
    assert counters.get("b") == 205


def test_after_a_burst_of_200_processes_the_next_writer_drops_back_after_the_window(fleet) -> None:
    """200 processes' slots stay for their window (their retries may still come); once it has
    passed, the next write drops all of them. Before: 16 per write, after a write that saw
    them, so ~14 writes at up to 4 WCU each."""
    backend, meter = fleet
    counters = backend.counters
    clock = _clock(backend)
    for _ in range(200):
        Process(backend.table).run(counters.increment, "b")
    clock.advance(WINDOW_S + 1)
    writer = Process(backend.table)
    writer.run(counters.increment, "b")  # sees 200 stale slots and drops them
    start = meter.wcu
    writer.run(counters.increment, "b")
    assert meter.wcu - start == 1, _slots(_item(backend, "b"))
    assert counters.get("b") == 202


# -- drops race without refusing -------------------------------------------------------------------


def test_two_processes_dropping_the_same_stale_slots_in_their_writes_are_not_refused(
    fleet,
) -> None:
    """X and Y both saw the same stale slots; X's next write drops them, then Y's next write
    drops them too: they are gone, and Y's write applies (``attribute_not_exists(slot) OR
    slot = :seen``). Before: the first drop won and the other process's next write was
    refused, billed at the item's size, and sent again (0.74-0.94 refusals per increment
    at 4 calls/s in a fleet)."""
    backend, meter = fleet
    counters = backend.counters
    clock = _clock(backend)
    for _ in range(PRUNE_AT + 4):
        Process(backend.table).run(counters.increment, "r")
    clock.advance(WINDOW_S + 1)
    x, y = Process(backend.table), Process(backend.table)
    x.run(counters.increment, "r")  # both see the stale slots
    y.run(counters.increment, "r")
    clock.advance(1)
    start = meter.usage()
    x.run(counters.increment, "r")  # drops them
    y.run(counters.increment, "r")  # drops them too: they are gone
    used = meter.usage()
    assert sum(used.refusals.values()) - sum(start.refusals.values()) == 0, used.refusals
    assert sum(used.requests.values()) - sum(start.requests.values()) == 2
    assert _slots(_item(backend, "r")) == 2
    assert counters.get("r") == PRUNE_AT + 4 + 4


@contextmanager
def _before_the_drop(client: Any, action: Any) -> Iterator[list[bool]]:
    """Run ``action`` once, just before the next request that only drops slots is sent."""
    done: list[bool] = []

    def hook(params: dict[str, Any], **_: Any) -> None:
        if done or not str(params.get("UpdateExpression", "")).startswith("REMOVE "):
            return
        done.append(True)
        action()

    client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", hook)
    try:
        yield done
    finally:
        client.meta.events.unregister("before-parameter-build.dynamodb.UpdateItem", hook)


def test_two_one_shot_processes_dropping_the_same_stale_slots_are_not_refused(fleet) -> None:
    """A and B write once each and both see the same 40 stale slots: each drops them at once,
    B between A's write and A's drop. A's drop finds them gone and applies; nothing is
    refused."""
    backend, meter = fleet
    counters = backend.counters
    clock = _clock(backend)
    for _ in range(40):
        Process(backend.table).run(counters.increment, "r")
    clock.advance(WINDOW_S + 1)
    a, b = Process(backend.table), Process(backend.table)
    start = meter.usage()
    with _before_the_drop(backend.client, lambda: b.run(counters.increment, "r")) as done:
        a.run(counters.increment, "r")
    used = meter.usage()
    assert done, "A dropped the stale slots it saw"
    assert sum(used.refusals.values()) - sum(start.refusals.values()) == 0, used.refusals
    assert _slots(_item(backend, "r")) == 2
    assert counters.get("r") == 42


# -- sharded counters from 100 processes ---------------------------------------------------------


def test_each_shard_of_a_counter_written_by_100_processes_stays_within_2_wcu(fleet) -> None:
    backend, meter = fleet
    clock = _clock(backend)
    hits = backend.counters.sharded("hits", shards=8)
    processes = [Process(backend.table) for _ in range(100)]
    for _ in range(12):  # every process reaches (nearly) every shard
        for process in processes:
            with process.active():
                hits.increment()
            clock.advance(0.01)
    start = meter.usage()
    for process in processes:
        with process.active():
            hits.increment()
        clock.advance(0.01)
    used = meter.usage()
    assert (used.wcu - start.wcu) / len(processes) <= 2
    assert hits.value() == 13 * len(processes)


# -- Redis and MongoDB: the same fleet of one-shot writers ----------------------------------------


def test_one_shot_writers_leave_one_window_of_slots_on_every_backend(make_backend) -> None:
    kind = getattr(make_backend, "kind", "")
    if kind == "moto":
        pytest.skip("DynamoDB is proven on DynamoDB Local above")
    clock = ManualClock()
    backend = make_backend(clock=clock)
    counters = backend.counters
    table = getattr(backend, "table", None)
    window_s = (getattr(table, "count_window_ms", None) or 600_000) / 1000
    per_window = 40
    for _ in range(8 * per_window):  # eight windows
        Process(table).run(counters.increment, "cron")
        clock.advance(window_s / per_window)
    assert counters.get("cron") == 8 * per_window
    # DynamoDB leaves up to 4 x PRUNE_AT stale slots to be dropped inside a later write
    slack = 4 * PRUNE_AT if kind == "dynamodb" else PRUNE_AT
    assert stored_slots(backend, kind, "cron") <= per_window + slack + 1
