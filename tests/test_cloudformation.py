"""The bundled CloudFormation template: lint, package copy, and deployment under moto.

moto's CloudFormation creates the table from the template but does not apply
``TimeToLiveSpecification`` (nor point-in-time recovery): its table model ignores those
properties. So after a moto deploy ``verify_table`` reports exactly one problem, TTL, and
``ensure_table`` (which enables TTL when it is off) makes the table pass. On AWS the template's
TTL is applied by CloudFormation itself and ``ensure_table`` is then a no-op.

moto also cannot make a stack fail (a failing resource raises inside moto instead of producing
``CREATE_FAILED`` events), so the failure paths of ``deploy_stack`` / ``delete_stack`` use
botocore's ``Stubber`` with the responses CloudFormation returns in that case.

What else moto (5.2) cannot do, and so what these tests do not claim: it has no CloudFormation
model of ``AWS::CloudWatch::Alarm`` (the alarms are skipped with a warning, checked statically
here and by cfn-lint), it evaluates no ``Rules``, its update ignores resource ``Condition``s (so
switching the relay on or off by an update is not something it can run: each configuration is
created, updated and deleted on its own), it cannot update an ``AWS::IAM::ManagedPolicy`` (the
``Namespaces`` scoping is checked at creation), it evaluates ``Export``s of outputs whose
condition is false (the template exports only its unconditional outputs), and its
``AWS::KMS::Key`` expects KMS-API tags (the key has none), and a role made by CloudFormation
gets none of its ``ManagedPolicyArns`` (checked statically).
"""

from __future__ import annotations

import ast
import datetime
import io
import json
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
from dynacoord.provision.stack import LAYOUT_PARAMETERS
from dynacoord.testing import DUMMY_CREDENTIALS

#: moto has no CloudFormation model of CloudWatch alarms: it skips them with this warning.
pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS.+CloudWatch.+Alarm:UserWarning")

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


def _every_parameter(**overrides: Any) -> dict[str, Any]:
    """Every template parameter, at its default unless overridden. moto keeps only the values
    passed explicitly and fails (KeyError) on UsePreviousValue for a defaulted one; AWS does not."""
    values: dict[str, Any] = {
        name: spec.get("Default", "") for name, spec in _template()["Parameters"].items()
    }
    for name in values:
        if isinstance(values[name], list):  # cfn-lint decodes a list default
            values[name] = ",".join(values[name])
    unknown = set(overrides) - set(values)
    assert not unknown, unknown
    values.update(overrides)
    return values


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


def _defaults(node: Any) -> Any:
    """``node`` with each ``Ref`` to a table layout parameter replaced by its default (the
    table's names are parameters: tests/test_stack_layout.py deploys other ones)."""
    if isinstance(node, dict):
        if set(node) == {"Ref"} and node["Ref"] in LAYOUT_PARAMETERS.values():
            return _template()["Parameters"][node["Ref"]]["Default"]
        return {k: _defaults(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_defaults(v) for v in node]
    return node


def test_template_table_matches_the_design() -> None:
    props = _defaults(_template()["Resources"]["Table"]["Properties"])
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
    # Encryption: an AWS owned key by default, a customer-managed one on request.
    assert props["SSESpecification"] == {
        "Fn::If": [
            "UsesCustomerKey",
            {
                "SSEEnabled": True,
                "SSEType": "KMS",
                "KMSMasterKeyId": {
                    "Fn::If": [
                        "CreatesKey",
                        {"Fn::GetAtt": ["TableKey", "Arn"]},
                        {"Ref": "EncryptionKey"},
                    ]
                },
            },
            {"SSEEnabled": True},
        ]
    }
    assert props["StreamSpecification"] == {
        "Fn::If": ["HasStream", {"StreamViewType": "NEW_IMAGE"}, {"Ref": "AWS::NoValue"}]
    }


def test_a_stack_deletion_keeps_the_table_and_its_key() -> None:
    resources = _template()["Resources"]
    for name in ("Table", "TableKey"):
        assert resources[name]["DeletionPolicy"] == "Retain", name
        assert resources[name]["UpdateReplacePolicy"] == "Retain", name


def test_template_policy_is_the_iam_policy_function() -> None:
    """The stack's managed policy and iam_policy() grant the same actions on the same resources."""
    statements = _template()["Resources"]["AccessPolicy"]["Properties"]["PolicyDocument"][
        "Statement"
    ]
    by_sid = {s["Sid"]: s for s in statements}
    assert by_sid["DynacoordItems"]["Action"] == list(ITEM_ACTIONS)
    assert by_sid["DynacoordItems"]["Resource"] == {"Fn::GetAtt": ["Table", "Arn"]}
    assert by_sid["DynacoordIndexQuery"]["Action"] == list(INDEX_ACTIONS)
    assert by_sid["DynacoordIndexQuery"]["Resource"] == {
        "Fn::Sub": "${Table.Arn}/index/${IndexName}"
    }
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
    conditional = {k: o["Condition"] for k, o in outputs.items() if "Condition" in o}
    assert conditional == {
        "StreamArn": "HasStream",
        "EncryptionKeyArn": "CreatesKey",
        "RelayFunctionName": "HasRelay",
        "SweeperFunctionName": "HasRelay",
        "DeadLetterQueueUrl": "HasRelay",
        "AlarmTopicArn": "CreatesAlarmTopic",
        # the alarms' names (dynacoord stack status, the runbook)
        "TableThrottleAlarmName": "WantsAlarms",
        **{
            f"{alarm}Name": "WantsRelayAlarms"
            for alarm in (
                "RelayErrorAlarm",
                "SweeperErrorAlarm",
                "RelayThrottleAlarm",
                "RelayLagAlarm",
                "DeadLetterAlarm",
            )
        },
        "OutboxLagAlarmName": "WantsLagAlarms",
        "OutboxExpiredLeaseAlarmName": "WantsLagAlarms",
    }
    for key, output in outputs.items():
        if key in conditional:
            assert "Export" not in output, key  # see the module docstring (moto)
        else:
            assert output["Export"]["Name"] == {"Fn::Sub": f"${{AWS::StackName}}-{key}"}
    assert set(outputs) - set(conditional) == {"TableName", "TableArn", "AccessPolicyArn"}


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
    everything = _every_parameter(
        TableName="dc-again-table",
        BillingMode="PROVISIONED",
        ReadCapacity=5,
        WriteCapacity=5,
        DeletionProtection="false",
    )
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


def test_delete_stack_keeps_the_table_and_its_items(aws: tuple[Any, Any]) -> None:
    cfn, ddb = aws
    result = deploy_stack(cfn, "dc-del", parameters={"DeletionProtection": False}, poll_interval=0)
    table_name = result.outputs["TableName"]
    ddb.put_item(TableName=table_name, Item={"pk": {"S": "LOCK#ns#k"}, "sk": {"S": "LOCK"}})
    assert delete_stack(cfn, "dc-del", poll_interval=0) is True
    assert cfn.describe_stacks()["Stacks"] == []
    # DeletionPolicy Retain: the stack is gone, the table and its data stay.
    item = ddb.get_item(TableName=table_name, Key={"pk": {"S": "LOCK#ns#k"}, "sk": {"S": "LOCK"}})
    assert item["Item"]["pk"] == {"S": "LOCK#ns#k"}
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
    # no value given: deploy_stack reads the stack's template to tell whether anything changes
    stub.add_response(
        "get_template",
        {"TemplateBody": "an older template"},
        expected_params={"StackName": STACK_ID, "TemplateStage": "Original"},
    )
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


# --- the serverless outbox delivery (issue 15) --------------------------------------------------


def _filter_matches(pattern: Any, record: Any) -> bool:
    """The part of Lambda's event filtering the template uses: a list of allowed values, or
    ``{"prefix": ...}``, at the leaves of nested keys."""
    if isinstance(pattern, dict):
        return isinstance(record, dict) and all(
            key in record and _filter_matches(sub, record[key]) for key, sub in pattern.items()
        )
    assert isinstance(pattern, list), pattern
    return any(
        (isinstance(allowed, dict) and str(record).startswith(allowed["prefix"]))
        or allowed == record
        for allowed in pattern
    )


def _relay_filter(namespace: str) -> dict[str, Any]:
    mapping = _template()["Resources"]["RelayEventSourceMapping"]["Properties"]
    (only,) = mapping["FilterCriteria"]["Filters"]
    text = only["Pattern"]["Fn::Sub"].replace("${RelayNamespace}", namespace)
    text = text.replace("${PartitionKey}", "pk").replace("${KeyPrefix}", "")
    assert "${" not in text
    return dict(json.loads(text))


def _stream_record(event_name: str, **image: str) -> dict[str, Any]:
    return {
        "eventName": event_name,
        "eventSource": "aws:dynamodb",
        "dynamodb": {
            "NewImage": {k: {"N": v} if k == "attempts" else {"S": v} for k, v in image.items()},
            "SequenceNumber": "1",
        },
    }


def test_only_new_outbox_events_of_the_relay_namespace_reach_the_relay() -> None:
    pattern = _relay_filter("orders")
    new_event = _stream_record(
        "INSERT", pk="OUTBOX#orders#e1", sk="EVENT", status="pending", attempts="0"
    )
    assert _filter_matches(pattern, new_event)
    for other in (
        _stream_record("MODIFY", pk="OUTBOX#orders#e1", sk="EVENT", status="in_flight"),
        _stream_record("MODIFY", pk="OUTBOX#orders#e1", sk="EVENT", status="pending"),
        _stream_record("INSERT", pk="OUTBOX#ordersx#e1", sk="EVENT", status="pending"),
        _stream_record("INSERT", pk="OUTBOX#other#e1", sk="EVENT", status="pending"),
        _stream_record("INSERT", pk="LOCK#orders#k", sk="LOCK"),
        {"eventName": "REMOVE", "dynamodb": {"Keys": {"pk": {"S": "OUTBOX#orders#e1"}}}},
    ):
        assert not _filter_matches(pattern, other), other


def test_the_relay_is_wired_for_partial_batch_failures_bisecting_and_dead_letters() -> None:
    resources = _template()["Resources"]
    mapping = resources["RelayEventSourceMapping"]["Properties"]
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": ["Table", "StreamArn"]}
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["BisectBatchOnFunctionError"] is True
    assert mapping["StartingPosition"] == "TRIM_HORIZON"
    assert mapping["DestinationConfig"] == {
        "OnFailure": {"Destination": {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}}
    }
    assert resources["RelayFunction"]["Properties"]["Handler"] == "dynacoord.serverless.relay"
    assert resources["SweeperFunction"]["Properties"]["Handler"] == "dynacoord.serverless.sweep"
    assert resources["SweepRule"]["Properties"]["ScheduleExpression"] == {"Ref": "SweepSchedule"}
    assert resources["SweepPermission"]["Properties"]["SourceArn"] == {
        "Fn::GetAtt": ["SweepRule", "Arn"]
    }
    # The functions' role: the table policy, logging, and what the handlers need (moto ignores a
    # role's ManagedPolicyArns, so this is checked here).
    role = resources["FunctionRole"]["Properties"]
    with_extra, without = role["ManagedPolicyArns"]["Fn::If"][1:]
    basic = {
        "Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"
    }
    assert without == [{"Ref": "AccessPolicy"}, basic]
    assert with_extra["Fn::Split"][1]["Fn::Join"][1] == [
        {"Ref": "AccessPolicy"},
        basic,
        {"Fn::Join": [",", {"Ref": "RelayPolicyArns"}]},
    ]
    (inline,) = role["Policies"]
    statements = {st["Sid"]: st for st in inline["PolicyDocument"]["Statement"] if "Sid" in st}
    assert statements["ReadTheTableStream"]["Resource"] == {"Fn::Sub": "${Table.Arn}/stream/*"}
    assert statements["SendDeadLetters"]["Action"] == "sqs:SendMessage"
    (decrypt,) = [st["Fn::If"] for st in inline["PolicyDocument"]["Statement"] if "Fn::If" in st]
    assert decrypt[0] == "UsesCustomerKey" and decrypt[1]["Action"] == "kms:Decrypt"
    assert decrypt[2] == {"Ref": "AWS::NoValue"}
    # every piece of the relay exists only with Relay=true
    relay_parts = {name for name, r in resources.items() if r.get("Condition") == "HasRelay"}
    assert relay_parts == {
        "DeadLetterQueue",
        "FunctionRole",
        "RelayFunction",
        "RelayLogGroup",
        "RelayEventSourceMapping",
        "SweeperFunction",
        "SweeperLogGroup",
        "SweepRule",
        "SweepPermission",
    }


def test_alarms_cover_relay_errors_dead_letters_and_throttles() -> None:
    resources = _template()["Resources"]
    alarms = {
        name: r["Properties"]
        for name, r in resources.items()
        if r["Type"] == "AWS::CloudWatch::Alarm"
    }
    metrics = {name: (p["Namespace"], p["MetricName"]) for name, p in alarms.items()}
    assert metrics == {
        "TableThrottleAlarm": ("AWS/DynamoDB", "WriteThrottleEvents"),
        "RelayErrorAlarm": ("AWS/Lambda", "Errors"),
        "SweeperErrorAlarm": ("AWS/Lambda", "Errors"),
        "RelayThrottleAlarm": ("AWS/Lambda", "Throttles"),
        "RelayLagAlarm": ("AWS/Lambda", "IteratorAge"),
        "DeadLetterAlarm": ("AWS/SQS", "ApproximateNumberOfMessagesVisible"),
        "OutboxLagAlarm": ("dynacoord", "OutboxOldestDueAge"),
        "OutboxExpiredLeaseAlarm": ("dynacoord", "OutboxExpiredLeaseAge"),
    }
    for name, props in alarms.items():
        assert props["AlarmActions"]["Fn::If"][0] == "NotifiesAlarms", name
        assert props["TreatMissingData"] == "notBreaching", name
    assert resources["AlarmTopicCreated"]["Condition"] == "CreatesAlarmTopic"


@pytest.fixture()
def code_bucket(aws: tuple[Any, Any]) -> Any:
    """A bucket with two code bundles (k1.zip, k2.zip) in moto's S3; returns the S3 client."""
    import zipfile

    import boto3

    s3 = boto3.client("s3", **DUMMY_CREDENTIALS)
    s3.create_bucket(Bucket="dc-code")
    for key, text in (("k1.zip", "v = 1\n"), ("k2.zip", "v = 2\n")):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as bundle:
            bundle.writestr("app_handlers.py", text)
        s3.put_object(Bucket="dc-code", Key=key, Body=buffer.getvalue())
    return s3


ALL_ON = {
    "TableName": "dc-on-table",
    "DeletionProtection": "false",
    "Namespaces": "orders,billing",
    "EncryptionKey": "create",
    "Relay": "true",
    "RelayNamespace": "orders",
    "RelayHandlers": "app_handlers:HANDLERS",
    "CodeS3Bucket": "dc-code",
    "CodeS3Key": "k1.zip",
    "RelayPolicyArns": "arn:aws:iam::aws:policy/AmazonSQSFullAccess",
    "OutboxOptions": '{"max_attempts": 8}',
    "HandlerSettings": '{"queue_url": "https://sqs.example/q"}',
    "ReconcileHandler": "app_handlers:on_stalled",
    "AlarmTopic": "create",
}


def _policy_document(iam: Any, policy_arn: str) -> dict[str, Any]:
    version = iam.get_policy(PolicyArn=policy_arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=policy_arn, VersionId=version)["PolicyVersion"][
        "Document"
    ]
    return dict(json.loads(document) if isinstance(document, str) else document)


def _by_sid(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["Sid"]: s for s in document["Statement"]}


def test_every_optional_part_on_deploys_updates_and_deletes(
    aws: tuple[Any, Any], code_bucket: Any
) -> None:
    import boto3

    cfn, ddb = aws
    lam = boto3.client("lambda", **DUMMY_CREDENTIALS)
    iam = boto3.client("iam", **DUMMY_CREDENTIALS)
    events = boto3.client("events", **DUMMY_CREDENTIALS)
    kms = boto3.client("kms", **DUMMY_CREDENTIALS)
    sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)

    created = deploy_stack(cfn, "dc-on", parameters=_every_parameter(**ALL_ON), poll_interval=0)
    assert created.status == "CREATE_COMPLETE"
    outputs = created.outputs
    assert set(outputs) == {
        "TableName",
        "TableArn",
        "AccessPolicyArn",
        "StreamArn",
        "EncryptionKeyArn",
        "RelayFunctionName",
        "SweeperFunctionName",
        "DeadLetterQueueUrl",
        "AlarmTopicArn",
    }
    table = ddb.describe_table(TableName="dc-on-table")["Table"]
    assert table["StreamSpecification"] == {"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"}
    assert outputs["StreamArn"] == table["LatestStreamArn"]
    # (moto's DescribeKey fails on a key CloudFormation made: its policy is kept as a dict)
    assert outputs["EncryptionKeyArn"] in {k["KeyArn"] for k in kms.list_keys()["Keys"]}

    relay = lam.get_function(FunctionName=outputs["RelayFunctionName"])["Configuration"]
    sweeper = lam.get_function(FunctionName=outputs["SweeperFunctionName"])["Configuration"]
    assert relay["Handler"] == "dynacoord.serverless.relay"
    assert sweeper["Handler"] == "dynacoord.serverless.sweep"
    assert relay["Environment"]["Variables"] == {
        "DYNACOORD_TABLE": "dc-on-table",
        # dynacoord's own schema: the backend sees the default layout (no translation)
        "DYNACOORD_TABLE_LAYOUT": '{"pk":"pk","sk":"sk","index":"gsi1", "index_pk":"gsi1pk",'
        '"index_sk":"gsi1sk", "ttl":"ttl","expires_at":"expires_at_ms","prefix":""}',
        "DYNACOORD_NAMESPACE": "orders",
        "DYNACOORD_OUTBOX_HANDLERS": "app_handlers:HANDLERS",
        "DYNACOORD_OUTBOX_OPTIONS": '{"max_attempts": 8}',
        "DYNACOORD_HANDLER_SETTINGS": '{"queue_url": "https://sqs.example/q"}',
    }
    assert sweeper["Environment"]["Variables"]["DYNACOORD_RECONCILE_HANDLER"] == (
        "app_handlers:on_stalled"
    )
    # The role reads the stream of a table encrypted with the stack's key through that key.
    role = relay["Role"].rsplit("/", 1)[1]
    inline = iam.get_role_policy(RoleName=role, PolicyName="stream-and-dead-letters")
    document = inline["PolicyDocument"]
    if isinstance(document, str):  # moto keeps a CloudFormation-made one as Python's repr
        document = ast.literal_eval(document)
    statements = [st for st in document["Statement"] if st]  # moto keeps AWS::NoValue as None
    decrypt = {st["Sid"]: st for st in statements}["DecryptTheTableStream"]
    assert decrypt["Resource"] == outputs["EncryptionKeyArn"]
    (mapping,) = lam.list_event_source_mappings(FunctionName=outputs["RelayFunctionName"])[
        "EventSourceMappings"
    ]
    assert mapping["EventSourceArn"] == table["LatestStreamArn"]
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["BisectBatchOnFunctionError"] is True
    dlq_arn = sqs.get_queue_attributes(
        QueueUrl=outputs["DeadLetterQueueUrl"], AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    assert mapping["DestinationConfig"]["OnFailure"]["Destination"] == dlq_arn
    (only,) = mapping["FilterCriteria"]["Filters"]
    assert json.loads(only["Pattern"]) == _relay_filter("orders")
    (rule,) = events.list_rules()["Rules"]
    assert rule["ScheduleExpression"] == "rate(1 minute)"
    (target,) = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
    assert target["Arn"] == sweeper["FunctionArn"]

    # The managed policy is scoped to the namespaces, as iam_policy() scopes it.
    document = _policy_document(iam, outputs["AccessPolicyArn"])
    expected = _by_sid(iam_policy(outputs["TableArn"], ["orders", "billing"]))
    for sid, statement in _by_sid(document).items():
        keys = statement.get("Condition", {}).get("ForAllValues:StringLike", {})
        wanted = expected[sid].get("Condition", {}).get("ForAllValues:StringLike", {})
        assert sorted(keys.get("dynamodb:LeadingKeys", [])) == sorted(
            wanted.get("dynamodb:LeadingKeys", [])
        ), sid
    assert "Condition" in _by_sid(document)["DynacoordItems"]

    # An update with the relay on: new code, a bigger batch, a slower sweep.
    # (no item is written here: moto would invoke the relay through Docker for its stream record)
    updated = deploy_stack(
        cfn,
        "dc-on",
        parameters={
            "CodeS3Key": "k2.zip",
            "RelayBatchSize": 25,
            "SweepSchedule": "rate(5 minutes)",
        },
        poll_interval=0,
    )
    assert updated.status == "UPDATE_COMPLETE" and updated.changed
    (mapping,) = lam.list_event_source_mappings(FunctionName=outputs["RelayFunctionName"])[
        "EventSourceMappings"
    ]
    assert mapping["BatchSize"] == 25
    assert events.list_rules()["Rules"][0]["ScheduleExpression"] == "rate(5 minutes)"
    new_code = lam.get_function(FunctionName=outputs["RelayFunctionName"])["Configuration"]
    assert new_code["CodeSha256"] != relay["CodeSha256"]
    assert updated.outputs["TableName"] == "dc-on-table"

    # Deleting the stack removes the delivery and keeps the table, its data and its key.
    assert delete_stack(cfn, "dc-on", poll_interval=0) is True
    assert lam.list_functions()["Functions"] == []
    assert lam.list_event_source_mappings()["EventSourceMappings"] == []
    assert events.list_rules()["Rules"] == []
    assert ddb.describe_table(TableName="dc-on-table")["Table"]["TableStatus"] == "ACTIVE"
    assert outputs["EncryptionKeyArn"] in {k["KeyArn"] for k in kms.list_keys()["Keys"]}


def test_every_optional_part_off_deploys_updates_and_deletes(aws: tuple[Any, Any]) -> None:
    import boto3

    cfn, ddb = aws
    off = _every_parameter(TableName="dc-off-table", DeletionProtection="false", Alarms="false")
    created = deploy_stack(cfn, "dc-off", parameters=off, poll_interval=0)
    resources = {
        r["LogicalResourceId"]
        for r in cfn.list_stack_resources(StackName="dc-off")["StackResourceSummaries"]
    }
    assert resources - {""} == {"Table", "AccessPolicy"}  # moto lists a skipped one as ""
    assert set(created.outputs) == {"TableName", "TableArn", "AccessPolicyArn"}
    table = ddb.describe_table(TableName="dc-off-table")["Table"]
    assert table.get("StreamSpecification", {"StreamEnabled": False})["StreamEnabled"] is False
    iam = boto3.client("iam", **DUMMY_CREDENTIALS)
    document = _policy_document(iam, created.outputs["AccessPolicyArn"])
    assert document == iam_policy(created.outputs["TableArn"])  # no namespace condition

    updated = deploy_stack(cfn, "dc-off", parameters={"DeletionProtection": True}, poll_interval=0)
    assert updated.status == "UPDATE_COMPLETE"
    assert updated.outputs == created.outputs  # the same table
    stack = cfn.describe_stacks(StackName="dc-off")["Stacks"][0]
    assert {p["ParameterKey"]: p["ParameterValue"] for p in stack["Parameters"]}[
        "DeletionProtection"
    ] == "true"  # (moto does not apply it to the table; CloudFormation does)

    assert delete_stack(cfn, "dc-off", poll_interval=0) is True
    assert "dc-off-table" in ddb.list_tables()["TableNames"]


def test_a_stream_without_the_relay_and_alarms_to_an_existing_topic(aws: tuple[Any, Any]) -> None:
    import boto3

    cfn, ddb = aws
    topic = boto3.client("sns", **DUMMY_CREDENTIALS).create_topic(Name="ops")["TopicArn"]
    result = deploy_stack(
        cfn,
        "dc-stream",
        parameters=_every_parameter(
            TableName="dc-stream-table", Stream="true", AlarmTopic=topic, DeletionProtection="false"
        ),
        poll_interval=0,
    )
    assert set(result.outputs) == {"TableName", "TableArn", "AccessPolicyArn", "StreamArn"}
    table = ddb.describe_table(TableName="dc-stream-table")["Table"]
    assert table["StreamSpecification"]["StreamViewType"] == "NEW_IMAGE"
    assert boto3.client("lambda", **DUMMY_CREDENTIALS).list_functions()["Functions"] == []
    assert delete_stack(cfn, "dc-stream", poll_interval=0) is True


def test_stack_parameters_are_checked_before_any_request(aws: tuple[Any, Any]) -> None:
    cfn, _ = aws
    bad: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"Namespaces": "a,b#c"}, ValueError, "'#'"),
        ({"Namespaces": ["a", "team-*"]}, ValueError, "wildcard"),
        ({"RelayNamespace": "x*"}, ValueError, "wildcard"),
        ({"Namespaces": "a,b", "RelayNamespace": "c"}, ValueError, "not one of Namespaces"),
        ({"RelayHandlers": "app.handlers"}, ValueError, "MODULE:ATTRIBUTE"),
        ({"ReconcileHandler": "app:"}, ValueError, "MODULE:ATTRIBUTE"),
        ({"OutboxOptions": {"lesae": 5}}, ValueError, "unknown outbox option"),
        # a value each function would refuse at its first event, refused before the deploy
        ({"OutboxOptions": {"batch_size": 0}}, ValueError, "OutboxOptions: batch_size must be"),
        ({"OutboxOptions": {"on_missing_handler": "drop"}}, ValueError, "on_missing_handler"),
        ({"OutboxOptions": "[1]"}, ValueError, "JSON object"),
        ({"OutboxOptions": "{"}, ValueError, "not JSON"),
        ({"HandlerSettings": "[]"}, ValueError, "HandlerSettings must be a JSON object"),
        ({"RelayTimeout": 60, "OutboxOptions": {"lease": 60}}, ValueError, "no room for the lease"),
        ({"HandlerSettings": 5}, ValueError, "HandlerSettings must be a JSON object"),
        ({"Namespaces": {"a": 1}}, TypeError, "list of str"),
    ]
    for parameters, error, message in bad:
        with pytest.raises(error, match=message):
            deploy_stack(cfn, "dc-bad", parameters=parameters)
    assert cfn.describe_stacks()["Stacks"] == []


def test_list_and_dict_parameters_are_sent_as_cloudformation_text(
    aws: tuple[Any, Any], code_bucket: Any
) -> None:
    cfn, _ = aws
    parameters = _every_parameter(
        **{
            **ALL_ON,
            "TableName": "dc-text-table",
            "Namespaces": ["orders", "billing"],
            "OutboxOptions": {"max_attempts": 8, "lease": 45},
            "EncryptionKey": "",
        }
    )
    sent: list[dict[str, Any]] = []
    cfn.meta.events.register(
        "provide-client-params.cloudformation.CreateStack",
        lambda params, **_: sent.append(params),
    )
    deploy_stack(cfn, "dc-text", parameters=parameters, poll_interval=0)
    given = {p["ParameterKey"]: p["ParameterValue"] for p in sent[0]["Parameters"]}
    assert given["Namespaces"] == "orders,billing"
    assert json.loads(given["OutboxOptions"]) == {"max_attempts": 8, "lease": 45}
