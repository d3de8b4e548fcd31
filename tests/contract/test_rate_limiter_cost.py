"""What a rate limiter call costs on DynamoDB (docs/ratelimit.md, "Cost"), by AWS's rules.

Units are counted from the requests sent and the items' sizes (bench/_units.py) on DynamoDB
Local: an admitted call is one UpdateItem of 1 WCU and no read; a refusal is one refused
UpdateItem (1 WCU) the first time, and nothing once the caller has seen the limiter that full;
many writers at one instant cost about one write per admitted call (busy writes add to ``tat``
and never refuse each other).
"""

from __future__ import annotations

import threading
from typing import Any

from bench._units import UnitMeter
from dynacoord import ManualClock
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.testing import unique_name


def _metered(ddb_table: tuple[Any, str], clock: ManualClock) -> tuple[DynamoDBBackend, UnitMeter]:
    client, table = ddb_table
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("rc"), clock=clock)
    return backend, UnitMeter(client, client, table)


def test_an_admitted_call_is_one_write_unit_and_a_refusal_seen_is_free(ddb_table) -> None:
    clock = ManualClock()
    backend, meter = _metered(ddb_table, clock)
    try:
        limiter = backend.rate_limiter("cost", rate=100, per=1, burst=10)
        for _ in range(40):  # at the full rate: every call admitted
            assert limiter.try_acquire().admitted
            clock.advance(0.01)
        usage = meter.usage()
        assert usage.requests == {"UpdateItem": 40} and usage.wcu == 40 and usage.rcu == 0
        assert max(meter.sizes.values()) < 200  # tat, ttl, keys and one writer slot
        for _ in range(10):  # the burst
            assert limiter.try_acquire().admitted
        before = meter.usage()
        assert not limiter.try_acquire().admitted  # seen full already: no request
        assert (meter.usage() - before).total_requests == 0
        fresh = backend.rate_limiter("cost", rate=100, per=1, burst=10)
        assert not fresh.try_acquire().admitted  # one refused write tells it the wait
        spent = meter.usage() - before
        assert spent.requests == {"UpdateItem": 1} and spent.wcu == 1 and spent.rcu == 0
        assert spent.refusals["ConditionalCheckFailedException"] == 1
    finally:
        meter.close()


def test_many_writers_cost_about_one_write_per_admitted_call(ddb_table) -> None:
    clock = ManualClock()
    backend, meter = _metered(ddb_table, clock)
    threads, calls = 8, 10
    admitted: list[int] = []
    start = threading.Barrier(threads)
    try:

        def worker() -> None:
            limiter = backend.rate_limiter("many", rate=1000, per=1, burst=1000)
            start.wait()
            admitted.append(sum(limiter.try_acquire().admitted for _ in range(calls)))

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        usage = meter.usage()
        assert sum(admitted) == threads * calls
        # each object's first call guesses an idle limiter and may be refused once (the item
        # shows it busy), then busy writes add to tat and never refuse each other
        writes = usage.requests["UpdateItem"]
        assert writes <= threads * calls + 2 * threads, writes
        assert usage.rcu == 0
        print(f"\n{threads} writers x {calls}: {writes} UpdateItem, {usage.wcu} WCU")
    finally:
        meter.close()
