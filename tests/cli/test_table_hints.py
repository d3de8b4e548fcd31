"""What ``table verify`` and ``table create`` say about an application's table: TTL on the
application's own attribute is usable (a note, exit 0), and a table whose keys no layout can fit
gets a hint that names what can help (issue 52 items 6 and 7)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cli_helpers import SHOP_LAYOUT, cli_aws, cli_tables, run_cli  # noqa: F401

REGION = ("--region", "us-east-1")


def _app_table(client: Any, name: str) -> None:
    from dynacoord.provision import create_table

    create_table(client, name)
    client.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": False, "AttributeName": "ttl"}
    )
    client.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires"}
    )


@pytest.mark.parametrize("command", ["verify", "create"])
def test_ttl_on_the_applications_own_attribute_is_usable_with_a_note(
    capsys: pytest.CaptureFixture[str], cli_aws: Any, command: str
) -> None:
    _app_table(cli_aws["dynamodb"], "apptable")
    code, out, err = run_cli(capsys, *REGION, "--json", "--table", "apptable", "table", command)
    assert code == 0, err
    assert json.loads(out)["ok"] is True
    (note,) = [line for line in err.splitlines() if line.startswith("dynacoord: warning:")]
    assert note.startswith("dynacoord: warning: TTL is enabled on attribute 'expires'")
    assert """--table-layout '{"ttl":"expires"}'""" in note
    # the application's TTL is left on
    described = cli_aws["dynamodb"].describe_time_to_live(TableName="apptable")
    assert described["TimeToLiveDescription"]["AttributeName"] == "expires"


def _keyed(client: Any, name: str, *keys: tuple[str, str]) -> None:
    client.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": k, "AttributeType": t} for k, t in keys],
        KeySchema=[
            {"AttributeName": k, "KeyType": kind}
            for (k, _), kind in zip(keys, ("HASH", "RANGE"), strict=False)
        ],
        BillingMode="PAY_PER_REQUEST",
    )


@pytest.mark.parametrize("command", ["verify", "create"])
def test_a_one_key_table_is_told_what_can_help_not_the_layout(
    capsys: pytest.CaptureFixture[str], cli_aws: Any, command: str
) -> None:
    _keyed(cli_aws["dynamodb"], "onekey", ("id", "S"))
    code, out, err = run_cli(capsys, *REGION, "--table", "onekey", "table", command)
    assert code == 1
    (line,) = err.splitlines()
    assert "--table-layout '" not in line  # no layout to give: it cannot help
    assert "a table of its own" in line and "dynacoord --table NEW table create" in line
    # nothing promises that the command which refused the table would enable its TTL
    assert "table create` enables" not in out + err


def test_a_two_key_table_of_strings_is_told_its_own_key_names(
    capsys: pytest.CaptureFixture[str], cli_aws: Any
) -> None:
    _keyed(cli_aws["dynamodb"], "twokey", ("tenant", "S"), ("entity", "S"))
    code, _, err = run_cli(capsys, *REGION, "--table", "twokey", "table", "verify")
    assert code == 1
    assert """--table-layout '{"pk":"tenant","sk":"entity"}'""" in err


def test_a_table_with_its_own_index_is_told_the_layout_of_both(
    capsys: pytest.CaptureFixture[str], cli_tables: Any
) -> None:
    from dynacoord import TableLayout

    code, _, err = run_cli(capsys, *REGION, "--table", "shop", "table", "verify")
    assert code == 1
    given = err.split("--table-layout '", 1)[1].split("'", 1)[0]
    assert TableLayout.from_json(given) == TableLayout.from_json(SHOP_LAYOUT)
