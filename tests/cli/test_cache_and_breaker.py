"""``dynacoord cache ...`` and ``dynacoord breaker ...`` against Amazon DynamoDB Local."""

from __future__ import annotations

import json

import pytest

from dynacoord import BreakerState


@pytest.fixture()
def cli(ddb_cli):
    backend, run = ddb_cli
    return backend, lambda *argv, json_output=False: run(*argv, json_output=json_output, quiet=True)


def test_cache_set_get_delete(cli):
    backend, run = cli
    cache = backend.cache()

    assert run("cache", "set", "greeting", "hello world")[0] == 0
    assert cache.get("greeting") == "hello world"
    code, out, _ = run("cache", "get", "greeting")
    assert (code, out) == (0, "hello world\n")

    assert run("cache", "set", "cfg", '{"retries": 3, "on": true}', "--ttl", "60")[0] == 0
    assert cache.get("cfg") == {"retries": 3, "on": True}
    code, out, _ = run("cache", "get", "cfg", json_output=True)
    assert code == 0 and json.loads(out) == {"key": "cfg", "value": {"retries": 3, "on": True}}

    assert run("cache", "set", "n", "42")[0] == 0
    assert cache.get("n") == 42
    assert run("cache", "set", "s", "42", "--string")[0] == 0
    assert cache.get("s") == "42"

    code, _, err = run("cache", "set", "n", "1", "--nx")
    assert code == 1 and "already holds" in err
    assert cache.get("n") == 42

    code, out, _ = run("cache", "delete", "n", "never-set", json_output=True)
    assert code == 0
    assert json.loads(out) == [
        {"key": "n", "deleted": True},
        {"key": "never-set", "deleted": False},
    ]
    code, _, err = run("cache", "get", "n")
    assert code == 1 and err.startswith("dynacoord: error: ") and "not found" in err


def test_cache_set_bad_input_exits_2_and_writes_nothing(cli):
    backend, run = cli
    code, _, err = run("cache", "set", "k", "v", "--ttl", "0")
    assert code == 2 and "ttl" in err
    code, _, err = run("cache", "set", "", "v")
    assert code == 2 and "empty" in err
    code, _, err = run("cache", "set", "big", "x" * 500_000)
    assert code == 2 and "limit" in err
    assert backend.cache().keys() == []


def test_cache_keys_and_clear(cli):
    backend, run = cli
    backend.cache().set_many({f"user:{i}": i for i in range(30)} | {"order:1": "o"})

    code, out, _ = run("cache", "keys", "user:1*", json_output=True)
    assert code == 0
    assert json.loads(out) == ["user:1", *sorted(f"user:{i}" for i in range(10, 20))]
    code, out, _ = run("cache", "keys")
    assert code == 0 and len(out.splitlines()) == 31

    code, _, err = run("cache", "clear")
    assert code == 2 and "--yes" in err
    assert len(backend.cache().keys()) == 31

    code, out, _ = run("cache", "clear", "--yes", json_output=True)
    assert code == 0 and json.loads(out)["removed"] == 31
    assert backend.cache().keys() == []


def test_breaker_status_trip_reset(cli):
    backend, run = cli
    breaker = backend.breaker("payments", failure_threshold=5)
    breaker.record_failure()
    breaker.record_failure()

    code, out, _ = run("breaker", "status", "payments", json_output=True)
    assert code == 0
    status = json.loads(out)
    assert status["state"] == "closed" and status["failures"] == 2
    assert status["opened_at"] is None

    code, out, _ = run("breaker", "trip", "payments", json_output=True)
    assert code == 0 and json.loads(out)["state"] == "open"
    assert breaker.state is BreakerState.OPEN

    code, out, _ = run("breaker", "status", "payments", "--reset-timeout", "60")
    assert code == 0
    assert "state: open" in out and "retry_after:" in out

    code, out, _ = run("breaker", "reset", "payments", json_output=True)
    assert code == 0
    assert json.loads(out)["state"] == "closed" and json.loads(out)["failures"] == 0
    assert breaker.state is BreakerState.CLOSED

    code, _, err = run("breaker", "status", "")
    assert code == 2 and "empty" in err


def test_json_output_is_lossless_for_bytes_and_decimals(capsys):
    import argparse
    import base64
    import json
    from decimal import Decimal

    from dynacoord._cli.common import Context, emit

    ctx = Context(argparse.Namespace(json=True))
    emit(
        ctx,
        {
            "b": b"\xff\x00ok",
            "d": Decimal("1.10"),
            "big": Decimal("12345678901234567890.123456789012345678"),
            "n": Decimal("7"),
        },
    )
    out = json.loads(capsys.readouterr().out)
    assert base64.b64decode(out["b"]["$bytes"]) == b"\xff\x00ok"
    assert out["d"] == {"$decimal": "1.10"}
    assert Decimal(out["big"]["$decimal"]) == Decimal("12345678901234567890.123456789012345678")
    assert out["n"] == 7
