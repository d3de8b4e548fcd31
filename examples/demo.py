"""`make demo`: the main job of dynacoord on an embedded DynamoDB, narrated.

Runs against Amazon DynamoDB Local when Java and the jar are available (`make dynamodb-local`),
otherwise against moto's in-process DynamoDB. Nothing here touches AWS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3

from dynacoord import CircuitOpenError, DynamoDBBackend, Event, IdempotencyKeyMismatchError
from dynacoord.provision import ensure_table
from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal, find_dynamodb_local

TABLE = "dynacoord-demo"


def say(message: str) -> None:
    print(f"  {message}", flush=True)


@contextlib.contextmanager
def embedded_dynamodb() -> Iterator[Any]:
    forced_moto = os.environ.get("DYNACOORD_DEMO_BACKEND") == "moto"
    if not forced_moto and shutil.which("java") and find_dynamodb_local():
        with DynamoDBLocal() as server:
            print(f"* Amazon DynamoDB Local on {server.endpoint_url}")
            yield server.client()
        return
    from moto import mock_aws

    print("* Java or DynamoDB Local missing: using moto's in-process DynamoDB")
    with mock_aws():
        yield boto3.client("dynamodb", **DUMMY_CREDENTIALS)


def demo_locks(backend: DynamoDBBackend) -> None:
    print("* Locks with fencing tokens")
    locks = backend.locks
    lease = locks.acquire("nightly-report", ttl=5, owner="worker-a")
    assert lease is not None
    say(f"worker-a acquired 'nightly-report' with fence {lease.fence}")
    other = locks.acquire("nightly-report", ttl=5, owner="worker-b")
    say(f"worker-b tries while it is held -> {other}")
    lease.release()
    say("worker-a released it")
    lease_b = locks.acquire("nightly-report", ttl=5, owner="worker-b")
    assert lease_b is not None
    say(f"worker-b acquired it with fence {lease_b.fence} (> {lease.fence}: stale writers lose)")
    lease_b.release()

    print("* hold() renews in the background while the work outlives the TTL")
    with locks.hold("compaction", ttl=0.6) as held:
        time.sleep(1.2)
        say(f"after 1.2 s on a 0.6 s TTL the lease is still ours: lost={held.lost}")

    print("* 4 threads x 10 critical sections on one key")
    inside = 0
    worst = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, worst
        for _ in range(10):
            with locks.hold("counter", ttl=5, timeout=30, heartbeat=False):
                with guard:
                    inside += 1
                    worst = max(worst, inside)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    say(f"most threads inside at once: {worst} (mutual exclusion held)")


def demo_cache(backend: DynamoDBBackend) -> None:
    print("* Cache with stampede protection")
    cache = backend.cache(default_ttl=60)
    calls = []

    def slow_rate() -> float:
        calls.append(1)
        time.sleep(0.3)
        return 1.0842

    threads = [
        threading.Thread(target=cache.get_or_set, args=("eur-usd", slow_rate)) for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    say(f"6 threads asked for a cold key; the loader ran {len(calls)} time(s)")
    say(f"cache.get('eur-usd') -> {cache.get('eur-usd')!r}; keys('eur-*') -> {cache.keys('eur-*')}")


def demo_breaker(backend: DynamoDBBackend) -> None:
    print("* Circuit breaker shared by every process")
    breaker = backend.breaker("payments-api", failure_threshold=3, reset_timeout=0.5)

    def flaky() -> None:
        raise ConnectionError("payments-api down")

    for _ in range(3):
        with contextlib.suppress(ConnectionError):
            breaker.call(flaky)
    status = breaker.status()
    say(f"after 3 failures: state={status.state.value}, failures={status.failures}")
    try:
        breaker.call(lambda: "never called")
    except CircuitOpenError as exc:
        say(f"a call while open is refused: retry_after={exc.retry_after:.2f}s")
    time.sleep(0.6)
    say(f"after reset_timeout one trial call goes through: {breaker.call(lambda: 'ok')!r}")
    say(f"state now: {breaker.status().state.value}")


def demo_idempotency(backend: DynamoDBBackend) -> None:
    print("* Idempotent handler: a redelivered event replays the stored result")
    runs = []

    @backend.idempotent(key="order_id", payload="amount")
    def charge(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        runs.append(event["order_id"])
        return {"charged": event["amount"]}

    first = charge({"order_id": "o-1", "amount": 1250})
    again = charge({"order_id": "o-1", "amount": 1250})
    say(f"first call -> {first}, redelivery -> {again}, body ran {len(runs)} time(s)")
    try:
        charge({"order_id": "o-1", "amount": 999})
    except IdempotencyKeyMismatchError:
        say("same key, different amount -> IdempotencyKeyMismatchError")


def demo_outbox(backend: DynamoDBBackend) -> None:
    print("* Transactional outbox: business write and event commit together")
    with backend.transaction() as tx:
        tx.put(TABLE, {"pk": "ORDER#o-1", "sk": "ORDER", "total_cents": 1250})
        tx.publish(Event("order.placed", {"order_id": "o-1"}))
    delivered = []
    worker = backend.outbox.worker({"order.placed": lambda e: delivered.append(e.payload)})
    worker.run_once()
    say(f"worker delivered {delivered}; stats now {backend.outbox.stats()}")


def demo_runs(backend: DynamoDBBackend) -> None:
    print("* Workflow runs, a fan-in join and the stalled-run reconciler")
    runs, counters = backend.runs, backend.counters
    runs.start("run-1", context={"order": "o-1"})
    fired = [counters.join("join:run-1", step, expected=3).fired for step in ("a", "b", "a", "c")]
    say(f"join arrivals a, b, a (redelivered), c -> fired {fired}")
    runs.complete("run-1", result={"ok": True})
    runs.start("run-2")
    time.sleep(1.1)
    stats = runs.reconcile(1, lambda run: say(f"reconciler re-enqueues stalled {run.run_id}"))
    say(f"reconcile: scanned={stats.scanned} stalled={stats.stalled} reconciled={stats.reconciled}")


def main() -> None:
    with embedded_dynamodb() as client:
        ensure_table(client, TABLE, progress=lambda m: say(m))
        backend = DynamoDBBackend(client, table_name=TABLE, namespace="demo")
        print(f"* table {TABLE!r} ready, namespace 'demo'")
        demo_locks(backend)
        demo_cache(backend)
        demo_breaker(backend)
        demo_idempotency(backend)
        demo_outbox(backend)
        demo_runs(backend)
    print("demo finished")


if __name__ == "__main__":
    main()
