"""Section 3: outbox throughput.

For each configuration a fresh namespace gets N events (2,000 in the full run, published 100 per
``publish`` call, i.e. one TransactWriteItems each), then workers deliver them to a no-op handler
that records each delivery: 1, 2 and 4 worker threads (one ``OutboxWorker`` each, sharing one
boto3 client) and 2 worker processes (spawned, one client each). Workers use their defaults
(batch 25, 30 s lease with heartbeat, completed events kept for the retention period) except a
short ``poll_interval`` so an idle poll does not stretch the measurement.

Designs side by side: ``batched`` (the default: one request claims a batch, one request stores
its outcomes, as conditional PartiQL batches), ``batched-tx`` (the same as transactions, what an
endpoint without conditional PartiQL gets) and ``per-event`` (``batch_claim=False``: a claim and
a completion per event, plain writes). The worker before batching is no longer run: its figures
stay in the history of the committed reports.

Reported: events delivered per second (first claim to last delivery), requests per delivered
event, table write units per delivered event (see :class:`CapacityMeter`: a transactional write
costs twice a plain one), and lost (published, never delivered
within the deadline) and duplicate (delivered more than once) counts, which must both be 0.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from ._harness import BenchEnv, RedisCommandCounter, RequestCounter, unique
from ._units import RefusalCounter

__all__ = ["run"]

BATCH = 100
POLL_INTERVAL = 0.05


def _publish(outbox: Any, n: int, count: Callable[[], int]) -> tuple[list[str], float, int]:
    """Publish ``n`` events; returns their ids, the seconds it took and the requests it made.

    ``count()`` is the running total of requests (round trips) of the outbox's client.
    """
    from dynacoord.outbox import Event

    ids: list[str] = []
    before = count()
    started = time.perf_counter()
    for offset in range(0, n, BATCH):
        ids += outbox.publish(
            [Event("bench.tick", {"n": j}) for j in range(offset, min(n, offset + BATCH))]
        )
    return ids, time.perf_counter() - started, count() - before


def _deadline(n: int) -> float:
    return 30.0 + n * 0.06


class CapacityMeter:
    """Table write units by AWS's pricing rule for items up to 1 KB (every event here is): 1 per
    plain write (PutItem, UpdateItem, DeleteItem, a write statement of a
    BatchExecuteStatement), 2 per item of a TransactWriteItems or ExecuteTransaction. Counted
    from the requests, not read from ``ConsumedCapacity``: DynamoDB Local reports a transaction
    as if it held one item. Index writes are left out: each design moves an event through the
    index the same way (claim: a key change; completion: a removal)."""

    def __init__(self) -> None:
        self.plain = 0
        self.transactional = 0
        self._client: Any = None

    @property
    def write_units(self) -> int:
        return self.plain + 2 * self.transactional

    def attach(self, client: Any) -> None:
        self._client = client
        client.meta.events.register("provide-client-params.dynamodb.*", self._count)

    def detach(self) -> None:
        if self._client is not None:
            self._client.meta.events.unregister("provide-client-params.dynamodb.*", self._count)
            self._client = None

    def reset(self) -> None:
        self.plain = self.transactional = 0

    def _count(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in ("PutItem", "UpdateItem", "DeleteItem"):
            self.plain += 1
        elif model.name == "TransactWriteItems":
            self.transactional += len(params.get("TransactItems", ()))
        elif model.name == "BatchExecuteStatement":
            # each statement is its own plain write (a SELECT is a read)
            self.plain += sum(
                1
                for s in params.get("Statements", ())
                if not s["Statement"].lstrip().upper().startswith("SELECT")
            )
        elif model.name == "ExecuteTransaction":
            self.transactional += sum(
                1
                for s in params.get("TransactStatements", ())
                if not s["Statement"].lstrip().upper().startswith("SELECT")
            )


def _make_worker(outbox: Any, handler: Any, design: str, name: str) -> Any:
    return outbox.worker(
        handler, poll_interval=POLL_INTERVAL, name=name, batch_claim=design != "per-event"
    )


@contextlib.contextmanager
def _transactions_only(backend: Any, design: str) -> Iterator[None]:
    """For the "batched-tx" design: the batch's conditional writes as transactions (the design
    before conditional PartiQL batches, and what an endpoint without them gets), for a
    comparison in the same run."""
    if design != "batched-tx":
        yield
        return
    state = backend.outbox._store._table.state
    # a "no" never asked again during the run
    state.partiql = (False, float("inf"))
    try:
        yield
    finally:
        state.partiql = None


def _threads(
    outbox: Any,
    ids: list[str],
    workers_n: int,
    count: Callable[[], int],
    design: str = "batched",
    meter: CapacityMeter | None = None,
    refusals: RefusalCounter | None = None,
) -> dict[str, Any]:
    deliveries: list[tuple[str, float]] = []  # list.append is atomic under the GIL

    def handler(event: Any) -> None:
        deliveries.append((event.id, time.perf_counter()))

    stop = threading.Event()
    workers = [_make_worker(outbox, handler, design, f"bench-{i}") for i in range(workers_n)]
    threads = [
        threading.Thread(target=w.run, args=(stop,), name=f"bench-outbox-{i}", daemon=True)
        for i, w in enumerate(workers)
    ]
    wanted = set(ids)
    before = count()
    if meter is not None:
        meter.reset()
    if refusals is not None:
        refusals.reset()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    deadline = started + _deadline(len(ids))
    while time.perf_counter() < deadline:
        if len(deliveries) >= len(ids) and wanted <= {d for d, _ in deliveries}:
            break
        time.sleep(0.01)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    requests = count() - before
    last = max((t for _, t in deliveries), default=started)
    row = _summary(
        ids,
        [d for d, _ in deliveries],
        last - started,
        requests,
        workers_n,
        "threads",
        lease_lost=sum(w.lost for w in workers),
    )
    row["design"] = design
    if meter is not None and row["delivered"]:
        row["write_units_per_event"] = round(meter.write_units / row["delivered"], 2)
    if refusals is not None and row["delivered"]:
        row["claim_refusals_per_event"] = round(refusals.refused_items / row["delivered"], 3)
        row["refused_requests"] = dict(refusals.refusals)
    return row


def _process_worker(
    endpoint: str,
    table: str,
    namespace: str,
    results: Any,
    go: Any,
    stop: Any,
) -> None:
    """One worker process: deliver until ``stop``; stream deliveries, then report requests."""
    import boto3
    from botocore.config import Config

    from dynacoord.backends.dynamodb import DynamoDBBackend
    from dynacoord.testing import DUMMY_CREDENTIALS

    client = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}),
        aws_access_key_id=DUMMY_CREDENTIALS["aws_access_key_id"],
        aws_secret_access_key=DUMMY_CREDENTIALS["aws_secret_access_key"],
        region_name=DUMMY_CREDENTIALS["region_name"],
    )
    counter = RequestCounter()
    counter.attach(client)
    refusals = RefusalCounter()
    refusals.attach(client)
    outbox = DynamoDBBackend(client, table_name=table, namespace=namespace).outbox

    def handler(event: Any) -> None:
        results.put(("delivered", event.id, time.time()))

    worker = outbox.worker(handler, poll_interval=POLL_INTERVAL)
    outbox.get("warm-up")  # loads botocore's service model before the clock starts
    results.put(("ready", None, 0.0))
    go.wait()
    counter.reset()
    refusals.reset()
    worker.run(stop)
    results.put(("done", counter.total, (worker.lost, refusals.refused_items)))


def _processes(env: BenchEnv, namespace: str, ids: list[str], workers_n: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    go = ctx.Event()
    stop = ctx.Event()
    procs = [
        ctx.Process(
            target=_process_worker,
            args=(env.ddb.endpoint_url, env.table, namespace, results, go, stop),
            name=f"bench-outbox-proc-{i}",
            daemon=True,
        )
        for i in range(workers_n)
    ]
    for proc in procs:
        proc.start()
    ready = 0
    while ready < workers_n:
        kind, _, _ = results.get(timeout=120)
        ready += kind == "ready"
    delivered: list[str] = []
    last = 0.0
    wanted = set(ids)
    seen: set[str] = set()
    started = time.time()
    go.set()
    deadline = time.monotonic() + _deadline(len(ids))
    while time.monotonic() < deadline and not wanted <= seen:
        try:
            kind, event_id, at = results.get(timeout=0.5)
        except queue.Empty:
            continue
        if kind == "delivered":
            delivered.append(event_id)
            seen.add(event_id)
            last = max(last, at)
    stop.set()
    requests = 0
    lease_lost = 0
    refused = 0
    done = 0
    end_wait = time.monotonic() + 60
    while done < workers_n and time.monotonic() < end_wait:
        try:
            kind, value, extra = results.get(timeout=1)
        except queue.Empty:
            continue
        if kind == "delivered":  # late deliveries still count (duplicates would show here)
            delivered.append(value)
        elif kind == "done":
            done += 1
            requests += int(value)
            lease_lost += int(extra[0])
            refused += int(extra[1])
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.terminate()
    row = _summary(
        ids,
        delivered,
        (last or started) - started,
        requests,
        workers_n,
        "processes",
        lease_lost=lease_lost,
    )
    row["design"] = "batched"
    if row["delivered"]:
        row["claim_refusals_per_event"] = round(refused / row["delivered"], 3)
    return row


def _summary(
    ids: list[str],
    delivered: list[str],
    seconds: float,
    requests: int,
    workers_n: int,
    kind: str,
    *,
    lease_lost: int,
) -> dict[str, Any]:
    counts = Counter(delivered)
    unique_delivered = len(set(ids) & set(counts))
    return {
        "workers": f"{workers_n} {kind if workers_n > 1 else kind[:-1]}",
        "events": len(ids),
        "delivered": unique_delivered,
        "seconds": round(seconds, 2),
        "events_per_s": round(unique_delivered / seconds, 1) if seconds > 0 else None,
        "requests": requests,
        "requests_per_event": round(requests / unique_delivered, 2) if unique_delivered else None,
        "lost": len(ids) - unique_delivered,
        "duplicates": sum(c - 1 for c in counts.values() if c > 1),
        "lease_lost_reports": lease_lost,
    }


CONFIGS = [
    (1, "threads", "batched"),
    (2, "threads", "batched"),
    (4, "threads", "batched"),
    (4, "threads", "batched-tx"),
    (4, "threads", "per-event"),
    (2, "processes", "batched"),
]
REDIS_CONFIGS = [(1, "batched"), (4, "batched")]
REDIS_EVENTS_FACTOR = 4


def _redis(env: BenchEnv, n: int) -> dict[str, Any]:
    """The same delivery on the Redis backend with 1 and 4 worker threads (informational)."""
    if env.redis is None:
        return {"status": "error", "error": f"no redis-server: {env.redis_error}"}
    try:
        from dynacoord.backends.redis import RedisBackend
    except ImportError as exc:
        return {"status": "error", "error": f"Redis backend not available: {exc}"}
    counter = RedisCommandCounter()
    client = counter.attach(env.redis_client())

    def count() -> int:
        return counter.total

    rows: list[dict[str, Any]] = []
    publish: dict[str, Any] = {}
    # Redis delivers a run's events in a fraction of a second: more events for a steadier rate.
    n *= REDIS_EVENTS_FACTOR
    try:
        for workers_n, design in REDIS_CONFIGS:
            outbox = RedisBackend(client, namespace=unique("outbox")).outbox
            ids, seconds, requests = _publish(outbox, n, count)
            publish = publish or {
                "publish_events_per_s": round(n / seconds, 1) if seconds > 0 else None,
                "publish_round_trips_per_event": round(requests / n, 3),
            }
            rows.append(_threads(outbox, ids, workers_n, count, design))
    except Exception as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}", "rows": rows}
    finally:
        client.close()
    return {"status": "ok", **publish, "rows": rows}


def run(env: BenchEnv) -> dict[str, Any]:
    n = env.scale.outbox_events
    rows: list[dict[str, Any]] = []
    publish: dict[str, Any] = {}

    def count() -> int:
        return env.counter.snapshot()[0]

    # Untimed warm-up: DynamoDB Local's JIT and botocore's caches, so the first row is not
    # measured cold.
    warm = env.backend(namespace=unique("outbox-warm")).outbox
    warm_ids, _, _ = _publish(warm, min(n, 300), count)
    _threads(warm, warm_ids, 2, count)
    meter = CapacityMeter()
    refusals = RefusalCounter()
    for workers_n, kind, design in CONFIGS:
        namespace = unique("outbox")
        backend = env.backend(namespace=namespace)
        outbox = backend.outbox
        if kind == "threads":
            meter.attach(backend.client)
            refusals.attach(backend.client)
        ids, seconds, requests = _publish(outbox, n, count)
        if not publish:
            publish = {
                "publish_seconds": round(seconds, 2),
                "publish_events_per_s": round(n / seconds, 1) if seconds > 0 else None,
                "publish_requests_per_event": round(requests / n, 3),
            }
        try:
            if kind == "threads":
                with _transactions_only(backend, design):
                    rows.append(_threads(outbox, ids, workers_n, count, design, meter, refusals))
            else:
                rows.append(_processes(env, namespace, ids, workers_n))
        except Exception as exc:
            rows.append(
                {
                    "workers": f"{workers_n} {kind}",
                    "design": design,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
        finally:
            meter.detach()
            refusals.detach()
    return {
        "status": "ok",
        "redis": _redis(env, n),
        "events": n,
        "batch_per_publish": BATCH,
        **publish,
        "rows": rows,
        "note": (
            "Requests per delivered event include every poll. `batched`: the worker as it is "
            "configured by default (`outbox.worker(handler)`: batches claimed and settled "
            "together; what it sends is what is counted, section 10 prices it request by "
            "request). `per-event`: `batch_claim=False`, a claim and a completion (UpdateItem) "
            "per event after the same polls. Write units follow AWS's rule for items "
            "up to 1 KB (1 per plain write or batch statement, 2 per transaction item; index "
            "writes left out: section 10 counts them). Lost and duplicates must be 0; "
            "`lease_lost_reports` counts completions refused because a lease had been taken "
            "over; `claim_refusals_per_event` counts the items refused by a failed condition "
            "(a refused write, a statement of a batch, an item of a cancelled transaction), "
            "mostly claims lost to another worker, per delivered event."
        ),
    }
