"""``dynacoord lock acquire|show|release`` through ``dynacoord.cli.main`` on DynamoDB Local."""

from __future__ import annotations

import json
from typing import Any

import pytest


@pytest.fixture()
def cli(ddb_cli: Any) -> Any:
    """Run the CLI against the session table in a fresh namespace: returns (code, out, err)."""
    return ddb_cli[1]


def test_acquire_show_release(cli: Any) -> None:
    code, out, err = cli("--json", "lock", "acquire", "job-1", "--ttl", "30", "--owner", "alice")
    assert code == 0, err
    lease = json.loads(out)
    assert lease["key"] == "job-1" and lease["owner"] == "alice"
    assert isinstance(lease["fence"], int)

    code, out, err = cli("--json", "lock", "show", "job-1")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["held"] is True and shown["owner"] == "alice"
    assert shown["fence"] == lease["fence"]

    # a held lock: exit 1 with one clear line naming the holder
    code, out, err = cli("lock", "acquire", "job-1", "--ttl", "30", "--owner", "bob")
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("dynacoord: error: lock ") and "not acquired" in err and "'alice'" in err

    # releasing as someone else fails and leaves the lock alone
    code, _, err = cli("lock", "release", "job-1", "--owner", "bob", "--fence", str(lease["fence"]))
    assert code == 1 and "held by 'alice', not by that owner" in err
    # the right owner with a wrong fence is told so, precisely
    wrong = str(lease["fence"] + 7)
    code, _, err = cli("lock", "release", "job-1", "--owner", "alice", "--fence", wrong)
    assert code == 1 and f"with fence {lease['fence']}, not {wrong}" in err
    code, out, _ = cli("--json", "lock", "show", "job-1")
    assert json.loads(out)["owner"] == "alice"

    code, out, err = cli(
        "--json", "lock", "release", "job-1", "--owner", "alice", "--fence", str(lease["fence"])
    )
    assert code == 0, err
    assert json.loads(out) == {"key": "job-1", "released": True}

    code, out, _ = cli("--json", "lock", "show", "job-1")
    assert json.loads(out) == {"key": "job-1", "held": False}

    # free again: bob gets it with a larger fence
    code, out, err = cli("--json", "lock", "acquire", "job-1", "--ttl", "30", "--owner", "bob")
    assert code == 0, err
    assert json.loads(out)["fence"] > lease["fence"]
    code, out, err = cli("lock", "release", "job-1", "--force")
    assert code == 0, err
    assert "released: true" in out
    # --force on a free lock says there was nothing to release
    code, _, err = cli("lock", "release", "job-1", "--force")
    assert code == 1 and "is not held (nothing to release)" in err


@pytest.mark.parametrize("ttl", ["0", "-5", "nan"])
def test_bad_ttl_is_a_usage_error(cli: Any, ttl: str) -> None:
    code, out, err = cli("lock", "acquire", "job-2", "--ttl", ttl)
    assert code == 2
    assert out == ""
    assert "ttl" in err and err.count("\n") == 1
    code, out, _ = cli("--json", "lock", "show", "job-2")
    assert json.loads(out)["held"] is False  # nothing was written


def test_lock_usage_errors(cli: Any) -> None:
    code, _, err = cli("lock", "acquire", "job-3", "--ttl", "abc")
    assert code == 2 and "invalid float value" in err
    code, _, err = cli("lock", "acquire", "job-3")
    assert code == 2 and "--ttl" in err
    code, _, err = cli("lock", "release", "job-3")
    assert code == 2 and "--owner and --fence" in err
    code, _, err = cli("lock", "acquire", "", "--ttl", "5")
    assert code == 2 and "must not be empty" in err


def test_json_flag_is_accepted_before_and_after_the_command():
    from dynacoord.cli import build_parser

    parser = build_parser()
    after = parser.parse_args(["lock", "show", "k", "--json"])
    before = parser.parse_args(["--json", "lock", "show", "k"])
    neither = parser.parse_args(["lock", "show", "k"])
    assert after.json is True and before.json is True and neither.json is False
    assert parser.parse_args(["cache", "keys", "-q"]).quiet is True
