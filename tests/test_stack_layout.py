"""The bundled stack with a table layout, and its outbox lag alarms (moto).

The lag alarms watch what the stack's sweeper writes: the test runs the sweeper's entry point
(``dynacoord.serverless.sweep``) in the environment the template gives it and compares the EMF
line it prints with the alarm's namespace, metric, unit and dimensions.
"""

from __future__ import annotations

import io
import json
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest

from dynacoord import Event, TableLayout
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._stack import EXPIRED_LEASE_AGE, OLDEST_DUE_AGE
from dynacoord.provision import create_table, deploy_stack, template_body, verify_table
from dynacoord.provision.stack import LAYOUT_PARAMETERS, layout_parameters
from dynacoord.testing import DUMMY_CREDENTIALS
from tests.backends_fixtures import LAYOUT

#: moto has no CloudFormation model of CloudWatch alarms: it skips them with this warning.
pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS.+CloudWatch.+Alarm:UserWarning")


def _template() -> dict[str, Any]:
    from cfnlint.decode import decode_str

    template, matches = decode_str(template_body())
    assert not matches and template is not None
    return dict(template)


@pytest.fixture()
def aws() -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        s3 = boto3.client("s3", **DUMMY_CREDENTIALS)
        s3.create_bucket(Bucket="dc-code")
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as bundle:
            bundle.writestr("app_handlers.py", "HANDLERS = print\n")
        s3.put_object(Bucket="dc-code", Key="k1.zip", Body=buffer.getvalue())
        yield boto3.client("cloudformation", **DUMMY_CREDENTIALS)


RELAY = {
    "Relay": "true",
    "RelayNamespace": "orders",
    "RelayHandlers": "app_handlers:HANDLERS",
    "CodeS3Bucket": "dc-code",
    "CodeS3Key": "k1.zip",
}


def test_a_stack_with_a_layout_makes_the_table_policy_filter_and_functions_use_it(aws: Any) -> None:
    import boto3

    deployed = deploy_stack(
        aws,
        "dc-layout",
        parameters={"TableName": "app", "Namespaces": "orders", **RELAY},
        layout=LAYOUT,
        poll_interval=0,
    )
    assert deployed.status == "CREATE_COMPLETE"
    ddb = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
    table = ddb.describe_table(TableName="app")["Table"]
    assert [k["AttributeName"] for k in table["KeySchema"]] == ["PK", "SK"]
    (gsi,) = table["GlobalSecondaryIndexes"]
    assert gsi["IndexName"] == "GSI1"
    assert [k["AttributeName"] for k in gsi["KeySchema"]] == ["GSI1PK", "GSI1SK"]
    # moto ignores the template's TimeToLiveSpecification: the only problem is TTL
    problems = verify_table(ddb, "app", layout=LAYOUT)
    assert len(problems) == 1 and problems[0].startswith("TTL is"), problems

    iam = boto3.client("iam", **DUMMY_CREDENTIALS)
    arn = deployed.outputs["AccessPolicyArn"]
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
    document = json.loads(document) if isinstance(document, str) else document
    by_sid = {s["Sid"]: s for s in document["Statement"]}
    keys = by_sid["DynacoordItems"]["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert "DC#LOCK#orders#*" in keys and all(k.startswith("DC#") for k in keys)
    assert by_sid["DynacoordIndexQuery"]["Resource"].endswith("/index/GSI1")

    lam = boto3.client("lambda", **DUMMY_CREDENTIALS)
    functions = {f["Handler"]: f for f in lam.list_functions()["Functions"]}
    for function in functions.values():
        variables = function["Environment"]["Variables"]
        assert TableLayout.from_json(variables["DYNACOORD_TABLE_LAYOUT"]) == LAYOUT
    sweeper = functions["dynacoord.serverless.sweep"]["Environment"]["Variables"]
    assert sweeper["DYNACOORD_OUTBOX_LAG_METRICS"] == "dynacoord"

    # the relay's filter lets through new events of its namespace, with the prefix, only
    pattern = _template()["Resources"]["RelayEventSourceMapping"]["Properties"]
    (only,) = pattern["FilterCriteria"]["Filters"]
    text = only["Pattern"]["Fn::Sub"]
    for field, name in LAYOUT_PARAMETERS.items():
        text = text.replace("${" + name + "}", str(getattr(LAYOUT, field)))
    text = text.replace("${RelayNamespace}", "orders")
    new_image = json.loads(text)["dynamodb"]["NewImage"]
    assert new_image["PK"] == {"S": [{"prefix": "DC#OUTBOX#orders#"}]}


def test_layout_parameters_are_checked_before_any_request(aws: Any) -> None:
    assert layout_parameters(TableLayout())["PartitionKey"] == "pk"
    with pytest.raises(ValueError, match="PartitionKey='pk' contradicts the layout's 'PK'"):
        deploy_stack(aws, "dc-x", parameters={"PartitionKey": "pk"}, layout=LAYOUT)
    with pytest.raises(ValueError, match="TableLayout.pk='sk'"):
        deploy_stack(aws, "dc-x", parameters={"PartitionKey": "sk"})
    with pytest.raises(ValueError, match="KeyPrefix"):
        deploy_stack(aws, "dc-x", parameters={"KeyPrefix": "a*"})
    with pytest.raises(ValueError, match="OutboxLagAlarmSeconds"):
        deploy_stack(aws, "dc-x", parameters={"OutboxLagAlarmSeconds": "-1"})
    assert aws.list_stacks()["StackSummaries"] == []


def test_a_zero_lag_threshold_turns_the_lag_metrics_off(aws: Any) -> None:
    import boto3

    deploy_stack(
        aws, "dc-nolag", parameters={**RELAY, "OutboxLagAlarmSeconds": "0"}, poll_interval=0
    )
    lam = boto3.client("lambda", **DUMMY_CREDENTIALS)
    functions = {f["Handler"]: f for f in lam.list_functions()["Functions"]}
    sweeper = functions["dynacoord.serverless.sweep"]["Environment"]["Variables"]
    assert sweeper["DYNACOORD_OUTBOX_LAG_METRICS"] == ""
    conditions = _template()["Conditions"]["WantsLagAlarms"]
    assert {"Condition": "WantsRelayAlarms"} in conditions["Fn::And"]


class _Context:
    """Lambda's context with too little time left for a lease: the sweep makes no pass, so
    the due event stays due when the lag is read."""

    def get_remaining_time_in_millis(self) -> int:
        return 1000


@pytest.mark.parametrize("layout", [TableLayout(), LAYOUT], ids=["default", "layout"])
def test_the_sweeper_writes_what_the_lag_alarms_watch(
    layout: TableLayout,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Any,
) -> None:
    import boto3
    from moto import mock_aws

    from dynacoord import serverless

    (tmp_path / "lag_handlers.py").write_text("def HANDLERS(event):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with mock_aws():
        client = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
        create_table(client, "app", layout=layout)
        # the sweeper's environment as the template writes it (Alarms on, the default 300 s)
        for name, value in {
            "DYNACOORD_TABLE": "app",
            "DYNACOORD_TABLE_LAYOUT": layout.to_json(),
            "DYNACOORD_NAMESPACE": "orders",
            "DYNACOORD_OUTBOX_HANDLERS": "lag_handlers:HANDLERS",
            "DYNACOORD_OUTBOX_LAG_METRICS": "dynacoord",
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("DYNACOORD_ENDPOINT_URL", raising=False)
        backend = DynamoDBBackend(client, table_name="app", namespace="orders", layout=layout)
        backend.outbox.publish(Event("t", {}))
        time.sleep(0.05)
        serverless._reset()
        try:
            capsys.readouterr()
            result = serverless.sweep({}, _Context())
            out = capsys.readouterr().out
        finally:
            serverless._reset()
    assert result["passes"] == 0 and result["lag"][OLDEST_DUE_AGE] >= 50
    assert result["lag"][EXPIRED_LEASE_AGE] == 0
    (line,) = [json.loads(x) for x in out.splitlines() if x.startswith('{"_aws"')]
    (directive,) = line["_aws"]["CloudWatchMetrics"]
    emitted = {
        metric["Name"]: (
            directive["Namespace"],
            metric["Unit"],
            {name: line[name] for name in directive["Dimensions"][0]},
        )
        for metric in directive["Metrics"]
    }
    assert line[OLDEST_DUE_AGE] == result["lag"][OLDEST_DUE_AGE]

    template = _template()
    resources = template["Resources"]
    sweeper_env = resources["SweeperFunction"]["Properties"]["Environment"]["Variables"]
    assert sweeper_env["DYNACOORD_OUTBOX_LAG_METRICS"] == {
        "Fn::If": ["WantsLagAlarms", "dynacoord", ""]
    }
    resolved = {"Table": "app", "RelayNamespace": "orders"}
    for alarm_name, metric in (
        ("OutboxLagAlarm", OLDEST_DUE_AGE),
        ("OutboxExpiredLeaseAlarm", EXPIRED_LEASE_AGE),
    ):
        alarm = resources[alarm_name]
        props = alarm["Properties"]
        assert alarm["Condition"] == "WantsLagAlarms"
        dimensions = {
            d["Name"]: resolved[d["Value"]["Ref"]] if isinstance(d["Value"], dict) else d["Value"]
            for d in props["Dimensions"]
        }
        namespace, unit, written = emitted[metric]
        assert (props["Namespace"], props["MetricName"], dimensions) == (
            namespace,
            metric,
            written,
        )
        # the threshold is in the metric's unit: the parameter's seconds as milliseconds
        assert unit == "Milliseconds"
        assert props["Threshold"] == {"Fn::Sub": "${OutboxLagAlarmSeconds}000"}
        assert props["TreatMissingData"] == "notBreaching"
        assert props["AlarmActions"]["Fn::If"][0] == "NotifiesAlarms"
    assert template["Parameters"]["OutboxLagAlarmSeconds"]["Default"] == "300"


def test_stack_deploy_takes_the_layout_on_the_command_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from moto.server import ThreadedMotoServer

    from dynacoord.cli import main
    from dynacoord.testing import free_port

    monkeypatch.delenv("DYNACOORD_TABLE_LAYOUT", raising=False)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        base = ["--endpoint-url", endpoint, "--region", "us-east-1", "--json"]
        code = main(
            [*base, "stack", "deploy", "--stack-name", "dc-cli", "--poll-interval", "0",
             "--parameter", "TableName=app", "--table-layout", LAYOUT.to_json()]
        )  # fmt: skip
        err = capsys.readouterr().err
        assert code == 0, err
        ddb = boto3.client("dynamodb", endpoint_url=endpoint, **DUMMY_CREDENTIALS)
        table = ddb.describe_table(TableName="app")["Table"]
        assert [k["AttributeName"] for k in table["KeySchema"]] == ["PK", "SK"]
        cfn = boto3.client("cloudformation", endpoint_url=endpoint, **DUMMY_CREDENTIALS)
        (stack,) = cfn.describe_stacks(StackName="dc-cli")["Stacks"]
        given = {p["ParameterKey"]: p["ParameterValue"] for p in stack["Parameters"]}
        assert given["KeyPrefix"] == "DC#" and given["IndexName"] == "GSI1"
        code = main([*base, "stack", "deploy", "--stack-name", "dc-cli", "--table-layout", "{x"])
        assert (
            code == 2 and "--table-layout: the table layout is not JSON" in capsys.readouterr().err
        )
    finally:
        server.stop()


def test_the_lag_costs_two_one_item_queries_per_shard_and_one_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import boto3
    from moto import mock_aws

    from dynacoord.backends.dynamodb._stack import lag_outbox

    with mock_aws():
        client = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
        create_table(client, "app")
        backend = DynamoDBBackend(client, table_name="app", namespace="o", shards=4)
        outbox = lag_outbox(backend, "dynacoord")
        sent: list[tuple[str, Any]] = []

        def record(params: Any, model: Any, **_: Any) -> None:
            sent.append((model.name, params.get("Limit")))

        client.meta.events.register("provide-client-params.dynamodb.*", record)
        assert outbox.lag() == {OLDEST_DUE_AGE: 0, EXPIRED_LEASE_AGE: 0}
    assert sorted(sent, key=str) == [("GetItem", None)] + [("Query", 1)] * 8
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)[OLDEST_DUE_AGE] == 0  # written when nothing waits too


def test_the_stacks_sweeper_leaves_new_events_to_the_relay() -> None:
    """The sweeper that reports the lag is the stack's sweeper: like every DynamoDB sweeper it
    leaves a new event to the stream relay for one lease (the relay delivers it without a
    claim); it took them at once before, beside the relay."""
    import boto3
    from moto import mock_aws

    from dynacoord.backends.dynamodb._stack import LagSweepHandler, lag_outbox

    with mock_aws():
        client = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
        create_table(client, "app")
        backend = DynamoDBBackend(client, table_name="app", namespace="o")
        sweeper = lag_outbox(backend, "dynacoord").sweep_handler(lambda event: None, lease=20)
    assert isinstance(sweeper, LagSweepHandler)
    assert sweeper.worker.leave_new_ms == 20_000
