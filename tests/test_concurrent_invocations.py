"""Many Lambda invocations at once in one process, sharing one module-level backend.

Lambda Managed Instances send several invocations to one execution environment at a time. The
Python runtime runs each in its own process (so module state is not shared between them), but
code that fans a handler out over threads, a threaded web framework, or a runtime that uses
threads shares one backend between invocations running at the same moment. Every Lambda helper
of the package runs here under ``N`` threads, each an invocation with its own context (its own
``aws_request_id`` and remaining time), a barrier making them overlap, on DynamoDB Local (moto's
store is not atomic across threads). Each checks what the invocation saw of its own context and
that the outcome is the one a serial run gives.

The races found are pinned by deterministic tests (a store call or a write held open by an
event, so the interleaving does not depend on the scheduler); each fails without its fix.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from dynacoord import DynamoDBBackend, EMFMetrics, Event
from dynacoord.aws_lambda import process_sqs_batch, process_stream_batch
from dynacoord.idempotency import lambda_context, register_lambda_context
from dynacoord.metrics import Metrics
from dynacoord.testing import DynamoDBLocal, unique_name

pytestmark = pytest.mark.integration

#: concurrent invocations in each test
N = 16

T = TypeVar("T")


class Context:
    """A Lambda context of one invocation: its own request id and deadline."""

    function_name = "orders"

    def __init__(self, request_id: str, remaining_ms: int) -> None:
        self.aws_request_id = request_id
        self._deadline = time.monotonic() + remaining_ms / 1000
        #: the deadline as epoch milliseconds (what a lease bounded by it ends at)
        self.deadline_ms = time.time() * 1000 + remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def invoke_concurrently(count: int, invocation: Callable[[int], T]) -> list[T]:
    """Run ``invocation(i)`` for i in range(count), each in its own thread, all released at
    once; the results in order. An exception in any of them is raised here."""
    start = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = invocation(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "an invocation hung"
    if errors:
        raise errors[0]
    return results


def emf_totals(stream: io.StringIO) -> Counter[tuple[str, str]]:
    """(metric, Primitive) -> sum of the counts written as EMF lines; each line must parse."""
    totals: Counter[tuple[str, str]] = Counter()
    for line in stream.getvalue().splitlines():
        doc = json.loads(line)
        for metric in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]:
            if metric["Unit"] == "Count":
                totals[(metric["Name"], doc.get("Primitive", ""))] += doc[metric["Name"]]
    return totals


@pytest.fixture()
def table(ddb_table: tuple[Any, str]) -> tuple[Any, str]:
    return ddb_table


def make_backend(table: tuple[Any, str], **kwargs: Any) -> DynamoDBBackend:
    client, name = table
    return DynamoDBBackend(client, table_name=name, namespace=unique_name("ns"), **kwargs)


# -- idempotency: each invocation's lease ends with its own invocation -------------------------


def test_idempotent_handlers_each_bound_their_leases_by_their_own_context(
    table: tuple[Any, str],
) -> None:
    backend = make_backend(table)
    inside = threading.Barrier(N)
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    @backend.idempotent(key=lambda order: f"charge:{order['order_id']}", use_local_cache=True)
    def charge(order: dict[str, Any]) -> dict[str, Any]:
        with lock:
            runs[order["order_id"]] += 1
        context = lambda_context()
        # the lease of this claim and of the handler's, as stored: both end with this invocation
        leases = [
            backend.idempotency.get(key).expires_at_ms  # type: ignore[union-attr]
            for key in (f"charge:{order['order_id']}", order["order_id"])
            if backend.idempotency.get(key) is not None
        ]
        inside.wait(10)  # every invocation holds its claims now
        return {"order": order["order_id"], "request": context.aws_request_id, "leases": leases}

    @backend.idempotent(key="order_id")
    def decorated(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {**charge(event), "handler": context.aws_request_id}

    def plain(event: dict[str, Any], context: Any) -> dict[str, Any]:
        # not decorated: it tells the idempotent functions it calls which invocation it is
        register_lambda_context(context)
        return {**charge(event), "handler": context.aws_request_id}

    # remaining times 1 s apart, so a lease bounded by another invocation's is told apart
    contexts = [Context(f"req-{i}", 20_000 + 1000 * i) for i in range(N)]

    def invocation(i: int) -> dict[str, Any]:
        handler = decorated if i % 2 == 0 else plain
        return handler({"order_id": f"o-{i}"}, contexts[i])

    results = invoke_concurrently(N, invocation)
    for i, result in enumerate(results):
        assert result["request"] == result["handler"] == f"req-{i}"
        assert result["order"] == f"o-{i}"
        assert result["leases"], "no claim found while the function ran"
        for lease in result["leases"]:
            assert abs(lease - contexts[i].deadline_ms) < 400, (i, lease - contexts[i].deadline_ms)
    assert runs == {f"o-{i}": 1 for i in range(N)}

    # the redelivery of every invocation at once: all replayed, nothing runs again
    again = invoke_concurrently(N, invocation)
    assert [r["order"] for r in again] == [r["order"] for r in results]
    assert runs == {f"o-{i}": 1 for i in range(N)}


def test_one_key_from_every_invocation_at_once_runs_once_and_all_get_its_result(
    table: tuple[Any, str],
) -> None:
    backend = make_backend(table)
    runs: list[str] = []

    @backend.idempotent(key="order_id", wait=True, wait_timeout=20)
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        runs.append(context.aws_request_id)
        time.sleep(0.3)  # the others arrive while it runs
        return {"charged": event["order_id"], "by": context.aws_request_id}

    results = invoke_concurrently(
        N, lambda i: handler({"order_id": "o-1"}, Context(f"req-{i}", 30_000))
    )
    assert len(runs) == 1
    assert results == [{"charged": "o-1", "by": runs[0]}] * N  # what a serial run returns


# -- the batch helpers -------------------------------------------------------------------------


def sqs_event(invocation: int, count: int) -> dict[str, Any]:
    return {
        "Records": [
            {
                "messageId": f"m-{invocation}-{j}",
                "body": json.dumps({"order_id": f"o-{invocation}-{j}", "fail": j == 1}),
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:eu-west-1:123456789012:orders",
            }
            for j in range(count)
        ]
    }


def test_sqs_batches_of_concurrent_invocations_keep_their_contexts_and_metrics(
    table: tuple[Any, str],
) -> None:
    stream = io.StringIO()
    metrics = EMFMetrics(namespace="Orders", stream=stream, flush_at_exit=False)
    backend = make_backend(table, metrics=metrics)
    started = threading.Barrier(N - 1)  # invocation 0 has no time to start any record
    lock = threading.Lock()
    ran: list[tuple[str, str]] = []

    @backend.idempotent(key=lambda order_id: f"ship:{order_id}")
    def ship(order_id: str) -> str:
        lease = backend.idempotency.get(f"ship:{order_id}")
        context = lambda_context()
        assert lease is not None and context is not None
        assert abs(lease.expires_at_ms - context.deadline_ms) < 400
        return order_id

    def record_handler(record: dict[str, Any]) -> None:
        body = json.loads(record["body"])
        context = lambda_context()
        assert context is not None
        if record["messageId"].endswith("-0"):
            started.wait(10)  # every invocation that starts is inside its batch now
        with lock:
            ran.append((record["messageId"], context.aws_request_id))
        if body["fail"]:
            raise ValueError(f"order {body['order_id']} cannot be shipped")
        ship(body["order_id"])

    contexts = [Context(f"req-{i}", 500 if i == 0 else 20_000 + 1000 * i) for i in range(N)]

    def invocation(i: int) -> dict[str, Any]:
        return process_sqs_batch(
            sqs_event(i, 3), record_handler, backend=backend, context=contexts[i]
        )

    logging.disable(logging.ERROR)  # the failing records log their exceptions
    try:
        results = invoke_concurrently(N, invocation)
    finally:
        logging.disable(logging.NOTSET)
    # what a serial run gives: invocation 0 starts nothing, the others report their record 1
    assert results[0] == {"batchItemFailures": [{"itemIdentifier": f"m-0-{j}"} for j in range(3)]}
    for i in range(1, N):
        assert results[i] == {"batchItemFailures": [{"itemIdentifier": f"m-{i}-1"}]}
    assert sorted(ran) == sorted(
        (f"m-{i}-{j}", f"req-{i}") for i in range(1, N) for j in range(3)
    )  # each record ran once, in the invocation it belongs to
    totals = emf_totals(stream)
    assert totals[("BatchRecordSucceeded", "sqs")] == 2 * (N - 1)
    assert totals[("BatchRecordFailed", "sqs")] == N - 1
    assert totals[("BatchRecordNotStarted", "sqs")] == 3
    # record claims (3 per started batch) and the ship claims (1 per succeeded record)
    assert totals[("IdempotencyFirstCall", "idempotency")] == 3 * (N - 1) + 2 * (N - 1)


def test_stream_batches_of_concurrent_invocations_stop_at_their_own_failure(
    table: tuple[Any, str],
) -> None:
    stream = io.StringIO()
    metrics = EMFMetrics(namespace="Orders", stream=stream, flush_at_exit=False)
    backend = make_backend(table, metrics=metrics)
    inside = threading.Barrier(N)
    seen: dict[str, list[str]] = {}
    lock = threading.Lock()

    def kinesis_event(i: int) -> dict[str, Any]:
        import base64

        return {
            "Records": [
                {
                    "kinesis": {
                        "sequenceNumber": f"{i:04d}{j:04d}",
                        "data": base64.b64encode(json.dumps({"j": j}).encode()).decode(),
                    },
                    "eventSource": "aws:kinesis",
                    "eventID": f"shard-{i}:{j}",
                    "eventSourceARN": f"arn:aws:kinesis:eu-west-1:123456789012:stream/s{i}",
                }
                for j in range(4)
            ]
        }

    def record_handler(record: dict[str, Any]) -> None:
        context = lambda_context()
        assert context is not None
        if record["eventID"].endswith(":0"):
            inside.wait(10)
        with lock:
            seen.setdefault(context.aws_request_id, []).append(record["eventID"])
        if record["eventID"].endswith(":2") and context.aws_request_id.endswith(("1", "3")):
            raise ValueError("poison record")

    def invocation(i: int) -> dict[str, Any]:
        return process_stream_batch(
            kinesis_event(i), record_handler, backend=backend, context=Context(f"req-{i}", 20_000)
        )

    logging.disable(logging.ERROR)
    try:
        results = invoke_concurrently(N, invocation)
    finally:
        logging.disable(logging.NOTSET)
    failing = {i for i in range(N) if str(i).endswith(("1", "3"))}
    for i, result in enumerate(results):
        expected = [{"itemIdentifier": f"{i:04d}0002"}] if i in failing else []
        assert result == {"batchItemFailures": expected}
        ran = 3 if i in failing else 4
        assert seen[f"req-{i}"] == [f"shard-{i}:{j}" for j in range(ran)]
    totals = emf_totals(stream)
    assert totals[("BatchRecordFailed", "stream")] == len(failing)
    assert totals[("BatchRecordSucceeded", "stream")] == 4 * N - 2 * len(failing)


# -- metrics -----------------------------------------------------------------------------------


def test_flush_after_writes_every_invocations_counts_once(table: tuple[Any, str]) -> None:
    stream = io.StringIO()
    metrics = EMFMetrics(namespace="Orders", stream=stream, flush_at_exit=False)
    backend = make_backend(table, metrics=metrics)
    cache = backend.cache(default_ttl=60)
    written_by_return: dict[str, bool] = {}

    @metrics.flush_after
    def handler(event: dict[str, Any], context: Any) -> None:
        mine = metrics.scope(RequestId=context.aws_request_id)
        for j in range(event["count"]):
            mine.count("Work")
            mine.milliseconds("Step", j)
            cache.get(f"{context.aws_request_id}:{j}")  # CacheMiss, and store request metrics

    def invocation(i: int) -> None:
        handler({"count": 20}, Context(f"req-{i}", 20_000))
        # flush_after returned: this invocation's data points are written already
        written_by_return[f"req-{i}"] = f'"RequestId":"req-{i}"' in stream.getvalue()

    invoke_concurrently(N, invocation)
    assert written_by_return == {f"req-{i}": True for i in range(N)}
    work: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    for line in stream.getvalue().splitlines():
        doc = json.loads(line)
        if "RequestId" in doc:
            work[doc["RequestId"]] += doc["Work"]
            step = doc["Step"]
            steps[doc["RequestId"]] += len(step) if isinstance(step, list) else 1
    assert work == {f"req-{i}": 20 for i in range(N)}  # none lost, none doubled
    assert steps == {f"req-{i}": 20 for i in range(N)}
    assert emf_totals(stream)[("CacheMiss", "cache")] == 20 * N


class HeldStream(io.StringIO):
    """A stream whose first write waits until ``release`` is set (a slow stdout)."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.release = threading.Event()
        self._first = True

    def write(self, text: str) -> int:
        if self._first:
            self._first = False
            self.writing.set()
            assert self.release.wait(10)
        return super().write(text)


def test_a_flush_returns_only_once_the_points_of_its_invocation_are_written() -> None:
    # A's flush takes the buffer (B's point with it) and is still writing it when B flushes:
    # B's flush must not return before that write is done, or B ends with its metrics unwritten
    # (flush_after promises each invocation's data points are written when it ends).
    stream = HeldStream()
    metrics = EMFMetrics(namespace="Orders", stream=stream, flush_at_exit=False)
    metrics.emit("Work", 1, "Count", {"RequestId": "a"})
    metrics.emit("Work", 1, "Count", {"RequestId": "b"})
    first = threading.Thread(target=metrics.flush)
    first.start()
    assert stream.writing.wait(10)  # A took what was buffered, B's point too, and is writing it
    seen_by_b: list[str] = []

    def flush_b() -> None:
        metrics.flush()
        seen_by_b.append(stream.getvalue())

    second = threading.Thread(target=flush_b)
    second.start()
    second.join(0.3)  # B waits for A's write (without the fix it has returned already)
    stream.release.set()
    first.join(10)
    second.join(10)
    assert '"RequestId":"b"' in seen_by_b[0]
    assert stream.getvalue().count('"RequestId":"b"') == 1


def test_a_failing_listener_is_logged_once_when_invocations_report_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import weakref

    from dynacoord import metrics as metrics_module

    class Broken(Metrics):
        def emit(self, name: str, value: float, unit: str, dimensions: Any) -> None:
            raise RuntimeError("sink down")

    both_looked = threading.Barrier(2)

    class SlowSet(weakref.WeakSet):  # type: ignore[type-arg]
        def __contains__(self, item: object) -> bool:
            found = super().__contains__(item)
            # both invocations looked before either added: the window of the race
            with contextlib.suppress(threading.BrokenBarrierError):
                both_looked.wait(0.5)
            return found

    monkeypatch.setattr(metrics_module, "_broken_listeners", SlowSet())
    scope = Broken().scope(Primitive="lock", DynacoordNamespace="default")
    with caplog.at_level(logging.ERROR, logger="dynacoord.metrics"):
        invoke_concurrently(2, lambda i: scope.count("LockAcquired"))
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1


def test_a_timing_that_grows_past_100_values_while_waiting_to_be_written_is_split() -> None:
    # The emit that reaches 100 values writes them under the flush lock; other invocations may
    # add values meanwhile. No document may hold more than the format's 100 values.
    stream = io.StringIO()
    metrics = EMFMetrics(namespace="Orders", stream=stream, flush_at_exit=False)
    dims = {"Primitive": "lock"}

    def emit(count: int) -> Callable[[], None]:
        return lambda: [metrics.emit("Wait", 1.0, "Milliseconds", dims) for _ in range(count)]

    def buffered() -> int:
        with metrics._lock:
            return sum(len(v) for g in metrics._buffer.values() for _u, v in g.values())

    def wait_for(count: int) -> None:
        deadline = time.monotonic() + 10
        while buffered() < count and time.monotonic() < deadline:
            time.sleep(0.005)

    with metrics._flush_lock:  # a flush in progress elsewhere
        first = threading.Thread(target=emit(100))
        first.start()
        wait_for(100)  # the 100th value is in: its emit waits to write them
        second = threading.Thread(target=emit(30))
        second.start()
        wait_for(101)  # another invocation's value joined them; it waits too
    first.join(10)
    second.join(10)
    metrics.flush()
    sizes = []
    for line in stream.getvalue().splitlines():
        value = json.loads(line)["Wait"]
        sizes.append(len(value) if isinstance(value, list) else 1)
    assert sum(sizes) == 130
    assert max(sizes) <= 100
    assert len(sizes) >= 3  # the 101st value waited in a document of its own


# -- the cache's in-process tier ---------------------------------------------------------------


class HeldCall:
    """Wraps a store: the first call of ``method`` is made, then its answer is held until
    ``release`` is set (a slow response), so another invocation can act in between."""

    def __init__(self, store: Any, method: str) -> None:
        self._store = store
        self._method = method
        self.answered = threading.Event()
        self.release = threading.Event()
        self._held = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name != self._method or self._held:
            return attr

        def held(*args: Any, **kwargs: Any) -> Any:
            self._held = True
            result = attr(*args, **kwargs)
            self.answered.set()
            assert self.release.wait(10)
            return result

        return held


def slow_in_thread(action: Callable[[], Any], held: HeldCall) -> threading.Thread:
    """Start ``action`` in another invocation and return once its held call was answered."""
    thread = threading.Thread(target=action)
    thread.start()
    assert held.answered.wait(10)
    return thread


@pytest.mark.parametrize("change", ["delete", "set", "incr"])
def test_a_read_in_flight_does_not_bring_back_what_this_cache_changed_meanwhile(
    table: tuple[Any, str], change: str
) -> None:
    # Invocation A reads "k" (a miss in the tier: one read, answered with 1 but slow to come
    # back); invocation B changes "k" through the same cache. A's answer is older than B's
    # change: kept in the tier, every invocation would get the old value for local_ttl.
    backend = make_backend(table)
    cache = backend.cache(default_ttl=60, local_ttl=30)
    backend.cache(default_ttl=60).set("k", 1)  # written elsewhere: not in this cache's tier
    held = HeldCall(cache._store, "get")
    cache._store = held  # type: ignore[assignment]
    reader = slow_in_thread(lambda: cache.get("k"), held)
    if change == "delete":
        cache.delete("k")
        expected = None
    elif change == "set":
        cache.set("k", 2)
        expected = 2
    else:
        expected = cache.incr("k")
    held.release.set()
    reader.join(10)
    assert cache.get("k") == expected == backend.cache().get("k")


def test_two_writes_in_flight_leave_the_tier_with_what_the_store_holds(
    table: tuple[Any, str],
) -> None:
    # A's write reaches the store first but its answer comes back after B's whole write: A
    # must not put its value in the tier over B's (the store holds B's).
    backend = make_backend(table)
    cache = backend.cache(default_ttl=60, local_ttl=30)
    held = HeldCall(cache._store, "set")
    cache._store = held  # type: ignore[assignment]
    writer = slow_in_thread(lambda: cache.set("k", "a"), held)
    cache.set("k", "b")
    held.release.set()
    writer.join(10)
    assert backend.cache().get("k") == "b"
    assert cache.get("k") == "b"


def test_invocations_sharing_a_cache_with_a_local_tier_see_their_own_writes(
    table: tuple[Any, str],
) -> None:
    backend = make_backend(table)
    cache = backend.cache(default_ttl=60, local_ttl=30, local_max=8)  # evictions too

    def invocation(i: int) -> tuple[Any, ...]:
        seen = []
        for j in range(5):
            cache.set(f"own:{i}", j)
            seen.append(cache.get(f"own:{i}"))
            cache.incr("shared")
            cache.get("shared")
        cache.delete(f"own:{i}")
        return (seen, cache.get(f"own:{i}"))

    results = invoke_concurrently(N, invocation)
    assert results == [([0, 1, 2, 3, 4], None)] * N  # a serial run's answers
    assert cache.get("shared") == backend.cache().get("shared") == 5 * N
    assert len(cache._local) <= 8


# -- the stack's outbox entry points (dynacoord.serverless) ------------------------------------

#: the remaining time of an invocation of the outbox functions: a whole lease must fit in it
LONG = 300_000

_delivered_lock = threading.Lock()
#: event id -> deliveries, by the handlers below
delivered_events: Counter[str] = Counter()


def relay_handler(event: Any) -> None:
    with _delivered_lock:
        delivered_events[event.id] += 1


@pytest.fixture()
def stack_env(
    table: tuple[Any, str], dynamodb_local: DynamoDBLocal, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DynamoDBBackend]:
    """The environment of the stack's functions, a fresh namespace, the entry points unbuilt."""
    from dynacoord import serverless

    client, name = table
    namespace = unique_name("ns")
    for variable, value in {
        "DYNACOORD_ENDPOINT_URL": dynamodb_local.endpoint_url,
        "DYNACOORD_TABLE": name,
        "DYNACOORD_NAMESPACE": namespace,
        "DYNACOORD_OUTBOX_HANDLERS": f"{__name__}:relay_handler",
        "DYNACOORD_OUTBOX_OPTIONS": '{"backoff": 0, "max_backoff": 0, "batch_size": 5}',
    }.items():
        monkeypatch.setenv(variable, value)
    serverless._reset()
    delivered_events.clear()
    try:
        yield DynamoDBBackend(client, table_name=name, namespace=namespace)
    finally:
        serverless._reset()


def test_the_entry_points_are_built_once_when_the_first_invocations_arrive_together(
    stack_env: DynamoDBBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynacoord import serverless

    real_backend = serverless._backend
    built: list[str] = []
    both_inside = threading.Barrier(2)

    def counted_backend() -> Any:
        built.append(threading.current_thread().name)
        # a second invocation building too would be inside now (the window of the race)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_inside.wait(0.5)
        return real_backend()

    monkeypatch.setattr(serverless, "_backend", counted_backend)
    empty = {"Records": []}
    invoke_concurrently(2, lambda i: serverless.relay(empty, Context(f"req-{i}", 20_000)))
    invoke_concurrently(2, lambda i: serverless.sweep({}, Context(f"req-{i}", 20_000)))
    assert len(built) == 2  # one relay, one sweeper


def stream_batch(backend: DynamoDBBackend, event_ids: list[str]) -> dict[str, Any]:
    """A DynamoDB Streams batch announcing ``event_ids`` as Lambda would hand it over."""
    records = []
    for event_id in event_ids:
        item = backend.client.get_item(
            TableName=backend.table_name,
            Key={"pk": {"S": f"OUTBOX#{backend.namespace}#{event_id}"}, "sk": {"S": "EVENT"}},
        )["Item"]
        records.append(
            {
                "eventID": unique_name("ev"),
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "dynamodb": {"NewImage": item, "SequenceNumber": unique_name("")},
            }
        )
    return {"Records": records}


def test_concurrent_relay_invocations_deliver_every_event_once(
    stack_env: DynamoDBBackend,
) -> None:
    from dynacoord import serverless

    backend = stack_env
    ids = backend.outbox.publish([Event("order.placed", {"n": n}) for n in range(4 * N)])
    batches = [stream_batch(backend, ids[4 * i : 4 * i + 4]) for i in range(N)]

    def wave() -> list[dict[str, Any]]:
        return invoke_concurrently(
            N, lambda i: serverless.relay(batches[i], Context(f"req-{i}", LONG))
        )

    assert wave() == [{"batchItemFailures": []}] * N
    assert delivered_events == dict.fromkeys(ids, 1)
    # Lambda retries every batch (say each invocation's answer was lost), all at once again
    assert wave() == [{"batchItemFailures": []}] * N
    assert delivered_events == dict.fromkeys(ids, 1)
    relay = serverless._relay
    assert relay is not None  # one relay counted every invocation's records
    assert (relay.worker.delivered, relay.not_claimed, relay.skipped) == (4 * N, 4 * N, 0)


def publish_for_the_sweeper(backend: DynamoDBBackend, count: int) -> list[str]:
    """Publish ``count`` events the sweeper delivers: with a 3 s lease, past the time a sweeper
    may leave a new event to the stream relay. (A 1 s lease, extended every third of it, lapsed
    on a machine loaded 6 deep on 2 cores, and a second sweep delivered the event again, as a
    lapsed lease allows: the test is of concurrent sweeps, not of a starved process.)"""
    os.environ["DYNACOORD_OUTBOX_OPTIONS"] = '{"backoff": 0, "max_backoff": 0, "lease": 3}'
    ids = backend.outbox.publish([Event("order.placed", {"n": n}) for n in range(count)])
    time.sleep(3.2)
    return ids


def test_concurrent_sweeps_deliver_every_event_once(stack_env: DynamoDBBackend) -> None:
    from dynacoord import serverless

    ids = publish_for_the_sweeper(stack_env, 40)
    invoke_concurrently(8, lambda i: serverless.sweep({}, Context(f"req-{i}", LONG)))
    assert delivered_events == dict.fromkeys(ids, 1)


def test_each_concurrent_sweep_reports_only_its_own_deliveries(
    stack_env: DynamoDBBackend,
) -> None:
    from dynacoord import serverless

    publish_for_the_sweeper(stack_env, 40)
    results = invoke_concurrently(8, lambda i: serverless.sweep({}, Context(f"req-{i}", LONG)))
    assert sum(r["delivered"] for r in results) == 40


# -- the breaker's state cache -----------------------------------------------------------------


def test_a_read_in_flight_does_not_reopen_the_state_cache_after_this_process_tripped(
    table: tuple[Any, str],
) -> None:
    from dynacoord import CircuitOpenError

    backend = make_backend(table)
    breaker = backend.breaker("payments", state_cache=30, reset_timeout=60)
    held = HeldCall(breaker._store, "get")
    breaker._store = held  # type: ignore[assignment]
    caller = slow_in_thread(lambda: breaker.call(lambda: "ok"), held)  # read: closed
    breaker.trip()  # another invocation of this process trips it meanwhile
    held.release.set()
    caller.join(10)
    with pytest.raises(CircuitOpenError):
        breaker.call(lambda: "charged")  # not for 30 s through the cached "closed"


def test_invocations_sharing_a_breaker_with_a_state_cache_count_every_failure(
    table: tuple[Any, str],
) -> None:
    from dynacoord import CircuitOpenError

    backend = make_backend(table)
    breaker = backend.breaker("payments", state_cache=30, failure_threshold=N + 1)

    def invocation(i: int) -> str:
        with contextlib.suppress(ValueError):
            breaker.call(lambda: (_ for _ in ()).throw(ValueError("down")))
        return breaker.call(lambda: f"ok-{i}")

    # every invocation's failure counted, then each success resets the count: still closed
    assert invoke_concurrently(N, invocation) == [f"ok-{i}" for i in range(N)]
    assert breaker.status().state.value == "closed"
    breaker.trip()
    with pytest.raises(CircuitOpenError):
        breaker.call(lambda: "after the trip of this process")


# -- locks held by concurrent invocations ------------------------------------------------------


def test_invocations_holding_one_lock_take_turns_and_their_heartbeats_renew_their_own(
    table: tuple[Any, str],
) -> None:
    backend = make_backend(table)
    lock = threading.Lock()
    holders: list[int] = []
    fences: list[int] = []
    most = 0
    renewed: list[tuple[str, str, int]] = []
    extend = backend.locks._store.extend

    def recorded(key: str, owner: str, fence: int, *args: Any) -> Any:
        with lock:
            renewed.append((key, owner, fence))
        return extend(key, owner, fence, *args)

    backend.locks._store.extend = recorded  # type: ignore[method-assign]

    def invocation(i: int) -> tuple[str, int]:
        nonlocal most
        # a lock of its own, held past its TTL: its heartbeat renews it
        with backend.locks.hold(f"job:{i}", ttl=0.6, timeout=5) as own:
            with backend.locks.hold("shared", ttl=5, timeout=30) as shared:
                with lock:
                    holders.append(i)
                    fences.append(shared.fence)
                    most = max(most, len(holders))
                time.sleep(0.02)
                with lock:
                    holders.remove(i)
            time.sleep(0.7)
            return own.owner, own.fence

    owned = invoke_concurrently(N, invocation)
    assert most == 1  # never two holders of "shared" at once
    assert fences == sorted(fences) and len(set(fences)) == N  # later holders, higher fences
    # Whether a lease outlives its TTL depends on the scheduler (a loaded machine can starve a
    # heartbeat past it); what is checked is that each heartbeat renewed its own lease only.
    for i, (owner, fence) in enumerate(owned):
        mine = {(o, f) for key, o, f in renewed if key == f"job:{i}"}
        assert mine == {(owner, fence)}


# -- the table check on first use --------------------------------------------------------------


def test_the_first_invocations_of_a_new_backend_pass_the_table_check_together(
    table: tuple[Any, str], dynamodb_local: DynamoDBLocal
) -> None:
    _, name = table
    client = dynamodb_local.client()  # a new client: the table is not known to be right yet
    described: list[str] = []
    client.meta.events.register(
        "before-call.dynamodb.DescribeTable", lambda **_: described.append("DescribeTable")
    )
    backend = DynamoDBBackend(client, table_name=name, namespace=unique_name("ns"))
    results = invoke_concurrently(N, lambda i: backend.counters.increment("hits"))
    assert sorted(results) == list(range(1, N + 1))
    assert backend.table.layout in backend.table.state.verified
    assert backend.table.guards == ()  # later requests skip the check
    # one check for all of them (16 DescribeTables before the first check took a lock)
    assert described == ["DescribeTable"]
    backend.counters.increment("hits")
    assert described == ["DescribeTable"]  # never again after it passed


def test_a_thread_started_inside_an_invocation_sees_its_context_only_when_given_it(
    table: tuple[Any, str],
) -> None:
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    from dynacoord.idempotency import DEFAULT_IN_PROGRESS_TTL

    backend = make_backend(table)

    @backend.idempotent(key=lambda order_id: f"charge:{order_id}")
    def charge(order_id: str) -> int:
        record = backend.idempotency.get(f"charge:{order_id}")
        assert record is not None
        return record.expires_at_ms

    @backend.idempotent(key="order_id")
    def handler(event: dict[str, Any], context: Any) -> tuple[int, int]:
        with ThreadPoolExecutor(2) as pool:
            given = pool.submit(contextvars.copy_context().run, charge, f"{event['order_id']}-a")
            bare = pool.submit(charge, f"{event['order_id']}-b")
            return given.result(), bare.result()

    context = Context("req-1", 20_000)
    started = time.time() * 1000
    given, bare = handler({"order_id": "o-1"}, context)
    assert abs(given - context.deadline_ms) < 400  # the invocation's deadline
    assert 0 <= bare - (started + DEFAULT_IN_PROGRESS_TTL * 1000) < 5000  # the default lease


def test_a_stream_that_reports_through_the_listener_while_it_writes_does_not_deadlock() -> None:
    # The flush lock is held during the write; a stream whose write reaches the same listener
    # again (a log handler that reports metrics, say) must not wait for its own thread.
    class Reporting(io.StringIO):
        def write(self, text: str) -> int:
            if "Reentered" not in text:
                metrics.emit("Reentered", 1, "Count", {})
                metrics.flush()
            return super().write(text)

    stream = Reporting()
    metrics = EMFMetrics(namespace="Orders", stream=stream, flush_at_exit=False)
    metrics.emit("Work", 1, "Count", {})
    flusher = threading.Thread(target=metrics.flush, daemon=True)
    flusher.start()
    flusher.join(5)
    assert not flusher.is_alive()
    assert emf_totals(stream) == {("Work", ""): 1, ("Reentered", ""): 1}
