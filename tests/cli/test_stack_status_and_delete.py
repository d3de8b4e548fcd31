"""``dynacoord stack status`` (the stack's outputs and its alarms' state, with what to run) and
``dynacoord stack delete`` (what it kept and how to remove it), against moto; the runbook of
docs/deployment.md holds every alarm of the template."""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynacoord.cli import main
from dynacoord.provision import ALARM_RUNBOOK, template_body
from dynacoord.provision.stack import _template_resources
from dynacoord.testing import DUMMY_CREDENTIALS

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS.+CloudWatch.+Alarm:UserWarning")

ROOT = Path(__file__).resolve().parents[2]
ALARMS = [
    name
    for name, spec in _template_resources(template_body()).items()
    if spec.get("Type") == "AWS::CloudWatch::Alarm"
]
RELAY = {
    "TableName": "dc-status-table",
    "DeletionProtection": "false",
    "Relay": "true",
    "RelayHandlers": "app_handlers:HANDLERS",
    "CodeS3Bucket": "dc-code",
    "CodeS3Key": "k1.zip",
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--region", "us-east-1", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    for name in ("DYNACOORD_ENDPOINT_URL", "DYNACOORD_TABLE", "DYNACOORD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        s3 = boto3.client("s3", **DUMMY_CREDENTIALS)
        s3.create_bucket(Bucket="dc-code")
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as bundle:
            bundle.writestr("app_handlers.py", "HANDLERS = {}\n")
        s3.put_object(Bucket="dc-code", Key="k1.zip", Body=buffer.getvalue())
        yield boto3.client("cloudwatch", **DUMMY_CREDENTIALS)


def _deploy(capsys: pytest.CaptureFixture[str], stack: str) -> dict[str, Any]:
    argv = ["--json", "stack", "deploy", "--stack-name", stack, "--poll-interval", "0"]
    for key, value in RELAY.items():
        argv += ["--parameter", f"{key}={value}"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    return dict(json.loads(out))


def _cloudformation_alarm(cloudwatch: Any, stack: str, logical: str, state: str) -> str:
    """An alarm named as CloudFormation names it (moto's CloudFormation makes none)."""
    name = f"{stack}-{logical}-1A2B3C4D5E6F"
    cloudwatch.put_metric_alarm(
        AlarmName=name,
        Namespace="AWS/Lambda",
        MetricName="Errors",
        Statistic="Sum",
        Period=300,
        EvaluationPeriods=1,
        Threshold=1,
        ComparisonOperator="GreaterThanOrEqualToThreshold",
    )
    cloudwatch.set_alarm_state(AlarmName=name, StateValue=state, StateReason=f"{logical} test")
    return name


def test_status_shows_outputs_and_each_alarms_state_and_exits_1_while_one_fires(
    capsys: pytest.CaptureFixture[str], aws: Any
) -> None:
    _deploy(capsys, "dcs")
    for logical in ALARMS:
        _cloudformation_alarm(aws, "dcs", logical, "OK")
    # another stack's alarm with a longer name is not this stack's
    _cloudformation_alarm(aws, "dcs-other", "DeadLetterAlarm", "ALARM")
    code, out, err = run(capsys, "--json", "stack", "status", "--stack-name", "dcs")
    assert code == 0, err
    status = json.loads(out)
    assert status["stack"] == "dcs" and status["status"] == "CREATE_COMPLETE"
    assert status["outputs"]["TableName"] == "dc-status-table"
    assert [a["alarm"] for a in status["alarms"]] == ALARMS
    assert {a["state"] for a in status["alarms"]} == {"OK"}

    aws.set_alarm_state(
        AlarmName="dcs-DeadLetterAlarm-1A2B3C4D5E6F", StateValue="ALARM", StateReason="1 message"
    )
    code, out, err = run(capsys, "stack", "status", "--stack-name", "dcs")
    assert code == 1
    assert err == (
        "dynacoord: error: stack dcs: 1 alarm(s) in ALARM: DeadLetterAlarm (the runbook lines "
        "above say what to run; docs/deployment.md#runbook)\n"
    )
    assert "alarm DeadLetterAlarm: ALARM (dcs-DeadLetterAlarm-1A2B3C4D5E6F)" in out
    assert "  reason: 1 message" in out
    # its commands name the stack's table and the relay's namespace (pasted, they read them)
    filled = ALARM_RUNBOOK["DeadLetterAlarm"].replace(
        "`dynacoord ", "`dynacoord --table dc-status-table --namespace default "
    )
    assert f"  runbook: {filled}" in out
    assert "output TableName: dc-status-table" in out


def test_status_of_a_missing_stack_exits_1(capsys: pytest.CaptureFixture[str], aws: Any) -> None:
    code, _, err = run(capsys, "stack", "status", "--stack-name", "nothere")
    assert code == 1 and err == "dynacoord: error: stack nothere does not exist\n"


def test_delete_says_what_it_kept_and_how_to_remove_each(
    capsys: pytest.CaptureFixture[str], aws: Any
) -> None:
    _deploy(capsys, "dcd")
    code, out, err = run(
        capsys, "--json", "stack", "delete", "--stack-name", "dcd", "--yes", "--poll-interval", "0"
    )
    assert code == 0, err
    kept = {k["logical_id"]: k for k in json.loads(out)["kept"]}
    assert set(kept) == {"Table", "DeadLetterQueue", "RelayLogGroup", "SweeperLogGroup"}
    assert kept["Table"]["remove_with"] == (
        "dynacoord --table dc-status-table table delete --yes --disable-deletion-protection"
    )
    queue = kept["DeadLetterQueue"]["physical_id"]
    assert kept["DeadLetterQueue"]["remove_with"] == f"aws sqs delete-queue --queue-url {queue}"
    group = kept["RelayLogGroup"]["physical_id"]
    assert kept["RelayLogGroup"]["remove_with"] == (
        f"aws logs delete-log-group --log-group-name {group}"
    )
    for logical in kept:  # each also on stderr, for a reader without --json
        assert f"kept {logical} " in err


def test_every_retained_resource_type_has_a_removal_command() -> None:
    from dynacoord.provision.stack import _REMOVE_WITH

    retained = {
        spec["Type"]
        for spec in _template_resources(template_body()).values()
        if spec.get("DeletionPolicy") == "Retain"
    }
    assert retained <= set(_REMOVE_WITH)


def test_the_runbook_covers_every_alarm_of_the_template() -> None:
    assert list(ALARM_RUNBOOK) == ALARMS
    text = (ROOT / "docs" / "deployment.md").read_text()
    runbook = text.split("### Runbook", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+Alarm)` \|", runbook, flags=re.MULTILINE)
    assert rows == ALARMS
    body = template_body()
    for logical in ALARMS:  # its name is an output, for other tools
        assert f"  {logical}Name:\n" in body.split("\nOutputs:\n", 1)[1]


def test_runbook_options_are_shell_quoted_and_carry_the_stacks_layout() -> None:
    import shlex

    from dynacoord import TableLayout
    from dynacoord.provision.stack import _runbook_options

    options = _runbook_options(
        {},  # no outputs (an emulator that reports none): the parameter names the table
        {
            "TableName": "orders-coord",
            "RelayNamespace": "eu orders's",
            "PartitionKey": "PK",
            "SortKey": "SK",
            "KeyPrefix": "DC#",
        },
    )
    words = shlex.split(options)
    assert words[:4] == ["--table", "orders-coord", "--namespace", "eu orders's"]
    assert words[4] == "--table-layout"
    assert TableLayout.from_json(words[5]) == TableLayout(pk="PK", sk="SK", prefix="DC#")
    assert len(words) == 6
    # a stack whose table name is in neither: a placeholder that reads no other table
    assert shlex.split(_runbook_options({}, {}))[:2] == ["--table", "TABLE"]
