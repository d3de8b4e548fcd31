"""``dynacoord counters ...`` and ``dynacoord runs ...`` (moto: DynamoDB and SQS in process)."""

from __future__ import annotations

import json
import time

import boto3
import pytest

from dynacoord import ManualClock, RunStatus
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.cli import main
from dynacoord.testing import DUMMY_CREDENTIALS, unique_name


@pytest.fixture()
def cli(moto_table, capsys):
    client, table = moto_table
    namespace = unique_name("cli")

    def backend(clock=None):
        return DynamoDBBackend(client, table_name=table, namespace=namespace, clock=clock)

    def run(*argv, json_output=True):
        capsys.readouterr()
        options = ["--table", table, "--namespace", namespace, "--quiet"]
        if json_output:
            options.append("--json")
        code = main([*options, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return backend, run


def test_counters_incr_get_delete(cli):
    backend, run = cli
    code, out, _ = run("counters", "incr", "hits")
    assert code == 0 and json.loads(out) == {"key": "hits", "value": 1}
    code, out, _ = run("counters", "incr", "hits", "--by", "41", "--ttl", "3600")
    assert json.loads(out)["value"] == 42
    assert backend().counters.get("hits") == 42

    code, out, _ = run("counters", "get", "hits")
    shown = json.loads(out)
    assert code == 0 and shown["kind"] == "counter" and shown["value"] == 42
    assert shown["expires_at"] is not None

    backend().counters.join("fan", "b", expected=2)
    backend().counters.join("fan", "a", expected=2)
    code, out, _ = run("counters", "get", "fan")
    assert json.loads(out)["members"] == ["a", "b"]

    code, out, _ = run("counters", "delete", "hits")
    assert code == 0 and json.loads(out)["deleted"] is True
    code, _, err = run("counters", "get", "hits")
    assert code == 1 and "hits" in err
    code, _, err = run("counters", "delete", "hits")
    assert code == 1


def test_counters_refuses_bad_input(cli):
    _, run = cli
    code, _, err = run("counters", "incr", "k", "--ttl", "-1")
    assert code == 2 and "ttl" in err
    code, _, _ = run("counters", "incr", "k", "--by", "x")
    assert code == 2


def test_runs_show_list_stalled(cli):
    backend, run = cli
    past = ManualClock(time.time() - 3600)  # an hour before the real clock: looks stalled
    old = backend(past).runs
    old.start("stuck", context={"step": 2})
    backend().runs.start("fresh")
    backend().runs.start("done")
    backend().runs.complete("done", result={"n": 1})

    code, out, _ = run("runs", "show", "stuck")
    shown = json.loads(out)
    assert code == 0 and shown["status"] == "running" and shown["context"] == {"step": 2}
    code, _, err = run("runs", "show", "nope")
    assert code == 1 and "nope" in err

    code, out, _ = run("runs", "stalled", "--older-than", "60")
    assert [r["run_id"] for r in json.loads(out)] == ["stuck"]
    code, out, _ = run("runs", "stalled", "--older-than", "60", json_output=False)
    assert out.startswith("stuck\trunning\t")

    code, out, _ = run("runs", "list", "--status", "completed")
    rows = json.loads(out)
    assert [r["run_id"] for r in rows] == ["done"] and rows[0]["result"] == {"n": 1}


def test_runs_reconcile_fail(cli):
    backend, run = cli
    past = ManualClock(time.time() - 3600)
    backend(past).runs.start("stuck")
    code, out, _ = run("runs", "reconcile", "--older-than", "60", "--fail", "stalled")
    stats = json.loads(out)
    assert code == 0 and (stats["scanned"], stats["reconciled"], stats["failed"]) == (1, 1, 0)
    ended = backend().runs.get("stuck")
    assert ended.status is RunStatus.FAILED and ended.error == "stalled"
    code, _, _ = run("runs", "reconcile", "--older-than", "60")  # an action is required
    assert code == 2


def test_runs_reconcile_to_sqs(cli):
    backend, run = cli
    sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
    url = sqs.create_queue(QueueName="reconcile")["QueueUrl"]
    past = ManualClock(time.time() - 3600)
    backend(past).runs.start("stuck", context={"order": "o-9"})
    code, out, _ = run("runs", "reconcile", "--older-than", "60", "--queue-url", url)
    assert code == 0 and json.loads(out)["reconciled"] == 1
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [json.loads(m["Body"]) for m in messages] == [
        {"run_id": "stuck", "context": {"order": "o-9"}}
    ]
    assert backend().runs.get("stuck").reconciles == 1
