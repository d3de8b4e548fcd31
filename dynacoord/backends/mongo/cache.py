"""The cache store on MongoDB.

Document: ``pk=CACHE#{ns}#{key}``, ``sk=CACHE``, ``gsi1pk=CACHE#{ns}#0``, ``gsi1sk={key}``, the
value in ``n`` (a plain integer in BSON's signed 64-bit range, so that ``incr`` is one atomic
``$inc``) or ``v`` (codec text of everything else), and, when it expires, ``expires_at_ms`` plus
``expires_at`` (TTL monitor only). Listing reads the (gsi1pk, gsi1sk) index with an anchored
prefix, page by page.

Item size: the same limit as DynamoDB (400 KB) is enforced, so data written through one backend
always fits in the others.
"""

from __future__ import annotations

import re
from typing import Any

import pymongo
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from ... import codec
from ..._clock import Clock, now_ms
from ...cache import CacheEntry, KeyPage, is_int64_text
from ...errors import InvalidValueError
from ...keys import cache_key
from ._collection import (
    CountingToken,
    MongoCollection,
    live_filter,
)

__all__ = ["MongoCacheStore"]

_PAGE = 1000


class MongoCacheStore:
    partitions = 1
    max_batch_get = 100
    max_batch_write = 100

    def __init__(self, coll: MongoCollection, namespace: str, clock: Clock) -> None:
        self._coll = coll
        self._ns = namespace
        self._clock = clock
        self._index_pk = cache_key(namespace, "x").gsi1pk

    def _primary(self, key: str) -> dict[str, Any]:
        return cache_key(self._ns, key).primary

    def _doc(self, key: str, encoded: str, expires_at_ms: int | None, now: int) -> dict[str, Any]:
        doc: dict[str, Any] = dict(cache_key(self._ns, key).as_dict())
        if is_int64_text(encoded):
            doc["n"] = int(encoded)
        else:
            doc["v"] = encoded
        if expires_at_ms is not None:
            doc["expires_at_ms"] = expires_at_ms
            doc["expires_at"] = self._coll.gc_date(expires_at_ms, now)
        return doc

    def check_entry(self, key: str, encoded: str, expires_at_ms: int | None) -> None:
        item: dict[str, Any] = {**cache_key(self._ns, key).as_dict(), "v": encoded}
        if expires_at_ms is not None:
            item["expires_at_ms"] = expires_at_ms
        codec.check_item_size(item, key=key)

    # -- single items ---------------------------------------------------------------------------

    def get(self, key: str, now_ms: int, *, consistent: bool = True) -> CacheEntry | None:
        # reads here are always consistent: ``consistent`` changes nothing
        return CacheEntry.from_item(
            self._coll.call("cache get", "find_one", self._primary(key)), now_ms
        )

    def set(self, key: str, encoded: str, expires_at_ms: int | None) -> None:
        doc = self._doc(key, encoded, expires_at_ms, now_ms(self._clock))
        for attempt in range(2):
            try:
                self._coll.call("cache set", "replace_one", self._primary(key), doc, upsert=True)
                return
            except DuplicateKeyError:
                # Two upserts of a new key raced (servers before 4.2 do not retry this
                # themselves): the document exists now, so the second try replaces it.
                if attempt:
                    raise

    def add(self, key: str, encoded: str, expires_at_ms: int | None, now_ms: int) -> bool:
        doc = self._doc(key, encoded, expires_at_ms, now_ms)
        # False: a live entry (or one without expiry) holds the key
        return self._coll.replace_if_free(self._primary(key), doc, now_ms, "cache add")

    def create_counter(self, key: str, value: int, expires_at_ms: int | None, now_ms: int) -> bool:
        return self.add(key, str(value), expires_at_ms, now_ms)

    def delete(self, key: str, now_ms: int) -> bool:
        old = self._coll.call("cache delete", "find_one_and_delete", self._primary(key))
        return CacheEntry.from_item(old, now_ms) is not None

    def touch(self, key: str, expires_at_ms: int | None, now_ms: int) -> bool:
        if expires_at_ms is None:
            update: dict[str, Any] = {"$unset": {"expires_at_ms": "", "expires_at": ""}}
        else:
            update = {
                "$set": {
                    "expires_at_ms": expires_at_ms,
                    "expires_at": self._coll.gc_date(expires_at_ms, now_ms),
                }
            }
        result = self._coll.call(
            "cache touch", "update_one", {**self._primary(key), **live_filter(now_ms)}, update
        )
        return bool(result.matched_count == 1)

    def incr(self, key: str, by: int, now_ms: int, expires_if_new: int | None) -> int | None:
        token = CountingToken(now_ms)
        live_counter = {
            **self._primary(key),
            "n": {"$exists": True},
            # a retry of this very incr (its token applied) counts once
            **token.unapplied,
            **live_filter(now_ms),
        }
        # A sum outside int64 does not match (nothing written), then reads as out of range.
        if by > 0:
            live_counter["n"] = {"$exists": True, "$not": {"$gt": codec.INT64_MAX - by}}
        elif by < 0:
            live_counter["n"] = {"$exists": True, "$not": {"$lt": codec.INT64_MIN - by}}
        update: dict[str, Any] = {
            "$inc": {"n": by},
            "$set": {token.field: token.token},
        }
        # An upsert also creates an absent key in the same request. A `by` outside int64 cannot
        # be a BSON counter; create_counter then stores it as text, as `set` would.
        upsert = is_int64_text(str(by))
        if upsert:
            on_insert: dict[str, Any] = dict(cache_key(self._ns, key).as_dict())
            for field in self._primary(key):
                del on_insert[field]  # the upsert takes these from the filter
            if expires_if_new is not None:
                on_insert["expires_at_ms"] = expires_if_new
                on_insert["expires_at"] = self._coll.gc_date(expires_if_new, now_ms)
            update["$setOnInsert"] = on_insert
        try:
            doc = self._coll.call(
                "cache incr",
                "find_one_and_update",
                live_counter,
                update,
                upsert=upsert,
                return_document=ReturnDocument.AFTER,
            )
            if doc is not None:
                self._coll.drop_stale_slots(self._primary(key), doc, now_ms, "cache incr")
                return int(doc["n"])
        except DuplicateKeyError:
            pass  # an expired or non-integer entry holds the key, or a racing incr created it
        finally:
            token.release()
        current = self._coll.call("cache get", "find_one", self._primary(key))
        if token.applied(current):
            return int((current or {})["n"])
        n = (current or {}).get("n")
        if (
            CacheEntry.from_item(current, now_ms) is not None
            and isinstance(n, int)
            and not codec.INT64_MIN <= n + by <= codec.INT64_MAX
        ):
            raise InvalidValueError(
                f"incr of cache key {key!r} by {by} would leave MongoDB's signed 64-bit range; "
                "nothing was written"
            )
        if CacheEntry.from_item(current, now_ms) is not None and "n" not in (current or {}):
            raise InvalidValueError(
                f"cache key {key!r} holds a value that is not an integer (in MongoDB's signed "
                "64-bit range): incr needs an int (set it with an int, or delete it first)"
            )
        return None  # absent, expired, or a counter created meanwhile: the caller goes on

    # -- listing and batches --------------------------------------------------------------------

    def keys_page(self, partition: int, prefix: str, now_ms: int, cursor: Any) -> KeyPage:
        sk: dict[str, Any] = {}
        if prefix:
            sk["$regex"] = "^" + re.escape(prefix)  # anchored: an index range scan
        if cursor is not None:
            sk["$gt"] = str(cursor)
        query: dict[str, Any] = {"gsi1pk": self._index_pk}
        if sk:
            query["gsi1sk"] = sk
        docs = self._coll.find(
            "cache keys",
            query,
            {"_id": 0, "gsi1sk": 1, "expires_at_ms": 1},
            sort=("gsi1sk", pymongo.ASCENDING),
            limit=_PAGE + 1,
        )
        more = len(docs) > _PAGE
        docs = docs[:_PAGE]
        live: list[str] = []
        expired: list[str] = []
        for doc in docs:
            exp = doc.get("expires_at_ms")
            (expired if exp is not None and int(exp) <= now_ms else live).append(str(doc["gsi1sk"]))
        return KeyPage(live, expired, str(docs[-1]["gsi1sk"]) if more else None)

    def get_batch(
        self, keys: list[str], now_ms: int, *, consistent: bool = True
    ) -> tuple[dict[str, CacheEntry], list[str]]:
        by_pk = {cache_key(self._ns, k).pk: k for k in keys}
        docs = self._coll.find("cache get_many", {"pk": {"$in": list(by_pk)}, "sk": "CACHE"})
        found: dict[str, CacheEntry] = {}
        for doc in docs:
            entry = CacheEntry.from_item(doc, now_ms)
            if entry is not None:
                found[by_pk[str(doc["pk"])]] = entry
        return found, []

    def set_batch(
        self, entries: list[tuple[str, str, int | None]]
    ) -> list[tuple[str, str, int | None]]:
        if not entries:
            return []
        now = now_ms(self._clock)
        requests = []
        for key, encoded, expires in entries:
            doc = self._doc(key, encoded, expires, now)
            gone = {f: "" for f in ("n", "v", "expires_at_ms", "expires_at") if f not in doc}
            update: dict[str, Any] = {"$set": doc}
            if gone:
                update["$unset"] = gone
            # UpdateMany on the unique (pk, sk) matches at most one document, so it is a
            # replace-or-insert; UpdateOne/ReplaceOne would do the same on a server, but
            # mongomock's bulk API refuses them with current pymongo versions.
            requests.append(pymongo.UpdateMany(self._primary(key), update, upsert=True))
        self._coll.call("cache set_many", "bulk_write", requests, ordered=False)
        return []

    def delete_batch(self, keys: list[str]) -> list[str]:
        if not keys:
            return []
        pks = [cache_key(self._ns, k).pk for k in keys]
        self._coll.call("cache delete_many", "delete_many", {"pk": {"$in": pks}, "sk": "CACHE"})
        return []
