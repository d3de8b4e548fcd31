"""``dynacoord outbox work`` with handlers for some event types only: nothing is claimed until the
operator says what becomes of the other types (``--on-missing-handler``), and ``--once`` exits 1
when it marked events failed (its result still on stdout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dynacoord import Event

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def env(ddb_cli: Any) -> Any:
    backend, run = ddb_cli
    return run, backend.outbox


def test_handlers_for_some_types_claim_nothing_without_a_missing_handler_choice(env: Any) -> None:
    run, outbox = env
    outbox.publish([Event("order.placed", 1, id="mh1"), Event("order.paid", 2, id="mh2")])
    code, out, err = run("outbox", "work", "--once", "--handler", "order.placed=builtins:print")
    assert code == 2, err
    assert err.startswith("dynacoord: error: ") and err.count("\n") == 1
    assert "--on-missing-handler" in err and "order.placed" in err
    assert out == ""
    for event_id in ("mh1", "mh2"):  # nothing claimed, no attempt spent
        record = outbox.get(event_id)
        assert record is not None
        assert record.status.value == "pending" and record.attempts == 0


def test_a_catch_all_or_a_relay_needs_no_choice(env: Any) -> None:
    run, outbox = env
    outbox.publish([Event("order.placed", 1, id="ca1"), Event("order.paid", 2, id="ca2")])
    code, out, err = run(
        "--json",
        "outbox",
        "work",
        "--once",
        "--handler",
        "order.placed=builtins:repr",
        "--handler",
        "*=builtins:repr",
    )
    assert code == 0, err
    assert json.loads(out)["delivered"] == 2


def test_once_exits_1_after_marking_events_failed_and_still_prints_the_counts(env: Any) -> None:
    run, outbox = env
    outbox.publish([Event("order.placed", 1, id="of1"), Event("order.paid", 2, id="of2")])
    code, out, err = run(
        "--json",
        "outbox",
        "work",
        "--once",
        "--handler",
        "order.placed=builtins:repr",
        "--on-missing-handler",
        "fail",
    )
    assert code == 1
    result = json.loads(out)
    assert result["delivered"] == 1 and result["failed"] == 1
    assert err == (
        "dynacoord: error: outbox work marked 1 event(s) failed "
        "(see `dynacoord outbox failed`, retry with `dynacoord outbox retry`)\n"
    )
    failed = outbox.get("of2")
    assert failed is not None and failed.status.value == "failed"


def test_retry_and_skip_are_explicit_choices(env: Any) -> None:
    run, outbox = env
    outbox.publish([Event("order.placed", 1, id="rs1"), Event("order.paid", 2, id="rs2")])
    code, out, err = run(
        "--json",
        "outbox",
        "work",
        "--once",
        "--handler",
        "order.placed=builtins:repr",
        "--on-missing-handler",
        "retry",
    )
    assert code == 0, err
    assert json.loads(out)["retried"] == 1
    record = outbox.get("rs2")
    assert record is not None and record.status.value == "pending"


def test_cli_md_documents_the_option_and_the_exit() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    assert "--on-missing-handler" in text
    assert "marked 1 event(s) failed" in text or "event(s) failed" in text


def test_leave_gives_the_other_types_back_pending_with_no_attempt_counted(env: Any) -> None:
    """``leave`` (the Python worker's default) is a choice of the CLI too: the other type stays
    pending for a worker that has its handler, and its attempts are not spent."""
    run, outbox = env
    outbox.publish([Event("order.placed", 1, id="lv1"), Event("order.paid", 2, id="lv2")])
    code, out, err = run(
        "--json",
        "outbox",
        "work",
        "--once",
        "--handler",
        "order.placed=builtins:repr",
        "--on-missing-handler",
        "leave",
    )
    assert code == 0, err
    assert json.loads(out)["delivered"] == 1
    left = outbox.get("lv2")
    assert left is not None
    assert left.status.value == "pending" and left.attempts == 0
