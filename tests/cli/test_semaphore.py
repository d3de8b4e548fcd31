"""``dynacoord semaphore show`` (moto): the holders as the item holds them, the limit only when
given (the table does not store it), and a clear "no semaphore" for one that is not there."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from dynacoord import ManualClock

from ._moto_cli import moto_cli


@pytest.fixture()
def cli(moto_table: Any, capsys: pytest.CaptureFixture[str]) -> Any:
    return moto_cli(moto_table, capsys)


def test_show_lists_the_live_holders_with_owner_fence_and_expiry(cli: Any) -> None:
    backend, run = cli
    pool = backend().semaphore("exports", limit=3, ttl=600)
    alice = pool.acquire(blocking=False, owner="alice")
    bob = pool.acquire(blocking=False, owner="bob", ttl=60)

    code, out, err = run("semaphore", "show", "exports", "--limit", "3")
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["name"], shown["limit"], shown["held"], shown["free"]) == ("exports", 3, 2, 1)
    assert shown["last_fence"] == bob.fence > alice.fence
    assert [(h["owner"], h["fence"]) for h in shown["holders"]] == [
        ("alice", alice.fence),
        ("bob", bob.fence),
    ]
    assert [h["expires_at"] for h in shown["holders"]] == [alice.expires_at, bob.expires_at]
    assert 0 < shown["holders"][1]["expires_in"] <= 60
    assert err == ""

    # a released permit is no holder; the item (and its last fence) stays
    assert alice.release()
    code, out, _ = run("semaphore", "show", "exports", "--limit", "3")
    shown = json.loads(out)
    assert code == 0 and shown["held"] == 1 and shown["free"] == 2
    assert [h["owner"] for h in shown["holders"]] == ["bob"]
    assert shown["last_fence"] == bob.fence

    # the readable form, and without --limit: no free count, and a note saying why
    code, out, err = run("semaphore", "show", "exports", json_output=False)
    assert code == 0
    assert "held: 1" in out.splitlines() and "limit: null" in out.splitlines()
    assert "free" not in out
    (note,) = err.splitlines()
    assert note.startswith("dynacoord: note: the table does not store a semaphore's limit")


def test_an_expired_permit_is_no_holder(cli: Any) -> None:
    backend, run = cli
    # a holder an hour in the past, whose 10 s lease ended long ago (the CLI reads the real clock)
    past = ManualClock(time.time() - 3600)
    backend(past).semaphore("jobs", limit=2, ttl=10).acquire(blocking=False, owner="gone")
    code, out, err = run("semaphore", "show", "jobs", "--limit", "2")
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["held"], shown["free"], shown["holders"]) == (0, 2, [])


def test_a_missing_semaphore_and_bad_input(cli: Any) -> None:
    _, run = cli
    code, out, err = run("semaphore", "show", "nope")
    assert code == 1 and out == ""
    assert err.startswith("dynacoord: error: no semaphore 'nope' in namespace ")
    assert err.count("\n") == 1

    code, out, err = run("semaphore", "show", "")
    assert code == 2 and out == ""
    assert err.startswith("dynacoord: error: ") and "semaphore name" in err

    code, _, err = run("semaphore", "show", "exports", "--limit", "0")
    assert code == 2 and "--limit must be between 1 and 1000" in err
