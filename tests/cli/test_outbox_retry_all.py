"""``dynacoord outbox retry --all`` / ``--type`` / ``--older-than``: a failed backlog larger
than one listing page goes back to pending, page after page, on DynamoDB Local."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dynacoord import Event, ManualClock
from tests.outbox_helpers import drain


def boom(event: Event) -> None:
    raise RuntimeError("handler down")


@pytest.fixture()
def env(ddb_cli: Any) -> Any:
    backend, run = ddb_cli
    return run, backend


def _fail(backend: Any, events: list[Event]) -> None:
    for start in range(0, len(events), 100):  # at most 100 events per publish
        backend.outbox.publish(events[start : start + 100])
    worker = backend.outbox.worker(boom, max_attempts=1, batch_size=100)
    drain(worker)
    failed = {r.id for r in backend.outbox.failed(limit=1000)}
    assert {e.id for e in events} <= failed


def _status(backend: Any, event_id: str) -> str:
    record = backend.outbox.get(event_id)
    assert record is not None
    return str(record.status.value)


def test_retry_all_moves_a_backlog_past_one_page(env: Any) -> None:
    run, backend = env
    _fail(backend, [Event("order.paid", i, id=f"ra{i:03d}") for i in range(130)])
    code, out, err = run("--json", "outbox", "retry", "--all")
    assert code == 0, err
    assert json.loads(out) == {"retried": 130, "groups": [], "moved_by_someone_else": 0}
    assert backend.outbox.failed(limit=1000) == []
    assert backend.outbox.stats().pending == 130


def test_retry_by_type_and_age_leaves_the_others_failed(env: Any) -> None:
    run, backend = env
    _fail(backend, [Event("order.paid", i, id=f"rt-paid{i}") for i in range(3)])
    _fail(backend, [Event("order.placed", i, id=f"rt-placed{i}") for i in range(2)])
    code, out, err = run("--json", "outbox", "retry", "--type", "order.placed")
    assert code == 0, err
    assert json.loads(out)["retried"] == 2
    assert {_status(backend, f"rt-placed{i}") for i in range(2)} == {"pending"}
    assert {_status(backend, f"rt-paid{i}") for i in range(3)} == {"failed"}

    # failed just now: none is older than an hour
    code, out, err = run("--json", "outbox", "retry", "--all", "--older-than", "3600")
    assert code == 0, err
    assert json.loads(out)["retried"] == 0
    assert {_status(backend, f"rt-paid{i}") for i in range(3)} == {"failed"}


def test_retry_older_than_uses_the_failure_time(env: Any, ddb_table: Any) -> None:
    import time

    from dynacoord import DynamoDBBackend

    run, backend = env
    client, table = ddb_table
    # failed two hours ago (a clock in the past; expiry is hours away, nothing is swept)
    earlier = DynamoDBBackend(
        client,
        table_name=table,
        namespace=backend.namespace,
        clock=ManualClock(time.time() - 7200),
    )
    _fail(earlier, [Event("order.paid", 1, id="age-old")])
    _fail(backend, [Event("order.paid", 2, id="age-new")])
    code, out, err = run("--json", "outbox", "retry", "--older-than", "3600")
    assert code == 0, err
    assert json.loads(out)["retried"] == 1
    assert _status(backend, "age-old") == "pending"
    assert _status(backend, "age-new") == "failed"


def test_ordered_groups_are_retried_whole_in_their_order(env: Any) -> None:
    run, backend = env
    _fail(
        backend,
        [
            Event("order.paid", 1, id="og1", group="cart-1", ordered=True),
            Event("order.paid", 2, id="og2", group="cart-1", ordered=True),
            Event("order.paid", 3, id="un1"),
        ],
    )
    code, out, err = run("--json", "outbox", "retry", "--all")
    assert code == 0, err
    result = json.loads(out)
    assert result["retried"] == 3 and result["groups"] == ["cart-1"]
    assert backend.outbox.failed() == []


def test_usage_errors(env: Any) -> None:
    run, _ = env
    for argv in (
        ("outbox", "retry", "e1", "--all"),
        ("outbox", "retry", "--all", "--group", "g"),
        ("outbox", "retry", "e1", "--type", "t"),
    ):
        code, out, err = run(*argv)
        assert code == 2, argv
        assert err.startswith("dynacoord: error: outbox retry takes") and out == ""
    code, _, err = run("outbox", "retry", "--all", "--older-than", "-1")
    assert code == 2 and "--older-than" in err
