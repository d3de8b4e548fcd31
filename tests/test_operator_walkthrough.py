"""The operator's walkthrough of docs/deployment.md, run through the ``dynacoord`` command
(``dynacoord.cli.main``) against moto's *server* on a loopback port, as an operator would run it
with ``--endpoint-url``: create, redeploy (no change), update, the serverless relay, delete,
table cleanup (issue 31 points 6 and "an operator's walkthrough that runs").

Where moto's server differs from CloudFormation, the test says so and does what moto can run:

* the stack is created with ``Stream=true``: moto cannot turn the table's stream on by an update
  (it cannot update a DynamoDB table through CloudFormation at all), which the relay needs;
* the documented capacity update (``BillingMode=PROVISIONED``) cannot run: moto cannot update a
  table through CloudFormation (5.2.1 lost the stack's table resource, 5.2.6 refuses the
  template); the walkthrough updates ``DeletionProtection`` instead, a parameter the create left
  at its default. What an operator sees when an endpoint answers an HTML 500 page is driven by a
  stub endpoint of the test's own (test_an_emulators_internal_error_is_one_clear_line);
* after the relay update moto reports no outputs and has made no event source mapping (it does
  not re-evaluate conditions on update): the functions are read from Lambda instead.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEPLOYMENT = ROOT / "docs" / "deployment.md"
EXAMPLE = ROOT / "examples" / "serverless_outbox"
MODULES = ("orders", "relay_handlers")
SETTINGS = '{"queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/orders"}'
#: moto's CloudFormation has no CloudWatch alarm model and warns on every alarm resource
pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS.+:UserWarning")


@pytest.fixture()
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's server on a free loopback port, with dummy credentials; stopped after the test."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name in ("AWS_ENDPOINT_URL", "DYNACOORD_ENDPOINT_URL", "AWS_PROFILE", "DYNACOORD_TABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture()
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The serverless example's folder as the current directory (the operator runs `stack
    deploy --relay` there), its modules fresh."""
    from dynacoord import serverless

    monkeypatch.chdir(EXAMPLE)
    monkeypatch.delenv("DYNACOORD_HANDLER_SETTINGS", raising=False)
    for name in MODULES:
        sys.modules.pop(name, None)
    serverless._reset()
    try:
        yield EXAMPLE
    finally:
        serverless._reset()
        for name in MODULES:
            sys.modules.pop(name, None)


def _documented(command: str) -> None:
    """``command`` appears in docs/deployment.md (continuation lines joined, spaces squeezed)."""
    text = DEPLOYMENT.read_text(encoding="utf-8").replace("\\\n", " ")
    assert " ".join(command.split()) in re.sub(r"[ \t]+", " ", text), command


def _run(
    capsys: pytest.CaptureFixture[str], endpoint: str, command: str, *extra: str
) -> tuple[int, str, str]:
    """``dynacoord --endpoint-url ENDPOINT <command> <extra>``: (exit code, stdout, stderr)."""
    from dynacoord.cli import main

    argv = command.split()
    assert argv[0] == "dynacoord"
    capsys.readouterr()
    code = main(["--endpoint-url", endpoint, *argv[1:], *extra])
    out, err = capsys.readouterr()
    return code, out, err


FAST = ("--poll-interval", "0.1")  # not in the docs: moto settles at once


def test_the_walkthrough_of_deployment_md_runs_against_motos_server(
    endpoint: str, example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3

    ddb = boto3.client("dynamodb", endpoint_url=endpoint)

    # 1. create (under moto with the stream on from the start: see the module docstring)
    create = "dynacoord stack deploy --stack-name dynacoord --parameter TableName=dynacoord"
    _documented(create)
    code, out, err = _run(capsys, endpoint, create, "--parameter", "Stream=true", *FAST)
    assert code == 0, err
    assert "status: CREATE_COMPLETE" in out and "changed: true" in out
    assert "stack dynacoord is CREATE_COMPLETE" in err
    assert ddb.describe_table(TableName="dynacoord")["Table"]["TableStatus"] == "ACTIVE"

    # 2. the same again: nothing to change, nothing sent but reads
    code, out, err = _run(capsys, endpoint, create, "--parameter", "Stream=true", *FAST)
    assert code == 0, err
    assert "changed: false" in out and "stack dynacoord is up to date" in err

    outputs_command = "dynacoord --json stack outputs --stack-name dynacoord"
    _documented(outputs_command)
    code, out, err = _run(capsys, endpoint, outputs_command)
    assert code == 0, err
    outputs = json.loads(out)
    assert outputs["TableName"] == "dynacoord"
    assert set(outputs) >= {"TableName", "TableArn", "AccessPolicyArn", "StreamArn"}

    # 3. an update passing only what changes; a parameter left at its default is kept
    update = "dynacoord stack deploy --stack-name dynacoord --parameter DeletionProtection=false"
    _documented(update)
    code, out, err = _run(capsys, endpoint, update, *FAST)
    assert code == 0, err  # before: a raw ResponseParserError (moto's HTTP 500), exit 1
    assert "status: UPDATE_COMPLETE" in out and "changed: true" in out
    cfn = boto3.client("cloudformation", endpoint_url=endpoint)
    (stack,) = cfn.describe_stacks(StackName="dynacoord")["Stacks"]
    parameters = {p["ParameterKey"]: p["ParameterValue"] for p in stack["Parameters"]}
    assert parameters["DeletionProtection"] == "false"
    assert parameters["TableName"] == "dynacoord"  # kept (UsePreviousValue)
    assert parameters["Stream"] == "true"  # kept
    assert parameters["BillingMode"] == "PAY_PER_REQUEST"  # its default, kept
    code, out, err = _run(capsys, endpoint, update, *FAST)
    assert code == 0 and "changed: false" in out, err

    # 4. the serverless relay, in the operator's bucket
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="my-artifacts")
    relay = (
        "dynacoord --namespace orders stack deploy --relay relay_handlers:HANDLERS "
        "--code-bucket my-artifacts"
    )
    _documented(relay)
    code, out, err = _run(
        capsys, endpoint, relay, "--parameter", f"HandlerSettings={SETTINGS}", *FAST
    )
    assert code == 0, err
    assert "status: UPDATE_COMPLETE" in out
    (bundle,) = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket="my-artifacts")[
        "Contents"
    ]
    assert bundle["Key"].startswith("dynacoord/dynacoord-relay-")
    lam = boto3.client("lambda", endpoint_url=endpoint)
    functions = {f["Handler"]: f for f in lam.list_functions()["Functions"]}
    assert set(functions) == {"dynacoord.serverless.relay", "dynacoord.serverless.sweep"}
    variables = functions["dynacoord.serverless.relay"]["Environment"]["Variables"]
    assert variables["DYNACOORD_TABLE"] == "dynacoord"
    assert variables["DYNACOORD_NAMESPACE"] == "orders"
    assert variables["DYNACOORD_OUTBOX_HANDLERS"] == "relay_handlers:HANDLERS"
    # (moto creates no event source mapping on this update, nor reports outputs after it: the
    # stream wiring is checked on a stack created with the relay in tests/test_cloudformation.py)

    # 4b. an alarm fires: `stack status` prints runbook lines that, pasted as printed, read the
    # stack's table and the relay's namespace (not table `dynacoord`, namespace `default`);
    # an alarm with no data yet gets no runbook line
    _runbook_lines_run_as_printed(capsys, endpoint)

    # 5. delete the stack: the table stays
    delete = "dynacoord stack delete --stack-name dynacoord --yes"
    _documented(delete)
    code, out, err = _run(capsys, endpoint, delete, *FAST)
    assert code == 0, err
    assert "stack dynacoord is deleted" in err
    assert lam.list_functions()["Functions"] == []
    assert ddb.describe_table(TableName="dynacoord")["Table"]["TableStatus"] == "ACTIVE"

    # 6. the table cleanup
    cleanup = "dynacoord --table dynacoord table delete --yes --disable-deletion-protection"
    _documented(cleanup.replace("--table dynacoord", "--table NAME"))
    code, out, err = _run(capsys, endpoint, cleanup)
    assert code == 0, err
    assert "dynacoord" not in ddb.list_tables()["TableNames"]


@pytest.fixture()
def failing_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A loopback endpoint that answers every request with HTTP 500 and an HTML page: what an
    emulator's internal error or a proxy in front of the service sends. A stub of our own, so
    the test does not depend on a bug of one emulator's release (moto 5.2.1 lost the stack's
    table on a capacity update and answered such a page; 5.2.6 answers a ValidationError)."""
    import http.server
    import threading

    class InternalError(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            # a page with a doctype (as Werkzeug, moto's server, writes one): botocore reads a
            # bare <html> 500 as a generic error, and this one cannot be parsed at all
            body = (
                b"<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n"
                b"<h1>Internal Server Error</h1>\n<p>The server encountered an internal error."
                b"</p>\n"
            )
            self.send_response(500)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST  # noqa: N815 (the name http.server calls)

        def log_message(self, *args: object) -> None:
            pass

    for name in ("AWS_ENDPOINT_URL", "DYNACOORD_ENDPOINT_URL", "AWS_PROFILE", "DYNACOORD_TABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # one attempt: botocore's retries of a 500 would only slow the test down
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), InternalError)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_emulators_internal_error_is_one_clear_line(
    failing_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The documented capacity update against an endpoint that answers an HTML page with HTTP
    500. The operator gets one line naming the request, the endpoint and the 500, not
    botocore's parser error nor a hint at DynamoDB Local."""
    update = (
        "dynacoord stack deploy --stack-name dynacoord --parameter BillingMode=PROVISIONED "
        "--parameter ReadCapacity=20 --parameter WriteCapacity=10"
    )
    _documented(update)
    code, _, err = _run(capsys, failing_endpoint, update, *FAST)
    assert code == 1
    (line,) = err.strip().splitlines()[-1:]
    assert line.startswith("dynacoord: error: cannot describe stack"), err
    assert f"{failing_endpoint} failed with an internal server error (HTTP 500)" in line
    assert "DynamoDB Local" not in err and "ResponseParserError" not in err
    assert "<html" not in err


def test_unreadable_answers_are_stack_errors_naming_the_endpoint(failing_endpoint: str) -> None:
    """From Python too: a request whose answer botocore cannot parse (an HTML page with HTTP
    500) is a StackDeploymentError naming the stack, chained from botocore's
    ResponseParserError."""
    import boto3
    from botocore.parsers import ResponseParserError

    from dynacoord.errors import StackDeploymentError
    from dynacoord.provision import deploy_stack

    cfn = boto3.client("cloudformation", endpoint_url=failing_endpoint)
    with pytest.raises(StackDeploymentError) as info:
        deploy_stack(cfn, "dc-parse", parameters={"BillingMode": "PROVISIONED"}, poll_interval=0)
    assert isinstance(info.value.__cause__, ResponseParserError)
    assert info.value.stack_name == "dc-parse"
    assert "HTTP 500" in str(info.value)


def _runbook_lines_run_as_printed(capsys: pytest.CaptureFixture[str], endpoint: str) -> None:
    """Three events in the relay's namespace, an ``OutboxLagAlarm`` in ALARM and a
    ``DeadLetterAlarm`` with no data yet (moto's CloudFormation makes no alarms: they are made
    as CloudFormation names them); every ``dynacoord`` command of the printed runbook lines is
    run as printed (only ``--endpoint-url`` added, as for every command here)."""
    import shlex

    import boto3

    from dynacoord import Event
    from dynacoord.backends.dynamodb import DynamoDBBackend
    from dynacoord.cli import main

    backend = DynamoDBBackend(
        boto3.client("dynamodb", endpoint_url=endpoint), table_name="dynacoord", namespace="orders"
    )
    ids = backend.outbox.publish([Event("order.placed", {"n": n}) for n in range(3)])
    cloudwatch = boto3.client("cloudwatch", endpoint_url=endpoint)
    for logical, state in (("OutboxLagAlarm", "ALARM"), ("DeadLetterAlarm", "INSUFFICIENT_DATA")):
        name = f"dynacoord-{logical}-1A2B3C4D5E6F"
        cloudwatch.put_metric_alarm(
            AlarmName=name,
            Namespace="dynacoord",
            MetricName="OutboxOldestDueAge",
            Statistic="Maximum",
            Period=60,
            EvaluationPeriods=1,
            Threshold=300,
            ComparisonOperator="GreaterThanThreshold",
        )
        cloudwatch.set_alarm_state(AlarmName=name, StateValue=state, StateReason="test")
    status = "dynacoord stack status --stack-name dynacoord"
    _documented(status)
    code, out, err = _run(capsys, endpoint, status)
    assert code == 1, err
    lines = out.splitlines()
    runbooks = [line for line in lines if line.strip().startswith("runbook:")]
    assert len(runbooks) == 1, out  # the alarm in ALARM only
    dead_letter = lines.index(next(x for x in lines if x.startswith("alarm DeadLetterAlarm:")))
    assert "no data yet" in lines[dead_letter + 1], out
    commands = re.findall(r"`(dynacoord [^`]*)`", runbooks[0])
    assert commands, runbooks[0]
    printed: dict[str, str] = {}
    for command in commands:
        argv = shlex.split(command)
        capsys.readouterr()
        code = main(["--endpoint-url", endpoint, *argv[1:]])
        out, err = capsys.readouterr()
        assert code == 0, (command, err)
        printed[command] = out
    stats = [out for command, out in printed.items() if command.endswith("outbox stats")]
    due = [out for command, out in printed.items() if command.endswith("outbox pending --due")]
    assert len(stats) == 1 and len(due) == 1, commands
    assert "pending: 3" in stats[0] and "due: 3" in stats[0], stats
    assert {json.loads(line)["id"] for line in due[0].splitlines()} == set(ids), due
