"""``outbox failed`` and ``outbox pending`` list at most ``--limit`` events (100 by default); when
more are left they say so on stderr, with how to see them (issue 52 item 10)."""

from __future__ import annotations

import json
from typing import Any

from dynacoord import Event

HERE = "tests.cli.test_outbox_listing_limits"


def explode(event: Event) -> None:
    raise RuntimeError(f"cannot handle {event.id}")


def test_a_listing_cut_at_its_limit_says_so(ddb_cli: Any) -> None:
    backend, run = ddb_cli
    backend.outbox.publish([Event("x", n, id=f"l{n}") for n in range(3)])
    code, _, err = run(
        "outbox", "work", "--until-idle", "--max-attempts", "1", "--handler", f"{HERE}:explode"
    )
    assert code == 1, err  # all three failed
    code, out, err = run("--json", "outbox", "failed", "--limit", "2")
    assert code == 0, err
    assert len(json.loads(out)) == 2
    (note,) = err.splitlines()
    assert note.startswith("dynacoord: note: the first 2 failed events")
    assert "--limit" in note and "outbox stats" in note
    code, out, err = run("--json", "outbox", "failed", "--limit", "3")
    assert code == 0 and len(json.loads(out)) == 3 and err == ""

    code, out, err = run("outbox", "retry", "--all")
    assert code == 0, err
    code, out, err = run("outbox", "pending", "--limit", "1")
    assert code == 0 and len(out.splitlines()) == 1
    assert err.startswith("dynacoord: note: the first 1 pending events")


def test_a_limit_below_one_is_a_usage_error(ddb_cli: Any) -> None:
    _, run = ddb_cli
    code, _, err = run("outbox", "failed", "--limit", "0")
    assert code == 2 and "--limit" in err
