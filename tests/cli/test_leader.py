"""``dynacoord leader show`` (moto): who leads, its term (the lock's fence) and lease, and a
clear "no leader" once the seat is free."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from ._moto_cli import moto_cli


@pytest.fixture()
def cli(moto_table: Any, capsys: pytest.CaptureFixture[str]) -> Any:
    return moto_cli(moto_table, capsys)


def test_show_names_the_leader_its_term_and_lease(cli: Any) -> None:
    backend, run = cli
    code, _, err = run("leader", "show", "scheduler")
    assert code == 1 and err.startswith("dynacoord: error: no leader of 'scheduler' in namespace")

    leader = backend().leader("scheduler", ttl=30, owner="node-a")
    assert leader.campaign(timeout=5, heartbeat=False)
    try:
        code, out, err = run("leader", "show", "scheduler")
        assert code == 0, err
        shown = json.loads(out)
        assert (shown["name"], shown["leader"], shown["term"]) == (
            "scheduler",
            "node-a",
            leader.term,
        )
        assert shown["lock_key"] == "leader:scheduler"
        assert 0 < shown["lease_left"] <= 30
        assert shown["expires_at"] == pytest.approx(time.time() + shown["lease_left"], abs=5)
        # the same item as the lock view shows it
        code, out, _ = run("lock", "show", "leader:scheduler")
        assert json.loads(out)["fence"] == leader.term
    finally:
        assert leader.step_down()

    code, out, err = run("leader", "show", "scheduler", json_output=False)
    assert code == 1 and out == ""
    assert "no leader of 'scheduler'" in err and "stepped down" in err


def test_a_bad_name_is_refused_before_anything_is_sent(cli: Any) -> None:
    _, run = cli
    code, out, err = run("leader", "show", "")
    assert code == 2 and out == ""
    assert err.startswith("dynacoord: error: ") and "leader name" in err
