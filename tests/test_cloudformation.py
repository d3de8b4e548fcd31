"""The bundled CloudFormation template: lint, package copy, and deployment under moto.

moto's CloudFormation creates the table from the template but does not apply
``TimeToLiveSpecification`` (nor point-in-time recovery): its table model ignores those
properties. So after a moto deploy ``verify_table`` reports exactly one problem, TTL, and
``ensure_table`` (which enables TTL when it is off) makes the table pass. On AWS the template's
TTL is applied by CloudFormation itself and ``ensure_table`` is then a no-op.

moto also cannot make a stack fail (a failing resource raises inside moto instead of producing
``CREATE_FAILED`` events), so the failure paths of ``deploy_stack`` / ``delete_stack`` use
botocore's ``Stubber`` with the responses CloudFormation returns in that case.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber

from dynacoord.errors import StackDeploymentError
from dynacoord.provision import (
    INDEX_ACTIONS,
    ITEM_ACTIONS,
    METADATA_ACTIONS,
    STACK_PARAMETERS,
    delete_stack,
    deploy_stack,
    ensure_table,
    iam_policy,
    stack_outputs,
    template_body,
    template_path,
    verify_table,
)
from dynacoord.testing import DUMMY_CREDENTIALS

ROOT = Path(__file__).resolve().parent.parent
TOP_TEMPLATE = ROOT / "cloudformation" / "dynacoord.yaml"
PACKAGE_TEMPLATE = ROOT / "dynacoord" / "cloudformation" / "dynacoord.yaml"


def _cfn_lint() -> str:
    candidate = Path(sys.executable).parent / "cfn-lint"
    found = str(candidate) if candidate.exists() else shutil.which("cfn-lint")
    if not found:
        pytest.fail("cfn-lint is not installed (it is a dev dependency)")
    return found


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_cfn_lint(), "--format", "parseable", "--", str(path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _template() -> dict[str, Any]:
    from cfnlint.decode import decode_str

    template, matches = decode_str(TOP_TEMPLATE.read_text(encoding="utf-8"))
    assert not matches, matches
    assert template is not None
    return dict(template)


# --- static checks ----------------------------------------------------------------------------


def test_template_passes_cfn_lint() -> None:
    result = _lint(TOP_TEMPLATE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_cfn_lint_catches_a_broken_template(tmp_path: Path) -> None:
    """The lint test above can fail: a template with a wrong property is rejected."""
    broken = TOP_TEMPLATE.read_text(encoding="utf-8").replace(
        "ProjectionType: ALL", "ProjectionType: EVERYTHING"
    )
    path = tmp_path / "broken.yaml"
    path.write_text(broken, encoding="utf-8")
    result = _lint(path)
    assert result.returncode != 0
    assert "EVERYTHING" in result.stdout


def test_package_copy_is_byte_identical() -> None:
    assert PACKAGE_TEMPLATE.read_bytes() == TOP_TEMPLATE.read_bytes()
    assert template_path().read_bytes() == TOP_TEMPLATE.read_bytes()
    assert template_body() == TOP_TEMPLATE.read_text(encoding="utf-8")


def test_stack_parameters_match_the_template() -> None:
    assert tuple(_template()["Parameters"]) == STACK_PARAMETERS


def test_template_table_matches_the_design() -> None:
    props = _template()["Resources"]["Table"]["Properties"]
    assert props["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert {a["AttributeName"]: a["AttributeType"] for a in props["AttributeDefinitions"]} == {
        "pk": "S",
        "sk": "S",
        "gsi1pk": "S",
        "gsi1sk": "S",
    }
    (gsi,) = props["GlobalSecondaryIndexes"]
    assert gsi["IndexName"] == "gsi1"
    assert [k["AttributeName"] for k in gsi["KeySchema"]] == ["gsi1pk", "gsi1sk"]
    assert gsi["Projection"] == {"ProjectionType": "ALL"}
    assert props["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["SSESpecification"] == {"SSEEnabled": True}


def test_template_policy_is_the_iam_policy_function() -> None:
    """The stack's managed policy and iam_policy() grant the same actions on the same resources."""
    statements = _template()["Resources"]["AccessPolicy"]["Properties"]["PolicyDocument"][
        "Statement"
    ]
    by_sid = {s["Sid"]: s for s in statements}
    assert by_sid["DynacoordItems"]["Action"] == list(ITEM_ACTIONS)
    assert by_sid["DynacoordItems"]["Resource"] == {"Fn::GetAtt": ["Table", "Arn"]}
    assert by_sid["DynacoordIndexQuery"]["Action"] == list(INDEX_ACTIONS)
    assert by_sid["DynacoordIndexQuery"]["Resource"] == {"Fn::Sub": "${Table.Arn}/index/gsi1"}
    assert by_sid["DynacoordDescribe"]["Action"] == list(METADATA_ACTIONS)
    generated = iam_policy("arn:aws:dynamodb:us-east-1:123456789012:table/t")["Statement"]
    assert [(s["Sid"], s["Action"]) for s in generated] == [
        (s["Sid"], s["Action"]) for s in statements
    ]
    # least privilege: no wildcard action, no Scan, no table management
    actions = {a for s in statements for a in s["Action"]}
    assert not any("*" in a for a in actions)
    assert not actions & {"dynamodb:Scan", "dynamodb:DeleteTable", "dynamodb:CreateTable"}


def test_outputs_are_exported_with_the_stack_name() -> None:
    outputs = _template()["Outputs"]
    assert set(outputs) == {"TableName", "TableArn", "AccessPolicyArn"}
    for key, output in outputs.items():
        assert output["Export"]["Name"] == {"Fn::Sub": f"${{AWS::StackName}}-{key}"}


# --- moto deployment --------------------------------------------------------------------------


@pytest.fixture()
def aws() -> Iterator[tuple[Any, Any]]:
    """(cloudformation client, dynamodb client) inside moto's mock_aws."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield (
            boto3.client("cloudformation", **DUMMY_CREDENTIALS),
            boto3.client("dynamodb", **DUMMY_CREDENTIALS),
        )


def test_stack_deploys_a_table_that_verify_table_accepts(aws: tuple[Any, Any]) -> None:
    cfn, ddb = aws
    lines: list[str] = []
    result = deploy_stack(
        cfn,
        "dc-test",
        parameters={"DeletionProtection": False},
        progress=lines.append,
        poll_interval=0,
    )
    assert result.status == "CREATE_COMPLETE"
    assert result.changed is True
    assert set(result.outputs) == {"TableName", "TableArn", "AccessPolicyArn"}
    table_name = result.outputs["TableName"]
    assert table_name.startswith("dc-test-")  # generated: no TableName parameter
    assert result.outputs["TableArn"].endswith(f":table/{table_name}")
    assert any("creating stack dc-test" in line for line in lines)
    assert stack_outputs(cfn, "dc-test") == result.outputs

    # moto ignores TimeToLiveSpecification (see the module docstring): only TTL is reported ...
    problems = verify_table(ddb, table_name)
    assert len(problems) == 1 and "TTL" in problems[0], problems
    # ... and ensure_table turns it on without touching the rest.
    assert ensure_table(ddb, table_name) is False
    assert verify_table(ddb, table_name) == []
    table = ddb.describe_table(TableName=table_name)["Table"]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert table["DeletionProtectionEnabled"] is False


def test_provisioned_billing_and_table_name_parameters(aws: tuple[Any, Any]) -> None:
    cfn, ddb = aws
    result = deploy_stack(
        cfn,
        "dc-prov",
        parameters={
            "TableName": "dc-prov-table",
            "BillingMode": "PROVISIONED",
            "ReadCapacity": 7,
            "WriteCapacity": 3,
        },
        poll_interval=0,
    )
    assert result.outputs["TableName"] == "dc-prov-table"
    table = ddb.describe_table(TableName="dc-prov-table")["Table"]
    assert table["ProvisionedThroughput"]["ReadCapacityUnits"] == 7
    assert table["ProvisionedThroughput"]["WriteCapacityUnits"] == 3
    (gsi,) = table["GlobalSecondaryIndexes"]
    assert gsi["ProvisionedThroughput"]["ReadCapacityUnits"] == 7
    assert gsi["ProvisionedThroughput"]["WriteCapacityUnits"] == 3
    assert table["DeletionProtectionEnabled"] is True  # the default


def test_redeploy_without_changes_succeeds(aws: tuple[Any, Any]) -> None:
    cfn, ddb = aws
    lines: list[str] = []
    # Every parameter is given at creation: moto keeps only explicitly passed values and fails
    # (KeyError) on UsePreviousValue for a parameter that took its default; AWS does not.
    everything = {
        "TableName": "dc-again-table",
        "BillingMode": "PROVISIONED",
        "ReadCapacity": 5,
        "WriteCapacity": 5,
        "DeletionProtection": "false",
    }
    first = deploy_stack(cfn, "dc-again", parameters=everything, poll_interval=0)
    # Same template; the parameter not given keeps its previous value (UsePreviousValue), so
    # CloudFormation (and moto) answer "No updates are to be performed": a success.
    second = deploy_stack(cfn, "dc-again", progress=lines.append, poll_interval=0)
    assert second.changed is False
    assert second.status == "CREATE_COMPLETE"
    assert second.outputs == first.outputs
    assert lines == ["stack dc-again is up to date"]
    # A real change is an update of the same stack and table.
    third = deploy_stack(cfn, "dc-again", parameters={"DeletionProtection": True}, poll_interval=0)
    assert third.changed is True
    assert third.status == "UPDATE_COMPLETE"
    assert third.outputs["TableName"] == first.outputs["TableName"]
    stack = cfn.describe_stacks(StackName="dc-again")["Stacks"][0]
    params = {p["ParameterKey"]: p["ParameterValue"] for p in stack["Parameters"]}
    assert params["DeletionProtection"] == "true"
    assert params["ReadCapacity"] == "5"  # kept
    assert params["BillingMode"] == "PROVISIONED"  # kept
    table = ddb.describe_table(TableName=first.outputs["TableName"])["Table"]
    assert table["TableStatus"] == "ACTIVE"


def test_delete_stack_removes_the_table(aws: tuple[Any, Any]) -> None:
    cfn, ddb = aws
    result = deploy_stack(cfn, "dc-del", parameters={"DeletionProtection": False}, poll_interval=0)
    table_name = result.outputs["TableName"]
    assert delete_stack(cfn, "dc-del", poll_interval=0) is True
    assert table_name not in ddb.list_tables()["TableNames"]
    assert delete_stack(cfn, "dc-del", poll_interval=0) is False
    with pytest.raises(StackDeploymentError, match="does not exist"):
        stack_outputs(cfn, "dc-del")


def test_bad_input_raises_before_any_request(aws: tuple[Any, Any]) -> None:
    cfn, _ = aws
    with pytest.raises(ValueError, match="unknown stack parameter 'TableNme'"):
        deploy_stack(cfn, "dc-bad", parameters={"TableNme": "x"})
    with pytest.raises(TypeError, match="ReadCapacity"):
        deploy_stack(cfn, "dc-bad", parameters={"ReadCapacity": 1.5})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="stack name"):
        deploy_stack(cfn, "1-not valid")
    assert cfn.describe_stacks()["Stacks"] == []


# --- failure paths (stubbed CloudFormation answers) -------------------------------------------


@pytest.fixture()
def stubbed() -> Iterator[tuple[Any, Stubber]]:
    import boto3

    client = boto3.client("cloudformation", **DUMMY_CREDENTIALS)
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


STACK_ID = "arn:aws:cloudformation:us-east-1:123456789012:stack/dc-fail/abc"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def _stack(status: str, **extra: Any) -> dict[str, Any]:
    return {
        "Stacks": [
            {
                "StackName": "dc-fail",
                "StackId": STACK_ID,
                "StackStatus": status,
                "CreationTime": NOW,
                **extra,
            }
        ]
    }


def _event(
    event_id: str, logical: str, rtype: str, status: str, reason: str = ""
) -> dict[str, Any]:
    event = {
        "StackId": STACK_ID,
        "EventId": event_id,
        "StackName": "dc-fail",
        "LogicalResourceId": logical,
        "ResourceType": rtype,
        "ResourceStatus": status,
        "Timestamp": NOW,
    }
    if reason:
        event["ResourceStatusReason"] = reason
    return event


def test_failed_creation_raises_with_the_failed_resource_events(
    stubbed: tuple[Any, Stubber],
) -> None:
    client, stub = stubbed
    stub.add_client_error(
        "describe_stacks",
        service_error_code="ValidationError",
        service_message="Stack with id dc-fail does not exist",
        http_status_code=400,
    )
    stub.add_response("create_stack", {"StackId": STACK_ID})
    stub.add_response("describe_stacks", _stack("CREATE_IN_PROGRESS"))
    stub.add_response("describe_stacks", _stack("ROLLBACK_IN_PROGRESS"))
    stub.add_response("describe_stacks", _stack("ROLLBACK_COMPLETE"))
    stub.add_response(
        "describe_stack_events",
        {
            "StackEvents": [  # newest first, as CloudFormation returns them
                _event("e5", "dc-fail", "AWS::CloudFormation::Stack", "ROLLBACK_COMPLETE"),
                _event(
                    "e4",
                    "AccessPolicy",
                    "AWS::IAM::ManagedPolicy",
                    "CREATE_FAILED",
                    "Resource creation cancelled",
                ),
                _event(
                    "e3",
                    "Table",
                    "AWS::DynamoDB::Table",
                    "CREATE_FAILED",
                    "dc-table already exists in stack other",
                ),
                _event("e2", "Table", "AWS::DynamoDB::Table", "CREATE_IN_PROGRESS"),
                _event("e1", "dc-fail", "AWS::CloudFormation::Stack", "CREATE_IN_PROGRESS"),
            ]
        },
    )
    lines: list[str] = []
    with pytest.raises(StackDeploymentError) as info:
        deploy_stack(
            client,
            "dc-fail",
            parameters={"TableName": "dc-table"},
            progress=lines.append,
            poll_interval=0,
        )
    error = info.value
    assert error.stack_name == "dc-fail"
    assert [(e["logical_id"], e["status"]) for e in error.events] == [
        ("Table", "CREATE_FAILED"),
        ("AccessPolicy", "CREATE_FAILED"),
    ]
    message = str(error)
    assert "ROLLBACK_COMPLETE" in message
    assert "Table (AWS::DynamoDB::Table) CREATE_FAILED: dc-table already exists" in message
    assert "\n" not in message  # one line for the CLI
    assert "waiting for stack dc-fail (CREATE_IN_PROGRESS) ..." in lines
    assert "waiting for stack dc-fail (ROLLBACK_IN_PROGRESS) ..." in lines


def test_update_with_no_changes_is_success(stubbed: tuple[Any, Stubber]) -> None:
    client, stub = stubbed
    params = [{"ParameterKey": k, "ParameterValue": "x"} for k in STACK_PARAMETERS]
    outputs = [{"OutputKey": "TableName", "OutputValue": "dc-table"}]
    stub.add_response(
        "describe_stacks", _stack("UPDATE_COMPLETE", Parameters=params, Outputs=outputs)
    )
    stub.add_response(
        "describe_stack_events",
        {"StackEvents": [_event("e9", "dc-fail", "AWS::CloudFormation::Stack", "UPDATE_COMPLETE")]},
    )
    expected_parameters = [{"ParameterKey": "BillingMode", "ParameterValue": "PROVISIONED"}] + [
        {"ParameterKey": k, "UsePreviousValue": True}
        for k in STACK_PARAMETERS
        if k != "BillingMode"
    ]
    stub.add_client_error(
        "update_stack",
        service_error_code="ValidationError",
        service_message="No updates are to be performed.",
        http_status_code=400,
        expected_params={
            "StackName": STACK_ID,
            "TemplateBody": template_body(),
            "Parameters": expected_parameters,
            "Capabilities": ["CAPABILITY_IAM"],
        },
    )
    lines: list[str] = []
    result = deploy_stack(
        client, "dc-fail", parameters={"BillingMode": "PROVISIONED"}, progress=lines.append
    )
    assert result.changed is False
    assert result.status == "UPDATE_COMPLETE"
    assert result.outputs == {"TableName": "dc-table"}
    assert lines == ["stack dc-fail is up to date"]


def test_failed_update_lists_only_the_events_of_this_update(stubbed: tuple[Any, Stubber]) -> None:
    client, stub = stubbed
    stub.add_response("describe_stacks", _stack("CREATE_COMPLETE"))
    stub.add_response(
        "describe_stack_events",
        {
            "StackEvents": [
                _event("old2", "dc-fail", "AWS::CloudFormation::Stack", "CREATE_COMPLETE")
            ]
        },
    )
    stub.add_response("update_stack", {"StackId": STACK_ID})
    stub.add_response("describe_stacks", _stack("UPDATE_ROLLBACK_COMPLETE"))
    stub.add_response(
        "describe_stack_events",
        {
            "StackEvents": [
                _event("n2", "Table", "AWS::DynamoDB::Table", "UPDATE_FAILED", "Limit exceeded"),
                _event("n1", "dc-fail", "AWS::CloudFormation::Stack", "UPDATE_IN_PROGRESS"),
                _event("old2", "dc-fail", "AWS::CloudFormation::Stack", "CREATE_COMPLETE"),
                _event("old1", "Table", "AWS::DynamoDB::Table", "CREATE_FAILED", "an old failure"),
            ]
        },
    )
    with pytest.raises(StackDeploymentError, match="UPDATE_FAILED: Limit exceeded") as info:
        deploy_stack(client, "dc-fail", poll_interval=0)
    assert [e["reason"] for e in info.value.events] == ["Limit exceeded"]


def test_a_stack_whose_creation_failed_is_not_updated(stubbed: tuple[Any, Stubber]) -> None:
    client, stub = stubbed
    stub.add_response("describe_stacks", _stack("ROLLBACK_COMPLETE"))
    with pytest.raises(StackDeploymentError, match="delete it and deploy again"):
        deploy_stack(client, "dc-fail")


def test_failed_stack_deletion_raises_with_events(stubbed: tuple[Any, Stubber]) -> None:
    client, stub = stubbed
    stub.add_response("describe_stacks", _stack("CREATE_COMPLETE"))
    stub.add_response("describe_stack_events", {"StackEvents": []})
    stub.add_response("delete_stack", {})
    stub.add_response("describe_stacks", _stack("DELETE_FAILED"))
    stub.add_response(
        "describe_stack_events",
        {
            "StackEvents": [
                _event(
                    "d1",
                    "Table",
                    "AWS::DynamoDB::Table",
                    "DELETE_FAILED",
                    "Table cannot be deleted while DeletionProtectionEnabled is true",
                )
            ]
        },
    )
    with pytest.raises(StackDeploymentError, match="DeletionProtectionEnabled"):
        delete_stack(client, "dc-fail", poll_interval=0)
