"""docs/lambda.md runs as written: every block marked ``<!-- run: NAME -->`` is executed against
DynamoDB Local (through ``DynamoDBBackend.from_env``) and its handler called with real-shaped
events; the JMESPath key examples of docs/idempotency.md are evaluated on sample events."""

from __future__ import annotations

import base64
import json
import re
import sys
import types
from pathlib import Path

import pytest

from dynacoord import IdempotencyKeyMismatchError
from dynacoord.idempotency import compile_jmespath
from dynacoord.testing import unique_name
from tests.test_metrics import validate_emf

DOCS = Path(__file__).resolve().parent.parent / "docs"


def blocks(page: str) -> dict[str, str]:
    text = (DOCS / page).read_text()
    return dict(re.findall(r"<!-- run: (\w+) -->\n```python\n(.*?)```", text, re.S))


class Context:
    function_name = "docs"
    aws_request_id = "req"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


@pytest.fixture()
def from_env(ddb_table, dynamodb_local, monkeypatch):
    _client, table = ddb_table
    monkeypatch.setenv("DYNACOORD_TABLE", table)
    monkeypatch.setenv("DYNACOORD_ENDPOINT_URL", dynamodb_local.endpoint_url)
    monkeypatch.setenv("DYNACOORD_NAMESPACE", unique_name("docs"))


def run_block(name: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Run a block as the module of a handler file (registered, so dataclasses resolve)."""
    module = types.ModuleType(f"docs_{name}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    code = compile(blocks("lambda.md")[name], f"docs/lambda.md:{name}", "exec", dont_inherit=True)
    exec(code, module.__dict__)
    return module.__dict__


def test_every_marked_block_is_tested():
    assert set(blocks("lambda.md")) == {"api", "sqs", "kinesis"}


def test_api_gateway_handler(from_env, capsys, monkeypatch):
    scope = run_block("api", monkeypatch)
    handler = scope["handler"]
    event = {"body": json.dumps({"order_id": "o-1", "amount": 5}), "headers": {}}
    first = handler(event, Context())
    assert first["statusCode"] == 201 and "Idempotent-Replayed" not in first["headers"]
    lines = capsys.readouterr().out.splitlines()
    docs = [validate_emf(line) for line in lines]
    names = {m["Name"] for d in docs for m in d["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert {"IdempotencyFirstCall", "StoreRequestLatency"} <= names
    # the same body with its keys in another order is the same payload
    again = handler({"body": json.dumps({"amount": 5, "order_id": "o-1"})}, Context())
    assert again["headers"]["Idempotent-Replayed"] == "true"
    assert json.loads(again["body"]) == json.loads(first["body"])
    with pytest.raises(IdempotencyKeyMismatchError):
        handler({"body": json.dumps({"order_id": "o-1", "amount": 6})}, Context())
    # the nested typed call replays an equal Receipt
    receipt = scope["charge"]({"order_id": "o-1", "amount": 5})
    assert isinstance(receipt, scope["Receipt"])
    assert receipt.charged_at.isoformat() == json.loads(first["body"])["at"]


def test_sqs_handler(from_env, monkeypatch):
    scope = run_block("sqs", monkeypatch)
    event = {
        "Records": [
            {
                "messageId": f"{unique_name('m')}-{i}",
                "body": json.dumps(body),
                "eventSourceARN": "arn:aws:sqs:eu-west-1:123456789012:orders",
            }
            for i, body in enumerate(
                [
                    {"order_id": "a", "address": "x"},
                    {"order_id": "b"},
                    {"order_id": "c", "address": "y"},
                ]
            )
        ]
    }
    response = scope["handler"](event, Context())
    assert response == {"batchItemFailures": [{"itemIdentifier": event["Records"][1]["messageId"]}]}
    assert scope["shipped"] == ["a", "c"]
    scope["handler"](event, Context())  # the whole batch again
    assert scope["shipped"] == ["a", "c"]


def test_kinesis_handler(from_env, monkeypatch):
    scope = run_block("kinesis", monkeypatch)
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/s"
    ids = [unique_name("k"), unique_name("k")]
    event = {
        "Records": [
            {
                "kinesis": {
                    "sequenceNumber": str(100 + i),
                    "data": base64.b64encode(json.dumps({"id": ident}).encode()).decode(),
                },
                "eventID": f"shardId-0:{100 + i}",
                "eventSourceARN": arn,
            }
            for i, ident in enumerate([ids[0], ids[1], ids[0]])
        ]
    }
    assert scope["handler"](event, Context()) == {"batchItemFailures": []}
    assert scope["seen"] == ids


# -- the key examples of docs/idempotency.md --------------------------------------------------

API_GATEWAY = {
    "resource": "/orders",
    "httpMethod": "POST",
    "headers": {"Idempotency-Key": "k-123", "Content-Type": "application/json"},
    "body": json.dumps({"order_id": "o-7", "amount": 3}),
    "isBase64Encoded": False,
}
HTTP_API = {
    "version": "2.0",
    "headers": {"idempotency-key": "k-456"},
    "body": json.dumps({"order_id": "o-8"}),
}
SQS_RECORD = {"messageId": "m-1", "body": json.dumps({"order_id": "o-9"})}
SNS_VIA_SQS = {
    "messageId": "m-2",
    "body": json.dumps({"Type": "Notification", "Message": json.dumps({"order_id": "o-10"})}),
}
EVENTBRIDGE = {
    "version": "0",
    "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718",
    "detail-type": "OrderPlaced",
    "source": "shop",
    "detail": {"order_id": "o-11"},
}
S3 = {
    "Records": [
        {
            "eventName": "ObjectCreated:Put",
            "s3": {
                "bucket": {"name": "uploads"},
                "object": {"key": "in/a.csv", "sequencer": "0055AED6DCD90281E5"},
            },
        }
    ]
}

KEY_EXAMPLES = [
    (API_GATEWAY, "json(body).order_id", "o-7"),
    (API_GATEWAY, 'headers."Idempotency-Key"', "k-123"),
    (HTTP_API, 'headers."idempotency-key"', "k-456"),
    (SQS_RECORD, "json(body).order_id", "o-9"),
    (SNS_VIA_SQS, "json(json(body).Message).order_id", "o-10"),
    (EVENTBRIDGE, "id", "6a7e8feb-b491-4cf7-a9f1-bf3703467718"),
    (EVENTBRIDGE, "detail.order_id", "o-11"),
    (
        S3,
        "join('/', [Records[0].s3.bucket.name, Records[0].s3.object.key, "
        "Records[0].s3.object.sequencer])",
        "uploads/in/a.csv/0055AED6DCD90281E5",
    ),
]


@pytest.mark.parametrize(("event", "expression", "expected"), KEY_EXAMPLES)
def test_documented_key_examples(event, expression, expected):
    assert compile_jmespath(expression, "key")(event) == expected
    assert f"`{expression}`" in (DOCS / "idempotency.md").read_text()
