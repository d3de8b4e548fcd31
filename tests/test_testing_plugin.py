"""``dynacoord.testing`` as a pytest plugin (entry point ``pytest11``) and where ``DynamoDBLocal``
looks for the jar."""

from __future__ import annotations

import importlib.metadata
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dynacoord import testing
from dynacoord.testing import (
    DynamoDBLocal,
    DynamoDBLocalUnavailableError,
    find_dynamodb_local,
    find_java,
    user_cache_dir,
)

USES_THE_FIXTURES = """
def test_a_table(dynamodb_local, dynamodb_local_client, dynamodb_local_table):
    table = dynamodb_local_client.describe_table(TableName=dynamodb_local_table)["Table"]
    assert table["TableStatus"] == "ACTIVE"
    assert dynamodb_local.endpoint_url.startswith("http://127.0.0.1:")


def test_the_environment_points_boto3_at_the_server(dynamodb_local_env, dynamodb_local_table):
    import boto3

    assert dynamodb_local_table in boto3.client("dynamodb").list_tables()["TableNames"]
"""


DOCS = Path(__file__).resolve().parent.parent / "docs" / "testing.md"


def _docs_test_module() -> str:
    """The pytest example of docs/testing.md (its python block that defines tests)."""
    blocks = re.findall(r"^```python\n(.*?)^```$", DOCS.read_text(), flags=re.M | re.S)
    (module,) = [block for block in blocks if "def test_" in block]
    return module


def _pytest_env(**extra: str) -> dict[str, str]:
    """The environment of a pytest run in a folder of its own: no AWS settings, no plugin
    autoload switch, nothing from this run's options."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AWS_", "PYTEST_", "DYNAMODB_LOCAL"))
    }
    env.update(extra)
    return env


def _run_pytest(folder: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _require_dynamodb_local() -> Path:
    jar_dir = find_dynamodb_local()
    if jar_dir is None or find_java() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("DynamoDB Local and Java are required under CI=true")
        pytest.skip("DynamoDB Local or Java not installed")
    return jar_dir


def test_the_plugin_is_declared_as_a_pytest11_entry_point() -> None:
    found = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    assert found.get("dynacoord.testing") == "dynacoord.testing"


def test_a_test_folder_without_conftest_gets_the_fixtures(tmp_path: Path) -> None:
    jar_dir = _require_dynamodb_local()
    (tmp_path / "test_uses_fixtures.py").write_text(USES_THE_FIXTURES)
    (tmp_path / "test_docs_example.py").write_text(_docs_test_module())
    done = _run_pytest(tmp_path, env=_pytest_env(DYNAMODB_LOCAL_DIR=str(jar_dir)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout, done.stdout


def test_the_plugin_imports_no_boto3_loads_once_and_can_be_disabled(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(
        textwrap.dedent(
            """
            import sys

            import dynacoord.testing


            def test_nothing_is_imported_while_no_fixture_is_used():
                assert "boto3" not in sys.modules and "botocore" not in sys.modules


            def test_registered_once(request):
                manager = request.config.pluginmanager
                plugins = [p for p in manager.get_plugins() if p is dynacoord.testing]
                assert len(plugins) == 1
                assert manager.get_plugin("dynacoord.testing") is dynacoord.testing
            """
        )
    )
    done = _run_pytest(tmp_path, env=_pytest_env())  # by entry point only
    assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["dynacoord.testing"]\n')
    done = _run_pytest(tmp_path, env=_pytest_env())  # and by the conftest
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout

    (tmp_path / "conftest.py").unlink()
    (tmp_path / "test_wants_fixture.py").write_text(
        "def test_needs(dynamodb_local_table):\n    pass\n"
    )
    done = _run_pytest(
        tmp_path, "test_wants_fixture.py", "-p", "no:dynacoord.testing", env=_pytest_env()
    )
    assert done.returncode != 0
    assert "fixture 'dynamodb_local_table' not found" in done.stdout


def _fake_jar(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "DynamoDBLocal.jar").write_bytes(b"not a real jar")
    return folder


@pytest.fixture()
def no_jar_around(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory and user cache with no DynamoDB Local in them."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv("DYNAMODB_LOCAL_DIR", raising=False)
    return tmp_path


def test_dynamodb_local_finds_the_newest_jar_in_the_user_cache(no_jar_around: Path) -> None:
    cache = no_jar_around / "xdg-cache" / "dynacoord" / "dynamodb-local"
    assert user_cache_dir() == cache
    _fake_jar(cache / "package" / "lib" / "dynamodb_local_2025-01-01")
    newest = _fake_jar(cache / "package" / "lib" / "dynamodb_local_2026-05-28")
    assert DynamoDBLocal().jar_dir == newest


def test_without_xdg_cache_home_the_user_cache_is_under_home(
    no_jar_around: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(no_jar_around / "home"))
    folder = _fake_jar(
        no_jar_around / "home/.cache/dynacoord/dynamodb-local/package/lib/dynamodb_local_2026-05-28"
    )
    assert find_dynamodb_local() == folder


def test_the_override_then_the_working_copy_come_before_the_user_cache(
    no_jar_around: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_jar(no_jar_around / "xdg-cache/dynacoord/dynamodb-local/package/lib/dynamodb_local_1")
    clone = _fake_jar(
        no_jar_around / "work/.cache/dynamodb-local/package/lib/dynamodb_local_2026-05-28"
    )
    assert find_dynamodb_local() == clone
    override = _fake_jar(no_jar_around / "elsewhere")
    monkeypatch.setenv("DYNAMODB_LOCAL_DIR", str(override))
    assert find_dynamodb_local() == override


def test_a_wrong_override_is_an_error_not_a_fallback(
    no_jar_around: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_jar(no_jar_around / "work/.cache/dynamodb-local")
    monkeypatch.setenv("DYNAMODB_LOCAL_DIR", str(no_jar_around / "typo"))
    assert find_dynamodb_local() is None
    with pytest.raises(DynamoDBLocalUnavailableError, match="DYNAMODB_LOCAL_DIR=.*typo holds no"):
        DynamoDBLocal().start()


def test_a_missing_jar_names_the_places_searched_and_the_fetch_command(
    no_jar_around: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nowhere = [no_jar_around / "nowhere"]
    monkeypatch.setattr(testing, "dynamodb_local_search_paths", lambda: nowhere)
    with pytest.raises(DynamoDBLocalUnavailableError) as caught:
        DynamoDBLocal().start()
    assert "dynacoord local fetch" in str(caught.value)
    assert str(nowhere[0]) in str(caught.value)


def test_a_port_in_use_is_refused_before_java_starts(tmp_path: Path) -> None:
    jar_dir = _fake_jar(tmp_path / "jar")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # Any executable passes for java: the port is checked before anything is run.
        server = DynamoDBLocal(port=port, jar_dir=jar_dir, java=sys.executable)
        with pytest.raises(DynamoDBLocalUnavailableError, match=f"port {port} .* in use"):
            server.start()
    assert server.pid is None


def test_without_java_the_error_says_java_17_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(DynamoDBLocalUnavailableError, match="needs Java 17 or newer"):
        DynamoDBLocal(jar_dir=_fake_jar(tmp_path / "jar")).start()
