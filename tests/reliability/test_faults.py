"""Fault injection on DynamoDB Local: throttling, server errors, responses lost after the write was
applied, cancelled transactions with mixed reasons, and a worker process killed with SIGKILL.

Faults are injected with a botocore ``before-send`` hook on a dedicated client, so they happen
below dynacoord exactly where the network would fail, and botocore's own retry logic (standard
mode) reacts to them as it would in production:

* ``lost``: the hook sends the signed request to DynamoDB Local itself (so the write IS applied),
  then raises ``ReadTimeoutError`` / ``ConnectionClosedError`` or answers 500: the caller never sees
  the response and botocore retries the same request. This is the hard case: the retry must not
  double-apply, or must recognise its own earlier write.
* ``throttle``/``error``: the hook answers with a DynamoDB error body without sending anything.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import urllib3
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import ConnectionClosedError, ReadTimeoutError
from botocore.retries.standard import ExponentialBackoff

from dynacoord import BackendError, ManualClock, TransactionCancelledError
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.outbox import Event, EventStatus
from dynacoord.testing import DynamoDBLocal, unique_name
from tests.outbox_helpers import drain
from tests.reliability.conftest import scan_all

pytestmark = pytest.mark.integration

_http = urllib3.PoolManager()


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Any:
        yield self._body


def _error_response(url: str, status: int, code: str, message: str) -> AWSResponse:
    body = json.dumps(
        {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": message}
    ).encode()
    headers = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-RequestId": "injected"}
    return AWSResponse(url, status, headers, _Raw(body))


class Faults:
    """A before-send hook with a plan: ``plan[operation]`` is a list of fault names, consumed one
    per request of that operation (``None`` = pass through)."""

    def __init__(self, client: Any) -> None:
        self.plan: dict[str, list[Any]] = {}
        self.log: list[tuple[str, str | None, int | None]] = []
        client.meta.events.register("before-send.dynamodb", self._hook)

    def inject(self, operation: str, *faults: Any) -> None:
        self.plan.setdefault(operation, []).extend(faults)

    def _hook(self, request: Any, event_name: str, **_: Any) -> AWSResponse | None:
        operation = event_name.rsplit(".", 1)[-1]
        queue = self.plan.get(operation)
        fault = queue.pop(0) if queue else None
        if fault is None:
            self.log.append((operation, None, None))
            return None
        if callable(fault):  # a hand-made answer, nothing sent
            self.log.append((operation, "custom", None))
            return fault(request)  # type: ignore[no-any-return]
        if fault.startswith("lost"):
            # Deliver the request for real, then lose the answer.
            real = _http.request(
                request.method, request.url, body=request.body, headers=dict(request.headers)
            )
            self.log.append((operation, fault, real.status))
            if fault == "lost-timeout":
                raise ReadTimeoutError(endpoint_url=request.url)
            if fault == "lost-reset":
                raise ConnectionClosedError(endpoint_url=request.url)
            if fault == "lost-500":
                return _error_response(request.url, 500, "InternalServerError", "injected")
            raise AssertionError(fault)
        self.log.append((operation, fault, None))
        if fault == "throttle":
            return _error_response(
                request.url, 400, "ProvisionedThroughputExceededException", "injected"
            )
        if fault == "throttling":
            return _error_response(request.url, 400, "ThrottlingException", "injected")
        if fault == "500":
            return _error_response(request.url, 500, "InternalServerError", "injected")
        raise AssertionError(fault)

    def applied(self, operation: str) -> int:
        """How many injected-lost requests of ``operation`` DynamoDB Local accepted (HTTP 200)."""
        return sum(1 for op, f, s in self.log if op == operation and f and s == 200)


@pytest.fixture()
def faulty(
    dynamodb_local: DynamoDBLocal, ddb_table: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[Callable[..., DynamoDBBackend], Faults, Any]:
    """(make backend on the faulty client, the fault plan, a clean client for checks)."""
    # botocore's standard backoff sleeps up to 1 s, 2 s, ... between attempts; the retries are
    # what is under test, not the waiting, so keep them short.
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.01)
    client = dynamodb_local.client(
        config=Config(
            retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=5, read_timeout=5
        )
    )
    faults = Faults(client)
    namespace = unique_name("faults")

    def make(**kwargs: Any) -> DynamoDBBackend:
        kwargs.setdefault("namespace", namespace)
        return DynamoDBBackend(client, table_name=ddb_table[1], **kwargs)

    return make, faults, ddb_table[0]


LOST = ["lost-timeout", "lost-reset", "lost-500"]


# -- locks -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", LOST)
def test_lock_acquire_retried_after_lost_response_recognises_its_own_lock(faulty, fault):
    make, faults, _ = faulty
    locks = make().locks
    faults.inject("UpdateItem", fault)
    lease = locks.acquire("job", ttl=30, owner="me")
    assert faults.applied("UpdateItem") == 1, "the first attempt must have reached DynamoDB"
    assert lease is not None, "the retry must recognise the lock its lost attempt took"
    info = locks.get("job")
    assert info is not None and (info.owner, info.fence) == ("me", lease.fence)
    assert locks.acquire("job", ttl=30, owner="other") is None
    assert lease.release() is True
    assert locks.get("job") is None


def test_lock_acquire_with_default_owner_after_lost_response(faulty):
    make, faults, _ = faulty
    locks = make().locks
    faults.inject("UpdateItem", "lost-timeout")
    lease = locks.acquire("anon", ttl=30)
    assert lease is not None and locks.get("anon").owner == lease.owner


def test_lock_extend_after_lost_response_is_idempotent(faulty):
    make, faults, _ = faulty
    clock = ManualClock(time.time())
    locks = make(clock=clock).locks
    lease = locks.acquire("ext", ttl=10, owner="me")
    clock.advance(5)
    faults.inject("UpdateItem", "lost-reset")
    assert lease.extend(10) is True
    assert locks.get("ext").expires_at_ms == lease.expires_at_ms


def test_lock_release_after_lost_response_frees_the_lock_and_reports_it(faulty):
    """The release was applied, and its retry recognises it (the item keeps the call's token):
    the caller hears True. The lock is free and no one else's lock was touched."""
    make, faults, _ = faulty
    locks = make().locks
    lease = locks.acquire("rel", ttl=30, owner="me")
    faults.inject("UpdateItem", "lost-timeout")
    assert lease.release() is True
    assert faults.applied("UpdateItem") == 1
    assert locks.get("rel") is None
    nxt = locks.acquire("rel", ttl=30, owner="b")
    assert nxt is not None and nxt.fence > lease.fence


@pytest.mark.parametrize("fault", ["throttle", "throttling", "500"])
def test_throttling_and_server_errors_are_retried(faulty, fault):
    make, faults, _ = faulty
    locks = make().locks
    faults.inject("UpdateItem", fault, fault)
    lease = locks.acquire("t", ttl=30, owner="me")
    assert lease is not None and locks.get("t").owner == "me"
    assert [f for op, f, _ in faults.log if op == "UpdateItem"][:3] == [fault, fault, None]


@pytest.mark.parametrize("fault", ["throttle", "throttling", "500"])
def test_persistent_throttling_surfaces_as_backend_error_and_writes_nothing(faulty, fault):
    make, faults, clean = faulty
    backend = make()
    before = scan_all(clean, backend.table_name, namespace=backend.namespace)
    faults.inject("UpdateItem", *[fault] * 10)
    faults.inject("PutItem", *[fault] * 10)
    with pytest.raises(BackendError) as err:
        backend.locks.acquire("t", ttl=30, owner="me")
    expected = {
        "throttle": "ProvisionedThroughputExceededException",
        "throttling": "ThrottlingException",
        "500": "InternalServerError",
    }[fault]
    assert err.value.code == expected
    assert isinstance(err.value.__cause__, Exception)  # the botocore error is chained
    with pytest.raises(BackendError):
        backend.outbox.publish(Event("e", 1))
    faults.plan.clear()
    assert scan_all(clean, backend.table_name, namespace=backend.namespace) == before


# -- cache batches ------------------------------------------------------------------------------


def _half_processed_batch_get(request: Any) -> AWSResponse:
    """Send only the first half of a BatchGetItem's keys; report the rest unprocessed, in the
    wire format DynamoDB uses under throttling."""
    body = json.loads(request.body)
    ((table, spec),) = body["RequestItems"].items()
    keys = spec["Keys"]
    half, rest = keys[: len(keys) // 2], keys[len(keys) // 2 :]
    sent = {**body, "RequestItems": {table: {**spec, "Keys": half}}}
    headers = {k: v for k, v in request.headers.items() if k.lower() not in ("content-length",)}
    real = _http.request(request.method, request.url, body=json.dumps(sent), headers=headers)
    answer = json.loads(real.data)
    answer["UnprocessedKeys"] = {table: {**spec, "Keys": rest}}
    return AWSResponse(
        request.url,
        real.status,
        {"Content-Type": "application/x-amz-json-1.0", "x-amzn-RequestId": "injected"},
        _Raw(json.dumps(answer).encode()),
    )


def test_cache_get_many_resends_the_keys_dynamodb_left_unprocessed(faulty):
    make, faults, _ = faulty
    cache = make().cache()
    mapping = {f"k{i}": i if i % 2 else {"v": [i, "x"]} for i in range(30)}
    cache.set_many(mapping)
    cache.set("short", "gone soon", ttl=0.001)
    time.sleep(0.01)
    faults.inject("BatchGetItem", _half_processed_batch_get)
    assert cache.get_many([*mapping, "short", "absent"]) == mapping
    assert [op for op, *_ in faults.log if op == "BatchGetItem"] == ["BatchGetItem"] * 2


# -- idempotency --------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", LOST)
def test_idempotent_claim_retried_after_lost_response_runs_the_body_once(faulty, fault):
    make, faults, _ = faulty
    backend = make()
    runs = []

    @backend.idempotent(key=lambda order: order, in_progress_ttl=30)
    def charge(order: str) -> str:
        runs.append(order)
        return f"charged {order}"

    faults.inject("PutItem", fault)
    assert charge("o-1") == "charged o-1"
    assert faults.applied("PutItem") == 1
    assert charge("o-1") == "charged o-1"
    assert runs == ["o-1"]
    record = backend.idempotency.get("o-1")
    assert record is not None and record.completed and record.result == "charged o-1"


def test_idempotent_complete_retried_after_lost_response_keeps_the_result(faulty):
    make, faults, _ = faulty
    backend = make()
    runs = []

    @backend.idempotent(key=lambda order: order, in_progress_ttl=30)
    def charge(order: str) -> int:
        runs.append(order)
        return 42

    faults.inject("UpdateItem", "lost-timeout")  # the complete() write
    assert charge("o-2") == 42
    assert charge("o-2") == 42
    assert runs == ["o-2"]
    assert backend.idempotency.get("o-2").result == 42


# -- counters -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", LOST)
def test_counter_increment_after_lost_response_is_counted_once(faulty, fault):
    """The increment's request token is on the item: botocore's retry of the applied write is
    refused by it and reads back the count (it was counted twice before issue 13)."""
    make, faults, _ = faulty
    counters = make().counters
    faults.inject("UpdateItem", fault)
    assert counters.increment("hits") == 1
    assert faults.applied("UpdateItem") == 1
    assert counters.get("hits") == 1


def test_join_arrival_after_lost_response_is_counted_once(faulty):
    make, faults, _ = faulty
    counters = make().counters
    faults.inject("UpdateItem", "lost-reset")
    first = counters.join("fan-in", "task-1", expected=2)
    assert faults.applied("UpdateItem") == 1
    assert counters.get("fan-in") == 1
    second = counters.join("fan-in", "task-2", expected=2)
    assert counters.get("fan-in") == 2
    assert not first.fired and second.fired


# -- outbox -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", LOST)
@pytest.mark.parametrize("count", [1, 5])
def test_outbox_publish_retried_after_lost_response_does_not_duplicate(faulty, fault, count):
    make, faults, _ = faulty
    outbox = make().outbox
    events = [Event("order.created", {"n": i}) for i in range(count)]
    faults.inject("PutItem" if count == 1 else "TransactWriteItems", fault)
    assert outbox.publish(events) == [e.id for e in events]
    assert faults.applied("PutItem" if count == 1 else "TransactWriteItems") == 1
    got: list[Any] = []
    worker = outbox.worker(got.append, heartbeat=False)
    drain(worker)
    assert sorted(e.id for e in got) == sorted(e.id for e in events)
    assert outbox.stats().pending == 0


def test_outbox_complete_after_lost_response_is_delivered_once(faulty):
    make, faults, _ = faulty
    outbox = make().outbox
    event = Event("x", 1)
    outbox.publish(event)
    got: list[Any] = []
    worker = outbox.worker(got.append, heartbeat=False, retention=3600)
    faults.inject("UpdateItem", None, "lost-timeout")  # claim passes, the completion is lost
    assert worker.run_once() == 1
    assert worker.run_once() == 0
    assert [e.id for e in got] == [event.id]
    assert outbox.get(event.id).status is EventStatus.COMPLETED


def test_transaction_cancelled_with_mixed_reasons_writes_nothing(faulty):
    make, _, clean = faulty
    backend = make()
    table = backend.table_name
    existing = {"pk": f"BIZ#{backend.namespace}#1", "sk": "ORDER", "state": "new"}
    with backend.transaction() as tx:
        tx.put(table, existing)
    before = scan_all(clean, table, namespace=backend.namespace)
    event = Event("order.paid", {"order": 1})
    with pytest.raises(TransactionCancelledError) as err:
        with backend.transaction() as tx:
            tx.update(
                table,
                {"pk": existing["pk"], "sk": "ORDER"},
                "SET #s = :paid",
                condition="#s = :pending",  # false: the order is "new"
                names={"#s": "state"},
                values={":paid": "paid", ":pending": "pending"},
            )
            tx.put(table, {"pk": f"BIZ#{backend.namespace}#2", "sk": "ORDER", "state": "new"})
            tx.publish(event)
    codes = [r.get("Code") for r in err.value.reasons]
    assert codes[0] == "ConditionalCheckFailed"
    assert set(codes[1:]) <= {"None", None}
    assert "update" in str(err.value)
    assert scan_all(clean, table, namespace=backend.namespace) == before
    assert backend.outbox.get(event.id) is None


def _cancelled(reasons: list[dict[str, Any]]) -> Callable[[Any], AWSResponse]:
    def answer(request: Any) -> AWSResponse:
        body = json.dumps(
            {
                "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                "message": "Transaction cancelled, please refer cancellation reasons for specific "
                "reasons [" + ", ".join(r["Code"] for r in reasons) + "]",
                "CancellationReasons": reasons,
            }
        ).encode()
        headers = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-RequestId": "injected"}
        return AWSResponse(request.url, 400, headers, _Raw(body))

    return answer


def test_publish_cancelled_by_a_conflict_raises_and_writes_nothing(faulty):
    make, faults, clean = faulty
    backend = make()
    outbox = backend.outbox
    before = scan_all(clean, backend.table_name, namespace=backend.namespace)
    events = [Event("e", 1), Event("e", 2)]
    faults.inject(
        "TransactWriteItems",
        _cancelled([{"Code": "None"}, {"Code": "TransactionConflict", "Message": "conflict"}]),
    )
    with pytest.raises(TransactionCancelledError) as err:
        outbox.publish(events)
    assert [r.get("Code") for r in err.value.reasons] == ["None", "TransactionConflict"]
    assert scan_all(clean, backend.table_name, namespace=backend.namespace) == before
    assert outbox.publish(events) == [e.id for e in events]  # a plain retry then succeeds
    assert outbox.stats().pending == 2


def test_publish_cancelled_with_mixed_reasons_keeps_the_stored_event_and_writes_the_rest(faulty):
    """Reasons [ConditionalCheckFailed (this very event, stored by an earlier attempt),
    TransactionConflict]: the first is success for that event; the rest is published again."""
    make, faults, clean = faulty
    backend = make()
    outbox = backend.outbox
    first, second = Event("e", 1), Event("e", 2)
    outbox.publish(first)
    stored = clean.get_item(
        TableName=backend.table_name,
        Key={"pk": {"S": f"OUTBOX#{backend.namespace}#{first.id}"}, "sk": {"S": "EVENT"}},
        ConsistentRead=True,
    )["Item"]
    faults.inject(
        "TransactWriteItems",
        _cancelled(
            [
                {"Code": "ConditionalCheckFailed", "Message": "exists", "Item": stored},
                {"Code": "TransactionConflict", "Message": "conflict"},
            ]
        ),
    )
    assert outbox.publish([first, second]) == [first.id, second.id]
    got: list[Any] = []
    worker = outbox.worker(got.append, heartbeat=False)
    drain(worker)
    assert sorted(e.id for e in got) == sorted([first.id, second.id])


# -- a worker killed mid-event ------------------------------------------------------------------


def test_worker_killed_with_sigkill_mid_event_is_recovered_after_its_lease(
    dynamodb_local: DynamoDBLocal, ddb_table: tuple[Any, str]
):
    import multiprocessing

    from tests.reliability import _workers

    client, table = ddb_table
    namespace = unique_name("kill")
    outbox = DynamoDBBackend(client, table_name=table, namespace=namespace).outbox
    event = Event("job", {"n": 1})
    outbox.publish(event)
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    victim = ctx.Process(
        target=_workers.outbox_victim,
        args=(("dynamodb", dynamodb_local.endpoint_url, table), namespace, started),
        daemon=True,
    )
    victim.start()
    try:
        assert started.wait(60), "the victim never started handling the event"
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        assert victim.exitcode == -signal.SIGKILL
    finally:
        if victim.is_alive():
            victim.kill()
    record = outbox.get(event.id)
    assert record is not None and record.status is EventStatus.IN_FLIGHT
    got: list[Any] = []
    # Before the lease ends nobody may take it; after it (seen through a clock a lease ahead, so
    # the test does not sleep) any worker recovers and delivers it.
    assert outbox.worker(got.append, heartbeat=False).run_once() == 0
    later = DynamoDBBackend(
        client,
        table_name=table,
        namespace=namespace,
        clock=ManualClock(time.time() + _workers.VICTIM_LEASE + 1),
    ).outbox
    assert later.worker(got.append, heartbeat=False).run_once() == 1
    assert [(e.id, e.attempt) for e in got] == [(event.id, 2)]
    assert later.get(event.id).status is EventStatus.COMPLETED


def _kill_mid_work(target: tuple[str, ...], namespace: str, victim: Any) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    process = ctx.Process(target=victim, args=(target, namespace, started), daemon=True)
    process.start()
    try:
        deadline = time.monotonic() + 60
        while not started.wait(0.2):
            assert process.is_alive(), f"the victim exited early ({process.exitcode})"
            assert time.monotonic() < deadline, "the victim never got going"
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
        assert process.exitcode == -signal.SIGKILL
    finally:
        if process.is_alive():
            process.kill()


def test_lock_holder_killed_with_sigkill_is_recovered_after_its_ttl(
    dynamodb_local: DynamoDBLocal, ddb_table: tuple[Any, str]
):
    from tests.reliability import _workers

    client, table = ddb_table
    namespace = unique_name("kill")
    _kill_mid_work(
        ("dynamodb", dynamodb_local.endpoint_url, table), namespace, _workers.lock_victim
    )
    now = DynamoDBBackend(client, table_name=table, namespace=namespace).locks
    held = now.get("victim")
    assert held is not None and held.owner == "victim"
    assert now.acquire("victim", ttl=5, owner="next") is None
    later = DynamoDBBackend(
        client,
        table_name=table,
        namespace=namespace,
        clock=ManualClock(time.time() + _workers.VICTIM_LEASE + 1),
    ).locks
    lease = later.acquire("victim", ttl=5, owner="next")
    assert lease is not None and lease.fence > held.fence


def test_idempotent_call_killed_with_sigkill_is_taken_over_after_its_lease(
    dynamodb_local: DynamoDBLocal, ddb_table: tuple[Any, str]
):
    from dynacoord import IdempotencyInProgressError
    from tests.reliability import _workers

    client, table = ddb_table
    namespace = unique_name("kill")
    _kill_mid_work(
        ("dynamodb", dynamodb_local.endpoint_url, table), namespace, _workers.idempotency_victim
    )
    runs: list[str] = []

    def body() -> str:
        runs.append("ran")
        return "done"

    now = DynamoDBBackend(client, table_name=table, namespace=namespace)
    with pytest.raises(IdempotencyInProgressError):
        now.idempotent(key=lambda: "order-victim")(body)()
    later = DynamoDBBackend(
        client,
        table_name=table,
        namespace=namespace,
        clock=ManualClock(time.time() + _workers.VICTIM_LEASE + 1),
    )
    assert later.idempotent(key=lambda: "order-victim")(body)() == "done"
    assert later.idempotent(key=lambda: "order-victim")(body)() == "done"
    assert runs == ["ran"]
