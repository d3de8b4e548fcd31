"""``dynacoord table|stack|iam-policy`` through ``dynacoord.cli.main`` (DynamoDB Local, moto)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynacoord.cli import main
from dynacoord.provision import table_definition, verify_table
from dynacoord.testing import DynamoDBLocal, unique_name

TEMPLATE = Path(__file__).resolve().parents[2] / "cloudformation" / "dynacoord.yaml"
ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/dynacoord"


class Run:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()  # drop anything printed before
        code = main(list(argv))
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture()
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(capsys)


@pytest.fixture()
def local(dynamodb_local: DynamoDBLocal) -> list[str]:
    """Global options that point the CLI at DynamoDB Local."""
    return ["--endpoint-url", dynamodb_local.endpoint_url, "--region", "us-east-1"]


def test_table_create_verify_delete(
    run: Run, local: list[str], dynamodb_local: DynamoDBLocal
) -> None:
    name = unique_name("cli")
    table = [*local, "--table", name]

    code, out, err = run(*table, "--json", "table", "create")
    assert code == 0, err
    assert json.loads(out) == {"table": name, "created": True, "ok": True}
    assert f"creating table {name} ..." in err  # progress on stderr
    assert verify_table(dynamodb_local.client(), name) == []

    code, out, err = run(*table, "--json", "table", "create")  # idempotent
    assert code == 0, err
    assert json.loads(out)["created"] is False

    code, out, err = run(*table, "table", "verify")
    assert code == 0, err
    assert "ok: true" in out

    code, out, err = run(*table, "table", "delete")
    assert code == 2
    assert "--yes" in err and err.count("\n") == 1
    assert name in dynamodb_local.client().list_tables()["TableNames"]

    code, out, err = run(*table, "-q", "--json", "table", "delete", "--yes")
    assert code == 0, err
    assert json.loads(out) == {"table": name, "deleted": True}
    assert err == ""  # -q: no progress lines

    code, out, err = run(*table, "table", "verify")
    assert code == 1
    assert f"table {name!r} does not exist" in out
    assert err.startswith("dynacoord: error: ") and err.count("\n") == 1

    code, out, err = run(*table, "table", "delete", "--yes")
    assert code == 1
    assert "does not exist" in err
    code, out, err = run(*table, "table", "delete", "--yes", "--missing-ok")
    assert code == 0, err


def test_table_verify_lists_the_problems_of_a_wrong_table(
    run: Run, own_dynamodb_local: DynamoDBLocal
) -> None:
    dynamodb_local = own_dynamodb_local
    local = ["--endpoint-url", dynamodb_local.endpoint_url, "--region", "us-east-1"]
    name = unique_name("bad")
    client = dynamodb_local.client()
    request = table_definition(name)
    del request["GlobalSecondaryIndexes"]
    request["AttributeDefinitions"] = request["AttributeDefinitions"][:2]
    client.create_table(**request)
    try:
        code, out, err = run(*local, "--table", name, "--json", "table", "verify")
        assert code == 1
        report = json.loads(out)
        assert report["ok"] is False
        assert "global secondary index 'gsi1' is missing" in report["problems"]
        assert any("TTL" in p for p in report["problems"])
        assert "2 problem(s)" in err and err.count("\n") == 1
        # create completes an existing table: it adds the missing index and enables TTL.
        code, out, err = run(*local, "--table", name, "table", "create")
        assert code == 0, err
        assert f"adding index gsi1 to {name}" in err
        code, out, err = run(*local, "--table", name, "table", "verify")
        assert code == 0, err
    finally:
        client.delete_table(TableName=name)


def test_table_create_usage_errors(run: Run, local: list[str]) -> None:
    code, _, err = run(*local, "table", "create", "--billing-mode", "CHEAP")
    assert code == 2 and "invalid choice" in err
    code, _, err = run(*local, "table", "create", "--read-capacity", "0")
    assert code == 2 and "must be >= 1" in err


def test_stack_template_prints_the_bundled_template(run: Run) -> None:
    code, out, err = run("stack", "template")
    assert code == 0, err
    assert out == TEMPLATE.read_text(encoding="utf-8")
    code, out, _ = run("--json", "stack", "template")
    assert json.loads(out) == {"template": TEMPLATE.read_text(encoding="utf-8")}


def test_iam_policy_json(run: Run) -> None:
    code, out, err = run(
        "--json", "iam-policy", "--table-arn", ARN, "--namespace", "orders", "--namespace", "jobs"
    )
    assert code == 0, err
    policy = json.loads(out)
    items = policy["Statement"][0]
    patterns = items["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert "LOCK#orders#*" in patterns and "RUN#jobs#*" in patterns
    assert items["Resource"] == ARN

    code, out, _ = run("iam-policy", "--table-arn", ARN)  # plain output is the same JSON
    assert code == 0
    assert "Condition" not in json.loads(out)["Statement"][0]

    # the global --namespace narrows the policy when the policy's own is not given (issue 31)
    code, out, _ = run("--namespace", "billing", "--json", "iam-policy", "--table-arn", ARN)
    assert "LOCK#billing#*" in out
    code, out, _ = run(
        "--namespace", "ignored", "iam-policy", "--table-arn", ARN, "--namespace", "x"
    )
    assert "ignored" not in out

    code, out, err = run("iam-policy", "--table-arn", "not-an-arn")
    assert code == 2 and out == ""
    assert err.startswith("dynacoord: error: ValueError: table_arn") and err.count("\n") == 1
    code, _, err = run("iam-policy")
    assert code == 2 and "--table-arn" in err


@pytest.fixture()
def moto_aws() -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("cloudformation", region_name="us-east-1")


# moto has no CloudFormation model of the template's CloudWatch alarms: it warns and skips them.
@pytest.mark.filterwarnings("ignore:Tried to parse AWS.+CloudWatch.+Alarm:UserWarning")
def test_stack_deploy_outputs_delete_under_moto(run: Run, moto_aws: Any) -> None:
    code, out, err = run(
        "--region",
        "us-east-1",
        "--json",
        "stack",
        "deploy",
        "--stack-name",
        "dc-cli",
        "--parameter",
        "TableName=dc-cli-table",
        "--parameter",
        "DeletionProtection=false",
        "--poll-interval",
        "0",
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "CREATE_COMPLETE" and result["changed"] is True
    assert result["outputs"]["TableName"] == "dc-cli-table"
    assert "creating stack dc-cli ..." in err

    code, out, err = run(
        "--region", "us-east-1", "--json", "stack", "outputs", "--stack-name", "dc-cli"
    )
    assert code == 0, err
    assert json.loads(out) == result["outputs"]

    code, _, err = run("--region", "us-east-1", "stack", "delete", "--stack-name", "dc-cli")
    assert code == 2 and "--yes" in err
    code, out, err = run(
        "--region",
        "us-east-1",
        "stack",
        "delete",
        "--stack-name",
        "dc-cli",
        "--yes",
        "--poll-interval",
        "0",
    )
    assert code == 0, err
    assert "deleted: true" in out
    code, _, err = run(
        "--region", "us-east-1", "stack", "delete", "--stack-name", "dc-cli", "--yes"
    )
    assert code == 1 and "does not exist" in err


def test_stack_deploy_bad_parameters(run: Run, moto_aws: Any) -> None:
    code, _, err = run("stack", "deploy", "--parameter", "TableName")
    assert code == 2 and "KEY=VALUE" in err
    code, _, err = run("stack", "deploy", "--parameter", "Tablename=x")
    assert code == 2 and "unknown stack parameter 'Tablename'" in err
    assert moto_aws.describe_stacks()["Stacks"] == []


def test_table_verify_without_ttl_is_a_warning_with_exit_0(
    run: Run, local: list[str], dynamodb_local: DynamoDBLocal
) -> None:
    # The README's promise: a table without TTL works, it just keeps dead items.
    name = unique_name("nottl")
    client = dynamodb_local.client()
    client.create_table(**table_definition(name))
    try:
        code, out, err = run(*local, "--table", name, "--json", "table", "verify")
        assert code == 0, err
        report = json.loads(out)
        assert report["ok"] is True and report["problems"] == []
        assert any(w.startswith("TTL is DISABLED") for w in report["warnings"])
        assert "dynacoord: warning: TTL is DISABLED" in err
    finally:
        client.delete_table(TableName=name)


def test_capacities_without_provisioned_billing_are_refused(run: Run, local: list[str]) -> None:
    code, _, err = run(
        *local, "--table", unique_name("cap"), "table", "create", "--read-capacity", "3"
    )
    assert code == 2 and "PROVISIONED only" in err
