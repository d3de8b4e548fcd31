"""Section 4: lock contention.

N threads (8 in the full run) share one boto3 client and fight for ONE key for a fixed time. Each
thread loops: blocking ``acquire`` (backoff with jitter), a short critical section, ``release``.

Mutual exclusion is checked outside DynamoDB: inside the critical section each thread marks an
in-process "occupied" slot; finding it already taken is a violation. Fences are checked too: the
fences seen in critical sections, in the order they were entered, must strictly increase.
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
    return result


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


def _contend(env: BenchEnv, locks: Any) -> dict[str, Any]:
    threads_n = env.scale.contention_threads
    duration = env.scale.contention_seconds
    key = "one-hot-key"

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
            try:
                lease = locks.acquire(key, ttl=TTL, timeout=1.0)
            except Exception as exc:  # reported, not raised: a benchmark keeps going
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if lease is None:
                timeouts[index] += 1
                continue
            with occupied:
                if state["holder"] is not None:
                    state["violations"] += 1
                state["holder"] = index
                if lease.fence <= state["last_fence"]:
                    state["fence_errors"] += 1
                state["last_fence"] = lease.fence
            time.sleep(CRITICAL_SECTION_S)
            with occupied:
                if state["holder"] == index:
                    state["holder"] = None
            if not lease.release():
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
        "errors": errors[:5],
        "error_count": len(errors),
    }
