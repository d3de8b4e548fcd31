"""``dynacoord ratelimit show`` (moto): the bucket per shard as the store keeps it (``tat``) and,
given the rate, the calls left and the next admission as the limiter itself computes them."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from ._moto_cli import moto_cli


@pytest.fixture()
def cli(moto_table: Any, capsys: pytest.CaptureFixture[str]) -> Any:
    return moto_cli(moto_table, capsys)


def test_show_agrees_with_the_limiter(cli: Any) -> None:
    backend, run = cli
    # one call an hour, 3 at once: nothing changes while the test runs
    api = backend().rate_limiter("partner-api", rate=1, per=3600, burst=3)
    assert api.try_acquire() and api.try_acquire()
    settings = ("--rate", "1", "--per", "3600", "--burst", "3")

    code, out, err = run("ratelimit", "show", "partner-api", *settings)
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["rate"], shown["per"], shown["burst"], shown["shards"]) == (1, 3600, 3, 1)
    assert shown["available"] == api.available() == 1
    assert shown["retry_after"] == 0
    assert abs(shown["next_admission_at"] - time.time()) < 60
    # two calls of an hour each ahead of now: the bucket is full again in about two hours
    assert 7000 < shown["full_at"] - time.time() <= 7200
    assert err == ""

    assert api.try_acquire()
    refused = api.try_acquire()
    assert not refused
    code, out, _ = run("ratelimit", "show", "partner-api", *settings)
    shown = json.loads(out)
    assert code == 0 and shown["available"] == 0
    assert shown["retry_after"] == pytest.approx(refused.retry_after, abs=30)
    assert shown["next_admission_at"] == pytest.approx(time.time() + refused.retry_after, abs=30)

    # without the rate: when the bucket is full again, and a note on what else --rate shows
    code, out, err = run("ratelimit", "show", "partner-api", json_output=False)
    assert code == 0
    assert out.startswith("name: partner-api\n") and "full_at: " in out
    assert "available" not in out
    (note,) = err.splitlines()
    assert note.startswith("dynacoord: note: the table stores when the bucket is full again")
    # --burst left out: the library's default for the rate, said so
    code, out, err = run("ratelimit", "show", "partner-api", "--rate", "1", "--per", "3600")
    assert code == 0 and json.loads(out)["burst"] == 1
    assert err.startswith("dynacoord: note: assumes burst 1")


def test_a_sharded_limiter_is_shown_per_shard(cli: Any) -> None:
    backend, run = cli
    wide = backend().rate_limiter("ingest", rate=2, per=3600, burst=4, shards=2)
    # each call goes to a shard picked at random (2 at once each): 3 calls admit 3, or 2 and a
    # refusal when all three picked one shard
    admitted = sum(bool(wide.try_acquire()) for _ in range(3))
    assert admitted in (2, 3)
    code, out, err = run("ratelimit", "show", "ingest")
    assert code == 1 and "no rate limiter 'ingest'" in err and "--shards K" in err

    code, out, err = run(
        "ratelimit", "show", "ingest", "--rate", "2", "--per", "3600", "--burst", "4",
        "--shards", "2",
    )  # fmt: skip
    assert code == 0, err
    shown = json.loads(out)
    assert [s["shard"] for s in shown["per_shard"]] == [0, 1]
    assert sum(s["available"] for s in shown["per_shard"]) == shown["available"]
    assert shown["available"] == wide.available() == 4 - admitted
    assert sorted(s["available"] for s in shown["per_shard"]) in ([0, 1], [0, 2])


def test_a_missing_limiter_and_bad_input(cli: Any) -> None:
    _, run = cli
    code, out, err = run("ratelimit", "show", "nope", "--rate", "5")
    assert code == 1 and out == ""
    assert err.startswith("dynacoord: error: no rate limiter 'nope' in namespace ")
    assert err.count("\n") == 1

    for argv, message in [
        (("", "--rate", "5"), "rate limiter name"),
        (("x", "--burst", "3"), "--per and --burst describe a rate: give --rate too"),
        (("x", "--shards", "0"), "--shards must be between 1 and 100"),
        (("x", "--rate", "-1"), "rate must be a positive number"),
        (("x", "--rate", "4", "--burst", "2", "--shards", "3"), "must be at least shards"),
    ]:
        code, out, err = run("ratelimit", "show", *argv)
        assert code == 2 and out == "", argv
        assert err.startswith("dynacoord: error: ") and message in err, (argv, err)
