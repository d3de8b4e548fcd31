"""A poison event fails alone, with real processes (issue 49): e1's handler SIGKILLs its worker
process (as an OOM kill or a Lambda timeout ends it), e2 and e3 were claimed in the same batch.
Round after round a fresh process (its clock a lease later than the last) polls until it finds
nothing or dies. e1 must end failed after ``max_attempts`` deaths in its own handler; e2 and e3
are delivered, each handler run once (before the fix all three were stored failed after
``max_attempts`` rounds, e2's and e3's handlers never run), and an always-raising batchmate
fails after exactly ``max_attempts`` runs of its own handler. On DynamoDB Local and
redis-server; tests/contract/test_outbox_poison_event.py has the same histories on every
contract backend with a simulated death."""

from __future__ import annotations

import multiprocessing
import queue
import signal
import time
from typing import Any

import pytest

from dynacoord.outbox import Event, EventStatus
from dynacoord.testing import DynamoDBLocal, unique_name

from . import _workers

CTX = multiprocessing.get_context("spawn")
MAX_ATTEMPTS = 3


@pytest.fixture(params=["dynamodb", "redis"])
def target(request: pytest.FixtureRequest) -> tuple[str, ...]:
    if request.param == "redis":
        return ("redis", str(request.getfixturevalue("redis_server").port))
    server: DynamoDBLocal = request.getfixturevalue("dynamodb_local")
    _, table = request.getfixturevalue("ddb_table")
    return ("dynamodb", server.endpoint_url, table)


def _run_rounds(target: tuple[str, ...], payloads: dict[str, str]) -> tuple[Any, dict[str, int]]:
    namespace = unique_name("poison")
    one_shard = {"shards": 1} if target[0] == "dynamodb" else {}
    outbox = _workers.make_backend(target, namespace, **one_shard).outbox
    # One due time, so the queue holds them in id order: e1 runs first in the first batch.
    occurred = time.time()
    outbox.publish([Event("job", p, id=i, occurred_at=occurred) for i, p in payloads.items()])
    starts: dict[str, int] = {}
    results = CTX.Queue()
    at = time.time()
    for _round in range(4 * MAX_ATTEMPTS):
        process = CTX.Process(
            target=_workers.outbox_poison_round,
            args=(target, namespace, at, MAX_ATTEMPTS, results),
            daemon=True,
        )
        process.start()
        process.join(120)
        try:
            assert process.exitcode in (0, -signal.SIGKILL), process.exitcode
        finally:
            if process.is_alive():
                process.kill()
        while True:
            try:
                event_id, _attempt = results.get(timeout=0.5)
            except queue.Empty:
                break
            starts[event_id] = starts.get(event_id, 0) + 1
        records = {i: outbox.get(i) for i in payloads}
        if all(r.status in (EventStatus.COMPLETED, EventStatus.FAILED) for r in records.values()):
            return outbox, starts
        at += 31  # the dead process's 30 s leases have run out
    raise AssertionError(f"not finished: {records}; handler starts {starts}")


def test_a_poison_event_kills_only_its_own_chances(target: tuple[str, ...]) -> None:
    outbox, starts = _run_rounds(target, {"e1": "kill", "e2": "ok", "e3": "ok"})
    assert outbox.get("e1").status is EventStatus.FAILED
    assert starts["e1"] == MAX_ATTEMPTS, starts
    assert (outbox.get("e2").status, outbox.get("e3").status) == (EventStatus.COMPLETED,) * 2
    assert (starts["e2"], starts["e3"]) == (1, 1), starts


def test_an_always_raising_batchmate_fails_after_its_own_attempts(target: tuple[str, ...]) -> None:
    outbox, starts = _run_rounds(target, {"e1": "kill", "e2": "raise", "e3": "ok"})
    assert outbox.get("e2").status is EventStatus.FAILED
    assert starts["e2"] == MAX_ATTEMPTS, starts
    assert outbox.get("e3").status is EventStatus.COMPLETED
    assert starts["e3"] == 1, starts
