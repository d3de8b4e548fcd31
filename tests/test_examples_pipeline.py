"""Runs examples/pipeline.py against Amazon DynamoDB Local with moto's SQS."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from dynacoord import ManualClock, RunStatus
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.testing import DUMMY_CREDENTIALS, unique_name

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pipeline.py"


@pytest.fixture()
def example():
    name = f"pipeline_example_{unique_name()}"
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


@pytest.fixture()
def env(ddb_table):
    client, table = ddb_table
    clock = ManualClock()
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("pipe"), clock=clock)
    # moto intercepts AWS endpoints only; DynamoDB Local (a custom endpoint) is still reached.
    with mock_aws():
        yield backend, boto3.client("sqs", **DUMMY_CREDENTIALS), clock


def test_demo_story_recovers_the_lost_job(example, env, capsys):
    backend, sqs, clock = env
    outcome = example.run_demo(backend, sqs, clock_advance=clock.advance)
    assert outcome["lost"] in example.STEPS
    assert outcome["statuses_before_reconcile"] == {
        "order-1": "completed",
        "order-2": "completed",
        "order-3": "running",
    }
    stats = outcome["reconcile"]
    assert (stats.scanned, stats.stalled, stats.reconciled, stats.failed) == (1, 1, 1, 0)
    for n, run in zip((1, 2, 3), outcome["final"].values()):
        assert run.status is RunStatus.COMPLETED
        assert run.result == {
            "reserve": {"items": n},
            "charge": {"cents": 250 * n},
            "label": {"tracking": f"TRK-{n}"},
        }
    # Each run finished exactly once although a step was delivered twice and one was re-sent.
    assert outcome["executed"]["finish"] == 3
    assert "order-3: completed" in capsys.readouterr().out


def test_redelivered_steps_fire_the_join_once(example, env):
    backend, sqs, _ = env
    queue = example.SQSJobQueue(sqs, sqs.create_queue(QueueName="dups")["QueueUrl"])
    pipeline = example.Pipeline(backend, queue)
    run_id = pipeline.submit({"order_id": "9", "lines": [{"sku": "a", "quantity": 2, "cents": 5}]})
    for step in example.STEPS:  # every step delivered a second time
        queue.send({"type": "step", "run_id": run_id, "step": step})
    example.drain(pipeline)
    assert pipeline.executed["finish"] == 1
    assert backend.counters.get(f"join:{run_id}") == 3
    run = backend.runs.get(run_id)
    assert run.status is RunStatus.COMPLETED and run.result["charge"] == {"cents": 10}
    # A step arriving after the end is ignored.
    queue.send({"type": "step", "run_id": run_id, "step": "charge"})
    assert example.drain(pipeline).failed == 0
    assert pipeline.executed["finish"] == 1


def test_failing_step_is_redelivered_and_the_run_completes(example, env, monkeypatch):
    backend, sqs, _ = env
    queue = example.SQSJobQueue(sqs, sqs.create_queue(QueueName="flaky")["QueueUrl"])
    pipeline = example.Pipeline(backend, queue)
    real = example.do_step
    failures = []

    def flaky(step, order):
        if step == "label" and not failures:
            failures.append(step)
            raise RuntimeError("printer jammed")
        return real(step, order)

    monkeypatch.setattr(example, "do_step", flaky)
    run_id = pipeline.submit({"order_id": "5", "lines": [{"sku": "a", "quantity": 1, "cents": 1}]})
    stats = example.drain(pipeline)
    assert failures == ["label"] and stats.failed == 1
    assert backend.runs.get(run_id).status is RunStatus.COMPLETED
