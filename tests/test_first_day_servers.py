"""Issue 31, points 11 and 12: servers behind the tests and the backends fail cleanly.

11. A SIGTERM (how CI cancels a job) to the process that started DynamoDB Local stops Java too;
    a SIGKILL does as well on Linux (the child dies with its parent). A SIGTERM handler set by
    the program before the server started stays in charge.
12. Redis and MongoDB configuration and connection failures are dynacoord errors that name the
    variable or the server and the setting to change, within a bounded time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dynacoord.errors import BackendError, ConfigurationError, DynacoordError
from dynacoord.testing import find_dynamodb_local, find_java, free_port

ROOT = Path(__file__).resolve().parents[1]

# -- 11: DynamoDB Local does not outlive the process that started it -----------------------------

needs_dynamodb_local = pytest.mark.skipif(
    (find_dynamodb_local() is None or find_java() is None)
    and os.environ.get("CI", "").lower() != "true",
    reason="DynamoDB Local (jar and Java) not available",
)

STARTER = """
import signal, sys, time
from dynacoord import testing
from dynacoord.testing import DynamoDBLocal

if sys.argv[1] == "handler":  # the SIGTERM handler, as where the kernel cannot help
    testing._DIE_WITH_PARENT = False
if sys.argv[1] == "own-handler":
    def on_term(signum, frame):
        print("own handler", flush=True)
        server.stop()
        sys.exit(7)
    signal.signal(signal.SIGTERM, on_term)
server = DynamoDBLocal(startup_timeout=30)
server.start()
print(server.pid, flush=True)
while True:
    time.sleep(0.05)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie counts as gone: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


def _run_starter(mode: str, sig: int) -> tuple[int, int, str]:
    """Start a script that starts DynamoDB Local, send it ``sig`` once the server answers; its
    exit code, the Java pid it printed and what else it printed. Java is killed here if it
    outlives the check (only that pid: other runs' servers are left alone)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT)
    script = subprocess.Popen(
        [sys.executable, "-c", STARTER, mode],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    java_pid = 0
    try:
        assert script.stdout is not None
        line = script.stdout.readline()
        assert line.strip().isdigit(), (line, script.stderr.read() if script.stderr else "")
        java_pid = int(line)
        assert _alive(java_pid)
        script.send_signal(sig)
        out, _err = script.communicate(timeout=15)
        gone = _gone_within(java_pid, 5)
        return script.returncode, java_pid if not gone else 0, out
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
        if java_pid and _alive(java_pid):
            os.kill(java_pid, signal.SIGKILL)


@needs_dynamodb_local
def test_sigterm_to_the_starting_process_stops_dynamodb_local() -> None:
    code, orphan, _out = _run_starter("default", signal.SIGTERM)
    assert orphan == 0, f"DynamoDB Local (pid {orphan}) outlived the SIGTERM of its starter"
    # The starter still ends as a SIGTERM ends it: the default action, re-raised.
    assert code == -signal.SIGTERM


@needs_dynamodb_local
def test_sigterm_handler_stops_dynamodb_local_then_ends_the_process() -> None:
    code, orphan, _out = _run_starter("handler", signal.SIGTERM)
    assert orphan == 0, f"DynamoDB Local (pid {orphan}) outlived the SIGTERM of its starter"
    assert code == -signal.SIGTERM


@needs_dynamodb_local
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_sigkill_to_the_starting_process_stops_dynamodb_local() -> None:
    code, orphan, _out = _run_starter("default", signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert orphan == 0, f"DynamoDB Local (pid {orphan}) outlived the SIGKILL of its starter"


@needs_dynamodb_local
def test_a_sigterm_handler_set_before_stays_in_charge() -> None:
    code, orphan, out = _run_starter("own-handler", signal.SIGTERM)
    assert "own handler" in out
    assert code == 7
    assert orphan == 0


# -- 12: Redis -----------------------------------------------------------------------------------


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


# -- 12: MongoDB ---------------------------------------------------------------------------------


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
    testing_doc = (ROOT / "docs" / "testing.md").read_text()
    assert "SIGTERM" in testing_doc
