"""Separate processes (spawn) against the session's DynamoDB Local and redis-server: locks,
outbox, idempotency.

``make test`` runs short versions; ``make stress`` (``-m stress``) runs the long ones. Processes,
not threads: each has its own boto3 client, connection pool and GIL, like real service instances.
"""

from __future__ import annotations

import multiprocessing
import queue
from collections import Counter
from typing import Any

import pytest

from dynacoord.outbox import Event
from dynacoord.testing import DynamoDBLocal, unique_name
from tests.reliability import _workers

PROCESSES = 4
CTX = multiprocessing.get_context("spawn")


def _run(target: Any, args_for: Any) -> list[Any]:
    procs = [CTX.Process(target=target, args=args_for(i), daemon=True) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    return procs


def _join(procs: list[Any], timeout: float) -> None:
    for p in procs:
        p.join(timeout)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join()
    assert not alive, f"{len(alive)} worker processes did not finish in time"
    assert [p.exitcode for p in procs] == [0] * len(procs)


def _collect(results: Any, procs: list[Any], timeout: float) -> list[Any]:
    out = []
    for _ in procs:
        try:
            out.append(results.get(timeout=timeout))
        except queue.Empty:
            break
    return out


def _locks(target: tuple[str, ...], lock_keys: list[str], rounds: int) -> None:
    namespace = unique_name("stress")
    inside = {k: CTX.Value("i", 0) for k in lock_keys}
    last_fence = {k: CTX.Value("q", 0) for k in lock_keys}
    violations = CTX.Value("i", 0)
    sections = CTX.Value("i", 0)
    barrier = CTX.Barrier(PROCESSES)
    procs = _run(
        _workers.lock_worker,
        lambda i: (
            target,
            namespace,
            lock_keys,
            rounds,
            inside,
            last_fence,
            violations,
            sections,
            barrier,
        ),
    )
    _join(procs, timeout=240)
    assert violations.value == 0, "overlapping critical sections or non-increasing fences"
    assert sections.value == PROCESSES * rounds
    assert all(v.value == 0 for v in inside.values())


def _outbox(target: tuple[str, ...], total: int) -> None:
    namespace = unique_name("stress")
    outbox = _workers.make_backend(target, namespace).outbox
    published: list[str] = []
    for start in range(0, total, 100):
        published += outbox.publish([Event("stress", i) for i in range(start, start + 100)])
    assert outbox.stats().pending == total
    delivered = CTX.Value("i", 0)
    results = CTX.Queue()
    barrier = CTX.Barrier(PROCESSES)
    deadline = 60 + total * 0.05
    procs = _run(
        _workers.outbox_worker,
        lambda i: (target, namespace, total, delivered, results, barrier, deadline),
    )
    per_process = _collect(results, procs, timeout=deadline + 60)
    _join(procs, timeout=30)
    counts = Counter(event_id for _, ids in per_process for event_id in ids)
    duplicates = {k: n for k, n in counts.items() if n > 1}
    assert duplicates == {}, f"{len(duplicates)} events delivered more than once"
    assert set(counts) == set(published), "some events were never delivered"
    assert len([1 for _, ids in per_process if ids]) >= 2, "only one process did the work"
    stats = outbox.stats()
    assert (stats.pending, stats.in_flight, stats.failed) == (0, 0, 0)


def _idempotency(target: tuple[str, ...], n_keys: int) -> None:
    namespace = unique_name("stress")
    idem_keys = [f"order-{i}" for i in range(n_keys)]
    runs = {k: CTX.Value("i", 0) for k in idem_keys}
    results = CTX.Queue()
    barrier = CTX.Barrier(PROCESSES)
    procs = _run(
        _workers.idempotency_worker,
        lambda i: (target, namespace, idem_keys, runs, results, barrier),
    )
    per_process = _collect(results, procs, timeout=240)
    _join(procs, timeout=30)
    assert len(per_process) == PROCESSES
    assert {k: v.value for k, v in runs.items()} == dict.fromkeys(idem_keys, 1)
    for k in idem_keys:
        answers = {got[k] for _, got in per_process}
        assert len(answers) == 1, f"processes saw different results for {k!r}: {answers}"


@pytest.fixture(params=["dynamodb", "redis"])
def target(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """Where the worker processes connect: DynamoDB Local (session table) or redis-server."""
    if request.param == "redis":
        return ("redis", str(request.getfixturevalue("redis_server").port))
    server: DynamoDBLocal = request.getfixturevalue("dynamodb_local")
    _, table = request.getfixturevalue("ddb_table")
    return ("dynamodb", server.endpoint_url, table)


def test_4_processes_locks_no_overlap_fences_increase(target: tuple[str, ...]) -> None:
    _locks(target, ["p0", "p1"], rounds=15)


@pytest.mark.stress
@pytest.mark.timeout(900)
def test_stress_4_processes_locks(target: tuple[str, ...]) -> None:
    _locks(target, ["s0", "s1", "s2"], rounds=250)


def test_4_processes_outbox_each_event_once(target: tuple[str, ...]) -> None:
    _outbox(target, total=300)


@pytest.mark.stress
@pytest.mark.timeout(900)
def test_stress_4_processes_outbox_5000_events(target: tuple[str, ...]) -> None:
    _outbox(target, total=5000)


def test_4_processes_idempotency_body_runs_once_per_key(target: tuple[str, ...]) -> None:
    _idempotency(target, n_keys=10)


@pytest.mark.stress
@pytest.mark.timeout(900)
def test_stress_4_processes_idempotency(target: tuple[str, ...]) -> None:
    _idempotency(target, n_keys=200)
