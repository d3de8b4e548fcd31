"""Shared fixtures.

``make_backend`` is the contract-suite entry point: it is parametrized over every backend, and each
call returns a backend in a fresh namespace (namespaces isolate, so one table per session is
enough on DynamoDB Local). Backends: ``moto`` (in-process, fast), ``dynamodb`` (Amazon DynamoDB
Local). Under ``CI=true`` a server that cannot start fails the run instead of skipping.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord._backend import Backend
from dynacoord._clock import Clock
from dynacoord.testing import (  # noqa: F401  (fixtures are registered by import)
    DUMMY_CREDENTIALS,
    DynamoDBLocal,
    dynamodb_local,
    dynamodb_local_client,
    unique_name,
)
from tests.backends_fixtures import (  # noqa: F401  (Redis/MongoDB fixtures, issue 7)
    EXTRA_CONTRACT_BACKENDS,
    mongo_backend_factory,
    mongo_database,
    mongodb_backend_factory,
    mongodb_database,
    redis_backend_factory,
    redis_client,
    redis_cluster,
    redis_cluster_backend_factory,
    redis_cluster_client,
    redis_server,
)
from tests.lossy import lossy  # noqa: F401  (lost-response fault injection, issue 13)

# Never let a test reach real AWS by accident.
for _name, _value in {
    "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS["aws_access_key_id"],
    "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
    "AWS_DEFAULT_REGION": DUMMY_CREDENTIALS["region_name"],
}.items():
    os.environ[_name] = _value
os.environ.pop("AWS_PROFILE", None)
os.environ.pop("AWS_SESSION_TOKEN", None)

BackendFactory = Callable[..., Backend]

#: Backends every contract suite runs against. Later backends append here.
CONTRACT_BACKENDS = ["moto", "dynamodb", *EXTRA_CONTRACT_BACKENDS]  # + redis, mongo[, mongodb]


@pytest.fixture(scope="session")
def ddb_table(dynamodb_local: DynamoDBLocal) -> Iterator[tuple[Any, str]]:
    """(client, table name) of one dynacoord table on DynamoDB Local for the whole session."""
    from dynacoord.provision import create_table

    client = dynamodb_local.client()
    name = unique_name("session")
    create_table(client, name)
    yield client, name


@pytest.fixture()
def moto_table() -> Iterator[tuple[Any, str]]:
    """(client, table name) of a dynacoord table inside moto's mock_aws (function scope)."""
    import boto3
    from moto import mock_aws

    from dynacoord.provision import create_table

    with mock_aws():
        client = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
        create_table(client, "dynacoord-test")
        yield client, "dynacoord-test"


def _dynamodb_factory(client: Any, table: str) -> BackendFactory:
    from dynacoord.backends.dynamodb import DynamoDBBackend

    def make(*, clock: Clock | None = None, namespace: str | None = None, **kwargs: Any) -> Backend:
        return DynamoDBBackend(
            client,
            table_name=table,
            namespace=namespace or unique_name("ns"),
            clock=clock,
            **kwargs,
        )

    return make


@pytest.fixture(params=CONTRACT_BACKENDS)
def make_backend(request: pytest.FixtureRequest) -> BackendFactory:
    """A factory of backends of one kind, each in a fresh namespace: ``make_backend(clock=...)``."""
    return backend_factory(request, request.param)


def backend_factory(request: pytest.FixtureRequest, kind: str) -> BackendFactory:
    """The factory of ``make_backend`` for ``kind`` (its fixtures got from ``request``)."""
    if kind == "moto":
        client, table = request.getfixturevalue("moto_table")
        factory = _dynamodb_factory(client, table)
    elif kind == "dynamodb":
        client, table = request.getfixturevalue("ddb_table")
        factory = _dynamodb_factory(client, table)
    else:
        factory = request.getfixturevalue(f"{kind}_backend_factory")
    factory.kind = kind  # type: ignore[attr-defined]
    return factory


class CountingStore:
    """Wraps a primitive's store and counts the calls of each method it passes on (every
    backend alike, no client hooks): ``calls["get"]``."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)

        return counted


def needs_atomic_store(make_backend: BackendFactory) -> None:
    """Skip a concurrency case on moto: its in-memory store does not make conditional writes
    atomic across threads (that is proven on DynamoDB Local, Redis and MongoDB instead).
    mongomock runs them: the fixtures serialize it per collection call (a server's per-document
    atomicity, see tests/backends_fixtures.py)."""
    if getattr(make_backend, "kind", None) == "moto":
        pytest.skip(f"{make_backend.kind}'s in-memory store is not atomic across threads")  # type: ignore[attr-defined]


@pytest.fixture()
def backend(make_backend: BackendFactory) -> Backend:
    """One backend (real clock) in a fresh namespace."""
    return make_backend()


@pytest.fixture()
def own_dynamodb_local() -> Iterator[DynamoDBLocal]:
    """A DynamoDB Local server of the test's own (a few seconds to start), for adding an index
    to an existing table: on the session's server, after the whole suite's tables, DynamoDB
    Local left such an index CREATING for good (it builds indexes in the background; the same
    test passes on a fresh server in a second)."""
    from dynacoord.testing import dynamodb_local_for_tests

    yield from dynamodb_local_for_tests()


@pytest.fixture()
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture()
def ddb_backend(ddb_table: tuple[Any, str]) -> Backend:
    """A DynamoDB Local backend only (concurrency cases that need a real server)."""
    client, table = ddb_table
    return _dynamodb_factory(client, table)()


@pytest.fixture()
def ddb_cli(
    ddb_table: tuple[Any, str], dynamodb_local: DynamoDBLocal, capsys: pytest.CaptureFixture[str]
) -> tuple[Backend, Callable[..., tuple[int, str, str]]]:
    """(backend, run): the ``dynacoord`` CLI against the session table on DynamoDB Local, in a
    fresh namespace that ``backend`` shares. ``run(*argv, json_output=False, quiet=False)``
    returns (exit code, stdout, stderr)."""
    from dynacoord.cli import main

    client, table = ddb_table
    backend = _dynamodb_factory(client, table)()
    base = [
        "--endpoint-url",
        dynamodb_local.endpoint_url,
        "--region",
        DUMMY_CREDENTIALS["region_name"],
        "--table",
        table,
        "--namespace",
        backend.namespace,
    ]

    def run(*argv: str, json_output: bool = False, quiet: bool = False) -> tuple[int, str, str]:
        capsys.readouterr()
        options = [*base, *(["--json"] if json_output else []), *(["--quiet"] if quiet else [])]
        code = main([*options, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return backend, run
