"""Section 8: what metrics cost (dynacoord.metrics).

Every backend takes ``metrics=``; the default is ``NO_METRICS``, whose ``enabled`` is False, so a
request is not timed and a primitive's report is one call to an empty method. This section shows
that the default costs nothing measurable and what a real listener costs, on DynamoDB Local:

* **hooks**: the price of one no-op report (``NO_SCOPE.count``) and of the ``enabled`` check in
  the request helper, in nanoseconds, times the hooks one lock acquire + release passes through,
  as a share of that operation's median latency;
* **listeners**: a lock acquire + release and a cache get, interleaved A/B on the same server,
  with the default against ``Metrics()`` (a listener that receives every data point and drops
  it: the cost of timing and reporting) and against ``EMFMetrics`` writing to ``/dev/null``
  (buffering, JSON at each flush; flushed every 50 operations as a Lambda would per invocation),
  and against a listener with ``consumed_capacity = True`` (every request asks DynamoDB for
  ``ReturnConsumedCapacity``).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from ._harness import BenchEnv, interleaved, paired_ratio, paired_ratio_ci, stats, unique

__all__ = ["run"]

#: no-op hooks one lock acquire + release passes through: the enabled check of two requests,
#: LockAcquired, and nothing on release (LockLost only when lost)
_HOOKS_PER_LOCK_CYCLE = 3


def _hook_ns(n: int = 200_000) -> dict[str, float]:
    from dynacoord.metrics import NO_METRICS, NO_SCOPE

    count = NO_SCOPE.count
    start = time.perf_counter()
    for _ in range(n):
        count("LockAcquired")
    scope_ns = (time.perf_counter() - start) / n * 1e9
    start = time.perf_counter()
    for _ in range(n):
        if NO_METRICS.enabled:  # pragma: no cover - never true
            break
    check_ns = (time.perf_counter() - start) / n * 1e9
    start = time.perf_counter()
    for _ in range(n):
        pass
    loop_ns = (time.perf_counter() - start) / n * 1e9
    return {
        "noop_report_ns": round(max(0.0, scope_ns - loop_ns), 1),
        "enabled_check_ns": round(max(0.0, check_ns - loop_ns), 1),
    }


def run(env: BenchEnv) -> dict[str, Any]:
    from dynacoord.metrics import EMFMetrics, Metrics

    n = max(20, env.scale.samples)
    warmup = max(5, env.scale.warmup)
    client = env.new_client(counted=False)
    default = env.backend(namespace=unique("mdef"), client=client)
    listening = env.backend(namespace=unique("mlis"), client=client, metrics=Metrics())
    devnull = open(os.devnull, "w")  # noqa: SIM115 - closed below
    emf = EMFMetrics(namespace="Bench", stream=devnull, flush_at_exit=False)
    emitting = env.backend(namespace=unique("memf"), client=client, metrics=emf)
    with_capacity = Metrics()
    with_capacity.consumed_capacity = True
    capacity = env.backend(namespace=unique("mcap"), client=client, metrics=with_capacity)
    try:
        results: dict[str, Any] = {"status": "ok", "samples": n, **_hook_ns()}

        def lock_cycle(backend: Any) -> Any:
            locks = backend.locks

            def cycle(i: int) -> None:
                lease = locks.acquire(f"k{i % 20}", ttl=30)
                lease.release()
                if i % 50 == 0:
                    backend.metrics.flush()

            return cycle

        def cache_get(backend: Any) -> Any:
            cache = backend.cache()
            cache.set("present", {"v": 1})

            def get(i: int) -> None:
                cache.get("present")
                if i % 50 == 0:
                    backend.metrics.flush()

            return get

        # warm the server and the client first: the first pairs of a run are the slowest
        warm = lock_cycle(default)
        for i in range(4 * warmup):
            warm(i)
        rows = []
        for operation, make in (("lock acquire+release", lock_cycle), ("cache get", cache_get)):
            for label, other in (
                ("Metrics() listener", listening),
                ("EMFMetrics", emitting),
                ("Metrics(), consumed_capacity", capacity),
            ):
                a, b = interleaved(make(other), make(default), n, warmup)
                low, high = paired_ratio_ci(a, b)
                rows.append(
                    {
                        "operation": operation,
                        "listener": label,
                        "median_ms": round(stats(a).median_ms, 3),
                        "default_median_ms": round(stats(b).median_ms, 3),
                        "ratio": paired_ratio(a, b),
                        "ci_low": low,
                        "ci_high": high,
                    }
                )
        results["rows"] = rows
        lock_ms = statistics.median(
            r["default_median_ms"] for r in rows if r["operation"] == "lock acquire+release"
        )
        per_cycle_ns = _HOOKS_PER_LOCK_CYCLE * max(
            results["noop_report_ns"], results["enabled_check_ns"]
        )
        results["noop_share_of_lock_cycle"] = per_cycle_ns / (lock_ms * 1e6)
        results["lock_cycle_ms"] = lock_ms
        return results
    finally:
        emf.flush()
        devnull.close()
