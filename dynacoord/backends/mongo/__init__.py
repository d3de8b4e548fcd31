"""The MongoDB backend: the same key schema and primitives as DynamoDB, in one collection.

Install the extra: ``pip install 'dynacoord[mongo]'``. Pass a ``pymongo`` database; dynacoord
never connects at import time::

    import pymongo
    from dynacoord.backends.mongo import MongoBackend

    db = pymongo.MongoClient("mongodb://localhost:27017/?replicaSet=rs0")["app"]
    backend = MongoBackend(db, namespace="orders")
    backend.ensure_indexes()          # idempotent; also done on first use unless auto_indexes=False

Every item is one document with ``pk``/``sk`` (and ``gsi1pk``/``gsi1sk`` for listed kinds) as in
DESIGN.md. The unique (pk, sk) index is what makes the upserting compare-and-set writes safe, so
the backend creates the indexes on first use unless told not to (then call
:meth:`MongoBackend.ensure_indexes` yourself, for example at deploy time).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, NoReturn

try:
    import pymongo
    import pymongo.errors
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError("MongoBackend needs pymongo: pip install 'dynacoord[mongo]'") from exc

from ..._backend import Backend
from ..._clock import Clock
from ...errors import BackendError, ConfigurationError, NotSupportedError
from ...metrics import Metrics
from ._collection import MongoCollection

if TYPE_CHECKING:
    from ...breaker import BreakerStore
    from ...cache import CacheStore
    from ...checkpoints import CheckpointStore
    from ...counters import CounterStore
    from ...idempotency import IdempotencyStore
    from ...locks import LockStore
    from ...outbox import OutboxStore
    from ...ratelimit import RateLimitStore
    from ...runs import RunStore
    from ...semaphore import SemaphoreStore

__all__ = ["DEFAULT_SERVER_SELECTION_TIMEOUT_MS", "INDEXES", "MongoBackend"]

#: name -> (keys, options) of every index the collection needs.
INDEXES: dict[str, tuple[list[tuple[str, int]], dict[str, Any]]] = {
    "pk_sk": ([("pk", pymongo.ASCENDING), ("sk", pymongo.ASCENDING)], {"unique": True}),
    "gsi1": (
        [("gsi1pk", pymongo.ASCENDING), ("gsi1sk", pymongo.ASCENDING)],
        {"partialFilterExpression": {"gsi1pk": {"$exists": True}}},
    ),
    "ttl": ([("expires_at", pymongo.ASCENDING)], {"expireAfterSeconds": 0}),
}


#: ``serverSelectionTimeoutMS`` that :meth:`MongoBackend.from_env` gives its ``MongoClient``
#: unless the URI sets one: how long a call waits for a reachable server before it fails with a
#: :class:`~dynacoord.errors.BackendError` (pymongo's own default is 30 s).
DEFAULT_SERVER_SELECTION_TIMEOUT_MS = 5000


class MongoBackend(Backend):
    """dynacoord on MongoDB (pymongo ``Database``, MongoDB >= 4.2).

    ``lock_fence_grace`` (seconds) keeps a released or expired lock's document that long so
    fencing tokens keep growing from the stored value; ``gc_grace`` (seconds) is how long other
    expired documents linger before the TTL monitor may delete them (they are treated as absent
    from their expiry on, whatever the monitor has done).
    """

    kind = "mongo"

    def __init__(
        self,
        database: Any,
        *,
        namespace: str = "default",
        collection: str = "dynacoord",
        clock: Clock | None = None,
        lock_fence_grace: int = 3600,
        gc_grace: int = 60,
        auto_indexes: bool = True,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(namespace=namespace, clock=clock, metrics=metrics)
        if database is None:
            raise ConfigurationError("database is required: pass pymongo.MongoClient(...)[name]")
        _check_database(database)
        if not isinstance(collection, str) or not collection or "$" in collection:
            raise ConfigurationError(f"collection must be a non-empty name, got {collection!r}")
        for name, value in (("lock_fence_grace", lock_fence_grace), ("gc_grace", gc_grace)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"{name} must be an int >= 0 (seconds), got {value!r}")
        self.database = database
        self.collection_name = collection
        self.lock_fence_grace = lock_fence_grace
        self.gc_grace = gc_grace
        self.auto_indexes = auto_indexes
        self.coll = MongoCollection(
            database[collection], gc_grace_ms=gc_grace * 1000, metrics=self.metrics
        )
        self._indexes_ready = False
        self._index_lock = threading.Lock()

    @classmethod
    def from_env(
        cls, *, client: Any = None, clock: Clock | None = None, **kwargs: Any
    ) -> MongoBackend:
        """Build a backend from the environment (as ``DynamoDBBackend.from_env``).

        Reads ``DYNACOORD_MONGODB_URI`` (required unless ``client``, a ``MongoClient``, is
        given; any ``mongodb://`` or ``mongodb+srv://`` URI), ``DYNACOORD_MONGODB_DATABASE``
        (default: the database named in the URI, else ``dynacoord``),
        ``DYNACOORD_MONGODB_COLLECTION`` (default ``dynacoord``) and ``DYNACOORD_NAMESPACE``
        (default ``default``). Other keyword arguments go to the constructor (``metrics=``...).

        The client it builds waits at most :data:`DEFAULT_SERVER_SELECTION_TIMEOUT_MS` (5 s) for
        a reachable server, unless the URI sets ``serverSelectionTimeoutMS`` itself.
        """
        import os

        if client is None:
            uri = os.environ.get("DYNACOORD_MONGODB_URI")
            if not uri:
                raise ConfigurationError(
                    "DYNACOORD_MONGODB_URI is not set: set it to the server's URI "
                    "(mongodb://host:27017/app?replicaSet=rs0) or pass client="
                )
            options: dict[str, Any] = {}
            if "serverselectiontimeoutms=" not in uri.lower():
                options["serverSelectionTimeoutMS"] = DEFAULT_SERVER_SELECTION_TIMEOUT_MS
            client = pymongo.MongoClient(uri, **options)
        name = os.environ.get("DYNACOORD_MONGODB_DATABASE")
        database = client[name] if name else client.get_default_database(default="dynacoord")
        kwargs.setdefault(
            "collection", os.environ.get("DYNACOORD_MONGODB_COLLECTION") or "dynacoord"
        )
        kwargs.setdefault("namespace", os.environ.get("DYNACOORD_NAMESPACE") or "default")
        return cls(database, clock=clock, **kwargs)

    def __repr__(self) -> str:
        return (
            f"MongoBackend(database={getattr(self.database, 'name', '?')!r}, "
            f"collection={self.collection_name!r}, namespace={self.namespace!r})"
        )

    def ensure_indexes(self) -> list[str]:
        """Create the indexes the stores rely on (idempotent); return their names.

        No reachable server within the client's ``serverSelectionTimeoutMS`` raises
        :class:`~dynacoord.errors.BackendError` naming the servers and that setting.
        """
        names = []
        try:
            for name, (keys, options) in INDEXES.items():
                names.append(
                    self.coll.call("ensure_indexes", "create_index", keys, name=name, **options)
                )
        except BackendError as exc:
            cause = exc.__cause__
            if isinstance(cause, pymongo.errors.ServerSelectionTimeoutError):
                raise _unreachable(self.database, cause, "ensure_indexes") from cause
            raise
        self._indexes_ready = True
        return names

    def _ready(self) -> MongoCollection:
        if self.auto_indexes and not self._indexes_ready:
            with self._index_lock:
                if not self._indexes_ready:
                    self.ensure_indexes()
        return self.coll

    # -- store factories ------------------------------------------------------------------------

    def _lock_store(self, namespace: str) -> LockStore:
        from .locks import MongoLockStore

        return MongoLockStore(self._ready(), namespace, fence_grace_s=self.lock_fence_grace)

    def _checkpoint_store(self, namespace: str) -> CheckpointStore:
        from .checkpoints import MongoCheckpointStore

        return MongoCheckpointStore(self._ready(), namespace)

    def _idempotency_store(self, namespace: str) -> IdempotencyStore:
        from .idempotency import MongoIdempotencyStore

        return MongoIdempotencyStore(self._ready(), namespace)

    def _cache_store(self, namespace: str) -> CacheStore:
        from .cache import MongoCacheStore

        return MongoCacheStore(self._ready(), namespace, self.clock)

    def _breaker_store(self, namespace: str) -> BreakerStore:
        from .breaker import MongoBreakerStore

        return MongoBreakerStore(self._ready(), namespace)

    def _counter_store(self, namespace: str) -> CounterStore:
        from .counters import MongoCounterStore

        return MongoCounterStore(self._ready(), namespace)

    def _run_store(self, namespace: str) -> RunStore:
        from .runs import MongoRunStore

        return MongoRunStore(self._ready(), namespace)

    def _semaphore_store(self, namespace: str) -> SemaphoreStore:
        from .semaphore import MongoSemaphoreStore

        return MongoSemaphoreStore(self._ready(), namespace, fence_grace_s=self.lock_fence_grace)

    def _rate_limit_store(self, namespace: str) -> RateLimitStore:
        from .ratelimit import MongoRateLimitStore

        return MongoRateLimitStore(self._ready(), namespace)

    def _outbox_store(self, namespace: str) -> OutboxStore:
        from .outbox import MongoOutboxStore

        return MongoOutboxStore(self._ready(), namespace)

    def transaction(self, *, client_request_token: str | None = None) -> NoReturn:
        """Not available: ``backend.transaction()`` is DynamoDB-only (raises NotSupportedError)."""
        # Never a silent non-atomic fallback: refuse clearly instead.
        raise NotSupportedError(
            "backend.transaction() is DynamoDB-only: "
            "the collector commits DynamoDB TransactWriteItems (writes to other DynamoDB tables with DynamoDB condition expressions), which have no MongoDB equivalent; use a pymongo session transaction for your own documents and backend.outbox.publish() for events"
        )


def _check_database(database: Any) -> None:
    """Refuse what is not a pymongo ``Database`` (or one that acts like it: mongomock, a
    wrapper), naming the usual mistakes: a ``MongoClient``, a ``Collection``, a URI string.

    pymongo's ``Database`` and ``Collection`` answer any attribute name with a sub-collection,
    so those two are recognised by type; anything else must have ``get_collection`` and
    ``__getitem__``."""
    from pymongo.collection import Collection

    name = type(database).__name__
    if isinstance(database, pymongo.MongoClient) or name == "MongoClient":
        raise ConfigurationError(
            "MongoBackend needs a database, not a MongoClient: pass client['app'] (or "
            "client.get_default_database())"
        )
    if isinstance(database, Collection) or name == "Collection":
        raise ConfigurationError(
            "MongoBackend needs a database, not a Collection: pass its database "
            "(collection.database) and the collection's name as collection="
        )
    if not callable(getattr(database, "get_collection", None)) or not hasattr(
        type(database), "__getitem__"
    ):
        raise ConfigurationError(
            "MongoBackend needs a pymongo database, pymongo.MongoClient(uri)['app']; got a "
            f"{name}"
            + (" (a URI: use MongoBackend.from_env())" if isinstance(database, str) else "")
        )


def _unreachable(database: Any, exc: Exception, what: str) -> BackendError:
    """A short error for "no server answered in time": the servers, why, the bound and the
    setting to raise; not pymongo's topology description (the cause, chained, keeps it)."""
    text = str(exc)
    reason = text.split(", Timeout: ", 1)[0].split(" (configured timeouts:", 1)[0]
    client: Any = getattr(database, "client", None)
    timeout = getattr(getattr(client, "options", None), "server_selection_timeout", None)
    try:
        servers = ", ".join(
            f"{host}:{port}" for host, port in client.topology_description.server_descriptions()
        )
    except Exception:  # not a pymongo client: the reason names the servers
        servers = ""
    within = f" within {timeout:g} s (serverSelectionTimeoutMS)" if timeout is not None else ""
    at = f" at {servers}" if servers and servers not in reason else ""
    return BackendError(
        f"MongoDB unreachable during {what}: no server answered{within}{at}: {reason}. Check that "
        "the server runs and the URI (DYNACOORD_MONGODB_URI with from_env); to wait longer, "
        "raise serverSelectionTimeoutMS in the URI or on your MongoClient",
        code=type(exc).__name__,
    )
