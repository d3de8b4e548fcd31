"""The stack's checks and its cleanup: parameter values and the template's rules checked before
anything is uploaded or sent, the package check's advice, what a stack deletion keeps and how to
delete the table it kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dynacoord.provision import create_table, template_body
from tests.cli_helpers import cli_aws, run_cli  # noqa: F401
from tests.test_cloudformation import _template

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS.+CloudWatch.+Alarm:UserWarning")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "serverless_outbox"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "--region", "us-east-1", *argv)


# --- what a deletion keeps ------------------------------------------------------------------------


def test_a_stack_deletion_keeps_the_dead_letters_and_the_logs() -> None:
    resources = _template()["Resources"]
    for name in ("DeadLetterQueue", "RelayLogGroup", "SweeperLogGroup"):
        assert resources[name].get("DeletionPolicy") == "Retain", name
        assert resources[name].get("UpdateReplacePolicy") == "Retain", name


# --- deleting a kept table ------------------------------------------------------------------------


def test_table_delete_can_turn_deletion_protection_off(
    cli_aws: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    create_table(cli_aws["dynamodb"], "kept-table", deletion_protection=True)
    code, _, err = run(capsys, "--table", "kept-table", "table", "delete", "--yes")
    assert code == 1 and "--disable-deletion-protection" in err
    code, out, err = run(
        capsys, "--table", "kept-table", "table", "delete", "--yes", "--disable-deletion-protection"
    )
    assert code == 0, err
    assert "deleted: true" in out and "turning off deletion protection" in err
    assert cli_aws["dynamodb"].list_tables()["TableNames"] == []


# --- the package check ----------------------------------------------------------------------------


def test_package_of_the_example_names_the_settings_variable_and_no_check(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.delenv("DYNACOORD_HANDLER_SETTINGS", raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    out_zip = tmp_path / "bundle.zip"
    code, _, err = run(
        capsys, "stack", "package", "relay_handlers:HANDLERS", "--output", str(out_zip)
    )
    assert code != 0 and err.count("\n") == 1
    assert "DYNACOORD_HANDLER_SETTINGS" in err and "--no-check" in err
    assert not out_zip.exists()
    monkeypatch.setenv("DYNACOORD_HANDLER_SETTINGS", json.dumps({"queue_url": "https://q"}))
    code, _, err = run(
        capsys, "stack", "package", "relay_handlers:HANDLERS", "--output", str(out_zip)
    )
    assert code == 0, err
    assert out_zip.exists()


# --- checked before anything is sent --------------------------------------------------------------


def test_relay_values_are_checked_before_the_bundle_is_uploaded(
    cli_aws: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = cli_aws["s3"]
    s3.create_bucket(Bucket="code-bucket")
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.setenv("DYNACOORD_HANDLER_SETTINGS", json.dumps({"queue_url": "https://q"}))
    code, _, err = run(
        capsys,
        "--namespace",
        "orders",
        "stack",
        "deploy",
        "--parameter",
        "Namespaces=billing",
        "--relay",
        "relay_handlers:HANDLERS",
        "--code-bucket",
        "code-bucket",
    )
    assert code == 2 and "RelayNamespace 'orders' is not one of Namespaces" in err
    assert s3.list_objects_v2(Bucket="code-bucket").get("KeyCount", 0) == 0  # nothing uploaded
    assert cli_aws["cloudformation"].list_stacks()["StackSummaries"] == []


@pytest.mark.parametrize(
    ("parameter", "message"),
    [
        ("BillingMode=CHEAP", "BillingMode must be one of PAY_PER_REQUEST, PROVISIONED"),
        ("PythonRuntime=python3.9", "PythonRuntime must be one of python3.11"),
        ("RelayTimeout=5", "RelayTimeout must be in 60..900"),
        ("SweepSchedule=hourly", "SweepSchedule must match"),
        ("Relay=true", "Relay=true needs RelayHandlers, CodeS3Bucket, CodeS3Key"),
    ],
)
def test_allowed_values_and_rules_are_checked_before_any_request(
    cli_aws: dict[str, Any], capsys: pytest.CaptureFixture[str], parameter: str, message: str
) -> None:
    code, _, err = run(capsys, "stack", "deploy", "--parameter", parameter)
    assert code == 2, err
    assert message in err
    assert cli_aws["cloudformation"].list_stacks()["StackSummaries"] == []


def test_every_default_of_the_template_passes_the_local_checks() -> None:
    from dynacoord.provision._template import _bundled_template_parameters, _check_allowed

    spec = _bundled_template_parameters()
    assert set(spec) == set(_template()["Parameters"])
    _check_allowed({k: str(v["Default"]) for k, v in spec.items() if "Default" in v})
    assert template_body()  # the bundled copy is the one read


@pytest.mark.parametrize("previous", ["", "['']", "[]", "[' ']"])
def test_an_empty_previous_namespaces_list_allows_every_relay_namespace(previous: str) -> None:
    from dynacoord.provision import check_stack_rules

    relay = {"Relay": "true", "RelayHandlers": "m:h", "CodeS3Bucket": "b", "CodeS3Key": "k"}
    check_stack_rules({**relay, "Namespaces": previous, "RelayNamespace": "orders"})
    with pytest.raises(ValueError, match="not one of Namespaces 'billing'"):
        check_stack_rules({**relay, "Namespaces": "['billing']", "RelayNamespace": "orders"})
