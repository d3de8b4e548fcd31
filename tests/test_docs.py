"""Every code block of README.md and docs/*.md runs as written.

Each ```python block is executed in this process against DynamoDB Local; each ```sh block runs in
bash with this virtualenv's ``dynacoord`` on the PATH, against the same server. Every block gets
a database of its own: DynamoDB Local keeps one database per access key and region, so each block
gets a fresh access key and the table ``dynacoord`` created in it. The environment is what a
reader's shell would have: ``AWS_ENDPOINT_URL_DYNAMODB`` (boto3's own variable, so
``boto3.client("dynamodb")``, ``DynamoDBBackend.from_env()`` and the CLI all reach DynamoDB
Local) and ``DYNACOORD_TABLE=dynacoord``; namespace ``default``.

An HTML comment right above a block declares what the block needs:

* ``<!-- preamble: backend, shop_tables -->`` runs the named preambles (:data:`PREAMBLES`) first;
* ``<!-- after: name -->`` runs a check after the block (:data:`AFTER`: calls what it defined);
* ``<!-- skip: reason -->`` only for a block that cannot run here (it deploys to AWS, installs
  packages); :data:`SKIPPED` counts them per page, so a new skip is a visible change;
* ``<!-- run: name -->`` blocks of docs/lambda.md are run by tests/test_docs_lambda.py instead.

A block fails the test when it raises (python) or exits non-zero (sh, run with ``set -e``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[ \t]*$")
MARK = re.compile(
    r"^[ \t]*<!--\s*(?P<key>preamble|after|skip|run)\s*:\s*(?P<value>.*?)\s*-->[ \t]*$"
)
RUNNABLE = {"python", "sh"}
SHELL = {"sh", "bash", "shell", "console"}


@dataclass
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence
    lang: str
    code: str
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def names(self, key: str) -> list[str]:
        return [n.strip() for n in self.marks.get(key, "").split(",") if n.strip()]


def extract(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page with the marks right above each."""
    lines = path.read_text().splitlines()
    page = path.relative_to(ROOT).as_posix()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = opening["indent"], opening["lang"].lower()
        marks: dict[str, str] = {}
        j = i - 1
        while j >= 0 and (mark := MARK.match(lines[j])):
            marks[mark["key"]] = mark["value"]
            j -= 1
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            text = lines[i]
            body.append(text[len(indent) :] if text.startswith(indent) else text.lstrip())
            i += 1
        found.append(
            Block(
                page, i - len(body), "sh" if lang in SHELL else lang, "\n".join(body) + "\n", marks
            )
        )
        i += 1
    return found


ALL_BLOCKS = [b for p in PAGES for b in extract(p)]

#: Every skipped block, with the page it is on: a new skip must be added here on purpose.
SKIPPED = {
    "README.md": 3,  # make demo / make test; pip install and python -m build; local start
    "docs/backends.md": 1,  # the whole suite against a MongoDB server
    "docs/benchmarks.md": 1,  # make bench
    "docs/deployment.md": 3,  # the aws CLI; an update (moto); the relay bundle synopsis
    "docs/lambda.md": 1,  # aws lambda create-event-source-mapping
    "docs/metrics.md": 1,  # the OpenTelemetry SDK is not a dependency
    "docs/outbox.md": 2,  # the serverless walkthrough on AWS
    "docs/redis.md": 2,  # a cluster on AWS; redis-server daemons on fixed ports
}

#: Pages whose ``<!-- run: NAME -->`` blocks another test runs (with real-shaped events).
RUN_ELSEWHERE = {"docs/lambda.md": "tests/test_docs_lambda.py"}


def runnable(block: Block) -> bool:
    return (
        block.lang in RUNNABLE
        and "skip" not in block.marks
        and not ("run" in block.marks and block.page in RUN_ELSEWHERE)
    )


RUNNABLE_BLOCKS = [b for b in ALL_BLOCKS if runnable(b)]


# -- the environment of one block ----------------------------------------------------------------


@dataclass
class Env:
    """What a block runs with: a database of its own on DynamoDB Local, and a scope."""

    endpoint: str
    access_key: str
    tmp: Path
    request: pytest.FixtureRequest
    monkeypatch: pytest.MonkeyPatch
    scope: dict[str, Any] = field(default_factory=dict)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def variables(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": DUMMY_CREDENTIALS["region_name"],
            "AWS_ENDPOINT_URL_DYNAMODB": self.endpoint,
            "DYNACOORD_TABLE": "dynacoord",
        }

    def client(self) -> Any:
        import boto3

        return boto3.client("dynamodb", endpoint_url=self.endpoint)

    def backend(self) -> Any:
        from dynacoord import DynamoDBBackend

        return DynamoDBBackend.from_env()


# Preambles: each prepares the environment or the scope of a block before it runs. Keep them
# small; what a reader needs to see belongs in the block itself.


def _backend(env: Env) -> None:
    """``backend = DynamoDBBackend.from_env()`` (table ``dynacoord``, namespace ``default``)."""
    env.scope["backend"] = env.backend()


def _empty_database(env: Env) -> None:
    """No table: the block creates it."""


def _shop_tables(env: Env) -> None:
    """The business tables of the outbox examples: ``orders`` (key ``pk``) and ``stock`` (key
    ``sku``, with 5 of ``A-1``)."""
    client = env.client()
    for name, key in (("orders", "pk"), ("stock", "sku")):
        client.create_table(
            TableName=name,
            AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
            KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
    client.put_item(TableName="stock", Item={"sku": {"S": "A-1"}, "qty": {"N": "5"}})


def _aws(env: Env) -> None:
    """moto for every AWS service but DynamoDB (which stays on DynamoDB Local): ``queue_url``
    (an SQS queue), ``topic_arn`` (an SNS topic) and the EventBridge bus ``orders-bus``."""
    import boto3
    from moto import mock_aws

    env.stack.enter_context(mock_aws())
    env.scope["queue_url"] = boto3.client("sqs").create_queue(QueueName="orders")["QueueUrl"]
    env.scope["topic_arn"] = boto3.client("sns").create_topic(Name="orders")["TopicArn"]
    boto3.client("events").create_event_bus(Name="orders-bus")


def _redis_url(env: Env) -> None:
    """``DYNACOORD_REDIS_URL`` of the test session's redis-server."""
    server = env.request.getfixturevalue("redis_server")
    env.monkeypatch.setenv("DYNACOORD_REDIS_URL", f"redis://127.0.0.1:{server.port}/0")


def _mongo_database(env: Env) -> None:
    """``db``: a mongomock database (what ``pymongo.MongoClient(...)["app"]`` would be)."""
    env.scope["db"] = env.request.getfixturevalue("mongo_database")


def _cli_env(env: Env) -> None:
    """For shell blocks: the reader's shell (``dynacoord`` on the PATH, the variables above)."""


def _saved_checkpoints(env: Env) -> None:
    """Four checkpoints of task ``import-2024-06``."""
    for offset in range(0, 4000, 1000):
        env.backend().checkpoints.save("import-2024-06", {"offset": offset})


def _started_run(env: Env) -> None:
    """A running workflow run ``order-1042``."""
    env.backend().runs.start("order-1042", context={"step": 1})


def _held_permits(env: Env) -> None:
    """Two permits of semaphore ``exports`` (limit 3) held by ``alice`` and ``bob``."""
    pool = env.backend().semaphore("exports", limit=3, ttl=600)
    pool.acquire(blocking=False, owner="alice")
    pool.acquire(blocking=False, owner="bob")


def _admitted_calls(env: Env) -> None:
    """Three calls admitted by rate limiter ``partner-api`` (100 a minute, 10 at once)."""
    api = env.backend().rate_limiter("partner-api", rate=100, per=60, burst=10)
    for _ in range(3):
        api.try_acquire()


def _published_event(env: Env) -> None:
    """A pending event ``order-placed-o-1`` of type ``order.placed``."""
    from dynacoord import Event

    env.backend().outbox.publish(Event("order.placed", {"order_id": "o-1"}, id="order-placed-o-1"))


PREAMBLES: dict[str, Callable[[Env], None]] = {
    "backend": _backend,
    "empty_database": _empty_database,
    "shop_tables": _shop_tables,
    "aws": _aws,
    "redis_url": _redis_url,
    "mongo_database": _mongo_database,
    "cli_env": _cli_env,
    "saved_checkpoints": _saved_checkpoints,
    "started_run": _started_run,
    "published_event": _published_event,
    "held_permits": _held_permits,
    "admitted_calls": _admitted_calls,
}


# Checks after a block: call what it defined.


class LambdaContext:
    function_name = "docs"
    aws_request_id = "req-1"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def _tenant_handler(env: Env) -> None:
    handler = env.scope["handler"]
    first = handler({"tenant": "t-1"}, LambdaContext())
    assert first["status"] == "done"
    with env.scope["backend"].locks.hold("tenant:t-1", ttl=10):
        assert handler({"tenant": "t-1"}, LambdaContext()) == {"status": "busy"}
    assert handler({"tenant": "t-1"}, LambdaContext())["fence"] > first["fence"]


def _outbox_lambda(env: Env) -> None:
    import json

    order = {"order_id": "o-9", "total": 12}
    place_order, deliver = env.scope["place_order"], env.scope["deliver_events"]
    assert place_order({"body": json.dumps(order)}, LambdaContext()) == {"statusCode": 201}
    assert place_order({"body": json.dumps(order)}, LambdaContext()) == {"statusCode": 409}
    assert deliver({}, LambdaContext()) == {"delivered": 1, "failed": 0}


AFTER: dict[str, Callable[[Env], None]] = {
    "tenant_handler": _tenant_handler,
    "outbox_lambda": _outbox_lambda,
}


_counter = iter(range(1, 1_000_000))


@pytest.fixture()
def env(
    dynamodb_local: DynamoDBLocal,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Iterator[Env]:
    # DynamoDB Local keeps one database per access key and region: a fresh key is a fresh
    # database, so every block starts from nothing and may use the names a reader would.
    env = Env(
        endpoint=dynamodb_local.endpoint_url,
        access_key=f"docs{os.getpid()}x{next(_counter)}",
        tmp=tmp_path,
        request=request,
        monkeypatch=monkeypatch,
    )
    for name, value in env.variables().items():
        monkeypatch.setenv(name, value)
    for name in ("DYNACOORD_ENDPOINT_URL", "DYNACOORD_NAMESPACE", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    # boto3's default session keeps the credentials it first read: start a new one.
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.chdir(tmp_path)
    with env.stack:
        yield env


def prepare(block: Block, env: Env) -> None:
    names = block.names("preamble")
    unknown = [n for n in names + block.names("after") if n not in PREAMBLES and n not in AFTER]
    assert not unknown, f"{block.id}: unknown preamble or check {unknown}"
    if "empty_database" not in names:
        from dynacoord.provision import create_table

        create_table(env.client(), "dynacoord")
    for name in names:
        PREAMBLES[name](env)


def run_python(block: Block, env: Env) -> None:
    # A module of its own (registered, so that dataclasses and pickling resolve its names).
    module = types.ModuleType(f"docs_block_{block.line}")
    env.monkeypatch.setitem(sys.modules, module.__name__, module)
    module.__dict__.update(env.scope)
    code = compile(block.code, block.id, "exec", dont_inherit=True)
    exec(code, module.__dict__)
    env.scope = module.__dict__


def run_sh(block: Block, env: Env) -> None:
    if "aws" in block.names("preamble"):
        # moto lives in this process: run each command line through the CLI's main here.
        run_sh_in_process(block)
        return
    import subprocess

    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        env={**os.environ, "PATH": path},
        cwd=env.tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"{block.id} exited {result.returncode}\n--- stdout\n{result.stdout}\n"
        f"--- stderr\n{result.stderr}"
    )


def run_sh_in_process(block: Block) -> None:
    from dynacoord.cli import main

    for line in block.code.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        assert argv[0] == "dynacoord", f"{block.id}: only dynacoord commands run with moto: {line}"
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv[1:])
        assert code == 0, f"{block.id}: {line!r} exited {code}\n{out.getvalue()}{err.getvalue()}"


@pytest.mark.parametrize("block", RUNNABLE_BLOCKS, ids=[b.id for b in RUNNABLE_BLOCKS])
@pytest.mark.filterwarnings("ignore:Tried to parse AWS.+CloudWatch.+Alarm:UserWarning")  # moto
def test_block_runs(block: Block, env: Env) -> None:
    prepare(block, env)
    if block.lang == "python":
        run_python(block, env)
    else:
        run_sh(block, env)
    for name in block.names("after"):
        AFTER[name](env)


def test_every_block_is_run_or_skipped_with_a_reason() -> None:
    skipped: dict[str, int] = {}
    for block in ALL_BLOCKS:
        if "skip" in block.marks:
            assert block.marks["skip"], f"{block.id}: a skip needs a reason"
            skipped[block.page] = skipped.get(block.page, 0) + 1
        if "run" in block.marks:
            assert block.page in RUN_ELSEWHERE, f"{block.id}: no test runs 'run:' blocks here"
        if block.lang in RUNNABLE or "skip" in block.marks:
            continue
        # Not code to run: a synopsis, a tree, sample output. It must not look like Python.
        assert block.lang in {"", "text", "json", "yaml"}, f"{block.id}: language {block.lang!r}"
    assert skipped == SKIPPED


def test_pages_speak_of_nothing_a_reader_cannot_see() -> None:
    for page in PAGES:
        text = page.read_text()
        for word in ("DESIGN.md", "design document", "issue "):
            assert word.lower() not in text.lower(), f"{page.name} mentions {word!r}"
