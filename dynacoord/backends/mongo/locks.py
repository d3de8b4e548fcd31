"""The lock store on MongoDB.

Document: ``pk=LOCK#{ns}#{key}``, ``sk=LOCK``, ``owner``, ``fence``, ``expires_at_ms``,
``expires_at`` (TTL monitor only); after a release or ``force_release``, ``released_by`` (the
call's request token: its retry after a lost answer knows it applied), and after a
``force_release`` ``released_owner`` and ``released_until`` (the holder it freed).

Acquire is one upserting ``find_one_and_update`` whose filter says "free" (``expires_at_ms <=
now``; a released lock has its expiry set to the release time). When the lock is held, the filter
does not match, the upsert tries to insert a second (pk, sk) and the unique index refuses it with
``DuplicateKeyError``: the store then reads the holder. If that read finds the lock free (it
expired in between), the attempt is simply repeated, so a duplicate-key race never reports a
free lock as held.

As on DynamoDB, a released lock is kept so the fence continues from ``fence + 1``; a document
removed by the TTL monitor (``fence_grace`` after expiry) restarts from ``now_ms * 1000 + 1``.
"""

from __future__ import annotations

from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from ...errors import FenceRejectedError, InvalidValueError
from ...keys import lock_key
from ...locks import AcquireResult, LockInfo
from ._collection import MongoCollection, literal, request_token

__all__ = ["MongoLockStore"]

_ACQUIRE_ATTEMPTS = 4


class MongoLockStore:
    def __init__(self, coll: MongoCollection, namespace: str, *, fence_grace_s: int = 3600) -> None:
        self._coll = coll
        self._ns = namespace
        self._grace_ms = fence_grace_s * 1000

    def _filter(self, key: str) -> dict[str, Any]:
        return lock_key(self._ns, key).primary

    @staticmethod
    def _info(key: str, doc: dict[str, Any] | None, now_ms: int) -> LockInfo | None:
        if not doc or doc.get("owner") is None or int(doc.get("expires_at_ms", 0)) <= now_ms:
            return None
        return LockInfo(key, str(doc["owner"]), int(doc["fence"]), int(doc["expires_at_ms"]))

    def try_acquire(self, key: str, owner: str, ttl_ms: int, now_ms: int) -> AcquireResult:
        expires = now_ms + ttl_ms
        base = now_ms * 1000
        update = [
            {
                "$set": {
                    "owner": literal(owner),
                    "expires_at_ms": literal(expires),
                    "expires_at": literal(self._coll.gc_date(expires, now_ms, self._grace_ms)),
                    "fence": {"$add": [{"$ifNull": ["$fence", literal(base)]}, 1]},
                }
            }
        ]
        query = {**self._filter(key), "expires_at_ms": {"$lte": now_ms}}
        for _ in range(_ACQUIRE_ATTEMPTS):
            try:
                doc = self._coll.call(
                    "lock acquire",
                    "find_one_and_update",
                    query,
                    update,
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
                return AcquireResult(LockInfo(key, owner, int(doc["fence"]), expires))
            except DuplicateKeyError:
                # Held (or created by a racer a moment ago): report the holder, unless it turns
                # out to be free by now, in which case the attempt is repeated.
                current = self._coll.call("lock get", "find_one", self._filter(key))
                holder = self._info(key, current, now_ms)
                if holder is not None:
                    return AcquireResult(None, holder)
        return AcquireResult(None, None)

    def _if_held(
        self, key: str, owner: str, fence: int, now_ms: int, update: dict[str, Any], what: str
    ) -> bool:
        """One update, made only while ``owner`` holds the unexpired lock with ``fence``."""
        result = self._coll.call(
            what,
            "update_one",
            {
                **self._filter(key),
                "owner": owner,
                "fence": fence,
                "expires_at_ms": {"$gt": now_ms},
            },
            update,
        )
        return bool(result.matched_count == 1)

    def extend(self, key: str, owner: str, fence: int, ttl_ms: int, now_ms: int) -> LockInfo | None:
        expires = now_ms + ttl_ms
        update = {
            "$set": {
                "expires_at_ms": expires,
                "expires_at": self._coll.gc_date(expires, now_ms, self._grace_ms),
            }
        }
        if not self._if_held(key, owner, fence, now_ms, update, "lock extend"):
            return None
        return LockInfo(key, owner, fence, expires)

    def release(
        self, key: str, owner: str, fence: int, now_ms: int, token: str | None = None
    ) -> bool:
        # the caller's retry after a call that raised passes the same token
        token = request_token() if token is None else token
        update = {
            "$set": {
                "expires_at_ms": now_ms,
                "expires_at": self._coll.gc_date(now_ms, now_ms, self._grace_ms),
                "released_by": token,
            },
            "$unset": {"owner": ""},
        }
        if self._if_held(key, owner, fence, now_ms, update, "lock release"):
            return True
        # refused: by this very release, applied, its answer lost (pymongo re-sent it)?
        doc = self._coll.call("lock release", "find_one", self._filter(key), {"released_by": 1})
        return doc is not None and doc.get("released_by") == token

    def force_release(self, key: str, now_ms: int) -> bool:
        token = request_token()
        # Once per call (``released_by``): a retry after a lost answer must not free a lock
        # taken in the gap. A pipeline keeps the holder it freed (read from the document as it
        # was), so that retry answers as the call did.
        update = [
            {
                "$set": {
                    "released_by": literal(token),
                    "released_owner": {"$ifNull": ["$owner", None]},
                    "released_until": {"$ifNull": ["$expires_at_ms", 0]},
                    "expires_at_ms": literal(now_ms),
                    "expires_at": literal(self._coll.gc_date(now_ms, now_ms, self._grace_ms)),
                }
            },
            # $project, not the $unset stage: the same in MongoDB, and mongomock only knows it
            {"$project": {"owner": 0}},
        ]
        old = self._coll.call(
            "lock force_release",
            "find_one_and_update",
            {**self._filter(key), "released_by": {"$ne": token}},
            update,
            return_document=ReturnDocument.BEFORE,
        )
        if old is None:  # absent, or this very call applied and its answer was lost
            done = self._coll.call("lock force_release", "find_one", self._filter(key))
            return (
                done is not None
                and done.get("released_by") == token
                and done.get("released_owner") is not None
                and done.get("released_until", 0) > now_ms
            )
        return self._info(key, old, now_ms) is not None

    def get(self, key: str, now_ms: int) -> LockInfo | None:
        doc = self._coll.call("lock get", "find_one", self._filter(key))
        return self._info(key, doc, now_ms)

    def fenced_update(
        self,
        table: Any,
        key: Any,
        values: Any,
        attr: str,
        fence: int,
        *,
        lock_key: str,
        owner: str,
    ) -> None:
        """One upserting ``update_one`` of the application's document ``key`` in ``table`` (a
        collection name in this backend's database, a collection, or None: this backend's):
        ``$set`` of ``values`` and ``attr = fence``, filtered on ``attr`` missing or no larger
        than ``fence``. A document with a larger fence does not match; the upsert then inserts
        a second document with the same key and the unique index refuses it
        (``DuplicateKeyError``): ``key`` must be on a unique index (``_id`` always is).
        MongoDB runs multi-document transactions only on a replica set, in a session of your
        own client: this write is the fence check."""
        from ...fencing import FenceCondition, check_values

        if table is None:
            coll = self._coll
        elif (isinstance(table, str) and table) or hasattr(table, "update_one"):
            coll = self._coll.other(table)
        else:
            raise InvalidValueError(
                f"table must be a collection name, a collection or None, got {table!r}"
            )
        condition = FenceCondition(fence, attr)
        query = condition.mongo_filter(key)
        fields = check_values(values, attr, key)
        update = {"$set": {**fields, **condition.mongo_set()}}
        name = table if coll.name is None else coll.name
        try:
            coll.call("fenced update", "update_one", query, update, upsert=True)
            return
        except DuplicateKeyError as refused:
            doc = coll.call("fenced update", "find_one", dict(key), {attr: 1})
            stored = None if doc is None else doc.get(attr)
            raise FenceRejectedError(
                f"write of {dict(key)!r} in collection {name!r} with fence {fence} (lock "
                f"{lock_key!r}, owner {owner!r}) refused: it holds {attr} = {stored!r}",
                key=lock_key,
                owner=owner,
                fence=fence,
                stored_fence=stored if type(stored) is int else None,
                resource=f"{name}:{dict(key)!r}",
            ) from refused
