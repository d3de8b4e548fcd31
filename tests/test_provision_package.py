"""Issue 31: ``dynacoord.provision`` is a package (table, stack, bundle, iam) whose AWS calls go
through one error-translation point, and whose waiters take the caller's clock."""

from __future__ import annotations

import importlib
import time
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from dynacoord import ManualClock
from dynacoord.errors import BackendError, StackDeploymentError, TableNotReadyError
from dynacoord.testing import DUMMY_CREDENTIALS

#: every public name of the module before it became a package, with the part that now holds it
PUBLIC = {
    "table": [
        "GSI_NAME",
        "TTL_ATTRIBUTE",
        "create_table",
        "delete_table",
        "ensure_table",
        "is_warning",
        "table_definition",
        "verify_table",
    ],
    "stack": [
        "ALARM_RUNBOOK",
        "STACK_PARAMETERS",
        "RetainedResource",
        "StackAlarm",
        "StackDeployment",
        "StackParameterValue",
        "StackStatus",
        "check_stack_parameters",
        "check_stack_rules",
        "delete_stack",
        "deploy_stack",
        "retained_resources",
        "stack_outputs",
        "stack_parameters",
        "stack_status",
        "template_body",
        "template_path",
    ],
    "bundle": ["RelayBundle", "package_relay", "upload_bundle"],
    "iam": ["INDEX_ACTIONS", "ITEM_ACTIONS", "METADATA_ACTIONS", "iam_policy"],
}


def test_provision_is_a_package_of_table_stack_bundle_iam_with_every_name_as_before() -> None:
    provision = importlib.import_module("dynacoord.provision")
    assert hasattr(provision, "__path__"), "dynacoord.provision is a package"
    expected = sorted(name for names in PUBLIC.values() for name in names)
    assert sorted(provision.__all__) == expected
    for part, names in PUBLIC.items():
        module = importlib.import_module(f"dynacoord.provision.{part}")
        for name in names:
            assert getattr(provision, name) is getattr(module, name), (part, name)


def _client() -> Any:
    return boto3.client("dynamodb", **DUMMY_CREDENTIALS)


def _table(status: str, index_status: str = "ACTIVE") -> dict[str, Any]:
    return {
        "Table": {
            "TableName": "orders",
            "TableStatus": status,
            "KeySchema": [
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            "AttributeDefinitions": [
                {"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk", "gsi1pk", "gsi1sk")
            ],
            "GlobalSecondaryIndexes": [
                {
                    "IndexName": "gsi1",
                    "IndexStatus": index_status,
                    "KeySchema": [
                        {"AttributeName": "gsi1pk", "KeyType": "HASH"},
                        {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "ALL"},
                }
            ],
        }
    }


_TTL_ON = {"TimeToLiveDescription": {"TimeToLiveStatus": "ENABLED", "AttributeName": "ttl"}}


def test_a_refused_describe_while_waiting_for_the_table_is_a_backend_error_naming_it() -> None:
    from dynacoord.provision import ensure_table

    client = _client()
    with Stubber(client) as stub:
        stub.add_response("describe_table", _table("UPDATING"))
        stub.add_response("describe_table", _table("UPDATING"))
        stub.add_client_error(
            "describe_table", "AccessDeniedException", "not allowed to DescribeTable"
        )
        with pytest.raises(BackendError) as err:
            ensure_table(client, "orders", clock=ManualClock())
    assert "orders" in str(err.value) and "not allowed to DescribeTable" in str(err.value)
    assert err.value.code == "AccessDeniedException"


def test_table_waiters_take_the_clock() -> None:
    from dynacoord.provision import delete_table, ensure_table

    client = _client()
    clock = ManualClock()
    started_clock, started = clock.monotonic(), time.monotonic()
    with Stubber(client) as stub:
        stub.add_response("describe_table", _table("ACTIVE", "CREATING"))
        for _ in range(6):
            stub.add_response("describe_table", _table("ACTIVE", "CREATING"))
        stub.add_response("describe_table", _table("ACTIVE"))
        stub.add_response("describe_time_to_live", _TTL_ON)
        assert ensure_table(client, "orders", clock=clock) is False
    assert clock.monotonic() - started_clock > 1.0, "the waits went to the given clock"
    # a table that never becomes ACTIVE: the timeout is the clock's, not the wall's
    with Stubber(client) as stub:
        stub.add_response("describe_table", _table("CREATING"))
        for _ in range(40):
            stub.add_response("describe_table", _table("CREATING"))
        with pytest.raises(TableNotReadyError):
            ensure_table(client, "orders", clock=clock, timeout=30)
    with Stubber(client) as stub:
        stub.add_response("delete_table", {})
        for _ in range(3):
            stub.add_response("describe_table", _table("DELETING"))
        stub.add_client_error("describe_table", "ResourceNotFoundException", "gone")
        assert delete_table(client, "orders", clock=clock) is True
    assert time.monotonic() - started < 1.0, "nothing slept on the wall clock"


def test_stack_waiters_take_the_clock() -> None:
    from dynacoord.provision import delete_stack

    cfn = boto3.client("cloudformation", **DUMMY_CREDENTIALS)
    clock = ManualClock()
    started, started_clock = time.monotonic(), clock.monotonic()
    stack = {"StackName": "s", "StackId": "arn:s", "CreationTime": "2026-01-01T00:00:00Z"}
    with Stubber(cfn) as stub:
        stub.add_response(
            "describe_stacks", {"Stacks": [{**stack, "StackStatus": "CREATE_COMPLETE"}]}
        )
        stub.add_response("describe_stack_events", {"StackEvents": []})
        stub.add_response("delete_stack", {})
        for _ in range(3):
            stub.add_response(
                "describe_stacks", {"Stacks": [{**stack, "StackStatus": "DELETE_IN_PROGRESS"}]}
            )
        stub.add_response(
            "describe_stacks", {"Stacks": [{**stack, "StackStatus": "DELETE_COMPLETE"}]}
        )
        assert delete_stack(cfn, "s", clock=clock, poll_interval=5) is True
    assert clock.monotonic() - started_clock == pytest.approx(15)
    assert time.monotonic() - started < 1.0


def test_a_refused_stack_event_read_is_a_stack_deployment_error() -> None:
    from dynacoord.provision import delete_stack

    cfn = boto3.client("cloudformation", **DUMMY_CREDENTIALS)
    stack = {"StackName": "s", "StackId": "arn:s", "CreationTime": "2026-01-01T00:00:00Z"}
    with Stubber(cfn) as stub:
        stub.add_response(
            "describe_stacks", {"Stacks": [{**stack, "StackStatus": "CREATE_COMPLETE"}]}
        )
        stub.add_client_error("describe_stack_events", "AccessDenied", "no events for you")
        with pytest.raises(StackDeploymentError, match="no events for you"):
            delete_stack(cfn, "s", clock=ManualClock())


def test_every_aws_call_of_provision_goes_through_one_translation_point() -> None:
    import ast
    import pathlib

    import dynacoord.provision as provision

    root = pathlib.Path(provision.__file__).parent
    catching = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and "ClientError" in ast.unparse(
                node.type or node
            ):
                catching.append(f"{path.name}:{node.lineno}")
    assert len(catching) == 1, catching
