"""Worker processes killed (SIGKILL) or frozen (SIGSTOP) in the middle of a claimed batch, on
DynamoDB Local and redis-server: nothing is lost, and a frozen worker that wakes up after its
lease was taken over cannot overwrite the new claimant's outcomes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any

import pytest

from dynacoord._clock import ManualClock
from dynacoord.outbox import Event, EventStatus
from dynacoord.testing import DynamoDBLocal, unique_name

from . import _workers

CTX = multiprocessing.get_context("spawn")


@pytest.fixture(params=["dynamodb", "redis"])
def target(request: pytest.FixtureRequest) -> tuple[str, ...]:
    if request.param == "redis":
        return ("redis", str(request.getfixturevalue("redis_server").port))
    server: DynamoDBLocal = request.getfixturevalue("dynamodb_local")
    _, table = request.getfixturevalue("ddb_table")
    return ("dynamodb", server.endpoint_url, table)


def _start_victim(target: tuple[str, ...], namespace: str, lease: float) -> tuple[Any, Any]:
    started = CTX.Event()
    results = CTX.Queue()
    victim = CTX.Process(
        target=_workers.outbox_batch_victim,
        args=(target, namespace, started, lease, results),
        daemon=True,
    )
    victim.start()
    deadline = time.monotonic() + 60
    while not started.wait(0.2):
        assert victim.is_alive(), f"the victim exited early ({victim.exitcode})"
        assert time.monotonic() < deadline, "the victim never reached its third event"
    return victim, results


def test_a_worker_killed_mid_batch_loses_nothing(target: tuple[str, ...]) -> None:
    namespace = unique_name("batchkill")
    outbox = _workers.make_backend(target, namespace).outbox
    ids = outbox.publish([Event("job", i) for i in range(5)])
    victim, _ = _start_victim(target, namespace, _workers.VICTIM_LEASE)
    try:
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        assert victim.exitcode == -signal.SIGKILL
    finally:
        if victim.is_alive():
            victim.kill()
    # Nothing of the batch was stored yet (outcomes go out at the end of the batch): all five
    # wait for their lease, then any worker delivers them again.
    assert outbox.stats().in_flight == 5
    got: list[Event] = []
    assert outbox.worker(got.append, heartbeat=False).run_once() == 0
    later = _workers.make_backend(target, namespace)
    later_outbox = type(later.outbox)(
        later.outbox._store, clock=ManualClock(time.time() + _workers.VICTIM_LEASE + 1)
    )
    assert later_outbox.worker(got.append, heartbeat=False).run_once() == 5
    assert sorted(e.id for e in got) == sorted(ids)
    assert {e.attempt for e in got} == {2}
    assert all(later_outbox.get(i).status is EventStatus.COMPLETED for i in ids)


def test_a_frozen_worker_cannot_overwrite_the_worker_that_took_over(
    target: tuple[str, ...],
) -> None:
    namespace = unique_name("batchstop")
    outbox = _workers.make_backend(target, namespace).outbox
    ids = outbox.publish([Event("job", i) for i in range(5)])
    lease = 2.0
    victim, results = _start_victim(target, namespace, lease)
    try:
        os.kill(victim.pid, signal.SIGSTOP)
        time.sleep(lease + 0.5)  # its leases run out while it is frozen
        got: list[Event] = []
        rescuer = outbox.worker(got.append, heartbeat=False, lease=30)
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            rescuer.run_once()
            time.sleep(0.2)
        assert sorted(e.id for e in got) == sorted(ids)
        os.kill(victim.pid, signal.SIGCONT)
        delivered, lost, handled = results.get(timeout=60)
        victim.join(10)
    finally:
        if victim.is_alive():
            victim.kill()
    # The frozen worker stores nothing over the rescuer's claims (new lease tokens): the three
    # it had handled are refused, the two whose lease ran out before their turn are not run.
    assert (delivered, lost) == (0, 5)
    assert len(handled) == 3
    assert all(outbox.get(i).status is EventStatus.COMPLETED for i in ids)
    stats = outbox.stats()
    assert (stats.pending, stats.in_flight, stats.failed) == (0, 0, 0)
