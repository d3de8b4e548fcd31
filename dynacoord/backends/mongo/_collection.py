"""The door of the MongoDB stores, :class:`MongoCollection`: the only holder of the collection,
whose :meth:`MongoCollection.send` is the one request path (the request, metrics, error
translation); and what the stores share: filters, request tokens, counting slots.

Layout (DESIGN.md section 2): one collection; every item is one document with the ``pk``/``sk``
strings of the key schema (plus ``gsi1pk``/``gsi1sk`` for listed kinds), a unique (pk, sk)
index, an index on (gsi1pk, gsi1sk) and a TTL index on the ``expires_at`` date.

Expiry: the truth is ``expires_at_ms`` compared with the caller's ``now_ms``, as on DynamoDB.
``expires_at`` only feeds the TTL monitor (which runs every 60 s): it is set to the item's
remaining lifetime plus a grace period from the real wall clock, so an injected test clock can
never make the monitor delete a live item.

Atomicity: every conditional write is one single-document ``update_one``/``find_one_and_update``
with the condition in its filter. Values written through aggregation-pipeline updates are
wrapped in ``$literal`` so a user string starting with ``$`` is never read as a field path.
"""

from __future__ import annotations

import datetime
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..._writers import DEFAULT_WINDOW_MS, PRUNE_AT, Slot, lease, release, token_ms
from ...errors import BackendError, TableNotReadyError
from ...metrics import Metrics, measure_request

__all__ = ["MongoCollection", "literal", "live_filter"]

logger = logging.getLogger("dynacoord.backends.mongo")


def live_filter(now_ms: int) -> dict[str, Any]:
    """The query filter for "live at ``now_ms``": no ``expires_at_ms``, or one ahead of now."""
    return {"$or": [{"expires_at_ms": {"$exists": False}}, {"expires_at_ms": {"$gt": now_ms}}]}


def literal(value: Any) -> dict[str, Any]:
    """A constant in an aggregation expression (never interpreted as ``$field``)."""
    return {"$literal": value}


def _translated(exc: Exception, what: str) -> Exception | None:
    """The dynacoord error for a pymongo error; None for a refusal the stores catch themselves:
    ``DuplicateKeyError`` (how an upsert says that the item exists but did not match the
    condition) and a ``BulkWriteError`` refused only by duplicate keys (how ``insert_many``
    reports a clash)."""
    from pymongo import errors

    if isinstance(exc, errors.DuplicateKeyError):
        return None
    if isinstance(exc, errors.BulkWriteError):
        write_errors = exc.details.get("writeErrors") or []
        if write_errors and all(e.get("code") == 11000 for e in write_errors):
            return None
        return BackendError(f"MongoDB error during {what}: {exc}", code=str(exc.code))
    if isinstance(exc, errors.OperationFailure):
        if exc.code == 26:  # NamespaceNotFound
            return TableNotReadyError(
                f"MongoDB collection missing during {what}: call backend.ensure_indexes()"
            )
        return BackendError(
            f"MongoDB error during {what}: {exc}", code=str(exc.code) if exc.code else None
        )
    return BackendError(
        f"MongoDB {type(exc).__name__} during {what}: {exc}", code=type(exc).__name__
    )


#: Counting writes keep one slot per call in flight in the subdocument ``w`` (slot -> its last
#: token, an int; dynacoord._writers): the write's filter asks that its slot does not hold its
#: token yet, so a retried write (its first response lost) is refused and recognised. A writer
#: that sees more than PRUNE_AT slots drops those whose token's time has passed with one more
#: update, filtered on each dropped slot still holding the token it saw (a slot leased and
#: written since is kept); an ``rq`` token list, which nothing reads, goes with it. pymongo's
#: retry settings are not read: a call's tokens hold for COUNT_WINDOW_MS (ten minutes).
COUNT_WINDOW_MS = DEFAULT_WINDOW_MS


class CountingToken:
    """The slot and token of one counting write: the slot is leased from this process's pool
    when the token is made; :meth:`release` gives it back once the write (pymongo's retry
    included) has returned. ``held`` is a slot's name and token that a write holds across its
    sends (the breaker's window writes): then no slot is leased here, and :meth:`release` gives
    nothing back (the holder does)."""

    __slots__ = ("_slot", "field", "token", "writer")

    def __init__(self, now_ms: int, *, held: tuple[str, int] | None = None) -> None:
        self._slot: Slot | None = None
        if held is None:
            slot, self.token = lease(now_ms, COUNT_WINDOW_MS)
            self._slot = slot
            self.writer = slot.name
        else:
            self.writer, self.token = held
        self.field = "w." + self.writer

    def release(self) -> None:
        """Give the slot back (the write returned or raised); the token stays readable."""
        slot = self._slot
        if slot is not None:
            self._slot = None
            release(slot)

    @property
    def unapplied(self) -> dict[str, Any]:
        """The filter part: this token was not applied yet."""
        return {self.field: {"$ne": self.token}}

    def applied(self, doc: Mapping[str, Any] | None) -> bool:
        """Whether ``doc`` shows this write as applied."""
        slots = None if doc is None else doc.get("w")
        return isinstance(slots, dict) and slots.get(self.writer) == self.token


def stale_slots(doc: Mapping[str, Any] | None, now_ms: int) -> dict[str, Any] | None:
    """The filter of the stale slots of ``doc`` (``{"w.x": token, ...}``, plus an ``rq`` token
    list, which nothing reads) when there is something to drop, else None."""
    if not doc:
        return None
    found: dict[str, Any] = {}
    slots = doc.get("w")
    if isinstance(slots, dict) and len(slots) > PRUNE_AT:
        for writer, token in slots.items():
            # stale: the call that wrote it can no longer retry (its token says until when)
            if isinstance(token, int) and token_ms(token) < now_ms:
                found["w." + writer] = token
    if "rq" in doc:
        found["rq"] = {"$exists": True}
    return found or None


def request_token() -> str:
    """A fresh per-call request token for a conditional write (stored as ``req``)."""
    return secrets.token_hex(8)


class MongoCollection:
    """The door of every MongoDB store: the only holder of the collection. Stores send each
    request through one of its methods, never the collection:

    * :meth:`call`: one collection method (``find_one``, ``update_one``,
      ``find_one_and_update``, ``bulk_write``...);
    * :meth:`find`: one query, its cursor read whole;
    * :meth:`replace_if_free` and :meth:`drop_stale_slots`: writes several stores share.

    Each goes through :meth:`send`, the one request path (error translation, metrics).
    """

    def __init__(
        self, collection: Any, *, gc_grace_ms: int = 60_000, metrics: Metrics | None = None
    ) -> None:
        self.collection = collection
        # None: nothing is measured, the request path adds no clock read
        self._metrics = metrics if metrics is not None and metrics.enabled else None
        self.gc_grace_ms = gc_grace_ms
        from pymongo.errors import DuplicateKeyError, PyMongoError

        self._error: type[Exception] = PyMongoError
        self._refusal: type[Exception] = DuplicateKeyError

    def send(
        self, what: str, operation: str, request: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        """The request path of the MongoDB backend: every request of every store, in this order.

        1. The request: ``request(*args, **kwargs)``, one round trip. Retries are pymongo's own
           (``retryWrites``/``retryReads``: one retry of a request whose connection failed);
           dynacoord adds none, so a write whose response was lost may apply twice: every
           conditional write recognises its own applied write (``req`` tokens, counting slots).
        2. Metrics, when the backend has a listener: ``StoreRequestLatency`` with dimensions
           ``Backend=mongo`` and ``Operation`` (the method: ``find_one_and_update``, ``find``...),
           and ``StoreRequestErrors`` for a request that raised, except a ``DuplicateKeyError``
           (how a conditional upsert says "held": not an error).
        3. Errors: a ``PyMongoError`` becomes :class:`~dynacoord.errors.BackendError` (or
           :class:`~dynacoord.errors.TableNotReadyError` for a missing collection) naming
           ``what`` (the store call: ``"lock acquire"``), the cause chained. A duplicate key
           is left to the store, which catches it (see :func:`_translated`).
        """
        try:
            metrics = self._metrics
            if metrics is None:
                return request(*args, **kwargs)
            dimensions = {"Backend": "mongo", "Operation": operation}
            start = time.perf_counter()
            try:
                result = request(*args, **kwargs)
            except Exception as exc:
                failed = not isinstance(exc, self._refusal)
                measure_request(metrics, dimensions, start, failed=failed)
                raise
            measure_request(metrics, dimensions, start)
            return result
        except self._error as exc:
            error = _translated(exc, what)
            if error is None:
                raise
            raise error from exc

    def call(self, what: str, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """One request: ``collection.<method>(*args, **kwargs)`` through :meth:`send`."""
        return self.send(what, method, getattr(self.collection, method), *args, **kwargs)

    def find(
        self,
        what: str,
        query: Mapping[str, Any],
        projection: Mapping[str, Any] | None = None,
        *,
        sort: tuple[str, int] | None = None,
        limit: int = 0,
    ) -> list[dict[str, Any]]:
        """One query through :meth:`send` (``find``): the documents, read whole (the stores
        always bound them with a limit or a list of keys)."""
        docs: list[dict[str, Any]] = self.send(
            what, "find", self._find, query, projection, sort, limit
        )
        return docs

    def _find(
        self,
        query: Mapping[str, Any],
        projection: Mapping[str, Any] | None,
        sort: tuple[str, int] | None,
        limit: int,
    ) -> list[dict[str, Any]]:
        cursor = self.collection.find(query, projection)
        if sort is not None:
            cursor = cursor.sort(*sort)
        if limit:
            cursor = cursor.limit(limit)
        return list(cursor)

    @property
    def name(self) -> str | None:
        """The collection's name (None for a stand-in without one)."""
        name = getattr(self.collection, "name", None)
        return name if isinstance(name, str) else None

    def other(self, collection: Any) -> MongoCollection:
        """The door of another collection: a name in this collection's database, or a
        collection object (the application's own documents that ``lease.fenced_update``
        writes), with this one's request path and metrics."""
        if isinstance(collection, str):
            collection = self.collection.database[collection]
        return MongoCollection(collection, gc_grace_ms=self.gc_grace_ms, metrics=self._metrics)

    def gc_date(
        self, expires_at_ms: int, now_ms: int, grace_ms: int | None = None
    ) -> datetime.datetime:
        """The ``expires_at`` date for the TTL monitor: remaining lifetime plus grace, real time."""
        grace = self.gc_grace_ms if grace_ms is None else grace_ms
        at_ms = int(time.time() * 1000) + max(0, expires_at_ms - now_ms) + grace
        return datetime.datetime.fromtimestamp(at_ms / 1000, tz=datetime.timezone.utc)

    def replace_if_free(
        self, key: Mapping[str, Any], doc: Mapping[str, Any], now_ms: int, what: str
    ) -> bool:
        """Write ``doc`` under ``key`` unless a live document holds it; False (nothing written)
        then. One upserting ``replace_one`` filtered on "expired": when a live document (or one
        without expiry) holds the key, the filter does not match and the upsert's insert hits the
        unique (pk, sk) index (``DuplicateKeyError``).

        The document carries a fresh request token: a write retried after its first response was
        lost finds the document it wrote itself, and that is success (one read, only then)."""
        from pymongo.errors import DuplicateKeyError

        token = request_token()
        try:
            self.call(
                what,
                "replace_one",
                {**key, "expires_at_ms": {"$lte": now_ms}},
                {**doc, "req": token},
                upsert=True,
            )
        except DuplicateKeyError:
            current = self.call(what, "find_one", dict(key), {"req": 1})
            return current is not None and current.get("req") == token
        return True

    def drop_stale_slots(
        self, key: Mapping[str, Any], doc: Mapping[str, Any] | None, now_ms: int, what: str
    ) -> None:
        """After a counting write that returned ``doc``: drop its stale writer slots (see
        CountingToken), if any, with one update that applies only while every one of them still
        holds the token seen. A second request, once per stale slot, not per write."""
        stale = stale_slots(doc, now_ms)
        if stale is None:
            return
        self.call(what, "update_one", {**key, **stale}, {"$unset": dict.fromkeys(stale, "")})
