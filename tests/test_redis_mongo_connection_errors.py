"""Redis and MongoDB configuration and connection failures are dynacoord errors that name the
variable or the server and the setting to change, within a bounded time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dynacoord.errors import BackendError, ConfigurationError, DynacoordError
from dynacoord.testing import free_port

ROOT = Path(__file__).resolve().parents[1]


# -- Redis -----------------------------------------------------------------------------------------


def _redis_env(monkeypatch: pytest.MonkeyPatch, url: str, cluster: str = "") -> None:
    monkeypatch.setenv("DYNACOORD_REDIS_URL", url)
    monkeypatch.setenv("DYNACOORD_REDIS_CLUSTER", cluster)


@pytest.mark.parametrize("cluster", ["", "1"])
def test_a_redis_url_with_another_scheme_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, cluster: str
) -> None:
    from dynacoord.backends.redis import RedisBackend

    _redis_env(monkeypatch, "http://app:s3cret@127.0.0.1:6379/0", cluster)
    with pytest.raises(ConfigurationError) as info:
        RedisBackend.from_env()
    message = str(info.value)
    assert "DYNACOORD_REDIS_URL" in message
    assert "'http'" in message
    for scheme in ("redis://", "rediss://"):
        assert scheme in message
    assert "s3cret" not in message  # never the password


def test_a_malformed_redis_url_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynacoord.backends.redis import RedisBackend

    _redis_env(monkeypatch, "redis://127.0.0.1:notaport/0")
    with pytest.raises(ConfigurationError, match="DYNACOORD_REDIS_URL"):
        RedisBackend.from_env()


def test_redis_cluster_unreachable_is_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynacoord.backends.redis import RedisBackend

    port = free_port()
    _redis_env(monkeypatch, f"redis://user:s3cret@127.0.0.1:{port}/0", "1")
    started = time.monotonic()
    with pytest.raises(BackendError) as info:
        RedisBackend.from_env()
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert "DYNACOORD_REDIS_CLUSTER" in message
    assert f"127.0.0.1:{port}" in message
    assert "s3cret" not in message
    assert not type(info.value.__cause__).__module__.startswith("dynacoord")  # chained


def test_redis_cluster_flag_on_a_standalone_server_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, redis_server: Any
) -> None:
    from dynacoord.backends.redis import RedisBackend

    _redis_env(monkeypatch, f"redis://127.0.0.1:{redis_server.port}/0", "1")
    with pytest.raises(ConfigurationError) as info:
        RedisBackend.from_env()
    message = str(info.value)
    assert "DYNACOORD_REDIS_CLUSTER=1" in message
    assert "cluster mode" in message
    assert f"127.0.0.1:{redis_server.port}" in message


def test_redis_cluster_flag_values_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynacoord.backends.redis import RedisBackend

    _redis_env(monkeypatch, f"redis://127.0.0.1:{free_port()}/0", "maybe")
    with pytest.raises(ConfigurationError, match="DYNACOORD_REDIS_CLUSTER.*'maybe'"):
        RedisBackend.from_env()


# -- MongoDB ---------------------------------------------------------------------------------------


def test_mongodb_down_fails_within_the_bound_naming_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dynacoord.backends import mongo

    port = free_port()  # nothing listens there
    monkeypatch.setenv("DYNACOORD_MONGODB_URI", f"mongodb://127.0.0.1:{port}/app")
    backend = mongo.MongoBackend.from_env()
    bound = mongo.DEFAULT_SERVER_SELECTION_TIMEOUT_MS / 1000
    assert bound <= 10
    started = time.monotonic()
    try:
        with pytest.raises(BackendError) as info:
            backend.locks.acquire("nightly", ttl=10, timeout=0)
    finally:
        backend.database.client.close()
    took = time.monotonic() - started
    assert took < bound + 3, took
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "serverSelectionTimeoutMS" in message
    assert "Topology" not in message and "<ServerDescription" not in message
    assert isinstance(info.value, DynacoordError)


def test_mongodb_uri_timeout_wins_over_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynacoord.backends import mongo

    port = free_port()
    monkeypatch.setenv(
        "DYNACOORD_MONGODB_URI", f"mongodb://127.0.0.1:{port}/app?serverSelectionTimeoutMS=700"
    )
    backend = mongo.MongoBackend.from_env()
    started = time.monotonic()
    try:
        with pytest.raises(BackendError, match=r"0\.7 s"):
            backend.ensure_indexes()
    finally:
        backend.database.client.close()
    assert time.monotonic() - started < 3


def test_a_client_of_your_own_keeps_its_timeout_and_gets_the_clear_message() -> None:
    import pymongo

    from dynacoord.backends.mongo import MongoBackend

    port = free_port()
    client: Any = pymongo.MongoClient(f"127.0.0.1:{port}", serverSelectionTimeoutMS=500)
    try:
        backend = MongoBackend(client["app"])
        with pytest.raises(BackendError) as info:
            backend.cache().get("k")
    finally:
        client.close()
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "0.5 s" in message
    assert "Topology Description" not in message


def test_the_docs_state_the_bounds() -> None:
    backends = (ROOT / "docs" / "backends.md").read_text()
    assert "serverSelectionTimeoutMS" in backends
    redis = (ROOT / "docs" / "redis.md").read_text()
    assert "DYNACOORD_REDIS_CLUSTER" in redis and "at construction" in redis
