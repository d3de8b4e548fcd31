"""What a Python user (and the CLI) is told about a misspelt ``DYNACOORD_*`` variable and about
missing AWS credentials (issue 52 item 9)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dynacoord import DynamoDBBackend
from dynacoord.errors import CredentialsError


def test_an_unknown_dynacoord_variable_is_named_with_the_closest_known_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import boto3

    monkeypatch.setenv("DYNACOORD_NAMESAPCE", "orders")
    caplog.set_level(logging.WARNING, logger="dynacoord")
    client = boto3.client(
        "dynamodb", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b"
    )
    backend = DynamoDBBackend.from_env(client=client)
    assert backend.namespace == "default"  # ignored, as before: but now said
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    (line,) = [m for m in messages if "DYNACOORD_NAMESAPCE" in m]
    assert "DYNACOORD_NAMESPACE" in line and "ignored" in line
    # said once per process, not at every backend
    DynamoDBBackend.from_env(client=client)
    again = [r for r in caplog.records if "DYNACOORD_NAMESAPCE" in r.getMessage()]
    assert len(again) == 1


def test_known_variables_are_not_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from dynacoord._backend import KNOWN_VARIABLES, unknown_variables

    for name in KNOWN_VARIABLES:
        monkeypatch.setenv(name, "x")
    assert unknown_variables() == []


def test_the_cli_names_an_unknown_variable_as_a_warning_line() -> None:
    """In a ``dynacoord`` process of its own (no logging set up: the CLI's warning lines)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "DYNACOORD_TABEL": "orders",
    }
    result = subprocess.run(
        ["dynacoord", "stack", "template"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "dynacoord: warning: environment variable DYNACOORD_TABEL is not one dynacoord reads "
        "(did you mean DYNACOORD_TABLE?): it is ignored"
    ]


@pytest.fixture()
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import boto3

    # boto3's default session keeps the credentials it found first (an earlier test's)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)


def test_no_credentials_is_a_dynacoord_error_that_chains_botocores(no_credentials: None) -> None:
    import boto3
    from botocore.exceptions import NoCredentialsError

    backend = DynamoDBBackend(
        boto3.client("dynamodb", region_name="us-east-1", endpoint_url="http://127.0.0.1:9"),
        table_name="creds-table",
    )
    with pytest.raises(CredentialsError) as raised:
        backend.cache().set("a", 1)
    message = str(raised.value)
    assert "no AWS credentials" in message and "AWS_PROFILE" in message
    assert "nothing was sent" in message
    assert isinstance(raised.value.__cause__, NoCredentialsError)


def test_the_cli_keeps_its_own_credentials_line(
    no_credentials: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynacoord.cli import main

    for name in ("DYNACOORD_TABLE", "DYNACOORD_NAMESPACE", "DYNACOORD_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    code = main(
        ["--region", "us-east-1", "--endpoint-url", "http://127.0.0.1:9", "cache", "get", "k"]
    )
    _, err = capsys.readouterr()
    assert code == 1
    (line,) = err.splitlines()
    assert line.startswith("dynacoord: error: no AWS credentials")
