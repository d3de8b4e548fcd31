"""Request metrics of the MongoDB backend: a thin proxy of the collection that times each request.

It is installed by :class:`~dynacoord.backends.mongo._collection.MongoCollection` only when the
backend has a metrics listener (``MongoBackend(..., metrics=...)``); without one the stores use
the pymongo collection directly and nothing is measured. Each collection method below is one
request (``find_one``, ``update_one``, ``find_one_and_update``, ...); a ``find`` is timed when its
cursor is read (the stores read every cursor whole, with a limit).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ...metrics import Metrics, measure_request

__all__ = ["TimedCollection"]

_REQUESTS = frozenset(
    {
        "find_one",
        "find_one_and_update",
        "find_one_and_delete",
        "find_one_and_replace",
        "insert_one",
        "insert_many",
        "update_one",
        "update_many",
        "replace_one",
        "delete_one",
        "delete_many",
        "bulk_write",
        "count_documents",
        "aggregate",
    }
)


def _timed(method: Any, metrics: Metrics, operation: str) -> Any:
    dimensions = {"Backend": "mongo", "Operation": operation}

    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            result = method(*args, **kwargs)
        except Exception as exc:
            # A duplicate key is how a conditional upsert says "held": not an error.
            failed = type(exc).__name__ != "DuplicateKeyError"
            measure_request(metrics, dimensions, start, failed=failed)
            raise
        measure_request(metrics, dimensions, start)
        return result

    return call


class TimedCollection:
    """Forwards everything to a pymongo ``Collection``; times the requests."""

    def __init__(self, collection: Any, metrics: Metrics) -> None:
        self._collection = collection
        self._metrics = metrics

    def find(self, *args: Any, **kwargs: Any) -> _TimedCursor:
        return _TimedCursor(self._collection.find(*args, **kwargs), self._metrics)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._collection, name)
        if name in _REQUESTS and callable(attribute):
            return _timed(attribute, self._metrics, name)
        return attribute

    def __repr__(self) -> str:
        return f"TimedCollection({self._collection!r})"


class _TimedCursor:
    """A cursor whose reading is timed as one ``find`` request."""

    def __init__(self, cursor: Any, metrics: Metrics) -> None:
        self._cursor = cursor
        self._metrics = metrics

    def sort(self, *args: Any, **kwargs: Any) -> _TimedCursor:
        self._cursor = self._cursor.sort(*args, **kwargs)
        return self

    def limit(self, *args: Any, **kwargs: Any) -> _TimedCursor:
        self._cursor = self._cursor.limit(*args, **kwargs)
        return self

    def skip(self, *args: Any, **kwargs: Any) -> _TimedCursor:
        self._cursor = self._cursor.skip(*args, **kwargs)
        return self

    def __iter__(self) -> Iterator[Any]:
        docs: list[Any] = _timed(list, self._metrics, "find")(self._cursor)
        return iter(docs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)
