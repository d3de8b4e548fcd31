"""``dynacoord outbox retry --group G`` through ``main`` on DynamoDB Local."""

from __future__ import annotations

import json
from typing import Any

from dynacoord import Event
from dynacoord.outbox import EventStatus
from tests.outbox_helpers import drain


def test_retry_group_redrives_the_groups_failed_events_in_order(ddb_cli: Any) -> None:
    backend, run = ddb_cli
    outbox = backend.outbox
    outbox.publish([Event("t", i, group="acct", ordered=True, id=f"a{i}") for i in range(1, 4)])
    outbox.publish(Event("t", 0, id="loose"))

    def poison(event: Event) -> None:
        if event.id != "a2":
            raise RuntimeError("poison")

    drain(outbox.worker(poison, max_attempts=1, heartbeat=False))
    assert {r.id for r in outbox.failed()} == {"a1", "a3", "loose"}
    code, out, _ = run("--json", "outbox", "retry", "--group", "acct")
    assert code == 0 and json.loads(out) == {"retried": ["a1", "a3"]}
    assert [outbox.get(i).seq for i in ("a1", "a3")] == [4, 5]
    assert outbox.get("loose").status is EventStatus.FAILED
    code, out, _ = run("--json", "outbox", "retry", "--group", "acct")
    assert code == 0 and json.loads(out) == {"retried": []}  # nothing failed any more


def test_retry_needs_ids_or_a_group(ddb_cli: Any) -> None:
    _, run = ddb_cli
    code, _, err = run("outbox", "retry")
    assert code == 2 and "EVENT_ID..., --group GROUP or --all" in err
    code, _, err = run("outbox", "retry", "x", "--group", "g")
    assert code == 2 and "one of them" in err
    code, _, err = run("outbox", "retry", "--group", "")
    assert code == 2 and "event group" in err
