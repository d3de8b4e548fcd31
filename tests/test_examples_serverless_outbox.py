"""examples/serverless_outbox: the publisher, the relay to SQS and EventBridge, the sweeper, the
code bundle and its deployment with the CLI.

* End to end in one process: the publisher and the stack's entry points (``dynacoord.serverless``)
  run against Amazon DynamoDB Local with a real stream; SQS and EventBridge are moto's (its
  ``passthrough`` sends DynamoDB and DynamoDB Streams requests to DynamoDB Local).
* The bundle ``dynacoord stack package`` builds runs on its own: unzipped, with nothing but the
  bundle and the site-packages that hold boto3 on ``sys.path`` (what Lambda's runtime provides).
* ``dynacoord stack deploy --relay`` packages, uploads and deploys it under moto.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynacoord import DynamoDBBackend, EventStatus
from dynacoord.provision import package_relay, table_definition
from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal, unique_name
from tests.integration.test_outbox_stream import FakeContext, StreamReader

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "serverless_outbox"
MODULES = ("orders", "relay_handlers")


@pytest.fixture()
def example_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The example folder importable (as Lambda's /var/task is), its modules fresh."""
    from dynacoord import serverless

    monkeypatch.syspath_prepend(str(EXAMPLE))
    for name in MODULES:
        sys.modules.pop(name, None)
    serverless._reset()
    try:
        yield EXAMPLE
    finally:
        serverless._reset()
        for name in MODULES:
            sys.modules.pop(name, None)


@pytest.mark.integration
def test_published_orders_reach_sqs_and_eventbridge_through_the_stream_relay(
    dynamodb_local: DynamoDBLocal, example_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    import boto3
    from moto import mock_aws

    client = dynamodb_local.client()
    table = unique_name("example")
    definition = table_definition(table)
    definition["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"}
    client.create_table(**definition)
    stream = StreamReader(
        dynamodb_local.endpoint_url,
        client.describe_table(TableName=table)["Table"]["LatestStreamArn"],
    )
    namespace = unique_name("orders")
    config = {
        "core": {
            "mock_credentials": False,  # DynamoDB Local keeps one database per access key
            "passthrough": {"services": ["dynamodb", "dynamodbstreams"]},
        }
    }
    try:
        with mock_aws(config=config):  # type: ignore[arg-type]
            sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
            events = boto3.client("events", **DUMMY_CREDENTIALS)
            queue = sqs.create_queue(QueueName="orders")["QueueUrl"]
            watch = sqs.create_queue(QueueName="bus-watch")["QueueUrl"]
            watch_arn = sqs.get_queue_attributes(QueueUrl=watch, AttributeNames=["QueueArn"])[
                "Attributes"
            ]["QueueArn"]
            events.create_event_bus(Name="orders-bus")
            events.put_rule(
                Name="all", EventBusName="orders-bus", EventPattern='{"source": ["orders"]}'
            )
            events.put_targets(
                Rule="all", EventBusName="orders-bus", Targets=[{"Id": "w", "Arn": watch_arn}]
            )
            for name, value in {
                "DYNACOORD_ENDPOINT_URL": dynamodb_local.endpoint_url,
                "DYNACOORD_TABLE": table,
                "DYNACOORD_NAMESPACE": namespace,
                "DYNACOORD_OUTBOX_HANDLERS": "relay_handlers:HANDLERS",
                "DYNACOORD_OUTBOX_OPTIONS": '{"backoff": 0, "max_backoff": 0}',
                "DYNACOORD_HANDLER_SETTINGS": json.dumps(
                    {"queue_url": queue, "event_bus": "orders-bus"}
                ),
                "DYNACOORD_RECONCILE_HANDLER": "relay_handlers:on_stalled",
            }.items():
                monkeypatch.setenv(name, value)
            orders = importlib.import_module("orders")
            from dynacoord import serverless

            def post(order_id: str) -> dict[str, Any]:
                body = {"order_id": order_id, "customer": "alice", "total_cents": 1250}
                return dict(orders.place_order({"body": json.dumps(body)}, FakeContext()))

            assert post("o-1")["statusCode"] == 202
            assert post("o-2")["statusCode"] == 202
            assert post("o-2")["statusCode"] == 202  # a client retry: the same event, no new one
            assert orders.place_order({"body": "{}"}, FakeContext())["statusCode"] == 400

            batch = stream.next_batch()
            assert serverless.relay(batch, FakeContext()) == {"batchItemFailures": []}

            def drain(url: str) -> list[dict[str, Any]]:
                got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
                return [json.loads(m["Body"]) for m in got.get("Messages", [])]

            sent = drain(queue)
            assert sorted(m["id"] for m in sent) == ["order-placed-o-1", "order-placed-o-2"]
            assert sent[0]["payload"]["customer"] == "alice"
            on_bus = drain(watch)
            assert sorted(m["detail"]["id"] for m in on_bus) == sorted(m["id"] for m in sent)
            assert {m["detail-type"] for m in on_bus} == {"order.placed"}

            # SQS refuses (the queue is gone): the event is rescheduled, nothing is reported.
            sqs.delete_queue(QueueUrl=queue)
            assert post("o-3")["statusCode"] == 202
            assert serverless.relay(stream.next_batch(), FakeContext()) == {"batchItemFailures": []}
            backend = DynamoDBBackend(client, table_name=table, namespace=namespace)
            record = backend.outbox.get("order-placed-o-3")
            assert record is not None and record.status is EventStatus.PENDING
            assert record.attempts == 1 and "QueueDoesNotExist" in str(record.last_error)

            # The queue is back: the scheduled sweeper delivers the retry.
            queue = sqs.create_queue(QueueName="orders")["QueueUrl"]
            result = serverless.sweep({}, FakeContext())
            assert result["delivered"] == 1 and result["reconcile"]["scanned"] == 0
            assert [m["id"] for m in drain(queue)] == ["order-placed-o-3"]
            record = backend.outbox.get("order-placed-o-3")
            assert record is not None and record.status is EventStatus.COMPLETED
    finally:
        client.delete_table(TableName=table)


def _bundle_files(data: bytes) -> list[str]:
    with zipfile.ZipFile(io.BytesIO(data)) as bundle:
        return bundle.namelist()


def test_the_bundle_holds_dynacoord_and_the_handlers_and_runs_on_its_own(
    example_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = '{"queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/orders"}'
    monkeypatch.setenv("DYNACOORD_HANDLER_SETTINGS", settings)
    bundle = package_relay("relay_handlers:HANDLERS", reconcile="relay_handlers:on_stalled")
    again = package_relay("relay_handlers:HANDLERS", reconcile="relay_handlers:on_stalled")
    assert bundle.data == again.data  # deterministic: the same code is the same S3 key
    assert bundle.sha256 == hashlib.sha256(bundle.data).hexdigest()
    assert bundle.name == f"dynacoord-relay-{bundle.sha256[:20]}.zip"
    files = _bundle_files(bundle.data)
    assert files == sorted(files) == list(bundle.files)
    for needed in (
        "dynacoord/__init__.py",
        "dynacoord/serverless.py",
        "dynacoord/outbox/stream.py",
        "dynacoord/backends/dynamodb/outbox.py",
        "dynacoord/cloudformation/dynacoord.yaml",
        "typing_extensions.py",
        "relay_handlers.py",
    ):
        assert needed in files, needed
    assert "orders.py" not in files  # only the handlers' module (and --include)
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    assert not [f for f in files if f.split("/")[0] in ("boto3", "botocore", "moto")]

    # Unzipped and run with only the bundle and boto3's site-packages on the path (-S: no
    # site, so no editable install of dynacoord either).
    root = tmp_path / "task"
    with zipfile.ZipFile(io.BytesIO(bundle.data)) as archive:
        archive.extractall(root)
    script = (
        "import sys, dynacoord, dynacoord.serverless as s\n"
        f"assert dynacoord.__file__.startswith({str(root)!r}), dynacoord.__file__\n"
        "print(s.relay({'Records': []}, None))\n"
        "import relay_handlers\n"
        f"assert relay_handlers.__file__.startswith({str(root)!r})\n"
    )
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join([str(root), sysconfig.get_paths()["purelib"]]),
        "DYNACOORD_TABLE": "orders-coord",
        "DYNACOORD_OUTBOX_HANDLERS": "relay_handlers:HANDLERS",
        "DYNACOORD_HANDLER_SETTINGS": settings,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
    }
    done = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'batchItemFailures': []}"


def test_bad_handlers_are_refused_before_bundling(
    example_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DYNACOORD_HANDLER_SETTINGS", raising=False)
    with pytest.raises(ValueError, match="HandlerSettings names no target"):
        package_relay("relay_handlers:HANDLERS")  # its import fails as it would in Lambda
    assert "relay_handlers.py" in package_relay("relay_handlers:HANDLERS", check=False).files
    with pytest.raises(ValueError, match="MODULE:ATTRIBUTE"):
        package_relay("relay_handlers")
    with pytest.raises(ValueError, match="cannot find module"):
        package_relay("no_such_module_anywhere:H", check=False)
    monkeypatch.setenv("DYNACOORD_HANDLER_SETTINGS", '{"event_bus": "b"}')
    with pytest.raises(ValueError, match="cannot import handlers 'relay_handlers:NOPE'"):
        package_relay("relay_handlers:NOPE")
    with pytest.raises(ValueError, match="do not map an event type to a callable"):
        package_relay("relay_handlers:settings")  # a dict, but of settings
    with pytest.raises(ValueError, match="is not callable"):
        package_relay("relay_handlers:targets")
    with pytest.raises(ValueError, match="cannot include"):
        package_relay("relay_handlers:HANDLERS", include=[tmp_path / "missing"])
    extra = tmp_path / "shared"
    extra.mkdir()
    (extra / "util.py").write_text("X = 1\n", encoding="utf-8")
    files = package_relay("relay_handlers:HANDLERS", include=[extra]).files
    assert "shared/util.py" in files


# --- the CLI -----------------------------------------------------------------------------------


@pytest.fixture()
def moto_stack(monkeypatch: pytest.MonkeyPatch, example_path: Path) -> Iterator[Any]:
    """moto with a code bucket; the current directory is the example's (as a user runs it)."""
    import boto3
    from moto import mock_aws

    monkeypatch.chdir(example_path)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="dc-code")
        yield s3


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from dynacoord.cli import main

    capsys.readouterr()
    code = main(["--region", "us-east-1", *argv])
    out, err = capsys.readouterr()
    return code, out, err


SETTINGS = '{"queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/orders"}'


def test_stack_package_writes_and_uploads_the_bundle(
    moto_stack: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DYNACOORD_HANDLER_SETTINGS", SETTINGS)
    target = tmp_path / "relay.zip"
    code, out, err = _cli(
        capsys,
        "--json",
        "stack",
        "package",
        "relay_handlers:HANDLERS",
        "--output",
        str(target),
        "--code-bucket",
        "dc-code",
    )
    assert code == 0, err
    result = json.loads(out)
    data = target.read_bytes()
    assert result["sha256"] == hashlib.sha256(data).hexdigest()
    key = result["parameters"]["CodeS3Key"]
    assert key == f"dynacoord/dynacoord-relay-{result['sha256'][:20]}.zip"
    assert result["parameters"]["CodeS3Bucket"] == "dc-code"
    assert moto_stack.get_object(Bucket="dc-code", Key=key)["Body"].read() == data
    assert "relay_handlers.py" in _bundle_files(data)
    assert f"code bundle at s3://dc-code/{key}" in err

    code, _, err = _cli(capsys, "stack", "package", "relay_handlers:HANDLERS")
    assert code == 2 and "--output FILE and/or --code-bucket" in err
    code, _, err = _cli(capsys, "stack", "package", "relay_handlers", "--output", str(target))
    assert code == 2 and "MODULE:ATTRIBUTE" in err


@pytest.mark.filterwarnings("ignore:Tried to parse AWS.+CloudWatch.+Alarm:UserWarning")
def test_stack_deploy_relay_packages_uploads_and_wires_the_functions(
    moto_stack: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    monkeypatch.delenv("DYNACOORD_HANDLER_SETTINGS", raising=False)
    deploy = (
        "--namespace", "orders", "--json", "stack", "deploy", "--stack-name", "dc-orders",
        "--relay", "relay_handlers:HANDLERS", "--reconcile", "relay_handlers:on_stalled",
        "--code-bucket", "dc-code", "--poll-interval", "0",
    )  # fmt: skip
    # Every parameter is given (moto cannot reuse defaulted values on the update below).
    parameters = [
        "--parameter", "TableName=orders-coord", "--parameter", "DeletionProtection=false",
        "--parameter", f"HandlerSettings={SETTINGS}",
    ]  # fmt: skip
    from tests.test_cloudformation import _every_parameter

    for key, value in _every_parameter().items():
        if key not in {"TableName", "DeletionProtection", "HandlerSettings", "Relay",
                       "RelayHandlers", "CodeS3Bucket", "CodeS3Key", "ReconcileHandler",
                       "RelayNamespace"}:  # fmt: skip
            parameters += ["--parameter", f"{key}={value}"]
    code, out, err = _cli(capsys, *deploy, *parameters)
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "CREATE_COMPLETE"
    outputs = result["outputs"]
    lam = boto3.client("lambda", region_name="us-east-1")
    relay = lam.get_function(FunctionName=outputs["RelayFunctionName"])["Configuration"]
    variables = relay["Environment"]["Variables"]
    assert variables["DYNACOORD_OUTBOX_HANDLERS"] == "relay_handlers:HANDLERS"
    assert variables["DYNACOORD_NAMESPACE"] == "orders"  # the global --namespace
    assert variables["DYNACOORD_HANDLER_SETTINGS"] == SETTINGS
    sweeper = lam.get_function(FunctionName=outputs["SweeperFunctionName"])["Configuration"]
    assert sweeper["Environment"]["Variables"]["DYNACOORD_RECONCILE_HANDLER"] == (
        "relay_handlers:on_stalled"
    )
    (bundle,) = moto_stack.list_objects_v2(Bucket="dc-code")["Contents"]
    data = moto_stack.get_object(Bucket="dc-code", Key=bundle["Key"])["Body"].read()
    assert relay["CodeSha256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()

    # The same code again: the same key, nothing to update. The handlers are checked with the
    # HandlerSettings the stack has (none given here, none in the environment).
    code, out, err = _cli(capsys, *deploy)
    assert code == 0, err
    assert json.loads(out)["changed"] is False
    assert len(moto_stack.list_objects_v2(Bucket="dc-code")["Contents"]) == 1


def test_stack_deploy_relay_usage_errors(
    moto_stack: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(capsys, "stack", "deploy", "--relay", "relay_handlers:HANDLERS")
    assert code == 2 and "--relay needs --code-bucket" in err
    code, _, err = _cli(capsys, "stack", "deploy", "--code-bucket", "dc-code")
    assert code == 2 and "go with --relay" in err
    code, _, err = _cli(
        capsys, "stack", "deploy", "--relay", "relay_handlers:HANDLERS", "--code-bucket",
        "dc-code", "--parameter", "CodeS3Key=x.zip",
    )  # fmt: skip
    assert code == 2 and "--relay sets CodeS3Key" in err
    # the handlers are imported first, with the HandlerSettings given: none is a clear error
    code, _, err = _cli(
        capsys, "stack", "deploy", "--relay", "relay_handlers:HANDLERS", "--code-bucket", "dc-code"
    )
    assert code == 2 and "HandlerSettings names no target" in err
    assert moto_stack.list_objects_v2(Bucket="dc-code").get("KeyCount") == 0


def test_stack_commands_use_the_endpoint_url_for_every_service(
    example_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    monkeypatch.chdir(example_path)
    monkeypatch.setenv("DYNACOORD_HANDLER_SETTINGS", SETTINGS)

    seen: list[tuple[str, Any]] = []
    real_client = boto3.client

    class RefusedError(Exception):
        pass

    def client(service: str, **kwargs: Any) -> Any:
        if service in ("sqs", "events"):  # the handlers' own clients, made as they import
            return real_client(service, **kwargs)
        seen.append((service, kwargs.get("endpoint_url")))
        raise RefusedError(service)

    monkeypatch.setattr(boto3, "client", client)
    local = ("--endpoint-url", "http://localhost:4566")
    code, _, err = _cli(capsys, *local, "stack", "outputs")
    assert code == 1 and "RefusedError" in err
    assert seen == [("cloudformation", "http://localhost:4566")]
    for command in (
        ("stack", "package", "relay_handlers:HANDLERS", "--code-bucket", "b"),
        ("stack", "deploy", "--relay", "relay_handlers:HANDLERS", "--code-bucket", "b",
         "--parameter", f"HandlerSettings={SETTINGS}"),
        ("stack", "delete", "--yes"),
    ):  # fmt: skip
        seen.clear()
        code, _, err = _cli(capsys, *local, *command)
        assert code == 1 and "RefusedError" in err, err
        # package uploads first; deploy reads the stack's values first (all checked before the
        # bundle is uploaded); delete only talks to CloudFormation
        first = "s3" if "package" in command else "cloudformation"
        assert seen == [(first, local[1])], command
    # DYNACOORD_ENDPOINT_URL is DynamoDB's only (what `local start` prints): CloudFormation
    # goes where boto3 would send it
    monkeypatch.setenv("DYNACOORD_ENDPOINT_URL", "http://localhost:4577")
    seen.clear()
    assert _cli(capsys, "stack", "outputs")[0] == 1
    assert seen == [("cloudformation", None)]
    monkeypatch.undo()
    monkeypatch.chdir(example_path)

    # Without --endpoint-url, boto3's own AWS_ENDPOINT_URL applies.
    endpoints: list[str] = []

    def record(service: str, **kwargs: Any) -> Any:
        made = real_client(service, **kwargs)
        endpoints.append(made.meta.endpoint_url)
        raise RefusedError(service)

    monkeypatch.setattr(boto3, "client", record)
    monkeypatch.delenv("DYNACOORD_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")
    code, _, err = _cli(capsys, "stack", "outputs")
    assert code == 1 and endpoints == ["http://127.0.0.1:4566"]
