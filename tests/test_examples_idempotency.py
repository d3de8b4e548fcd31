"""Runs examples/lambda_idempotent_handler.py against Amazon DynamoDB Local with a fake context."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dynacoord import IdempotencyKeyMismatchError
from dynacoord.testing import unique_name

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "lambda_idempotent_handler.py"


class FakeContext:
    """Lambda's context: the remaining time drops by ``step_ms`` on every call."""

    function_name = "orders"
    aws_request_id = "req"

    def __init__(self, remaining_ms: int, step_ms: int = 0) -> None:
        self.remaining_ms = remaining_ms
        self.step_ms = step_ms

    def get_remaining_time_in_millis(self) -> int:
        value = self.remaining_ms
        self.remaining_ms -= self.step_ms
        return value


@pytest.fixture()
def example(ddb_table, dynamodb_local, monkeypatch):
    _, table = ddb_table
    monkeypatch.setenv("DYNACOORD_ENDPOINT_URL", dynamodb_local.endpoint_url)
    monkeypatch.setenv("DYNACOORD_TABLE", table)
    monkeypatch.setenv("DYNACOORD_NAMESPACE", unique_name("example"))
    name = f"lambda_example_{unique_name()}"
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # the module builds its backend from the environment
        yield module
    finally:
        sys.modules.pop(name, None)


def _event(order_id, n_lines):
    lines = [
        {"sku": f"s{i}", "quantity": i % 3 + 1, "unit_price_cents": 100 + i} for i in range(n_lines)
    ]
    return {"source": "shop", "detail": {"order_id": order_id, "lines": lines}}


def _expected_total(event):
    return sum(line["quantity"] * line["unit_price_cents"] for line in event["detail"]["lines"])


def test_runs_once_and_replays(example, monkeypatch):
    processed = []
    original = example.process_line
    monkeypatch.setattr(
        example,
        "process_line",
        lambda order, line: processed.append(line["sku"]) or original(order, line),
    )
    event = _event("order-1", 25)
    result = example.handler(event, FakeContext(60_000))
    assert result == {
        "order_id": "order-1",
        "lines": 25,
        "total_cents": _expected_total(event),
        "resumed_from_line": 0,
    }
    assert len(processed) == 25
    assert example.handler(event, FakeContext(60_000)) == result  # a redelivery: replayed
    assert len(processed) == 25
    assert example.backend.checkpoints.list("order-lines:order-1") == []  # cleaned up when done
    changed = _event("order-1", 3)
    with pytest.raises(IdempotencyKeyMismatchError):
        example.handler(changed, FakeContext(60_000))


def test_out_of_time_resumes_from_the_checkpoint(example, monkeypatch):
    processed = []
    original = example.process_line
    monkeypatch.setattr(
        example,
        "process_line",
        lambda order, line: processed.append(line["sku"]) or original(order, line),
    )
    event = _event("order-2", 100)
    # 30 s left and 5 s per batch: the decorator reads it once, then batches run at 25, 20, 15
    # and 10 s left; at 5 s the handler stops.
    context = FakeContext(30_000, step_ms=5_000)
    with pytest.raises(example.OutOfTime):
        example.handler(event, context)
    assert len(processed) == 40
    latest = example.backend.checkpoints.load_latest("order-lines:order-2")
    assert latest.data["next"] == 40 and latest.progress == 40.0
    assert example.backend.idempotency.get("order-2") is None  # the error was not cached

    result = example.handler(event, FakeContext(600_000))  # Lambda's retry
    assert result["resumed_from_line"] == 40
    assert result["total_cents"] == _expected_total(event)
    assert sorted(processed) == sorted(line["sku"] for line in event["detail"]["lines"])
    assert len(processed) == 100  # every line exactly once across both invocations
    assert example.handler(event, FakeContext(600_000)) == result
    assert len(processed) == 100
