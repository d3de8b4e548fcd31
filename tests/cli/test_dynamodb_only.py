"""The CLI works on DynamoDB only: a Redis or MongoDB user who runs it (``DYNACOORD_REDIS_URL``
set, no AWS region) is told so, not just "no AWS region" (issue 52 item 11)."""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord.cli import main


@pytest.mark.parametrize("variable", ["DYNACOORD_REDIS_URL", "DYNACOORD_MONGODB_URI"])
def test_a_redis_or_mongodb_user_is_told_the_cli_is_dynamodb_only(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    variable: str,
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "DYNACOORD_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv(variable, "redis://127.0.0.1:6379/0")
    code = main(["outbox", "stats"])
    _, err = capsys.readouterr()
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("dynacoord: error: no AWS region")
    assert f"{variable} is set" in line and "DynamoDB only" in line
    assert "docs/redis.md" in line or "docs/backends.md" in line


def test_without_those_variables_the_region_line_is_as_before(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "DYNACOORD_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name in ("DYNACOORD_REDIS_URL", "DYNACOORD_MONGODB_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    assert main(["outbox", "stats"]) == 2
    _, err = capsys.readouterr()
    assert "DynamoDB only" not in err and err.startswith("dynacoord: error: no AWS region")
