"""Worker functions of the multi-process stress and fault tests.

They run in child processes started with the ``spawn`` context, so they must be importable
top-level functions that build their own boto3 client (nothing is inherited from the parent
except the arguments).
"""

from __future__ import annotations

import os
import time
from typing import Any

from dynacoord.testing import DUMMY_CREDENTIALS

#: Lease (seconds) the victims of the SIGKILL tests hold: long enough that a loaded machine does
#: not let it run out before the parent checks that nobody else can take it.
VICTIM_LEASE = 15


def make_backend(target: tuple[str, ...], namespace: str, **options: Any) -> Any:
    """A backend in this process: ``("dynamodb", endpoint_url, table)`` or ``("redis", port)``;
    ``options`` (a ``clock``, ...) go to the backend."""
    if target[0] == "redis":
        import redis

        from dynacoord.backends.redis import RedisBackend

        return RedisBackend(
            redis.Redis(host="127.0.0.1", port=int(target[1])), namespace=namespace, **options
        )
    import boto3
    from botocore.config import Config

    from dynacoord.backends.dynamodb import DynamoDBBackend

    _, endpoint, table = target
    client = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        config=Config(retries={"max_attempts": 8, "mode": "standard"}),
        **DUMMY_CREDENTIALS,
    )
    return DynamoDBBackend(client, table_name=table, namespace=namespace, **options)


def lock_worker(
    target: tuple[str, ...],
    namespace: str,
    lock_keys: list[str],
    rounds: int,
    inside: dict[str, Any],
    last_fence: dict[str, Any],
    violations: Any,
    sections: Any,
    barrier: Any,
) -> None:
    """Take the locks ``rounds`` times; inside each critical section check that nobody else is in
    it (a shared per-key counter) and that the fence is above every earlier fence of the key."""
    locks = make_backend(target, namespace).locks
    owner = f"proc-{os.getpid()}"
    barrier.wait()
    for i in range(rounds):
        key = lock_keys[(i + os.getpid()) % len(lock_keys)]
        lease = locks.acquire(key, ttl=15, owner=owner, timeout=60)
        if lease is None:
            with violations.get_lock():
                violations.value += 1000  # starvation is a failure too
            continue
        with inside[key].get_lock():
            inside[key].value += 1
            if inside[key].value != 1:
                with violations.get_lock():
                    violations.value += 1
        with last_fence[key].get_lock():
            if lease.fence <= last_fence[key].value:
                with violations.get_lock():
                    violations.value += 1
            last_fence[key].value = lease.fence
        time.sleep(0.001)  # widen the window an overlap would need
        with inside[key].get_lock():
            inside[key].value -= 1
        with sections.get_lock():
            sections.value += 1
        if not lease.release():
            with violations.get_lock():
                violations.value += 1


def outbox_worker(
    target: tuple[str, ...],
    namespace: str,
    total: int,
    delivered: Any,
    results: Any,
    barrier: Any,
    deadline_s: float,
) -> None:
    """Deliver events until ``total`` deliveries were counted by all workers together; put the
    ids this process handled on ``results``."""
    outbox = make_backend(target, namespace).outbox
    seen: list[str] = []

    def handle(event: Any) -> None:
        seen.append(event.id)
        with delivered.get_lock():
            delivered.value += 1
        # A little work per event: batched claims on Redis are fast enough for the first
        # process to drain a few hundred events before the others' first poll.
        time.sleep(0.002)

    worker = outbox.worker(handle, batch_size=25, lease=60, heartbeat=False, poll_interval=0.05)
    barrier.wait()
    deadline = time.monotonic() + deadline_s
    while delivered.value < total and time.monotonic() < deadline:
        if worker.run_once() == 0:
            time.sleep(0.05)
    results.put((os.getpid(), seen))


def idempotency_worker(
    target: tuple[str, ...],
    namespace: str,
    idem_keys: list[str],
    runs: dict[str, Any],
    results: Any,
    barrier: Any,
) -> None:
    """Call one idempotent function for every key (racing the other processes); count body runs
    in ``runs`` and put (pid, {key: result}) on ``results``."""
    backend = make_backend(target, namespace)
    pid = os.getpid()

    @backend.idempotent(key=lambda k: k, in_progress_ttl=30, wait=True, wait_timeout=60)
    def body(k: str) -> str:
        with runs[k].get_lock():
            runs[k].value += 1
        time.sleep(0.005)
        return f"{k}:{pid}"

    got: dict[str, str] = {}
    barrier.wait()
    order = idem_keys if pid % 2 else list(reversed(idem_keys))
    for k in order:
        got[k] = body(k)
    results.put((pid, got))


def outbox_victim(target: tuple[str, ...], namespace: str, started: Any) -> None:
    """Claim one event (15 s lease) and hang in its handler until killed (SIGKILL from the
    parent)."""
    outbox = make_backend(target, namespace).outbox

    def hang(event: Any) -> None:
        started.set()
        time.sleep(600)

    outbox.worker(hang, lease=VICTIM_LEASE, heartbeat=False, batch_size=1).run_once()


def lock_victim(target: tuple[str, ...], namespace: str, started: Any) -> None:
    """Take a lock (15 s) and hang holding it until killed."""
    lease = make_backend(target, namespace).locks.acquire(
        "victim", ttl=VICTIM_LEASE, owner="victim"
    )
    assert lease is not None
    started.set()
    time.sleep(600)


def idempotency_victim(target: tuple[str, ...], namespace: str, started: Any) -> None:
    """Start an idempotent call (15 s lease) and hang in its body until killed."""
    backend = make_backend(target, namespace)

    @backend.idempotent(key=lambda: "order-victim", in_progress_ttl=VICTIM_LEASE)
    def body() -> str:
        started.set()
        time.sleep(600)
        return "never"

    body()


def outbox_batch_victim(
    target: tuple[str, ...], namespace: str, started: Any, lease: float, results: Any
) -> None:
    """Claim a batch, handle two events, signal ``started`` in the third handler and sleep
    there (the parent SIGKILLs or SIGSTOPs this process); if resumed, finish the batch and
    report (delivered, lost) and the ids this process handled."""
    outbox = make_backend(target, namespace).outbox
    handled: list[str] = []

    def handle(event: Any) -> None:
        handled.append(event.id)
        if len(handled) == 3:
            started.set()
            time.sleep(1.0)  # stopped or killed in here

    worker = outbox.worker(handle, lease=lease, heartbeat=False, batch_size=5)
    worker.run_once()
    results.put((worker.delivered, worker.lost, handled))


def outbox_poison_round(
    target: tuple[str, ...], namespace: str, at: float, max_attempts: int, results: Any
) -> None:
    """One process of the poison-event test: a worker (its clock fixed at ``at``) polls until it
    finds nothing. A handler of a ``"kill"`` event SIGKILLs this process; one of a ``"raise"``
    event raises; each start is reported (event id, attempt) on ``results`` first."""
    import signal

    from dynacoord import ManualClock

    one_shard = {"shards": 1} if target[0] == "dynamodb" else {}  # one queue: e1 first
    outbox = make_backend(target, namespace, clock=ManualClock(at), **one_shard).outbox

    def handler(event: Any) -> None:
        results.put((event.id, event.attempt))
        if event.payload == "kill":
            time.sleep(0.2)  # let the queue's feeder thread send the report first
            os.kill(os.getpid(), signal.SIGKILL)
        if event.payload == "raise":
            raise RuntimeError(f"{event.id} refused")

    worker = outbox.worker(
        handler, lease=30, max_attempts=max_attempts, backoff=0, max_backoff=0, heartbeat=False
    )
    while worker.run_once():
        pass
