"""The outbox's conditional PartiQL batches: the translation of a transaction item, and the
probe that decides whether an endpoint runs them (or the role may: IAM's PartiQLUpdate)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from dynacoord.backends.dynamodb import _partiql
from dynacoord.backends.dynamodb._table import DynamoTable

KEY = {"pk": {"S": "OUTBOX#ns#~"}, "sk": {"S": "PARTIQL-PROBE"}}


def _supported(client: Any) -> bool:
    """The probe's answer through a table session on ``client`` (each session of a client and
    table shares what the first one learnt)."""
    return DynamoTable(client, "t").statements_supported(KEY)


def _op(**extra: Any) -> dict[str, Any]:
    return {
        "TableName": "t",
        "Key": {"pk": {"S": "E#1"}, "sk": {"S": "EVENT"}},
        "ConditionExpression": "#status = :s AND attribute_not_exists(lease_token)",
        "UpdateExpression": "SET #status = :f, attempts = attempts + :one REMOVE gsi1pk",
        "ExpressionAttributeNames": {"#status": "status"},
        "ExpressionAttributeValues": {":s": {"S": "pending"}, ":f": {"S": "x"}, ":one": {"N": "1"}},
        **extra,
    }


def test_an_update_becomes_one_statement_with_its_parameters_in_order() -> None:
    got = _partiql.statement("Update", _op())
    assert got["Statement"] == (
        'UPDATE "t" SET "status" = ? SET "attempts" = "attempts" + ? REMOVE "gsi1pk" '
        'WHERE "pk" = ? AND "sk" = ? AND ("status" = ? AND "lease_token" IS MISSING)'
    )
    assert got["Parameters"] == [
        {"S": "x"},
        {"N": "1"},
        {"S": "E#1"},
        {"S": "EVENT"},
        {"S": "pending"},
    ]
    assert got["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"


@pytest.mark.parametrize(
    ("action", "op"),
    [
        ("Put", _op()),
        ("Update", _op(UpdateExpression="SET n = if_not_exists(n, :one)")),
        ("Update", _op(ReturnValues="ALL_NEW")),
        ("Update", _op(ConditionExpression="#missing = :s")),
    ],
)
def test_what_is_not_translated_is_said(action: str, op: dict[str, Any]) -> None:
    with pytest.raises(_partiql.NotTranslatableError):
        _partiql.statement(action, op)


class _Client:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls = 0

    def batch_execute_statement(self, **_: Any) -> Any:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "BatchExecuteStatement")


def test_a_refused_probe_means_supported_and_is_remembered() -> None:
    client = _Client({"Responses": [{"Error": {"Code": "ConditionalCheckFailed"}}]})
    assert _supported(client) is True
    assert _supported(client) is True
    assert client.calls == 1


@pytest.mark.parametrize(
    "answer",
    [
        _error("AccessDeniedException"),  # a role without dynamodb:PartiQLUpdate
        _error("ValidationException"),
        AssertionError(),  # moto's PartiQL parser
        {"Responses": [{}]},  # applied: the endpoint ignored the condition
    ],
)
def test_anything_but_a_refused_probe_means_transactions(answer: Any) -> None:
    assert _supported(_Client(answer)) is False


def test_a_throttled_probe_is_asked_again() -> None:
    client = _Client(_error("ThrottlingException"))
    with pytest.raises(ClientError):
        _supported(client)
    client.answer = {"Responses": [{"Error": {"Code": "ConditionalCheckFailed"}}]}
    assert _supported(client) is True
