"""``DynamoDBBackend.from_env()`` names the variable to fix: an endpoint without its scheme, no
region; nothing is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynacoord import ConfigurationError, DynamoDBBackend


@pytest.fixture(autouse=True)
def _fresh_session(monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


def test_an_endpoint_without_a_scheme_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYNACOORD_ENDPOINT_URL", "localhost:8000")
    with pytest.raises(ConfigurationError) as raised:
        DynamoDBBackend.from_env()
    message = str(raised.value)
    assert message.startswith("DYNACOORD_ENDPOINT_URL 'localhost:8000' has no scheme")
    assert "http://localhost:8000" in message


def test_boto3s_own_endpoint_variable_is_named_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DYNACOORD_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "not a url")
    with pytest.raises(ConfigurationError) as raised:
        DynamoDBBackend.from_env()
    assert "AWS_ENDPOINT_URL_DYNAMODB" in str(raised.value)


def test_no_region_names_the_region_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "DYNACOORD_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    with pytest.raises(ConfigurationError) as raised:
        DynamoDBBackend.from_env()
    message = str(raised.value)
    assert "no AWS region" in message
    assert "AWS_REGION" in message and "AWS_DEFAULT_REGION" in message


def test_a_good_environment_still_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYNACOORD_ENDPOINT_URL", "http://127.0.0.1:8000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    backend = DynamoDBBackend.from_env()
    assert backend.table.client.meta.endpoint_url == "http://127.0.0.1:8000"
