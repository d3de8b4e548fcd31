"""Fixtures for the Redis and MongoDB backends (imported by tests/conftest.py).

* ``redis_server``: a real ``redis-server`` (no persistence) on a free port in a temp dir, one per
  test session, stopped at the end. Missing binary: skip, or fail under ``CI=true``.
* ``redis_backend_factory``: ``make(*, clock=None, namespace=None, **kw) -> RedisBackend`` in a
  fresh namespace per call.
* ``mongo_backend_factory``: the same on ``mongomock`` (kind ``mongo``).
* ``mongodb_backend_factory``: the same on a real MongoDB at ``MONGODB_URI`` (kind ``mongodb``,
  only in the contract parametrization when the variable is set).
* ``moto_layout_backend_factory`` / ``dynamodb_layout_backend_factory``: DynamoDB backends with
  a :class:`~dynacoord.TableLayout` (``PK``/``SK``, ``GSI1`` on ``GSI1PK``/``GSI1SK``, prefix
  ``DC#``) on a table that also holds an application's items (:data:`FOREIGN_ITEMS`), checked
  unchanged after every test (the contract suite runs on them: tests/contract/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dynacoord import TableLayout
from dynacoord._backend import Backend
from dynacoord._clock import Clock
from dynacoord.testing import free_port
from tests.redis_cluster_fixtures import (  # re-exported (issue 20)
    redis_cluster,
    redis_cluster_backend_factory,
    redis_cluster_client,
)

__all__ = [
    "EXTRA_CONTRACT_BACKENDS",
    "FOREIGN_ITEMS",
    "LAYOUT",
    "RedisServer",
    "SerializedCollection",
    "SerializedDatabase",
    "dynamodb_layout_backend_factory",
    "dynamodb_layout_table",
    "mongo_backend_factory",
    "mongo_database",
    "mongodb_backend_factory",
    "mongodb_database",
    "moto_layout_backend_factory",
    "redis_backend_factory",
    "redis_client",
    "redis_cluster",
    "redis_cluster_backend_factory",
    "redis_cluster_client",
    "redis_server",
]

#: Kinds appended to the contract parametrization: redis_cluster = a 3-primary Redis Cluster
#: (tests/redis_cluster_fixtures.py), mongo = mongomock, mongodb = MONGODB_URI.
EXTRA_CONTRACT_BACKENDS = [
    "redis",
    "redis_cluster",
    "mongo",
    *(["mongodb"] if os.environ.get("MONGODB_URI") else []),
]

BackendFactory = Callable[..., Backend]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"{reason} (CI=true: a missing server is a failure)", pytrace=False)
    pytest.skip(reason)


def _namespace() -> str:
    return f"ns-{uuid.uuid4().hex[:12]}"


# -- Redis ----------------------------------------------------------------------------------------


class RedisServer:
    """A throwaway ``redis-server`` process without persistence."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="dynacoord-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> RedisServer:
        import redis

        self._process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir.name,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        probe = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                if self._process.poll() is not None:
                    err = self._process.stderr.read().decode() if self._process.stderr else ""
                    raise RuntimeError(f"redis-server exited at start: {err.strip()}")
                try:
                    if probe.ping():
                        return self
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer within {timeout}s")
                time.sleep(0.05)
        finally:
            probe.close()

    def client(self, **kwargs: Any) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        if self._process is not None and self._process.stderr is not None:
            self._process.stderr.close()
        self._process = None
        self._dir.cleanup()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server for the whole session (skip, or fail under CI=true, when missing)."""
    try:
        import redis  # noqa: F401
    except ImportError:
        _unavailable("redis-py is not installed: pip install 'dynacoord[redis]'")
    binary = shutil.which("redis-server")
    if binary is None:
        _unavailable("redis-server not found on PATH: run `make redis-server`")
        raise AssertionError("unreachable")
    server = RedisServer(binary)
    try:
        server.start()
    except RuntimeError as exc:
        _unavailable(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_client(redis_server: RedisServer) -> Iterator[Any]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture()
def redis_backend_factory(redis_client: Any) -> BackendFactory:
    from dynacoord.backends.redis import RedisBackend

    def make(*, clock: Clock | None = None, namespace: str | None = None, **kwargs: Any) -> Backend:
        return RedisBackend(
            redis_client, namespace=namespace or _namespace(), clock=clock, **kwargs
        )

    return make


# -- MongoDB --------------------------------------------------------------------------------------
#
# mongomock is not atomic across threads: two threads in the same ``find_one_and_update`` can both
# see the document before either writes it, so a compare-and-set a real server refuses succeeds
# twice. A server makes each single-document operation atomic and nothing more, so that is what
# ``SerializedDatabase`` gives: one lock per collection held for the whole of each collection
# method call (a ``find`` cursor is read to the end under the lock, after its sort/skip/limit), and
# nothing held between calls. Thread-race cases therefore run on mongomock with a server's
# guarantees, no stronger ones: a read-then-write made of two calls still races.


class _SerializedCursor:
    """The cursor of :meth:`SerializedCollection.find`: chained calls (``sort``, ``limit``,
    ``skip``, ...) are recorded, and the query runs, to the last document, under the collection
    lock when the cursor is first iterated."""

    def __init__(self, owner: SerializedCollection, args: tuple[Any, ...], kwargs: dict[str, Any]):
        self._owner = owner
        self._args = args
        self._kwargs = kwargs
        self._chain: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self._docs: Iterator[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def chained(*args: Any, **kwargs: Any) -> _SerializedCursor:
            self._chain.append((name, args, kwargs))
            return self

        return chained

    def _materialize(self) -> Iterator[Any]:
        if self._docs is None:
            with self._owner.lock:
                cursor = self._owner.collection.find(*self._args, **self._kwargs)
                for name, args, kwargs in self._chain:
                    cursor = getattr(cursor, name)(*args, **kwargs)
                self._docs = iter(list(cursor))
        return self._docs

    def __iter__(self) -> Iterator[Any]:
        return self._materialize()

    def __next__(self) -> Any:
        return next(self._materialize())

    def next(self) -> Any:
        return next(self._materialize())


class SerializedCollection:
    """A mongomock collection whose every method call holds the collection's lock."""

    def __init__(self, collection: Any, lock: threading.RLock) -> None:
        self.collection = collection
        self.lock = lock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.collection, name)
        if not callable(attr):
            return attr
        if name == "find":
            return lambda *args, **kwargs: _SerializedCursor(self, args, kwargs)

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                result = attr(*args, **kwargs)
                if name in ("aggregate", "find_raw_batches", "list_indexes", "watch"):
                    result = iter(list(result))  # command cursors are lazy: read them here
                return result

        return call

    def __getitem__(self, name: str) -> Any:  # sub-collection (``coll["x"]``)
        return SerializedCollection(self.collection[name], self.lock)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SerializedCollection):
            return bool(self.collection == other.collection)
        return bool(self.collection == other)

    def __hash__(self) -> int:
        return hash(self.collection)


class SerializedDatabase:
    """A mongomock database whose collections are :class:`SerializedCollection` (one lock each,
    shared by every handle on the same collection)."""

    def __init__(self, database: Any) -> None:
        self.database = database
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()

    def _lock(self, name: str) -> threading.RLock:
        with self._guard:
            return self._locks.setdefault(name, threading.RLock())

    def __getitem__(self, name: str) -> SerializedCollection:
        return SerializedCollection(self.database[name], self._lock(name))

    def get_collection(self, name: str, *args: Any, **kwargs: Any) -> SerializedCollection:
        return SerializedCollection(
            self.database.get_collection(name, *args, **kwargs), self._lock(name)
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.database, name)


@pytest.fixture(scope="session")
def mongo_database() -> Any:
    """A mongomock database for the whole session (namespaces isolate tests), serialized per
    collection call (:class:`SerializedDatabase`) so thread races run with a server's atomicity."""
    try:
        import mongomock
    except ImportError:
        _unavailable("mongomock is not installed: pip install -e '.[dev]'")
        raise
    return SerializedDatabase(mongomock.MongoClient()["dynacoord_test"])


@pytest.fixture(scope="session")
def mongodb_database() -> Iterator[Any]:
    """A database on the real MongoDB at ``MONGODB_URI``, dropped at the end."""
    uri = os.environ.get("MONGODB_URI")
    if not uri:
        pytest.skip("MONGODB_URI is not set")
    import pymongo

    client: Any = pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000)
    name = f"dynacoord_test_{uuid.uuid4().hex[:8]}"
    try:
        client.admin.command("ping")
    except pymongo.errors.PyMongoError as exc:
        client.close()
        pytest.fail(f"MONGODB_URI is set but the server does not answer: {exc}", pytrace=False)
    try:
        yield client[name]
    finally:
        client.drop_database(name)
        client.close()


def _mongo_factory(database: Any) -> BackendFactory:
    from dynacoord.backends.mongo import MongoBackend

    def make(*, clock: Clock | None = None, namespace: str | None = None, **kwargs: Any) -> Backend:
        return MongoBackend(database, namespace=namespace or _namespace(), clock=clock, **kwargs)

    return make


@pytest.fixture()
def mongo_backend_factory(mongo_database: Any) -> BackendFactory:
    factory = _mongo_factory(mongo_database)
    factory.mongomock = True  # type: ignore[attr-defined]
    return factory


@pytest.fixture()
def mongodb_backend_factory(mongodb_database: Any) -> BackendFactory:
    factory = _mongo_factory(mongodb_database)
    factory.mongomock = False  # type: ignore[attr-defined]
    return factory


# -- DynamoDB in an application's own single table ------------------------------------------------

#: the layout of a typical single-table design, and a prefix that keeps dynacoord's items apart
LAYOUT = TableLayout(
    pk="PK", sk="SK", index="GSI1", index_pk="GSI1PK", index_sk="GSI1SK", prefix="DC#"
)

#: An application's items beside dynacoord's: other shapes, items in the application's own GSI1
#: partitions, and items whose keys are what dynacoord's keys would be without the prefix (in
#: the namespace ``default`` and in GSI1 partitions of its listings): none may be read, changed
#: or deleted by dynacoord.
FOREIGN_ITEMS: list[dict[str, Any]] = [
    {"PK": {"S": "USER#1"}, "SK": {"S": "PROFILE"}, "name": {"S": "Ada"}},
    {
        "PK": {"S": "USER#1"},
        "SK": {"S": "ORDER#2"},
        "GSI1PK": {"S": "ORDER#open"},
        "GSI1SK": {"S": "2024-01-01"},
        "total": {"N": "12"},
        "ttl": {"N": "1"},  # long expired: DynamoDB's TTL is the application's business
    },
    {"PK": {"S": "LOCK#default#job"}, "SK": {"S": "LOCK"}, "owner": {"S": "the app"}},
    {
        "PK": {"S": "OUTBOX#default#e1"},
        "SK": {"S": "EVENT"},
        "GSI1PK": {"S": "OUTBOX#default#pending#0"},
        "GSI1SK": {"S": "000000000000000#e1"},
        "status": {"S": "pending"},
        "event_id": {"S": "e1"},
    },
    {
        "PK": {"S": "CACHE#default#a"},
        "SK": {"S": "CACHE"},
        "GSI1PK": {"S": "CACHE#default#0"},
        "GSI1SK": {"S": "a"},
    },
]


def _foreign_items(namespace: str) -> list[dict[str, Any]]:
    """:data:`FOREIGN_ITEMS` keyed like what dynacoord's keys in ``namespace`` would be without
    the prefix."""
    items = []
    for item in FOREIGN_ITEMS:
        if "#default#" in item["PK"]["S"]:
            copy = {
                name: {"S": av["S"].replace("#default#", f"#{namespace}#")}
                if name in ("PK", "GSI1PK")
                else av
                for name, av in item.items()
            }
            items.append(copy)
    return items


def _put_items(client: Any, table: str, items: list[dict[str, Any]]) -> None:
    for item in items:
        client.put_item(TableName=table, Item=item)


def _check_foreign_items(client: Any, table: str, items: list[dict[str, Any]]) -> None:
    for item in items:
        key = {"PK": item["PK"], "SK": item["SK"]}
        found = client.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
        assert found == item, f"an application item was changed by dynacoord: {key} -> {found}"


def _layout_factory(client: Any, table: str, items: list[dict[str, Any]]) -> BackendFactory:
    """Backends with :data:`LAYOUT`; each new namespace first gets the application's items
    keyed like its unprefixed keys (added to ``items``, the items checked at the end)."""
    from dynacoord.backends.dynamodb import DynamoDBBackend

    namespaces: set[str] = set()

    def make(*, clock: Clock | None = None, namespace: str | None = None, **kwargs: Any) -> Backend:
        namespace = namespace or _namespace()
        if namespace not in namespaces:
            namespaces.add(namespace)
            copies = _foreign_items(namespace)
            _put_items(client, table, copies)
            items.extend(copies)
        kwargs.setdefault("layout", LAYOUT)
        return DynamoDBBackend(client, table_name=table, namespace=namespace, clock=clock, **kwargs)

    return make


_moto_clients: dict[str, Any] = {}


@pytest.fixture()
def moto_layout_backend_factory() -> Iterator[BackendFactory]:
    """Backends with :data:`LAYOUT` on a moto table that holds :data:`FOREIGN_ITEMS` too."""
    import boto3
    from moto import mock_aws

    from dynacoord.provision import create_table
    from dynacoord.testing import DUMMY_CREDENTIALS

    with mock_aws():
        client = _moto_clients.get("dynamodb")
        if client is None:
            # One client for the session: a client serves every later mock_aws (each with fresh
            # state), and making one costs about as much as the rest of this setup.
            client = _moto_clients["dynamodb"] = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
        create_table(client, "app-table", layout=LAYOUT)
        items = list(FOREIGN_ITEMS)
        _put_items(client, "app-table", items)
        factory = _layout_factory(client, "app-table", items)
        factory.layout_client = client  # type: ignore[attr-defined]
        factory.layout_table = "app-table"  # type: ignore[attr-defined]
        yield factory
        _check_foreign_items(client, "app-table", items)


@pytest.fixture(scope="session")
def dynamodb_layout_table(dynamodb_local: Any) -> tuple[Any, str]:
    """(client, table name) of one table with :data:`LAYOUT` on DynamoDB Local (session)."""
    from dynacoord.provision import create_table
    from dynacoord.testing import unique_name

    client = dynamodb_local.client()
    name = unique_name("layout")
    create_table(client, name, layout=LAYOUT)
    return client, name


@pytest.fixture()
def dynamodb_layout_backend_factory(
    dynamodb_layout_table: tuple[Any, str],
) -> Iterator[BackendFactory]:
    """Backends with :data:`LAYOUT` on DynamoDB Local; the application's items (also under the
    test's namespaces' unprefixed keys) are put before and checked after each test."""
    client, table = dynamodb_layout_table
    items = list(FOREIGN_ITEMS)
    _put_items(client, table, items)
    factory = _layout_factory(client, table, items)
    factory.layout_client = client  # type: ignore[attr-defined]
    factory.layout_table = table  # type: ignore[attr-defined]
    yield factory
    _check_foreign_items(client, table, items)
