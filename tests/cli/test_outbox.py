"""``dynacoord outbox stats|failed|pending|show|retry|work`` through ``main`` on DynamoDB Local."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dynacoord import Event

#: events seen by the importable handlers below (``--handler tests.cli.test_outbox:record``)
RECEIVED: list[Event] = []


def record(event: Event) -> None:
    RECEIVED.append(event)


def explode(event: Event) -> None:
    raise RuntimeError(f"cannot handle {event.id}")


@pytest.fixture()
def env(ddb_cli: Any) -> Any:
    """(run, outbox): run the CLI in a fresh namespace; the outbox of that namespace."""
    backend, run = ddb_cli
    RECEIVED.clear()
    return run, backend.outbox


def test_stats_work_once_and_show(env):
    run, outbox = env
    outbox.publish([Event("a", 1, id="c1"), Event("b", 2, id="c2")])
    code, out, _ = run("--json", "outbox", "stats")
    assert code == 0
    stats = json.loads(out)
    lag = stats.pop("oldest_due_age")
    assert stats == {"pending": 2, "due": 2, "in_flight": 0, "failed": 0, "expired_lease_age": None}
    assert 0 <= lag < 60  # seconds since the events were published
    code, out, _ = run("--json", "outbox", "pending")
    assert code == 0 and sorted(e["id"] for e in json.loads(out)) == ["c1", "c2"]

    code, out, _ = run(
        "--json",
        "outbox",
        "work",
        "--once",
        "--handler",
        "a=tests.cli.test_outbox:record",
        "--on-missing-handler",
        "fail",
    )
    assert code == 1  # an event was marked failed
    result = json.loads(out)
    # c1 delivered; c2 has no handler: failed, as asked
    assert result["handled"] == 2 and result["delivered"] == 1 and result["failed"] == 1
    assert [e.id for e in RECEIVED] == ["c1"]

    code, out, _ = run("--json", "outbox", "show", "c1")
    assert code == 0 and json.loads(out)["status"] == "completed"
    code, _, err = run("outbox", "show", "nope")
    assert code == 1 and "no event 'nope'" in err


def test_failed_and_retry(env):
    run, outbox = env
    outbox.publish(Event("x", {"k": 1}, id="f1"))
    code, _, _ = run(
        "outbox",
        "work",
        "--once",
        "--max-attempts",
        "1",
        "--handler",
        "tests.cli.test_outbox:explode",
    )
    assert code == 1  # marked failed
    code, out, _ = run("--json", "outbox", "failed")
    failed = json.loads(out)
    assert [f["id"] for f in failed] == ["f1"]
    assert "cannot handle f1" in failed[0]["last_error"]

    code, _, err = run("outbox", "retry", "f1", "ghost")
    assert code == 1
    assert "retried 1" in err and "not found: ghost" in err
    assert outbox.get("ghost") is None
    code, out, _ = run("--json", "outbox", "stats")
    assert json.loads(out)["pending"] == 1
    code, out, _ = run("outbox", "work", "--once", "--handler", "tests.cli.test_outbox:record")
    assert code == 0 and [e.id for e in RECEIVED] == ["f1"]
    code, out, _ = run("--json", "outbox", "retry", "f1")
    assert code == 1  # completed now: not failed, left alone


def test_work_usage_errors(env):
    run, _ = env
    assert run("outbox", "work", "--once")[0] == 2  # no handler and no relay
    code, _, err = run("outbox", "work", "--once", "--handler", "no_such_module_xyz:f")
    assert code == 2 and "cannot import handler" in err
    code, _, _ = run(
        "outbox",
        "work",
        "--once",
        "--handler",
        "tests.cli.test_outbox:record",
        "--sqs-queue-url",
        "https://example/q",
    )
    assert code == 2
    assert run("outbox", "work", "--once", "--handler", "missing-colon")[0] == 2


def test_outbox_work_imports_a_handler_module_from_the_current_directory(tmp_path, monkeypatch):
    import sys

    from dynacoord._cli.outbox import _import

    (tmp_path / "my_handlers_cwd.py").write_text("def handle(event):\n    return 'ok'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    handler = _import("my_handlers_cwd:handle")
    assert handler(None) == "ok"


def test_work_per_event_claims_one_event_per_request(env, monkeypatch):
    from dynacoord.outbox.worker import OutboxWorker

    run, outbox = env
    outbox.publish([Event("a", i, id=f"pe{i}") for i in range(3)])
    designs: list[bool] = []
    original = OutboxWorker.run_once

    def spy(self: OutboxWorker, **kwargs: Any) -> int:
        designs.append(self.options.batch_claim)
        return original(self, **kwargs)

    monkeypatch.setattr(OutboxWorker, "run_once", spy)
    code, out, _ = run(
        "--json",
        "outbox",
        "work",
        "--once",
        "--per-event",
        "--handler",
        "tests.cli.test_outbox:record",
    )
    assert code == 0 and json.loads(out)["delivered"] == 3
    assert sorted(e.id for e in RECEIVED) == ["pe0", "pe1", "pe2"]
    assert designs == [False]
