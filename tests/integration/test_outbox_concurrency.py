"""Outbox delivery under real contention on Amazon DynamoDB Local.

Four worker threads (500 events each on average) poll the same namespace while events are still
being published: every event must be delivered exactly once (no worker crashes or overruns its
lease here, so at-least-once must not produce duplicates), and nothing may be left pending, in
flight or failed.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from dynacoord import Event
from tests.outbox_helpers import drain

WORKERS = 4


def _deliver_concurrently(backend, total: int, *, batch: int = 50) -> None:
    outbox = backend.outbox
    deliveries: Counter[int] = Counter()
    guard = threading.Lock()
    errors: list[BaseException] = []
    published = threading.Event()

    def handler(event: Event) -> None:
        assert event.attempt == 1
        with guard:
            deliveries[event.payload["n"]] += 1

    workers = [
        outbox.worker(handler, batch_size=25, lease=60, heartbeat=False, name=f"w{i}")
        for i in range(WORKERS)
    ]

    def work(worker) -> None:
        try:
            idle_after_publish = 0
            while idle_after_publish < 2:
                done_publishing = published.is_set()
                if worker.run_once() == 0:
                    if done_publishing:
                        idle_after_publish += 1
                    else:
                        time.sleep(0.01)
                else:
                    idle_after_publish = 0
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    try:
        for start in range(0, total, batch):
            outbox.publish([Event("load", {"n": n}) for n in range(start, start + batch)])
    finally:
        published.set()
        for t in threads:
            t.join(120)
    assert not errors, errors[:3]
    assert deliveries == Counter(range(total)), "an event was lost or delivered twice"
    stats = outbox.stats()
    assert (stats.pending, stats.in_flight, stats.failed) == (0, 0, 0)
    assert sum(w.delivered for w in workers) == total
    assert sum(w.lost for w in workers) == 0


@pytest.mark.integration
def test_4_workers_x_500_events_each_delivered_once_none_left(ddb_backend):
    # 2000 events published in batches of 100 while 4 workers poll (about 30 s on DynamoDB Local)
    _deliver_concurrently(ddb_backend, WORKERS * 500, batch=100)


@pytest.mark.integration
def test_zombies_are_recovered_while_others_work(ddb_backend):
    """Half the claims die mid-event; after the lease the survivors deliver every event."""
    from dynacoord import ManualClock
    from tests.conftest import _dynamodb_factory

    clock = ManualClock()
    client, table = ddb_backend.client, ddb_backend.table_name
    backend = _dynamodb_factory(client, table)(clock=clock, namespace=ddb_backend.namespace + "z")
    outbox = backend.outbox
    outbox.publish([Event("job", i) for i in range(40)])

    class Crash(BaseException):
        pass

    def die_on_odd(event):
        if event.payload % 2:
            raise Crash()

    crasher = outbox.worker(die_on_odd, heartbeat=False, lease=30)
    for _ in range(100):
        try:
            if crasher.run_once() == 0:
                break
        except Crash:
            pass
    assert outbox.stats().in_flight == 20
    clock.advance(30)
    deliveries: Counter[int] = Counter()
    guard = threading.Lock()

    def handler(event):
        assert event.attempt == 2
        with guard:
            deliveries[event.payload] += 1

    rescuers = [outbox.worker(handler, batch_size=5) for _ in range(WORKERS)]

    threads = [threading.Thread(target=drain, args=(w,)) for w in rescuers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert deliveries == Counter(range(1, 40, 2))
    assert outbox.stats().in_flight == 0
