"""Runs examples/lambda_outbox.py's two handlers against Amazon DynamoDB Local."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from dynacoord.testing import unique_name

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "lambda_outbox.py"


class FakeContext:
    aws_request_id = "req-1"

    def __init__(self, remaining_ms: int = 60_000) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@pytest.fixture()
def example(ddb_table, dynamodb_local, monkeypatch):
    client, table = ddb_table
    orders = unique_name("orders")
    client.create_table(
        TableName=orders,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    monkeypatch.setenv("DYNACOORD_ENDPOINT_URL", dynamodb_local.endpoint_url)
    monkeypatch.setenv("DYNACOORD_TABLE", table)
    monkeypatch.setenv("DYNACOORD_NAMESPACE", unique_name("example"))
    monkeypatch.setenv("ORDERS_TABLE", orders)
    monkeypatch.delenv("OUTBOX_QUEUE_URL", raising=False)
    name = f"lambda_outbox_{unique_name()}"
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module, client, orders
    finally:
        sys.modules.pop(name, None)
        client.delete_table(TableName=orders)


def _post(order_id, customer="c-1", total=1250):
    return {"body": json.dumps({"order_id": order_id, "customer": customer, "total_cents": total})}


def test_order_and_event_are_written_together_then_delivered_once(example):
    module, client, orders = example
    response = module.place_order(_post("o-1"), FakeContext())
    assert response["statusCode"] == 201
    assert json.loads(response["body"])["event"] == "order-placed-o-1"
    item = client.get_item(TableName=orders, Key={"pk": {"S": "order#o-1"}})["Item"]
    assert item["total_cents"] == {"N": "1250"}

    # A client retry: the order exists, so neither the order nor a second event is written.
    assert module.place_order(_post("o-1", total=999), FakeContext())["statusCode"] == 409
    assert module.backend.outbox.stats().pending == 1

    assert module.place_order({"body": "{}"}, FakeContext())["statusCode"] == 400

    result = module.deliver_events({}, FakeContext())
    assert result["delivered"] == 1 and result["failed"] == 0
    assert module.CONFIRMATIONS == [
        {"event_id": "order-placed-o-1", "order_id": "o-1", "attempt": 1}
    ]
    assert module.deliver_events({}, FakeContext())["handled"] == 0
    stats = module.backend.outbox.stats()
    assert (stats.pending, stats.in_flight, stats.failed) == (0, 0, 0)


def test_worker_stops_claiming_when_time_runs_out(example):
    module, _, _ = example
    for i in range(3):
        assert module.place_order(_post(f"t-{i}"), FakeContext())["statusCode"] == 201
    assert module.deliver_events({}, FakeContext(remaining_ms=10_000))["handled"] == 0
    assert module.backend.outbox.stats().pending == 3
    assert module.deliver_events({}, FakeContext())["delivered"] == 3
