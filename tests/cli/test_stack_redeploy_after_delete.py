"""Deploying a stack again after ``stack delete`` kept its table (``DeletionPolicy: Retain``):
the new stack cannot create a table of that name. The command says so before anything is sent
to CloudFormation, with the three ways on (issue 52 item 4)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cli_helpers import cli_aws, run_cli  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS.+:UserWarning")
DEPLOY = ("--region", "us-east-1", "stack", "deploy", "--stack-name", "again", "--poll-interval")


def test_a_redeploy_onto_the_kept_table_says_what_to_do(
    capsys: pytest.CaptureFixture[str],
    cli_aws: Any,
) -> None:
    code, _, err = run_cli(capsys, *DEPLOY, "0", "--parameter", "TableName=kept-table")
    assert code == 0, err
    code, _, err = run_cli(
        capsys,
        "--region",
        "us-east-1",
        "stack",
        "delete",
        "--stack-name",
        "again",
        "--yes",
        "--poll-interval",
        "0",
    )
    assert code == 0, err
    assert "kept Table " in err
    assert "kept-table" in cli_aws["dynamodb"].list_tables()["TableNames"]

    code, out, err = run_cli(capsys, *DEPLOY, "0", "--parameter", "TableName=kept-table")
    assert code == 1
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("dynacoord: error: table 'kept-table' already exists")
    assert "--parameter TableName=" in line  # another name
    assert "import" in line and "docs/deployment.md" in line  # import it into the stack
    assert "dynacoord --table kept-table table delete --yes --disable-deletion-protection" in line
    assert "nothing was sent to CloudFormation" in line
    assert (
        cli_aws["cloudformation"].list_stacks(StackStatusFilter=["CREATE_COMPLETE"])[
            "StackSummaries"
        ]
        == []
    )


def test_an_update_of_the_stack_that_owns_the_table_is_not_refused(
    capsys: pytest.CaptureFixture[str],
    cli_aws: Any,
) -> None:
    code, _, err = run_cli(capsys, *DEPLOY, "0", "--parameter", "TableName=own-table")
    assert code == 0, err
    code, _, err = run_cli(
        capsys,
        *DEPLOY,
        "0",
        "--parameter",
        "TableName=own-table",
        "--parameter",
        "DeletionProtection=false",
    )
    assert code == 0, err
