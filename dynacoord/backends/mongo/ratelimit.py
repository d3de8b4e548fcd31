"""The rate limiter store on MongoDB.

Document: ``pk=RATE#{ns}#{name}``, ``sk=RATE`` (shard ``i``: ``RATE#{ns}#{name}#{i}`` /
``RATE#{i}``), ``tat`` (epoch microseconds), ``expires_at`` (TTL monitor only) and the writer
slots ``w`` of the calls in flight (dynacoord._writers).

As on DynamoDB, an admission is one ``find_one_and_update`` of one of two cases (see
dynacoord.ratelimit), filtered on the call's slot not holding its token yet: ``idle`` sets
``tat = now + cost`` where ``tat`` is absent or has passed (an upsert: the first call creates the
document; the unique (pk, sk) index refuses a second one), ``busy`` adds ``cost`` where ``now <
tat <= now + limit``. A filter that does not match is followed by one read, which shows the
stored ``tat`` (how long to wait, or the other case) and tells this very write applied earlier
(pymongo re-sent it, or the call raised and the limiter sent it again: the slot holds its token)
from a refusal.
"""

from __future__ import annotations

from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from ..._breaker_window import WindowWrite
from ...keys import rate_key
from ...ratelimit import RateAttempt
from ._collection import COUNT_WINDOW_MS, MongoCollection

__all__ = ["MongoRateLimitStore"]

#: how long past its last possible ``tat`` a document stays, besides the retry window (ms)
_GRACE_MS = 3_600_000


def _tat(doc: dict[str, Any] | None) -> int | None:
    if not doc or doc.get("tat") is None:
        return None
    return int(doc["tat"])


class MongoRateLimitStore:
    def __init__(self, coll: MongoCollection, namespace: str) -> None:
        self._coll = coll
        self._ns = namespace

    def _filter(self, name: str, shard: int | None) -> dict[str, Any]:
        return rate_key(self._ns, name, shard).primary

    def read(self, name: str, shard: int | None) -> int | None:
        """One ``find_one``."""
        return _tat(self._coll.call("rate limiter read", "find_one", self._filter(name, shard)))

    def admit(
        self,
        name: str,
        shard: int | None,
        cost_us: int,
        limit_us: int,
        now_us: int,
        idle: bool,
        write: WindowWrite,
    ) -> RateAttempt:
        """One ``find_one_and_update``, plus one read when it is refused."""
        now_ms = now_us // 1000
        slot, token = write.take(now_ms, COUNT_WINDOW_MS)
        field = "w." + slot
        key = self._filter(name, shard)
        # the largest tat this write may leave is now + limit + cost: the document outlives it
        last_ms = (now_us + limit_us + cost_us) // 1000 + COUNT_WINDOW_MS
        gc = self._coll.gc_date(last_ms, now_ms, _GRACE_MS)
        query: dict[str, Any] = {**key, field: {"$ne": token}}
        if idle:
            query["$or"] = [{"tat": {"$exists": False}}, {"tat": {"$lte": now_us}}]
            update: dict[str, Any] = {
                "$set": {"tat": now_us + cost_us, field: token, "expires_at": gc}
            }
        else:
            query["tat"] = {"$gt": now_us, "$lte": now_us + limit_us}
            update = {"$inc": {"tat": cost_us}, "$set": {field: token, "expires_at": gc}}
        try:
            doc = self._coll.call(
                "rate limiter admit",
                "find_one_and_update",
                query,
                update,
                upsert=idle,
                return_document=ReturnDocument.AFTER,
            )
        except DuplicateKeyError:  # the upsert of an idle write found the document there
            doc = None
        if doc is None:
            current = self._coll.call("rate limiter admit", "find_one", key)
            slots = current.get("w") if current else None
            # the slot holds the token: this very write, applied earlier
            mine = isinstance(slots, dict) and slots.get(slot) == token
            return RateAttempt(mine, _tat(current))
        self._coll.drop_stale_slots(key, doc, now_ms, "rate limiter admit")
        return RateAttempt(True, _tat(doc))
