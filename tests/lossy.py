"""The ``lossy`` fixture: a backend whose chosen write requests are applied, then lose their response.

Three kinds of fault, armed per write:

* **applied and re-sent** (:meth:`Lossy.lose_next`): the write applies, its answer is lost and the
  client library's own retry sends it again inside the same call (the call returns normally).
* **applied and then raised** (:meth:`Lossy.raise_next`): the write applies, its answer is lost
  and the call *raises* to its caller: botocore after its last attempt (the first timed out after
  it applied, the retries could not connect), redis-py once its retries failed to reconnect,
  pymongo's ``AutoReconnect``. The caller must treat the write as "maybe applied", never as "not
  written", and its next attempt must recognise it.
* **not applied and raised** (``raise_next(applied=False)``): the same error, raised before the
  request left the client: nothing was written.

What it reproduces: a write reaches the server and is applied, the answer never reaches the
client (a read timeout, a reset connection, a 5xx from a proxy), and the client library's *own*
retry sends the same request again. botocore (standard mode), redis-py (``Retry`` on
``ConnectionError``) and pymongo (retryable writes outside a replica set) all do that. A write
that does not recognise its own applied write then answers differently than had the response
arrived (DESIGN.md section 1).

Usage, on every backend (``lossy.kind`` is ``"dynamodb"``, ``"redis"`` or ``"mongo"``)::

    def test_add_recognises_its_own_write(lossy):
        cache = lossy.backend().cache
        lossy.lose_next(operation={"dynamodb": "UpdateItem", "redis": "EVALSHA",
                                   "mongo": "find_one_and_update"}[lossy.kind])
        assert cache.add("k", 1) is True
        assert lossy.lost == 1          # proves the fault fired

How each backend loses a response:

* ``dynamodb`` (DynamoDB Local, the session table): a ``before-send`` hook on a dedicated client
  (standard retry mode, 5 attempts) sends the signed request itself, then raises botocore's
  ``ReadTimeoutError``; botocore retries. Operation names are DynamoDB's (``UpdateItem``,
  ``PutItem``, ``DeleteItem``, ``TransactWriteItems``, ``BatchWriteItem``,
  ``BatchExecuteStatement``: dynacoord sends only conditional writes that way); reads are never
  lost.
* ``redis`` (the session redis-server): a ``Connection`` subclass reads the real reply of the
  command, discards it, disconnects and raises ``redis.exceptions.ConnectionError``; the client
  is built with ``Retry(NoBackoff(), 3)`` so redis-py re-sends the command. Names are Redis
  command names (``EVALSHA``, ``SET``, ``INCR``; a MULTI/EXEC pipeline is ``EXEC``, its reply is
  the one lost); ``Lossy.script(source)`` names the calls of one Lua script only
  (``EVALSHA:<sha1>``), for a test that must lose a script's answer and not another's. Read-only and connection-management commands are never lost.
* ``mongo`` (mongomock, serialized per call like the contract fixtures; ``mongodb``: a real
  server at ``MONGODB_URI``, through the same proxy): a collection proxy
  applies the write, then applies the *same call* again and returns the second call's result
  (or raises its error, e.g. ``DuplicateKeyError`` for a re-sent insert): what a retried write
  without server-side deduplication does. Names are collection method names (``insert_one``,
  ``update_one``, ``find_one_and_update``, ``bulk_write``...).

How each backend raises (``raise_next``):

* ``dynamodb``: the hook sends the request for real (``applied=True``) or not at all, then raises
  botocore's ``EndpointConnectionError``; a ``needs-retry`` hook registered first answers "no
  retry" for that very exception, so it reaches the caller as it does after botocore's last
  attempt (without the backoff's sleeps).
* ``redis``: the reply is read for real (``applied=True``), or the command is not sent at all;
  then ``ConnectionError`` is raised, and each re-send of the same packed command by redis-py's
  retry (up to :data:`REDIS_RETRIES`, or until this thread sends another write) fails to
  "connect" before anything is sent: the error reaches the caller after the client's retries.
* ``mongo``: the call is made (``applied=True``) or not, then ``pymongo.errors.AutoReconnect``
  is raised.

Rules shared by all three:

* Only a write whose first attempt *succeeded* loses its response (HTTP 200 on DynamoDB, a reply
  that is not an error on Redis, a call that did not raise on Mongo): a refused write (e.g.
  ``ConditionalCheckFailedException``) is answered normally and the fault stays armed for the
  next matching write. A Redis script's own refusal is a normal reply, so it can be lost.
* ``count`` counts distinct requests: the client's retry of a request whose response was lost is
  delivered normally (it is never lost itself).
* ``lost`` is the number of responses dropped so far; assert it to prove the fault fired.
  ``raised`` counts the calls made to raise (both ``raise_next`` kinds; an ``applied=True`` one
  counts in ``lost`` too).
* An ``applied=False`` fault fires on the next matching write whatever its answer would have
  been (nothing is sent).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dynacoord._backend import Backend
from dynacoord._clock import Clock
from dynacoord.testing import DynamoDBLocal, unique_name

__all__ = [
    "DYNAMODB_WRITES",
    "LOSSY_KINDS",
    "MONGO_WRITES",
    "REDIS_NOT_WRITES",
    "REDIS_RETRIES",
    "Lossy",
    "lossy",
]

#: re-sends redis-py makes of a command that failed with ConnectionError (``Retry(NoBackoff(), 3)``)
REDIS_RETRIES = 3

#: the kinds of fault: applied and re-sent by the client, applied then raised, raised unsent
RESENT, RAISED, UNSENT = "resent", "raised", "unsent"

#: DynamoDB operations that can lose their response (everything else is a read).
DYNAMODB_WRITES = frozenset(
    {
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "TransactWriteItems",
        "BatchWriteItem",
        "BatchExecuteStatement",
    }
)

#: Redis commands that never lose their response: read-only, script management, connection.
REDIS_NOT_WRITES = frozenset(
    {
        # reads
        "GET", "MGET", "GETRANGE", "STRLEN", "HGET", "HMGET", "HGETALL", "HKEYS", "HVALS",
        "HLEN", "HEXISTS", "HSTRLEN", "HSCAN", "EXISTS", "TTL", "PTTL", "EXPIRETIME",
        "PEXPIRETIME", "TYPE", "SCAN", "KEYS", "RANDOMKEY", "DBSIZE", "ZRANGE", "ZRANGEBYSCORE",
        "ZRANGEBYLEX", "ZREVRANGE", "ZREVRANGEBYSCORE", "ZREVRANGEBYLEX", "ZSCORE", "ZMSCORE",
        "ZRANK", "ZREVRANK", "ZCARD", "ZCOUNT", "ZLEXCOUNT", "ZSCAN", "SMEMBERS", "SISMEMBER",
        "SMISMEMBER", "SCARD", "SSCAN", "LRANGE", "LLEN", "LINDEX", "XRANGE", "XREVRANGE",
        "XLEN", "EVALSHA_RO", "EVAL_RO", "FCALL_RO", "OBJECT", "MEMORY", "DUMP", "TIME",
        # script management and the connection itself
        "SCRIPT", "PING", "ECHO", "HELLO", "AUTH", "SELECT", "CLIENT", "INFO", "COMMAND",
        "CONFIG", "QUIT", "RESET", "WATCH", "UNWATCH", "MULTI", "DISCARD", "READONLY",
        "READWRITE", "FLUSHALL", "FLUSHDB",
        # cluster topology (a RedisCluster client asks again after a lost reply)
        "CLUSTER", "ASKING",
    }
)  # fmt: skip

#: Mongo collection methods that can lose their response (replayed once).
MONGO_WRITES = frozenset(
    {
        "insert_one",
        "insert_many",
        "update_one",
        "update_many",
        "replace_one",
        "delete_one",
        "delete_many",
        "find_one_and_update",
        "find_one_and_replace",
        "find_one_and_delete",
        "bulk_write",
    }
)


class _Faults:
    """The armed faults and the count of lost responses, shared by the threads of one test."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # one per fault: an operation (or None: any), what runs in the gap, and the kind
        self._slots: list[tuple[str | None, Callable[[], object] | None, str]] = []
        self._retrying = threading.local()  # per thread: fingerprint of the request just lost
        self.lost = 0
        self.raised = 0
        self.log: list[tuple[str, bool]] = []  # (operation, lost) of every write seen

    def arm(
        self,
        count: int,
        operation: str | None,
        then: Callable[[], object] | None = None,
        kind: str = RESENT,
    ) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an int >= 1, got {count!r}")
        with self._lock:
            self._slots.extend([(operation, then, kind)] * count)

    def is_retry(self, fingerprint: Any) -> bool:
        """True (once) when this thread re-sends the request whose response was just lost."""
        previous = getattr(self._retrying, "fingerprint", None)
        self._retrying.fingerprint = None
        return previous is not None and previous == fingerprint

    def _first(self, operation: str, detail: str | None = None) -> int | None:
        """The first armed slot for ``operation``: armed for any write, for the operation, or for
        the operation with this ``detail`` (``"EVALSHA:<sha>"``: one Lua script's calls)."""
        qualified = None if detail is None else f"{operation}:{detail}"
        return next(
            (
                i
                for i, (slot, _, _) in enumerate(self._slots)
                if slot in (None, operation) or (qualified is not None and slot == qualified)
            ),
            None,
        )

    def wants(self, operation: str, detail: str | None = None) -> str | None:
        """The kind of fault a (successful) write of ``operation`` is to suffer (None: none):
        consumes the first armed slot that matches, and runs the slot's ``then`` (the write is
        applied, its retry or the caller's error not there yet)."""
        with self._lock:
            index = self._first(operation, detail)
            if index is None:
                return None
            _, then, kind = self._slots.pop(index)
        if then is not None:
            then()
        return kind

    def unsent(self, operation: str, detail: str | None = None) -> bool:
        """Whether the next write of ``operation`` is to raise before it is sent (consumes the
        slot and runs its ``then``)."""
        with self._lock:
            index = self._first(operation, detail)
            if index is None or self._slots[index][2] != UNSENT:
                return False
            then = self._slots.pop(index)[1]
        if then is not None:
            then()
        return True

    def armed_for(self, operation: str, detail: str | None = None) -> bool:
        with self._lock:
            return self._first(operation, detail) is not None

    def record(self, operation: str, lost: bool, fingerprint: Any = None) -> None:
        with self._lock:
            self.log.append((operation, lost))
            if lost:
                self.lost += 1
        if lost and fingerprint is not None:
            self._retrying.fingerprint = fingerprint

    def record_raised(self, operation: str, applied: bool) -> None:
        with self._lock:
            self.log.append((operation, applied))
            self.raised += 1
            if applied:
                self.lost += 1


class Lossy:
    """A factory of backends of one kind wired through a client that loses chosen responses."""

    kind: str

    def __init__(self, kind: str, faults: _Faults, make: Callable[..., Backend]) -> None:
        self.kind = kind
        self._faults = faults
        self._make = make

    def backend(
        self, *, clock: Clock | None = None, namespace: str | None = None, **kwargs: Any
    ) -> Backend:
        """A backend in a fresh namespace (unless given) wired through the lossy client."""
        return self._make(clock=clock, namespace=namespace or unique_name("lossy"), **kwargs)

    def lose_next(
        self,
        count: int = 1,
        *,
        operation: str | None = None,
        then: Callable[[], object] | None = None,
    ) -> None:
        """The next ``count`` WRITE requests (only those named ``operation`` when given) are
        applied for real, then their response is lost, and the client's own retry sends them
        again (see the module docstring for names and rules). ``then`` runs in the gap, after
        the write applied and before its retry: another process's request that lands there."""
        self._faults.arm(count, operation, then)

    def raise_next(
        self,
        count: int = 1,
        *,
        operation: str | None = None,
        applied: bool = True,
        then: Callable[[], object] | None = None,
    ) -> None:
        """The next ``count`` WRITE requests (only those named ``operation`` when given) raise
        to their caller the error the client raises once its retries are spent: after being
        applied for real (``applied=True``: only a write that succeeded, as for
        :meth:`lose_next`) or without being sent (``applied=False``). ``then`` runs after the
        write applied (or would have been sent) and before the caller sees the error."""
        self._faults.arm(count, operation, then, RAISED if applied else UNSENT)

    @staticmethod
    def script(source: str) -> str:
        """The ``operation`` of one Redis Lua script's calls (``"EVALSHA:<its sha1>"``): a fault
        armed with it is taken by that script only, not by another script of the same call
        (the worker's poll is a script too)."""
        return "EVALSHA:" + hashlib.sha1(source.encode("utf-8")).hexdigest()

    @property
    def lost(self) -> int:
        """Responses dropped so far (``raise_next(applied=True)`` included)."""
        return self._faults.lost

    @property
    def raised(self) -> int:
        """Calls made to raise so far by :meth:`raise_next` (either kind)."""
        return self._faults.raised

    @property
    def log(self) -> list[tuple[str, bool]]:
        """``(operation, lost)`` of every write request seen so far (for failure messages)."""
        return list(self._faults.log)

    def __repr__(self) -> str:
        return f"Lossy(kind={self.kind!r}, lost={self.lost}, raised={self.raised})"


# -- DynamoDB -------------------------------------------------------------------------------------


class _RawBody:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def _dynamodb_lossy_client(dynamodb_local: DynamoDBLocal, faults: _Faults) -> Any:
    import urllib3
    from botocore.awsrequest import AWSResponse
    from botocore.config import Config
    from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

    http = urllib3.PoolManager(maxsize=32)
    client = dynamodb_local.client(
        config=Config(
            retries={"mode": "standard", "max_attempts": 5},
            max_pool_connections=64,
            connect_timeout=5,
            read_timeout=30,
        )
    )
    # the errors raised to the caller as after botocore's last attempt: never retried
    final: threading.local = threading.local()

    def raise_final(url: str) -> None:
        error = EndpointConnectionError(endpoint_url=url)
        final.error = error
        raise error

    def hook(request: Any, event_name: str, **_: Any) -> Any:
        operation = event_name.rsplit(".", 1)[-1]
        if operation not in DYNAMODB_WRITES:
            return None
        body = request.body if isinstance(request.body, bytes) else bytes(request.body or b"")
        fingerprint = (operation, body)
        if faults.is_retry(fingerprint) or not faults.armed_for(operation):
            faults.record(operation, False)
            return None
        if faults.unsent(operation):
            faults.record_raised(operation, False)
            raise_final(request.url)
        # Send the signed request for real: the write is applied (or refused) by the server.
        real = http.request(
            request.method,
            request.url,
            body=body,
            headers=dict(request.headers),
            retries=False,
            preload_content=True,
        )
        kind = faults.wants(operation) if real.status == 200 else None
        if kind == RAISED:
            faults.record_raised(operation, True)
            raise_final(request.url)
        if kind is not None:
            faults.record(operation, True, fingerprint)
            raise ReadTimeoutError(endpoint_url=request.url)
        # A refusal (or a fault already taken by another thread): hand the real answer back.
        faults.record(operation, False)
        return AWSResponse(request.url, real.status, dict(real.headers), _RawBody(real.data))

    def no_retry(caught_exception: Any = None, **_: Any) -> Any:
        if caught_exception is not None and caught_exception is getattr(final, "error", None):
            final.error = None
            return False  # botocore's answer after its last attempt: raise it
        return None

    client.meta.events.register("before-send.dynamodb", hook)
    client.meta.events.register_first("needs-retry.dynamodb", no_retry)
    return client


# -- Redis ----------------------------------------------------------------------------------------


def _command_names(packed: Any) -> list[tuple[str, str | None]]:
    """The command names (first argument, upper case) of a packed RESP request, each with its
    script's sha1 for ``EVALSHA`` (else None)."""
    data = b"".join(bytes(chunk) for chunk in ([packed] if isinstance(packed, bytes) else packed))
    names: list[tuple[str, str | None]] = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 1] != b"*":
            raise AssertionError(f"unexpected RESP request at {pos}: {data[pos : pos + 20]!r}")
        end = data.index(b"\r\n", pos)
        count = int(data[pos + 1 : end])
        pos = end + 2
        for i in range(count):
            end = data.index(b"\r\n", pos)
            size = int(data[pos + 1 : end])
            text = data[end + 2 : end + 2 + size].decode("utf-8", "replace")
            if i == 0:
                names.append((text.upper(), None))
            elif i == 1 and names[-1][0] == "EVALSHA":
                names[-1] = ("EVALSHA", text.lower())
            pos = end + 2 + size + 2
    return names


def _redis_connection_class(faults: _Faults) -> type:
    import redis
    from redis.exceptions import ResponseError

    # per thread: the packed command whose call is to raise, and how many re-sends of it by
    # the client's retry still fail before anything is sent
    failing = threading.local()

    def fail(fingerprint: bytes, applied: bool, name: str) -> None:
        failing.fingerprint, failing.left = fingerprint, REDIS_RETRIES
        what = "the reply was lost" if applied else "not sent"
        raise redis.exceptions.ConnectionError(f"injected: {name}, {what}, connection refused")

    class LossyConnection(redis.Connection):
        """Reads each reply for real; a lossable one is then dropped with a ConnectionError."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._expect: deque[tuple[str, bool, bytes, str | None]] = deque()

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            fingerprint = b"".join(
                bytes(c) for c in ([command] if isinstance(command, bytes) else command)
            )
            names = _command_names(command)
            expect: list[tuple[str, bool, bytes, str | None]] = []
            in_multi = False
            multi_writes = False
            for name, sha in names:
                if name == "MULTI":
                    in_multi, multi_writes = True, False
                    expect.append((name, False, fingerprint, None))
                elif name == "EXEC" and in_multi:
                    in_multi = False
                    expect.append((name, multi_writes, fingerprint, None))
                elif in_multi:  # the reply is QUEUED: nothing applied yet
                    multi_writes = multi_writes or name not in REDIS_NOT_WRITES
                    expect.append((name, False, fingerprint, sha))
                else:
                    expect.append((name, name not in REDIS_NOT_WRITES, fingerprint, sha))
            writes = [(name, sha) for name, write, _, sha in expect if write]
            if writes and getattr(failing, "fingerprint", None) is not None:
                if failing.fingerprint == fingerprint and failing.left > 0:
                    failing.left -= 1  # the client's retry of a call that is to raise
                    self.disconnect()
                    raise redis.exceptions.ConnectionError("injected: connection refused")
                failing.fingerprint = None
            for name, sha in writes:
                if faults.unsent(name, sha):
                    faults.record_raised(name, False)
                    self.disconnect()
                    fail(fingerprint, False, name)
            super().send_packed_command(command, check_health=check_health)
            # Recorded after sending: a health check inside the send reads its own reply first.
            self._expect.extend(expect)

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            if not self._expect:
                return super().read_response(*args, **kwargs)
            name, write, fingerprint, sha = self._expect.popleft()
            if not write:
                return super().read_response(*args, **kwargs)
            if faults.is_retry((name, fingerprint)) or not faults.armed_for(name, sha):
                faults.record(name, False)
                return super().read_response(*args, **kwargs)
            try:
                reply = super().read_response(*args, **kwargs)
            except ResponseError:
                faults.record(name, False)  # refused: not applied, the fault stays armed
                raise
            kind = faults.wants(name, sha)
            if kind is None:
                faults.record(name, False)
                return reply
            if kind == RAISED:
                faults.record_raised(name, True)
                self.disconnect()
                fail(fingerprint, True, name)
            faults.record(name, True, (name, fingerprint))
            self.disconnect()
            raise redis.exceptions.ConnectionError(f"injected: the reply to {name} was lost")

        def disconnect(self, *args: Any, **kwargs: Any) -> None:
            self._expect.clear()
            super().disconnect(*args, **kwargs)

    return LossyConnection


def _redis_lossy_client(port: int, faults: _Faults) -> Any:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    pool = redis.ConnectionPool(
        host="127.0.0.1",
        port=port,
        connection_class=_redis_connection_class(faults),
        retry=Retry(NoBackoff(), 3),
        retry_on_error=[redis.exceptions.ConnectionError],
    )
    return redis.Redis(connection_pool=pool)


def _redis_cluster_lossy_client(cluster: Any, faults: _Faults) -> Any:
    """A ``RedisCluster`` whose node connections lose replies; its own retry (3 attempts, no
    backoff) re-sends the command, as the single-node client's does. Built ``from_url``: only then
    does redis-py give each node a connection pool of the ``connection_class`` passed."""
    from redis.backoff import NoBackoff
    from redis.cluster import RedisCluster
    from redis.retry import Retry

    return RedisCluster.from_url(
        f"redis://127.0.0.1:{cluster.ports[0]}",
        connection_class=_redis_connection_class(faults),
        retry=Retry(NoBackoff(), 3),
    )


# -- Mongo ----------------------------------------------------------------------------------------


class LossyCollection:
    """A collection whose write methods, when armed, run twice (the second call is the retry)
    and return the second call's result."""

    def __init__(self, collection: Any, faults: _Faults) -> None:
        self.collection = collection
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.collection, name)
        if name not in MONGO_WRITES or not callable(attr):
            return attr
        faults = self._faults

        def call(*args: Any, **kwargs: Any) -> Any:
            from pymongo.errors import AutoReconnect

            if faults.unsent(name):
                faults.record_raised(name, False)
                raise AutoReconnect(f"injected: {name} not sent, connection refused")
            first = attr(*args, **kwargs)  # raises when refused: nothing applied, still armed
            kind = faults.wants(name)
            if kind is None:
                faults.record(name, False)
                return first
            if kind == RAISED:
                faults.record_raised(name, True)
                raise AutoReconnect(f"injected: {name} applied, its answer lost")
            faults.record(name, True)
            return attr(*args, **kwargs)  # the retry, as the server sees it

        return call

    def __getitem__(self, name: str) -> LossyCollection:
        return LossyCollection(self.collection[name], self._faults)


class LossyDatabase:
    """A database whose collections are :class:`LossyCollection`."""

    def __init__(self, database: Any, faults: _Faults) -> None:
        self.database = database
        self._faults = faults

    def __getitem__(self, name: str) -> LossyCollection:
        return LossyCollection(self.database[name], self._faults)

    def get_collection(self, name: str, *args: Any, **kwargs: Any) -> LossyCollection:
        return LossyCollection(self.database.get_collection(name, *args, **kwargs), self._faults)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.database, name)


# -- the fixture ----------------------------------------------------------------------------------


#: the lossy fixture's parameters: ``mongodb`` (a real server) only when ``MONGODB_URI`` is set
LOSSY_KINDS = [
    "dynamodb",
    "redis",
    "redis_cluster",
    "mongo",
    *(["mongodb"] if os.environ.get("MONGODB_URI") else []),
]


@pytest.fixture(params=LOSSY_KINDS)
def lossy(request: pytest.FixtureRequest) -> Iterator[Lossy]:
    """A :class:`Lossy` of one backend kind (parametrized over dynamodb, redis, redis_cluster,
    mongo, and mongodb when ``MONGODB_URI`` is set; ``redis_cluster`` is the 3-primary cluster of
    tests/redis_cluster_fixtures.py and its ``kind`` is ``"redis"``: the same command names;
    ``mongodb`` is the real server's database (tests/backends_fixtures.py ``mongodb_database``)
    behind the same :class:`LossyDatabase` as mongomock's, and its ``kind`` is ``"mongo"``)."""
    kind: str = request.param
    faults = _Faults()
    if kind == "dynamodb":
        from dynacoord.backends.dynamodb import DynamoDBBackend

        dynamodb_local = request.getfixturevalue("dynamodb_local")
        _, table = request.getfixturevalue("ddb_table")
        client = _dynamodb_lossy_client(dynamodb_local, faults)

        def make_ddb(**kwargs: Any) -> Backend:
            return DynamoDBBackend(client, table_name=table, **kwargs)

        yield Lossy(kind, faults, make_ddb)
        client.close()
    elif kind == "redis":
        from dynacoord.backends.redis import RedisBackend

        server = request.getfixturevalue("redis_server")
        redis_client = _redis_lossy_client(server.port, faults)

        def make_redis(**kwargs: Any) -> Backend:
            return RedisBackend(redis_client, **kwargs)

        yield Lossy(kind, faults, make_redis)
        redis_client.close()
    elif kind == "redis_cluster":
        from dynacoord.backends.redis import RedisBackend

        cluster_client = _redis_cluster_lossy_client(
            request.getfixturevalue("redis_cluster"), faults
        )

        def make_cluster(**kwargs: Any) -> Backend:
            return RedisBackend(cluster_client, **kwargs)

        yield Lossy("redis", faults, make_cluster)
        cluster_client.close()
    elif kind in ("mongo", "mongodb"):
        from dynacoord.backends.mongo import MongoBackend

        # The same wrapper on mongomock and on a real pymongo database: it wraps the collection
        # objects the backend asks for, and a pymongo Collection's write methods are called and
        # answered as mongomock's are (the same names, arguments and errors).
        source = "mongo_database" if kind == "mongo" else "mongodb_database"
        database = LossyDatabase(request.getfixturevalue(source), faults)

        def make_mongo(**kwargs: Any) -> Backend:
            return MongoBackend(database, **kwargs)

        yield Lossy("mongo", faults, make_mongo)
    else:  # pragma: no cover
        raise AssertionError(kind)
