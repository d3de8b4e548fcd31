"""A real 3-primary Redis Cluster for the tests (issue 20), imported by tests/conftest.py.

* ``redis_cluster``: three ``redis-server --cluster-enabled yes`` processes (no persistence, no
  replicas) in a temp dir, joined by ``redis-cli --cluster create ... --cluster-replicas 0``,
  started once per session when a test first asks for it and stopped at the end. The setup waits
  until every node reports ``cluster_state:ok`` and agrees on all 16384 slots. Missing binaries or
  a failed start: skip, or fail under ``CI=true``.
* ``redis_cluster_client``: a ``redis.cluster.RedisCluster`` on it for the session.
* ``redis_cluster_backend_factory``: ``make(*, clock=None, namespace=None, **kw)`` ->
  ``RedisBackend`` on the cluster in a fresh namespace per call (contract kind ``redis_cluster``).

Each node gets a client port and a cluster bus port (``--cluster-port``, Redis >= 7), six
distinct ports that were free a moment ago, so several sessions can run side by side; a start that
loses a port to another process is tried once more on new ports.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dynacoord._backend import Backend
from dynacoord._clock import Clock

__all__ = [
    "RedisClusterProcesses",
    "redis_cluster",
    "redis_cluster_backend_factory",
    "redis_cluster_client",
    "start_cluster",
]

PRIMARIES = 3


def _free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago (held together while
    chosen, so no two are the same)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: a cluster that cannot start is a failure)", pytrace=False)
    pytest.skip(reason)


class RedisClusterProcesses:
    """Three throwaway cluster-enabled ``redis-server`` processes joined into one cluster."""

    def __init__(self, server: str, cli: str, primaries: int = PRIMARIES) -> None:
        self.server = server
        self.cli = cli
        ports = _free_ports(2 * primaries)
        self.ports, self._bus_ports = ports[:primaries], ports[primaries:]
        self._dir = tempfile.TemporaryDirectory(prefix="dynacoord-redis-cluster-")
        self._processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[str] = []

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports]

    def start(self, timeout: float = 30.0) -> RedisClusterProcesses:
        deadline = time.monotonic() + timeout
        try:
            for port, bus_port in zip(self.ports, self._bus_ports, strict=True):
                self._start_node(port, bus_port)
            for port in self.ports:
                self._wait(lambda p=port: self._cli(p, "PING") == "PONG", deadline, "node start")
            options = ["--cluster-replicas", "0", "--cluster-yes"]
            create = subprocess.run(
                [self.cli, "--cluster", "create", *self.nodes, *options],
                capture_output=True,
                timeout=max(1.0, deadline - time.monotonic()),
                check=False,
            )
            if create.returncode != 0:
                out = (create.stdout + create.stderr).decode(errors="replace").strip()
                raise RuntimeError(f"redis-cli --cluster create failed: {out[-500:]}")
            self._wait(self._ready, deadline, "cluster_state:ok on every node")
            return self
        except BaseException:
            self.stop()
            raise

    def _start_node(self, port: int, bus_port: int) -> None:
        node_dir = os.path.join(self._dir.name, str(port))
        os.makedirs(node_dir)
        log = os.path.join(node_dir, "redis.log")
        self._logs.append(log)
        process = subprocess.Popen(
            [
                self.server,
                "--port",
                str(port),
                "--cluster-port",
                str(bus_port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                os.path.join(node_dir, "nodes.conf"),
                "--cluster-node-timeout",
                "5000",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                node_dir,
                "--logfile",
                log,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._processes.append(process)

    def _cli(self, port: int, *command: str) -> str:
        for process, log in zip(self._processes, self._logs, strict=True):
            if process.poll() is not None:
                try:
                    with open(log, encoding="utf-8", errors="replace") as f:
                        tail = f.read()[-500:].strip()
                except OSError:
                    tail = "(no log)"
                raise RuntimeError(f"a cluster redis-server exited: {tail}")
        result = subprocess.run(
            [self.cli, "-h", "127.0.0.1", "-p", str(port), *command],
            capture_output=True,
            timeout=5,
            check=False,
        )
        return result.stdout.decode(errors="replace").strip()

    def _ready(self) -> bool:
        for port in self.ports:
            info = self._cli(port, "CLUSTER", "INFO")
            if "cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info:
                return False
            if f"cluster_known_nodes:{len(self.ports)}" not in info:
                return False
        return True

    @staticmethod
    def _wait(ready: Callable[[], bool], deadline: float, what: str) -> None:
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis cluster: timed out waiting for {what}")
            time.sleep(0.05)

    def client(self, **kwargs: Any) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)

    def stop(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self._processes = []
        self._dir.cleanup()


def start_cluster(server: str, cli: str, attempts: int = 2) -> RedisClusterProcesses | str:
    """A started cluster, or why it could not start (each attempt on new ports)."""
    error = ""
    for _ in range(attempts):
        try:
            return RedisClusterProcesses(server, cli).start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            error = str(exc)
    return error


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcesses]:
    """A real 3-primary Redis Cluster for the whole session (skip, or fail under CI=true)."""
    try:
        import redis.cluster  # noqa: F401
    except ImportError:
        _unavailable("redis-py is not installed: pip install 'dynacoord[redis]'")
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        _unavailable("redis-server / redis-cli not found on PATH: run `make redis-server`")
        raise AssertionError("unreachable")
    cluster = start_cluster(server, cli)
    if isinstance(cluster, str):
        _unavailable(f"could not start a 3-primary Redis Cluster: {cluster}")
        raise AssertionError("unreachable")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_cluster_client(redis_cluster: RedisClusterProcesses) -> Iterator[Any]:
    client = redis_cluster.client()
    yield client
    client.close()


@pytest.fixture()
def redis_cluster_backend_factory(redis_cluster_client: Any) -> Callable[..., Backend]:
    from dynacoord.backends.redis import RedisBackend

    def make(*, clock: Clock | None = None, namespace: str | None = None, **kwargs: Any) -> Backend:
        return RedisBackend(
            redis_cluster_client,
            namespace=namespace or f"ns-{uuid.uuid4().hex[:12]}",
            clock=clock,
            **kwargs,
        )

    return make
