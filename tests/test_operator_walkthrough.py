"""The operator's walkthrough of docs/deployment.md, run through the ``dynacoord`` command
(``dynacoord.cli.main``) against moto's *server* on a loopback port, as an operator would run it
with ``--endpoint-url``: create, redeploy (no change), update, the serverless relay, delete,
table cleanup (issue 31 points 6 and "an operator's walkthrough that runs").

Where moto's server differs from CloudFormation, the test says so and does what moto can run:

* the stack is created with ``Stream=true``: moto cannot turn the table's stream on by an update
  (it cannot update a DynamoDB table through CloudFormation at all), which the relay needs;
* the documented capacity update (``BillingMode=PROVISIONED``) cannot run: moto loses the stack's
  table resource on it (test_an_emulators_internal_error_is_one_clear_line shows what the
  operator then sees); the walkthrough updates ``DeletionProtection`` instead, a parameter the
  create left at its default (the update that failed with a raw ``ResponseParserError ... 500``);
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


def test_an_emulators_internal_error_is_one_clear_line(
    endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The documented capacity update: moto cannot update a table through CloudFormation (the
    stack loses its table resource and every later DescribeStacks fails inside moto with an
    HTTP 500 page). The operator gets one line naming the request, the endpoint and the 500,
    not botocore's parser error nor a hint at DynamoDB Local."""
    create = "dynacoord stack deploy --stack-name dynacoord --parameter TableName=dynacoord"
    code, _, err = _run(capsys, endpoint, create, *FAST)
    assert code == 0, err
    update = (
        "dynacoord stack deploy --stack-name dynacoord --parameter BillingMode=PROVISIONED "
        "--parameter ReadCapacity=20 --parameter WriteCapacity=10"
    )
    _documented(update)
    code, _, err = _run(capsys, endpoint, update, *FAST)
    assert code == 1
    (line,) = err.strip().splitlines()[-1:]
    assert line.startswith("dynacoord: error: cannot describe stack"), err
    assert f"{endpoint} failed with an internal server error (HTTP 500)" in line
    assert "DynamoDB Local" not in err and "ResponseParserError" not in err
    assert "<html" not in err


def test_unreadable_answers_are_stack_errors_naming_the_endpoint(endpoint: str) -> None:
    """From Python too: a request whose answer botocore cannot parse (moto's HTTP 500 page) is
    a StackDeploymentError naming the stack, chained from botocore's ResponseParserError."""
    import boto3
    from botocore.parsers import ResponseParserError

    from dynacoord.errors import StackDeploymentError
    from dynacoord.provision import deploy_stack

    cfn = boto3.client("cloudformation", endpoint_url=endpoint)
    deploy_stack(cfn, "dc-parse", parameters={"TableName": "dc-parse"}, poll_interval=0)
    with pytest.raises(StackDeploymentError) as info:
        deploy_stack(cfn, "dc-parse", parameters={"BillingMode": "PROVISIONED"}, poll_interval=0)
    assert isinstance(info.value.__cause__, ResponseParserError)
    assert info.value.stack_name == "dc-parse"
    assert "HTTP 500" in str(info.value)
