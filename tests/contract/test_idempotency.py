"""Idempotency contract: every backend must pass these unchanged (public API only, except the
request count, which is checked on the DynamoDB backends only)."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import logging
import threading
import time
import uuid
from decimal import Decimal

import pytest

from dynacoord import (
    ConfigurationError,
    IdempotencyInProgressError,
    IdempotencyKeyMismatchError,
    IdempotencyStatus,
    IdempotencyValueError,
    InvalidKeyError,
    ManualClock,
)
from dynacoord.idempotency import register_lambda_context
from tests.conftest import needs_atomic_store


class FakeLambdaContext:
    """The part of Lambda's context object the decorator uses."""

    function_name = "test-fn"
    aws_request_id = "req-1"

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


class Kind(enum.Enum):
    GOODS = "goods"
    SERVICE = "service"


def _backend(make_backend, **kwargs):
    return make_backend(**kwargs)


def test_replay_returns_the_stored_result_without_running(make_backend):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key=lambda order_id, amount: f"charge:{order_id}")
    def charge(order_id, amount):
        calls.append(order_id)
        return {"charged": amount, "order": order_id, "parts": [1.5, None, "ü"]}

    first = charge("o-1", 10)
    again = charge("o-1", 10)
    assert calls == ["o-1"]
    assert first == again == {"charged": 10, "order": "o-1", "parts": [1.5, None, "ü"]}
    assert charge("o-2", 5)["order"] == "o-2"
    assert calls == ["o-1", "o-2"]
    record = backend.idempotency.get("charge:o-1")
    assert record.status is IdempotencyStatus.COMPLETED and record.completed
    assert record.result == first
    assert charge.__name__ == "charge"  # functools.wraps


def test_none_result_is_replayed_too(make_backend):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key=lambda: "nothing")
    def nothing():
        calls.append(1)

    assert nothing() is None
    assert nothing() is None
    assert calls == [1]


def test_jmespath_key_on_a_lambda_event(make_backend):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key="body.order_id", payload="body")
    def handler(event, context):
        calls.append(event["body"]["order_id"])
        return {"statusCode": 200, "order": event["body"]["order_id"]}

    event = {"body": {"order_id": "A-1", "amount": 3}, "headers": {"x": "1"}}
    ctx = FakeLambdaContext(30_000)
    assert handler(event, ctx) == {"statusCode": 200, "order": "A-1"}
    # Headers are not part of the payload: a retry with other headers replays.
    retry = {"body": {"amount": 3, "order_id": "A-1"}, "headers": {"x": "2"}}
    assert handler(retry, ctx) == {"statusCode": 200, "order": "A-1"}
    assert calls == ["A-1"]


def test_payload_mismatch_raises(make_backend):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key="id", payload=lambda event: event["amount"])
    def handler(event):
        calls.append(event)
        return event["amount"]

    assert handler({"id": "p1", "amount": 5}) == 5
    with pytest.raises(IdempotencyKeyMismatchError) as err:
        handler({"id": "p1", "amount": 6})
    assert err.value.key == "p1"
    assert handler({"id": "p1", "amount": 5}) == 5
    assert len(calls) == 1


def test_errors_are_not_cached(make_backend):
    backend = _backend(make_backend)
    attempts = []

    @backend.idempotent(key=lambda n: f"flaky:{n}")
    def flaky(n):
        attempts.append(n)
        if len(attempts) == 1:
            raise ConnectionError("downstream failed")
        return "ok"

    with pytest.raises(ConnectionError):
        flaky(1)
    assert backend.idempotency.get("flaky:1") is None  # the claim was released
    assert flaky(1) == "ok"
    assert flaky(1) == "ok"
    assert attempts == [1, 1]


def test_duplicate_while_in_progress_raises(make_backend):
    clock = ManualClock()
    backend = _backend(make_backend, clock=clock)
    seen = {}

    @backend.idempotent(key=lambda: "busy", in_progress_ttl=30)
    def busy():
        with pytest.raises(IdempotencyInProgressError) as err:
            busy()  # a duplicate arriving while the first call runs
        seen["error"] = err.value
        return "done"

    assert busy() == "done"
    assert seen["error"].key == "busy"
    assert seen["error"].expires_at == pytest.approx(clock.time() + 30)
    assert busy() == "done"


def test_eight_threads_same_key_run_once(make_backend):
    needs_atomic_store(make_backend)
    backend = _backend(make_backend)
    calls = []
    barrier = threading.Barrier(8)
    results, errors = [], []

    @backend.idempotent(key=lambda job: job, wait=True, wait_timeout=20)
    def work(job):
        calls.append(job)
        time.sleep(0.3)  # long enough that every other thread arrives while it runs
        return {"job": job, "value": 42}

    def call():
        barrier.wait()
        try:
            results.append(work("same"))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(calls) == 1
    assert results == [{"job": "same", "value": 42}] * 8


def test_eight_threads_without_wait_run_once_and_others_are_refused(make_backend):
    needs_atomic_store(make_backend)
    backend = _backend(make_backend)
    calls = []
    barrier = threading.Barrier(8)
    outcomes = []

    @backend.idempotent(key=lambda: "nowait")
    def work():
        calls.append(1)
        time.sleep(0.3)
        return "result"

    def call():
        barrier.wait()
        try:
            outcomes.append(work())
        except IdempotencyInProgressError:
            outcomes.append("in-progress")

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert outcomes.count("result") >= 1 and len(outcomes) == 8
    assert set(outcomes) <= {"result", "in-progress"}


def test_takeover_after_a_crashed_in_progress_claim(make_backend):
    clock = ManualClock()
    backend = _backend(make_backend, clock=clock)
    idem = backend.idempotency
    # A call that claimed the key and then crashed (never completed, never released).
    crashed = idem.try_claim("crash", lease=10)
    assert crashed.claimed
    calls = []

    @backend.idempotent(key=lambda: "crash")
    def job():
        calls.append(1)
        return "second run"

    with pytest.raises(IdempotencyInProgressError) as err:
        job()
    assert err.value.expires_at == pytest.approx(clock.time() + 10)
    clock.advance(10.001)
    assert job() == "second run"
    assert calls == [1]
    # The crashed call coming back late cannot overwrite or delete the new record.
    assert idem.complete(crashed.claim, "stale") is False
    assert idem.release(crashed.claim) is False
    assert idem.get("crash").result == "second run"
    assert job() == "second run"


def test_wait_takes_over_when_the_lease_runs_out(make_backend):
    clock = ManualClock()
    backend = _backend(make_backend, clock=clock)
    assert backend.idempotency.try_claim("slow", lease=3).claimed

    @backend.idempotent(key=lambda: "slow", wait=True, wait_timeout=10)
    def job():
        return "mine"

    start = clock.monotonic()
    assert job() == "mine"
    assert 3 <= clock.monotonic() - start < 10


def test_wait_gives_up_at_the_deadline(make_backend):
    clock = ManualClock()
    backend = _backend(make_backend, clock=clock)
    assert backend.idempotency.try_claim("stuck", lease=100).claimed

    @backend.idempotent(key=lambda: "stuck", wait=True, wait_timeout=2)
    def job():  # pragma: no cover - must not run
        raise AssertionError("ran while another call held the key")

    start = clock.monotonic()
    with pytest.raises(IdempotencyInProgressError):
        job()
    assert clock.monotonic() - start == pytest.approx(2, abs=0.01)


def test_ttl_expiry_runs_again(make_backend):
    clock = ManualClock()
    backend = _backend(make_backend, clock=clock)
    calls = []

    @backend.idempotent(key=lambda: "ttl", ttl=5)
    def job():
        calls.append(clock.time())
        return len(calls)

    assert job() == 1
    clock.advance(4.999)
    assert job() == 1
    assert backend.idempotency.get("ttl").expires_at == pytest.approx(calls[0] + 5)
    clock.advance(0.002)
    assert backend.idempotency.get("ttl") is None
    assert job() == 2
    assert job() == 2


def test_lambda_remaining_time_bounds_the_lease(make_backend):
    clock = ManualClock()
    backend = _backend(make_backend, clock=clock)
    leases = {}

    @backend.idempotent(key="id", in_progress_ttl=600)
    def handler(event, context):
        leases[event["id"]] = backend.idempotency.get(event["id"]).expires_at_ms
        return "ok"

    now_ms = int(clock.time() * 1000)
    handler({"id": "short"}, FakeLambdaContext(2_000))
    handler({"id": "long"}, FakeLambdaContext(900_000))
    assert leases["short"] == now_ms + 2_000  # bounded by the remaining time
    assert leases["long"] == now_ms + 600_000  # bounded by in_progress_ttl

    @backend.idempotent(key="id")
    def default_lease(event, context):
        leases[event["id"]] = backend.idempotency.get(event["id"]).expires_at_ms
        return "ok"

    default_lease({"id": "default"}, FakeLambdaContext(123_456))
    assert leases["default"] == now_ms + 123_456  # no in_progress_ttl: the remaining time


def test_missing_key_is_refused_unless_allowed(make_backend, caplog):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key="order_id")
    def strict(event):
        calls.append(event)

    for event in ({}, {"order_id": None}, {"order_id": ""}):
        with pytest.raises(InvalidKeyError):
            strict(event)
    assert calls == []

    @backend.idempotent(key="order_id", raise_on_no_key=False)
    def lenient(event):
        calls.append(event)
        return "ran"

    with caplog.at_level(logging.WARNING, logger="dynacoord.idempotency"):
        assert lenient({}) == "ran"
        assert lenient({}) == "ran"
    assert len(calls) == 2
    assert "WITHOUT idempotency" in caplog.text


def test_non_string_keys_are_canonical(make_backend):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key="key")
    def job(event):
        calls.append(1)
        return len(calls)

    assert job({"key": {"a": 1, "b": [2, 3]}}) == 1
    assert job({"key": {"b": [2, 3], "a": 1}}) == 1  # same dict, other order
    assert job({"key": 7}) == 2


def test_unstorable_result_fails_loudly_and_never_runs_twice(make_backend):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key=lambda: "unstorable")
    def job():
        calls.append(1)
        return datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)

    with pytest.raises(IdempotencyValueError) as err:
        job()
    message = str(err.value)
    assert "datetime.datetime" in message  # names the type
    assert "output_type=datetime" in message  # and the fix
    assert err.value.key == "unstorable"
    # The side effects ran once: a duplicate raises the same kind of error without running.
    with pytest.raises(IdempotencyValueError) as again:
        job()
    assert "could not be stored" in str(again.value)
    assert calls == [1]
    record = backend.idempotency.get("unstorable")
    assert record.completed and record.unstorable == "datetime.datetime"
    with pytest.raises(IdempotencyValueError):
        _ = record.result
    # The operator frees the key once the function is fixed.
    assert backend.idempotency.delete("unstorable") is True


def test_unstorable_dataclass_names_the_dataclass(make_backend):
    backend = _backend(make_backend)

    @backend.idempotent(key=lambda: "dc")
    def job():
        return Receipt(order_id="o-1", amount=Decimal("9.99"), at=AT, lines=[])

    with pytest.raises(IdempotencyValueError) as err:
        job()
    assert "Receipt" in str(err.value) and "output_type=Receipt" in str(err.value)


def test_too_large_result_is_refused_with_its_own_fix(make_backend):
    backend = _backend(make_backend)

    @backend.idempotent(key=lambda: "big")
    def job():
        return "x" * (500 * 1024)

    with pytest.raises(IdempotencyValueError) as err:
        job()
    assert "return less" in str(err.value)


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    qty: int
    kind: Kind = dataclasses.field(default=None)  # type: ignore[assignment]


@dataclasses.dataclass
class Receipt:
    order_id: str
    amount: Decimal
    at: datetime.datetime
    lines: list[Line]
    ref: uuid.UUID | None = None
    tags: tuple[str, ...] = ()
    note: str = "none"


AT = datetime.datetime(2026, 11, 23, 5, 45, 1, 123456, tzinfo=datetime.timezone.utc)


def test_typed_dataclass_result_is_replayed_equal(make_backend):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key="order_id", output_type=Receipt)
    def charge(event):
        calls.append(1)
        return Receipt(
            order_id=event["order_id"],
            amount=Decimal("12.30"),
            at=AT,
            lines=[Line("a", 1, Kind.GOODS), Line("b", 2, Kind.SERVICE)],
            ref=uuid.UUID(int=7),
            tags=("x", "y"),
        )

    first = charge({"order_id": "T-1"})
    replay = charge({"order_id": "T-1"})
    assert calls == [1]
    assert isinstance(replay, Receipt) and replay == first
    assert isinstance(replay.lines[0], Line) and replay.lines[1].kind is Kind.SERVICE
    assert replay.at.tzinfo is not None and replay.tags == ("x", "y")
    # The stored form is plain codec data.
    stored = backend.idempotency.get("T-1").result
    assert stored["at"] == AT.isoformat() and stored["ref"] == str(uuid.UUID(int=7))


def test_typed_results_of_other_forms(make_backend):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key=lambda n: f"when:{n}", output_type=datetime.datetime)
    def when(n):
        calls.append(n)
        return AT

    @backend.idempotent(key=lambda n: f"many:{n}", output_type=list[Line])
    def many(n):
        calls.append(n)
        return [Line("a", n)]

    @backend.idempotent(
        key=lambda n: f"pair:{n}", output_type=(lambda s: sorted(s), lambda d: set(d))
    )
    def pair(n):
        calls.append(n)
        return {3, 1, 2}

    @backend.idempotent(key=lambda n: f"none:{n}", output_type=Receipt)
    def nothing(n):
        calls.append(n)
        return None

    for _ in range(2):
        assert when(1) == AT
        assert many(2) == [Line("a", 2)]
        assert pair(3) == {1, 2, 3}
        assert nothing(4) is None
    assert calls == [1, 2, 3, 4]


def test_typed_pydantic_result(make_backend):
    import pydantic  # a dev dependency (never one of dynacoord's)

    class Order(pydantic.BaseModel):
        id: str
        total: Decimal
        at: datetime.datetime
        items: list[str]

    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key="id", output_type=Order)
    def create(event):
        calls.append(1)
        return Order(id=event["id"], total=Decimal("1.50"), at=AT, items=["a"])

    first = create({"id": "P-1"})
    replay = create({"id": "P-1"})
    assert calls == [1] and isinstance(replay, Order) and replay == first


def test_output_type_mismatch_is_refused(make_backend):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key=lambda: "mismatch", output_type=Receipt)
    def job():
        calls.append(1)
        return {"not": "a receipt"}

    with pytest.raises(IdempotencyValueError) as err:
        job()
    assert "Receipt" in str(err.value)
    with pytest.raises(IdempotencyValueError):
        job()
    assert calls == [1]


def test_unsupported_output_type_fails_at_decoration(make_backend):
    backend = _backend(make_backend)

    @dataclasses.dataclass
    class Odd:
        handle: threading.Lock

    with pytest.raises(ConfigurationError, match="to_store, from_store"):
        backend.idempotent(key="id", output_type=Odd)
    with pytest.raises(ConfigurationError):
        backend.idempotent(key="id", output_type=(len,))


class CountingStore:
    """Wraps a backend's idempotency store and counts its requests."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def __getattr__(self, name):
        method = getattr(self.inner, name)

        def counted(*args, **kwargs):
            self.calls.append(name)
            return method(*args, **kwargs)

        return counted


def test_local_cache_replays_without_a_request(make_backend):
    clock = ManualClock()
    backend = _backend(make_backend, clock=clock)
    idem = backend.idempotency
    counting = CountingStore(idem._store)
    idem._store = counting
    calls = []

    @backend.idempotent(
        key="id", payload="amount", ttl=60, use_local_cache=True, local_cache_max_items=2
    )
    def handler(event):
        calls.append(event["id"])
        return {"id": event["id"]}

    assert handler({"id": "L-1", "amount": 1}) == {"id": "L-1"}
    assert counting.calls == ["claim", "complete"]
    counting.calls.clear()
    assert handler({"id": "L-1", "amount": 1}) == {"id": "L-1"}
    assert counting.calls == []  # a replay in the same process costs no request
    with pytest.raises(IdempotencyKeyMismatchError):
        handler({"id": "L-1", "amount": 2})
    # bounded: the least recently used entry is evicted
    handler({"id": "L-2", "amount": 1})
    handler({"id": "L-3", "amount": 1})
    assert len(handler.local_cache) == 2
    counting.calls.clear()
    assert handler({"id": "L-1", "amount": 1}) == {"id": "L-1"}
    assert counting.calls == ["claim"]  # evicted: one refused claim, then cached again
    clock.advance(61)
    assert handler({"id": "L-1", "amount": 1}) == {"id": "L-1"}
    assert calls == ["L-1", "L-2", "L-3", "L-1"]  # expired everywhere: ran again


def test_response_hook_marks_replays(make_backend):
    backend = _backend(make_backend)
    seen = []

    def hook(result, record):
        seen.append(record.key)
        return {**result, "replayed": True}

    @backend.idempotent(key="id", response_hook=hook, use_local_cache=True)
    def handler(event):
        return {"id": event["id"]}

    assert handler({"id": "H-1"}) == {"id": "H-1"}
    assert handler({"id": "H-1"}) == {"id": "H-1", "replayed": True}
    assert handler({"id": "H-1"}) == {"id": "H-1", "replayed": True}  # local hit too
    assert seen == ["H-1", "H-1"]


def test_nested_function_lease_is_bounded_by_the_invocation(make_backend):
    clock = ManualClock()
    backend = _backend(make_backend, clock=clock)
    leases = {}
    now_ms = int(clock.time() * 1000)

    @backend.idempotent(key=lambda order_id: f"nested:{order_id}", in_progress_ttl=600)
    def process(order_id):
        leases[order_id] = backend.idempotency.get(f"nested:{order_id}").expires_at_ms
        return order_id

    # A handler that is not idempotent itself registers the context.
    def handler(event, context):
        register_lambda_context(context)
        return process(event["id"])

    handler({"id": "a"}, FakeLambdaContext(5_000))
    assert leases["a"] == now_ms + 5_000

    # An idempotent handler registers its own context for what it calls.
    @backend.idempotent(key="id")
    def outer(event, context):
        return process(event["id"] + "-inner")

    outer({"id": "b"}, FakeLambdaContext(7_000))
    assert leases["b-inner"] == now_ms + 7_000

    # A context left registered by a finished invocation (no time left) is ignored.
    register_lambda_context(FakeLambdaContext(0))
    process("c")
    assert leases["c"] == now_ms + 600_000


def test_jmespath_json_function_parses_string_bodies(make_backend):
    backend = _backend(make_backend)
    calls = []

    @backend.idempotent(key="json(body).order_id", payload="json(body)")
    def handler(event, context):
        calls.append(1)
        return {"statusCode": 200}

    ctx = FakeLambdaContext(10_000)
    handler({"body": '{"order_id": "J-1", "n": 1}'}, ctx)
    handler({"body": '{"n": 1, "order_id": "J-1"}'}, ctx)  # same JSON, other text
    assert calls == [1]
    assert backend.idempotency.get("J-1").completed
    with pytest.raises(IdempotencyKeyMismatchError):
        handler({"body": '{"order_id": "J-1", "n": 2}'}, ctx)
    with pytest.raises(InvalidKeyError):
        handler({"body": "not json"}, ctx)
    assert calls == [1]


def test_store_level_api(make_backend):
    clock = ManualClock()
    backend = _backend(make_backend, clock=clock)
    idem = backend.idempotency
    outcome = idem.try_claim("manual", lease=30, payload_hash="h1")
    assert outcome.claimed and outcome.existing is None
    claim = outcome.claim
    record = idem.get("manual")
    assert record.status is IdempotencyStatus.IN_PROGRESS and record.payload_hash == "h1"
    refused = idem.try_claim("manual", lease=30)
    assert not refused.claimed
    assert refused.existing.status is IdempotencyStatus.IN_PROGRESS
    assert refused.existing.expires_at == pytest.approx(claim.expires_at)
    assert idem.complete(claim, {"v": [1, 2]}, ttl=60) is True
    replay = idem.try_claim("manual", lease=30)
    assert not replay.claimed and replay.existing.completed
    assert replay.existing.result == {"v": [1, 2]}
    with pytest.raises(IdempotencyValueError):
        idem.complete(claim, object())
    assert idem.delete("manual") is True
    assert idem.get("manual") is None
    assert idem.delete("manual") is False
    again = idem.try_claim("manual", lease=1)
    assert idem.release(again.claim) is True
    assert idem.get("manual") is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"key": 5}, ConfigurationError),
        ({"key": "a[?"}, ConfigurationError),
        ({"key": "id", "ttl": 0}, ValueError),
        ({"key": "id", "in_progress_ttl": -1}, ValueError),
        ({"key": "id", "wait_timeout": -1}, ValueError),
        ({"key": "id", "payload": 3}, ConfigurationError),
    ],
)
def test_bad_decorator_options_raise_at_decoration(make_backend, kwargs, error):
    backend = _backend(make_backend)
    with pytest.raises(error):
        backend.idempotent(**kwargs)


def test_requests_per_call_first_two_writes_replay_one(make_backend):
    if getattr(make_backend, "kind", "") not in ("moto", "dynamodb"):
        pytest.skip("request counting uses botocore event hooks (DynamoDB backends only)")
    backend = _backend(make_backend)
    operations = []

    def count(event_name, **_):
        operations.append(event_name.rsplit(".", 1)[-1])

    events = backend.client.meta.events
    events.register("before-call.dynamodb.*", count)
    try:

        @backend.idempotent(key="id")
        def handler(event, context):
            return {"ok": event["id"]}

        ctx = FakeLambdaContext(10_000)
        handler({"id": "count"}, ctx)
        assert operations == ["PutItem", "UpdateItem"]
        operations.clear()
        assert handler({"id": "count"}, ctx) == {"ok": "count"}
        assert operations == ["PutItem"]
    finally:
        events.unregister("before-call.dynamodb.*", count)


def test_a_completed_claim_cannot_be_completed_again_or_released(make_backend):
    """Once completed, the claim's token is gone: a second completion (another result) and a
    release by the same claim are refused and the first result stays."""
    idem = _backend(make_backend, clock=ManualClock()).idempotency
    claim = idem.try_claim("done-once", lease=30).claim
    assert idem.complete(claim, {"n": 1}, ttl=60) is True
    assert idem.complete(claim, {"n": 2}, ttl=60) is False
    assert idem.release(claim) is False
    record = idem.get("done-once")
    assert record.completed and record.result == {"n": 1}
