"""A small queue-driven pipeline: SQS jobs, workflow runs, a fan-in join and the stalled-run reconciler.

Each order becomes a workflow run that fans out to three independent steps (reserve stock, charge
the card, print a label), one SQS job each. Workers consume the queue; a step stores its result in
the run's context and then *arrives* at the run's join. The arrival that completes the join
(``fired``: exactly one, however often SQS redelivers a step) enqueues the ``finish`` job, which
completes the run with the collected results.

What can go wrong, and what takes care of it:

* A step job is delivered twice (SQS is at-least-once): the join counts each step once and fires
  once; storing a step's result again is harmless (same value).
* A step raises: its message is not deleted, so SQS redelivers it after the visibility timeout.
* A message is lost (a worker acknowledged it and crashed, someone purged the queue): the run stays
  ``running`` with no sign of life. The reconciler finds it with one index query, and re-enqueues
  the steps whose results are missing (or the ``finish`` job if they are all there).

Run it: ``python examples/pipeline.py`` uses Amazon DynamoDB Local when Java and the jar are
available (``make dynamodb-local``; else moto's DynamoDB) and moto's in-process SQS.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3

from dynacoord import (
    ConsumeStats,
    DynamoDBBackend,
    ReconcileStats,
    Run,
    RunNotFoundError,
    RunNotRunningError,
    SQSJobQueue,
    codec,
)

logger = logging.getLogger("pipeline")

STEPS = ("reserve", "charge", "label")
#: how long joins live: longer than any run should take
JOIN_TTL = 24 * 3600


def do_step(step: str, order: dict[str, Any]) -> Any:
    """The work of one step (real code would call the inventory, payment and shipping services)."""
    if step == "reserve":
        return {"items": sum(line["quantity"] for line in order["lines"])}
    if step == "charge":
        return {"cents": sum(line["quantity"] * line["cents"] for line in order["lines"])}
    if step == "label":
        return {"tracking": f"TRK-{order['order_id']}"}
    raise ValueError(f"unknown step {step!r}")


class Pipeline:
    """The orchestration: submit orders, handle jobs, reconcile stalled runs."""

    def __init__(self, backend: DynamoDBBackend, queue: SQSJobQueue) -> None:
        self.backend = backend
        self.queue = queue
        self.runs = backend.runs
        self.counters = backend.counters
        self._mutex = threading.Lock()
        #: how often each kind of work actually ran (to show what redeliveries did)
        self.executed: dict[str, int] = {}

    def _count(self, what: str) -> None:
        with self._mutex:
            self.executed[what] = self.executed.get(what, 0) + 1

    # -- producer ----------------------------------------------------------------------------

    def submit(self, order: dict[str, Any]) -> str:
        """Start the order's run and enqueue its steps."""
        run_id = f"order-{order['order_id']}"
        self.runs.start(run_id, context={"order": order}, ttl_after_end=7 * 24 * 3600)
        self.queue.send_many({"type": "step", "run_id": run_id, "step": step} for step in STEPS)
        return run_id

    # -- workers -----------------------------------------------------------------------------

    def handle(self, job: dict[str, Any]) -> None:
        """The SQS handler: one step, or the finish of a run."""
        if job["type"] == "step":
            self._step(job["run_id"], job["step"])
        elif job["type"] == "finish":
            self._finish(job["run_id"])
        else:
            raise ValueError(f"unknown job type {job['type']!r}")

    def _step(self, run_id: str, step: str) -> None:
        run = self.runs.get(run_id)
        if run is None or not run.running:
            logger.info("step %r of %r: run is gone or ended, nothing to do", step, run_id)
            return
        result = do_step(step, run.context["order"])
        self._count(f"step:{step}")
        try:
            # First the result, then the arrival: whoever fires sees every result in the context.
            self.runs.set(run_id, f"done:{step}", result)
        except (RunNotFoundError, RunNotRunningError):
            return
        arrival = self.counters.join(f"join:{run_id}", step, expected=len(STEPS), ttl=JOIN_TTL)
        if arrival.fired:
            self.queue.send({"type": "finish", "run_id": run_id})

    def _finish(self, run_id: str) -> None:
        run = self.runs.get(run_id)
        if run is None or not run.running:
            return  # a redelivered finish job: the run is already complete
        results = {s: run.context[f"done:{s}"] for s in STEPS}
        try:
            self.runs.complete(run_id, result=results)
        except RunNotRunningError:
            return
        self._count("finish")

    def work(self, **consume_options: Any) -> ConsumeStats:
        """Consume jobs (see :meth:`SQSJobQueue.consume` for the options)."""
        return self.queue.consume(self.handle, **consume_options)

    # -- reconciler --------------------------------------------------------------------------

    def _requeue(self, run: Run) -> None:
        missing = [s for s in STEPS if f"done:{s}" not in run.context]
        if missing:
            logger.warning("run %r stalled: re-enqueueing steps %r", run.run_id, missing)
            self.queue.send_many(
                {"type": "step", "run_id": run.run_id, "step": step} for step in missing
            )
        else:
            logger.warning("run %r stalled after its steps: re-enqueueing finish", run.run_id)
            self.queue.send({"type": "finish", "run_id": run.run_id})

    def reconcile(self, older_than: float) -> ReconcileStats:
        """Re-enqueue the missing work of every run silent for ``older_than`` seconds."""
        return self.runs.reconcile(older_than, self._requeue)


# -- the narrated run ----------------------------------------------------------------------------


def drain(pipeline: Pipeline) -> ConsumeStats:
    """Work until a receive comes back empty."""
    total = ConsumeStats()
    while True:
        stats = pipeline.work(wait_time=0, max_batches=1, visibility_timeout=5, retry_delay=0)
        total.received += stats.received
        total.succeeded += stats.succeeded
        total.failed += stats.failed
        if stats.received == 0:
            return total


def orders() -> list[dict[str, Any]]:
    return [
        {"order_id": str(n), "lines": [{"sku": f"sku-{n}", "quantity": n, "cents": 250}]}
        for n in (1, 2, 3)
    ]


def run_demo(backend: DynamoDBBackend, sqs: Any, *, clock_advance: Any = None) -> dict[str, Any]:
    """The story on a given backend and SQS client; returns what happened (used by the tests).

    ``clock_advance(seconds)`` moves the backend's clock (a ManualClock in tests); by default the
    demo sleeps.
    """
    advance = clock_advance or time.sleep
    queue = SQSJobQueue(sqs, sqs.create_queue(QueueName="pipeline-jobs")["QueueUrl"])
    pipeline = Pipeline(backend, queue)

    print("* Submitting 3 orders (3 step jobs each)")
    run_ids = [pipeline.submit(order) for order in orders()]

    print("* SQS delivers one step of order-1 twice")
    queue.send({"type": "step", "run_id": "order-1", "step": "charge"})

    print("* A worker takes one job of order-3 and crashes after acknowledging it: the job is lost")
    lost = None
    for _ in range(20):
        messages = sqs.receive_message(QueueUrl=queue.queue_url, MaxNumberOfMessages=10).get(
            "Messages", []
        )
        for message in messages:
            job = codec.decode(message["Body"])
            if lost is None and job["run_id"] == "order-3" and job["type"] == "step":
                lost = job["step"]
                sqs.delete_message(QueueUrl=queue.queue_url, ReceiptHandle=message["ReceiptHandle"])
            else:  # hand the others back at once
                sqs.change_message_visibility(
                    QueueUrl=queue.queue_url,
                    ReceiptHandle=message["ReceiptHandle"],
                    VisibilityTimeout=0,
                )
        if lost is not None:
            break
    print(f"  lost: the {lost!r} step of order-3")

    print("* Workers drain the queue")
    stats = drain(pipeline)
    print(f"  handled {stats.succeeded} jobs; executed {pipeline.executed}")
    statuses = {run_id: pipeline.runs.get(run_id).status.value for run_id in run_ids}
    print(f"  run statuses: {statuses}")

    print("* order-3 waits for a step that will never come; the reconciler finds it")
    advance(1.5)
    reconciled = pipeline.reconcile(older_than=1)
    print(
        f"  reconcile: scanned={reconciled.scanned} stalled={reconciled.stalled} "
        f"reconciled={reconciled.reconciled} failed={reconciled.failed}"
    )
    drain(pipeline)
    final = {run_id: pipeline.runs.get(run_id) for run_id in run_ids}
    for run_id, run in final.items():
        assert run is not None
        print(f"  {run_id}: {run.status.value} {run.result}")
    return {
        "lost": lost,
        "executed": dict(pipeline.executed),
        "statuses_before_reconcile": statuses,
        "reconcile": reconciled,
        "final": final,
    }


@contextlib.contextmanager
def _dynamodb() -> Iterator[Any]:
    from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal, find_dynamodb_local

    if os.environ.get("DYNACOORD_ENDPOINT_URL"):
        yield boto3.client("dynamodb", endpoint_url=os.environ["DYNACOORD_ENDPOINT_URL"])
    elif shutil.which("java") and find_dynamodb_local():
        with DynamoDBLocal() as server:
            print(f"* Amazon DynamoDB Local on {server.endpoint_url}")
            yield server.client()
    else:
        print("* Java or DynamoDB Local missing: using moto's in-process DynamoDB")
        yield boto3.client("dynamodb", **DUMMY_CREDENTIALS)


def main() -> None:
    from moto import mock_aws

    from dynacoord.provision import ensure_table
    from dynacoord.testing import DUMMY_CREDENTIALS

    logging.basicConfig(level=logging.WARNING, format="  [%(name)s] %(message)s")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", DUMMY_CREDENTIALS["aws_access_key_id"]),
        ("AWS_SECRET_ACCESS_KEY", DUMMY_CREDENTIALS["aws_secret_access_key"]),
        ("AWS_DEFAULT_REGION", DUMMY_CREDENTIALS["region_name"]),
    ):
        os.environ.setdefault(name, value)
    # moto intercepts AWS endpoints only: DynamoDB Local (a custom endpoint) is reached for real.
    with mock_aws(), _dynamodb() as client:
        ensure_table(client, "dynacoord-pipeline")
        backend = DynamoDBBackend(client, table_name="dynacoord-pipeline", namespace="pipeline")
        run_demo(backend, boto3.client("sqs", **DUMMY_CREDENTIALS))


if __name__ == "__main__":
    main()
