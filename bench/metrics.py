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
  ``ReturnConsumedCapacity``);
* **tracing** (dynacoord.tracing): the flag a publish and a delivery check when tracing is off
  or OpenTelemetry absent, in nanoseconds, what recording the context and opening the consumer
  span cost without a server, and an outbox publish + delivery of one event inside an active
  span, tracing on (the OpenTelemetry SDK recording spans, no exporter) against off.
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


def _tracing_ns(n: int = 100_000) -> dict[str, float]:
    """The off check, and what capture/run_handler cost on, without a server (ns per call)."""
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.trace import TracerProvider

    from dynacoord import Event, tracing

    def per_call(fn: Any, count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            fn()
        return (time.perf_counter() - start) / count * 1e9

    tracing.disable()
    start = time.perf_counter()
    for _ in range(n):
        if tracing.capturing:  # pragma: no cover - off
            break
    check_ns = (time.perf_counter() - start) / n * 1e9
    start = time.perf_counter()
    for _ in range(n):
        pass
    loop_ns = (time.perf_counter() - start) / n * 1e9
    provider = TracerProvider()  # records spans; no processor, no exporter
    tracing.enable(tracer_provider=provider)
    app = provider.get_tracer("app")
    event = Event("order.placed", {}, attempt=1)
    try:
        no_span_ns = per_call(tracing.capture, n // 10)
        with app.start_as_current_span("request"):
            capture_ns = per_call(tracing.capture, n // 10)
            traced = Event("order.placed", {}, metadata=tracing.capture(), attempt=1)
        span_ns = per_call(lambda: tracing.run_handler(_nothing, traced), n // 10)
        link = [otel_trace.Link(tracing._publisher(traced.metadata))]

        def sdk_span() -> None:  # what the SDK charges any instrumentation for such a span
            with app.start_as_current_span(
                "process", kind=otel_trace.SpanKind.CONSUMER, links=link
            ):
                pass

        sdk_ns = per_call(sdk_span, n // 10)
        bare_ns = per_call(lambda: tracing.run_handler(_nothing, event), n // 10)
    finally:
        tracing.enable()
    return {
        "off_check_ns": round(max(0.0, check_ns - loop_ns), 1),
        "capture_no_span_ns": round(no_span_ns, 1),
        "capture_ns": round(capture_ns, 1),
        "consumer_span_linked_ns": round(span_ns, 1),
        "consumer_span_unlinked_ns": round(bare_ns, 1),
        "sdk_linked_span_ns": round(sdk_ns, 1),
    }


def _nothing(event: Any) -> None:
    return None


def _tracing_rows(env: BenchEnv, client: Any, n: int, warmup: int) -> list[dict[str, Any]]:
    """One event published in an active span and delivered by a worker: tracing on vs off."""
    from opentelemetry.sdk.trace import TracerProvider

    from dynacoord import Event, tracing

    provider = TracerProvider()
    tracing.enable(tracer_provider=provider)
    tracing.is_enabled()
    app = provider.get_tracer("app")

    def cycle(on: bool) -> Any:
        outbox = env.backend(namespace=unique("mtr"), client=client).outbox
        worker = outbox.worker(_nothing, batch_size=1, heartbeat=False)

        def run(i: int) -> None:
            tracing.capturing = tracing.spanning = on
            with app.start_as_current_span("request"):
                outbox.publish(Event("order.placed", {"order": i}))
            worker.run_once()

        return run

    try:
        a, b = interleaved(cycle(True), cycle(False), n, warmup)
    finally:
        tracing.enable()
    low, high = paired_ratio_ci(a, b)
    return [
        {
            "operation": "outbox publish + delivery",
            "listener": "tracing on vs off (in a span)",
            "median_ms": round(stats(a).median_ms, 3),
            "default_median_ms": round(stats(b).median_ms, 3),
            "ratio": paired_ratio(a, b),
            "ci_low": low,
            "ci_high": high,
        }
    ]


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
        rows += _tracing_rows(env, client, n, warmup)
        results["rows"] = rows
        results["tracing"] = _tracing_ns()
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
