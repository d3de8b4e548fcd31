"""Section 4: lock contention.

N threads (8 in the full run) share one boto3 client and fight for ONE key for a fixed time. Each
thread loops: blocking ``acquire`` (backoff with jitter), a short critical section, ``release``.

Mutual exclusion is checked outside DynamoDB: inside the critical section each thread marks an
in-process "occupied" slot; finding it already taken is a violation. Fences are checked too: the
fences seen in critical sections, in the order they were entered, must strictly increase.

Beside the main run, ``rows`` compares in the same run, at 4 and 8 threads: dynacoord (FIFO
hand-off between threads of the process), dynacoord's previous design (no hand-off: every waiter
polls with backoff; ``Locks.fifo_handoff = False``), python-dynamodb-lock (on its own table, with
a 10 ms retry period so it is not handicapped by its 5 s default) and a raw boto3 floor (a
conditional PutItem retried every 5 ms, then a DeleteItem). Each row reports acquisitions/s,
fairness (min/max acquisitions per thread), the p95 wait of an acquire, requests per
acquisition and violations.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ._harness import BenchEnv, unique

__all__ = ["run"]

#: lock TTL: far above the critical section, so an expiry never hands the lock on by itself
TTL = 5.0
#: time spent holding the lock, roughly a tiny piece of real work
CRITICAL_SECTION_S = 0.001


def run(env: BenchEnv) -> dict[str, Any]:
    backend = env.backend(namespace=unique("contention"))
    with env.counter.measure() as ops:
        result = _contend(env, backend.locks)
    result["rows"] = _rows(env)
    requests = sum(ops.values())
    total = result["acquisitions"]
    result.update(
        {
            "status": "ok",
            "requests": requests,
            "requests_per_acquisition": round(requests / total, 2) if total else None,
            "apis": dict(sorted(ops.items())),
        }
    )
    result["redis"] = _redis(env)
    result["handoff"] = _handoff(env)
    return result


#: the cross-process hand-off: the holder's TTL, how long it holds before releasing early
HANDOFF_TTL = 30.0
HANDOFF_HOLD_S = 1.0


def _handoff(env: BenchEnv) -> dict[str, Any]:
    """A holder in another process (a second ``Locks``: no in-process hand-off) takes the lock
    for 30 s and releases it after 1 s; how long after the release its waiter has it, and what
    the wait sent (reads and refused writes)."""
    rounds = 10 if env.scale.contention_seconds >= 5 else 2
    hold = HANDOFF_HOLD_S if rounds > 2 else 0.3
    namespace = unique("handoff")
    holder_side = env.backend(namespace=namespace).locks
    waiter_side = env.backend(namespace=namespace).locks
    waits: list[float] = []
    with env.counter.measure() as ops:
        for _ in range(rounds):
            key = unique("handoff-key")
            held = holder_side.acquire(key, ttl=HANDOFF_TTL)
            assert held is not None
            got: list[float] = []

            def wait(key: str = key, got: list[float] = got) -> None:
                lease = waiter_side.acquire(key, ttl=5, timeout=HANDOFF_TTL + 5)
                got.append(time.monotonic())
                if lease is not None:
                    lease.release()

            thread = threading.Thread(target=wait)
            thread.start()
            time.sleep(hold)
            released = time.monotonic()
            held.release()
            thread.join(HANDOFF_TTL + 10)
            waits.append(got[0] - released if got else float("inf"))
    return {
        "rounds": rounds,
        "ttl_s": HANDOFF_TTL,
        "hold_s": hold,
        "p50_wait_after_release_s": round(_percentile(waits, 0.5), 3),
        "p95_wait_after_release_s": round(_percentile(waits, 0.95), 3),
        "max_wait_after_release_s": round(max(waits), 3),
        "requests_per_round": {k: round(v / rounds, 1) for k, v in sorted(ops.items())},
    }


def _redis(env: BenchEnv) -> dict[str, Any]:
    """The same contention on the Redis backend (informational)."""
    if env.redis is None:
        return {"status": "error", "error": f"no redis-server: {env.redis_error}"}
    try:
        from dynacoord.backends.redis import RedisBackend
    except ImportError as exc:
        return {"status": "error", "error": f"Redis backend not available: {exc}"}
    from ._harness import RedisCommandCounter

    counter = RedisCommandCounter()
    client = counter.attach(env.redis_client())
    try:
        locks = RedisBackend(client, namespace=unique("contention")).locks
        with counter.measure() as box:
            result = _contend(env, locks)
        total = result["acquisitions"]
        result["status"] = "ok"
        result["round_trips_per_acquisition"] = round(box[0] / total, 2) if total else None
        return result
    except Exception as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        client.close()


class _DynacoordLocks:
    """acquire(timeout) -> a release callable or None, and the fence of the last acquire."""

    def __init__(self, locks: Any) -> None:
        self.locks = locks

    def acquire(self, key: str, timeout: float) -> tuple[Any, int] | None:
        lease = self.locks.acquire(key, ttl=TTL, timeout=timeout)
        return None if lease is None else (lease.release, lease.fence)


def _contend(
    env: BenchEnv,
    locks: Any,
    *,
    threads: int | None = None,
    seconds: float | None = None,
    key: str = "one-hot-key",
) -> dict[str, Any]:
    threads_n = threads or env.scale.contention_threads
    duration = seconds or env.scale.contention_seconds
    lock = locks if isinstance(locks, (_RawFloor, _PeerLock)) else _DynacoordLocks(locks)
    waits: list[float] = []

    occupied = threading.Lock()  # guards the bookkeeping below, never held across requests
    state: dict[str, Any] = {"holder": None, "violations": 0, "last_fence": -1, "fence_errors": 0}
    acquisitions = [0] * threads_n
    timeouts = [0] * threads_n
    lost_releases = [0] * threads_n
    errors: list[str] = []
    start_barrier = threading.Barrier(threads_n + 1)
    stop_at = [0.0]

    def worker(index: int) -> None:
        start_barrier.wait()
        while time.monotonic() < stop_at[0]:
            asked = time.perf_counter()
            try:
                got = lock.acquire(key, 1.0)
            except Exception as exc:  # reported, not raised: a benchmark keeps going
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if got is None:
                timeouts[index] += 1
                continue
            waited = time.perf_counter() - asked
            release, fence = got
            with occupied:
                waits.append(waited)
                if state["holder"] is not None:
                    state["violations"] += 1
                state["holder"] = index
                if fence is not None:
                    if fence <= state["last_fence"]:
                        state["fence_errors"] += 1
                    state["last_fence"] = fence
            time.sleep(CRITICAL_SECTION_S)
            with occupied:
                if state["holder"] == index:
                    state["holder"] = None
            if release() is False:
                lost_releases[index] += 1
            acquisitions[index] += 1

    workers = [
        threading.Thread(target=worker, args=(i,), name=f"bench-contention-{i}", daemon=True)
        for i in range(threads_n)
    ]
    for thread in workers:
        thread.start()
    stop_at[0] = time.monotonic() + duration
    started = time.perf_counter()
    start_barrier.wait()
    for thread in workers:
        thread.join()
    elapsed = time.perf_counter() - started
    total = sum(acquisitions)
    return {
        "threads": threads_n,
        "seconds": round(elapsed, 3),
        "ttl_s": TTL,
        "critical_section_ms": CRITICAL_SECTION_S * 1000,
        "acquisitions": total,
        "acquisitions_per_s": round(total / elapsed, 2) if elapsed > 0 else 0.0,
        "per_thread": acquisitions,
        "fairness_min_max": round(min(acquisitions) / max(acquisitions), 3)
        if max(acquisitions) > 0
        else 0.0,
        "mutual_exclusion_violations": state["violations"],
        "fence_order_violations": state["fence_errors"],
        "lost_releases": sum(lost_releases),
        "acquire_timeouts": sum(timeouts),
        "p50_wait_ms": round(_percentile(waits, 0.5) * 1000, 2),
        "p95_wait_ms": round(_percentile(waits, 0.95) * 1000, 2),
        "errors": errors[:5],
        "error_count": len(errors),
    }


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _RawFloor:
    """The least a lock can cost: a conditional PutItem retried every 5 ms, then a DeleteItem."""

    def __init__(self, client: Any, table: str) -> None:
        self.client = client
        self.table = table

    def acquire(self, key: str, timeout: float) -> tuple[Any, int | None] | None:
        deadline = time.monotonic() + timeout
        item = {"pk": {"S": f"RAWLOCK#{key}"}, "sk": {"S": "LOCK"}}
        while True:
            try:
                self.client.put_item(
                    TableName=self.table,
                    Item=item,
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except self.client.exceptions.ConditionalCheckFailedException:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.005)
                continue
            return (
                lambda: self.client.delete_item(TableName=self.table, Key=item) and True,
                None,
            )


class _PeerLock:
    """python-dynamodb-lock with a usable retry period (10 ms) and a 1 s retry timeout."""

    def __init__(self, lock_client: Any) -> None:
        self.lock_client = lock_client

    def acquire(self, key: str, timeout: float) -> tuple[Any, int | None] | None:
        import datetime

        from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockError

        try:
            lock = self.lock_client.acquire_lock(
                key,
                retry_period=datetime.timedelta(milliseconds=10),
                retry_timeout=datetime.timedelta(seconds=timeout),
            )
        except DynamoDBLockError:
            return None
        return (lambda: lock.release(best_effort=False) is not False, None)


def _measured(env: BenchEnv, name: str, lock: Any, threads: int, seconds: float) -> dict[str, Any]:
    with env.counter.measure() as ops:
        result = _contend(env, lock, threads=threads, seconds=seconds, key=unique("hot"))
    total = result["acquisitions"]
    requests = sum(ops.values())
    return {
        "name": name,
        "threads": threads,
        "acquisitions_per_s": result["acquisitions_per_s"],
        "fairness_min_max": result["fairness_min_max"],
        "p50_wait_ms": result["p50_wait_ms"],
        "p95_wait_ms": result["p95_wait_ms"],
        "requests_per_acquisition": round(requests / total, 2) if total else None,
        "violations": result["mutual_exclusion_violations"] + result["fence_order_violations"],
        "acquire_timeouts": result["acquire_timeouts"],
        "error_count": result["error_count"],
    }


def _rows(env: BenchEnv) -> list[dict[str, Any]]:
    """dynacoord, its previous design, python-dynamodb-lock and a raw floor at 4 and 8 threads."""
    seconds = max(0.5, env.scale.contention_seconds / 2)
    rows: list[dict[str, Any]] = []
    peer: Any = None
    try:
        import boto3
        from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient

        lock_table = unique("pylock")
        DynamoDBLockClient.create_dynamodb_table(
            env.new_client(counted=False), table_name=lock_table
        )
        resource = boto3.resource(
            "dynamodb",
            endpoint_url=env.ddb.endpoint_url,
            aws_access_key_id="dynacoord",
            aws_secret_access_key="dynacoord",
            region_name="us-east-1",
        )
        env.counter.attach(resource.meta.client)
        peer = DynamoDBLockClient(
            resource, table_name=lock_table, heartbeat_period=datetime_seconds(1)
        )
    except Exception as exc:  # not installed: the rows say so
        rows.append({"name": "python-dynamodb-lock", "error": f"{type(exc).__name__}: {exc}"})
    raw_client = env.new_client()
    try:
        for threads in (4, 8):
            fair = env.backend(namespace=unique("fair")).locks
            previous = env.backend(namespace=unique("prev")).locks
            previous.fifo_handoff = False
            rows.append(_measured(env, "dynacoord", fair, threads, seconds))
            rows.append(
                _measured(
                    env, "dynacoord, previous design (no hand-off)", previous, threads, seconds
                )
            )
            if peer is not None:
                rows.append(
                    _measured(env, "python-dynamodb-lock", _PeerLock(peer), threads, seconds)
                )
            rows.append(
                _measured(
                    env,
                    "raw boto3 floor (put if absent, delete)",
                    _RawFloor(raw_client, env.table),
                    threads,
                    seconds,
                )
            )
    finally:
        if peer is not None:
            peer.close()
    return rows


def datetime_seconds(n: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=n)
