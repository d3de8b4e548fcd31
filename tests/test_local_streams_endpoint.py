"""DynamoDB Local's environment points stream readers at it: a ``dynamodbstreams`` client built
under ``DynamoDBLocal.env()`` (what ``dynacoord local start`` prints and the
``dynamodb_local_env`` fixture sets) talks to the local server, never to AWS."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dynacoord.testing import DynamoDBLocal, unique_name

ROOT = Path(__file__).resolve().parent.parent


def _streams_client() -> Any:
    import boto3

    # a fresh session: the default one would keep what it read before the environment changed
    return boto3.session.Session().client("dynamodbstreams")


def test_a_streams_client_built_under_the_fixture_environment_reaches_dynamodb_local(
    dynamodb_local: DynamoDBLocal, dynamodb_local_env: dict[str, str]
) -> None:
    client = _streams_client()
    assert client.meta.endpoint_url == dynamodb_local.endpoint_url
    # a real call: the local server answers with the stream of a table made there
    ddb = dynamodb_local.client()
    name = unique_name("streams")
    ddb.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"},
    )
    try:
        streams = client.list_streams(TableName=name)["Streams"]
        assert [s["TableName"] for s in streams] == [name]
    finally:
        ddb.delete_table(TableName=name)


def test_the_printed_environment_points_streams_at_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = DynamoDBLocal(port=8123, jar_dir=Path("/nonexistent"))
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    assert _streams_client().meta.endpoint_url == "http://127.0.0.1:8123"


def test_docs_testing_exports_what_botocore_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    exports = dict(re.findall(r"export (AWS_ENDPOINT_URL_\w+)=(\S+)", text))
    assert exports, "docs/testing.md shows no endpoint exports"
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for name, value in exports.items():
        monkeypatch.setenv(name, value)
    assert _streams_client().meta.endpoint_url == "http://127.0.0.1:8000"
