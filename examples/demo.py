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

from dynacoord import DynamoDBBackend
from dynacoord.provision import ensure_table
from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal, find_dynamodb_local

TABLE = "dynacoord-demo"


def say(message: str) -> None:
    print(f"  {message}", flush=True)


@contextlib.contextmanager
def embedded_dynamodb() -> Iterator[Any]:
    if shutil.which("java") and find_dynamodb_local():
        with DynamoDBLocal() as server:
            print(f"* Amazon DynamoDB Local on {server.endpoint_url}")
            yield server.client()
        return
    from moto import mock_aws

    print("* Java or DynamoDB Local missing: using moto's in-process DynamoDB")
    for name, value in DUMMY_CREDENTIALS.items():
        os.environ.setdefault(name.upper() if name != "region_name" else "AWS_DEFAULT_REGION", value)
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


def main() -> None:
    with embedded_dynamodb() as client:
        ensure_table(client, TABLE, progress=lambda m: say(m))
        backend = DynamoDBBackend(client, table_name=TABLE, namespace="demo")
        print(f"* table {TABLE!r} ready, namespace 'demo'")
        demo_locks(backend)
        for name in ("demo_cache", "demo_breaker", "demo_idempotency", "demo_outbox", "demo_runs"):
            step = globals().get(name)
            if callable(step):
                step(backend)
    print("demo finished")


if __name__ == "__main__":
    main()
