"""``dynacoord outbox work --until-idle``: a drain that delivers batch after batch until nothing
is due, then exits with the counts (``--once`` delivers one batch: 25 of a 60-event backlog)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dynacoord import Event

RECEIVED: list[str] = []
HERE = "tests.cli.test_outbox_work_until_idle"


def record(event: Event) -> None:
    if event.type == "bad":
        raise RuntimeError(f"cannot handle {event.id}")
    RECEIVED.append(event.id)


@pytest.fixture()
def env(ddb_cli: Any) -> Any:
    backend, run = ddb_cli
    RECEIVED.clear()
    return run, backend.outbox


def test_until_idle_drains_every_due_event_then_exits_with_the_counts(env: Any) -> None:
    run, outbox = env
    outbox.publish([Event("ok", n, id=f"d{n:02}") for n in range(60)])
    outbox.publish(Event("bad", 0, id="b1"))  # fails: retried after a backoff, not due again
    code, out, err = run("--json", "outbox", "work", "--until-idle", "--handler", f"{HERE}:record")
    assert code == 0, err
    assert json.loads(out) == {
        "handled": 61,
        "delivered": 60,
        "retried": 1,
        "failed": 0,
        "lost_leases": 0,
    }
    assert sorted(RECEIVED) == [f"d{n:02}" for n in range(60)]
    code, out, _ = run("--json", "outbox", "stats")
    stats = json.loads(out)
    assert (stats["pending"], stats["due"], stats["in_flight"]) == (1, 0, 0)


def test_until_idle_exits_1_when_it_marked_events_failed(env: Any) -> None:
    run, outbox = env
    outbox.publish([Event("ok", 1, id="g1"), Event("bad", 2, id="g2")])
    code, out, err = run(
        "outbox", "work", "--until-idle", "--max-attempts", "1", "--handler", f"{HERE}:record"
    )
    assert code == 1
    assert "delivered: 1" in out and "failed: 1" in out
    assert "marked 1 event(s) failed" in err


def test_until_idle_and_once_are_one_or_the_other(env: Any) -> None:
    run, _ = env
    code, _, err = run("outbox", "work", "--once", "--until-idle", "--handler", f"{HERE}:record")
    assert code == 2 and "--once" in err and "--until-idle" in err


#: the shape of the relay's RelayHandlers (MODULE:HANDLERS): event types to handlers
HANDLERS = {"ok": record, "*": record}


def test_the_relays_handler_mapping_drains_as_the_runbook_says(env: Any) -> None:
    run, outbox = env
    outbox.publish([Event("ok", 1, id="m1"), Event("other", 2, id="m2")])
    code, out, err = run(
        "--json", "outbox", "work", "--until-idle", "--handler", f"{HERE}:HANDLERS"
    )
    assert code == 0, err
    assert json.loads(out)["delivered"] == 2 and sorted(RECEIVED) == ["m1", "m2"]
