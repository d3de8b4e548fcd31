"""The CLI with a table layout: ``--table-layout`` on ``table create|verify`` and ``iam-policy``,
``DYNACOORD_TABLE_LAYOUT`` for every command (DynamoDB Local)."""

from __future__ import annotations

import json

import pytest

from dynacoord.cli import main
from dynacoord.testing import DynamoDBLocal, unique_name
from tests.backends_fixtures import LAYOUT


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_create_verify_and_commands_with_a_layout(
    dynamodb_local: DynamoDBLocal,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DYNACOORD_TABLE_LAYOUT", raising=False)
    table = unique_name("cli-layout")
    base = ["--endpoint-url", dynamodb_local.endpoint_url, "--region", "us-east-1"]
    base += ["--table", table]
    layout = LAYOUT.to_json()
    code, _, err = _run(capsys, *base, "table", "create", "--table-layout", layout)
    assert code == 0, err
    client = dynamodb_local.client()
    described = client.describe_table(TableName=table)["Table"]
    assert [k["AttributeName"] for k in described["KeySchema"]] == ["PK", "SK"]
    assert _run(capsys, *base, "table", "verify", "--table-layout", layout)[0] == 0
    # without the layout, the table is not dynacoord's schema: the report names what it expects
    code, out, _ = _run(capsys, *base, "table", "verify")
    assert code == 1 and "expected pk (HASH) + sk (RANGE)" in out
    # the environment gives the layout to every command
    monkeypatch.setenv("DYNACOORD_TABLE_LAYOUT", layout)
    code, out, err = _run(capsys, *base, "--namespace", "cli", "counters", "incr", "visits")
    assert code == 0, err
    key = {"PK": {"S": "DC#COUNTER#cli#visits"}, "SK": {"S": "COUNTER"}}
    assert "Item" in client.get_item(TableName=table, Key=key)
    assert _run(capsys, *base, "table", "verify")[0] == 0


def test_a_bad_layout_is_a_usage_error_naming_where_it_came_from(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    arn = "arn:aws:dynamodb:us-east-1:123456789012:table/app"
    code, _, err = _run(capsys, "iam-policy", "--table-arn", arn, "--table-layout", '{"pk": ""}')
    assert code == 2 and "--table-layout: TableLayout.pk must be a non-empty str" in err
    monkeypatch.setenv("DYNACOORD_TABLE_LAYOUT", '{"prefix": "a*"}')
    code, _, err = _run(capsys, "iam-policy", "--table-arn", arn)
    assert code == 2 and "DYNACOORD_TABLE_LAYOUT: TableLayout.prefix" in err
    monkeypatch.setenv("DYNACOORD_TABLE_LAYOUT", LAYOUT.to_json())
    code, out, _ = _run(capsys, "--namespace", "orders", "iam-policy", "--table-arn", arn)
    policy = json.loads(out)
    keys = policy["Statement"][0]["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert code == 0 and "DC#LOCK#orders#*" in keys
    assert policy["Statement"][1]["Resource"] == f"{arn}/index/GSI1"
