"""The counter / flag / join store on MongoDB.

Document: ``pk=COUNTER#{ns}#{key}``, ``sk=COUNTER``, ``kind`` (counter | flag | join) and

* counter: ``n``
* flag: ``value`` (codec text)
* join: ``n`` (distinct members), ``expected``, ``members`` (array)

plus ``expires_at_ms`` and ``expires_at`` (TTL monitor only) when it expires.

In-place writes (``add``, ``join_add``) are one upserting ``find_one_and_update`` whose filter is
"live item of this kind" (and for a join: same ``expected``, member not in yet). The update is an
aggregation pipeline so that "set the expiry only if there is none" is part of the same atomic
write (DynamoDB's ``if_not_exists``). When the filter does not match an existing document the
upsert hits the unique (pk, sk) index; the store then retries once as a plain update (the
document may have been created by a racing first writer a moment ago) and otherwise reads the
document back to report why it refused. Replacing writes (``restart``, ``set_if_absent``) are an
upserting ``replace_one`` filtered on "expired".
"""

from __future__ import annotations

from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from ... import codec
from ...counters import COUNTER, JOIN, CounterItem, WriteOutcome, value_fields
from ...keys import counter_key
from ._collection import (
    COUNT_WINDOW_MS,
    CountingToken,
    MongoCollection,
    literal,
    live_filter,
)

__all__ = ["MongoCounterStore"]


class MongoCounterStore:
    def __init__(self, coll: MongoCollection, namespace: str) -> None:
        self._coll = coll
        self._ns = namespace

    def _key(self, key: str) -> dict[str, Any]:
        return counter_key(self._ns, key).primary

    def _expiry_if_none(self, ttl_ms: int | None, now_ms: int) -> dict[str, Any]:
        if ttl_ms is None:
            return {}
        expires = now_ms + ttl_ms
        return {
            "expires_at_ms": {"$ifNull": ["$expires_at_ms", literal(expires)]},
            "expires_at": {
                "$ifNull": ["$expires_at", literal(self._coll.gc_date(expires, now_ms))]
            },
        }

    def _in_place(
        self,
        key: str,
        condition: dict[str, Any],
        stage: dict[str, Any],
        now_ms: int,
        what: str,
        token: CountingToken | None = None,
    ) -> WriteOutcome:
        if token is not None:
            # Counting: refused if this token was applied (a retried write); remembered if not.
            condition = {**condition, **token.unapplied}
            stage = {**stage, token.field: literal(token.token)}
        query = {**self._key(key), **condition}
        for upsert in (True, False):
            try:
                doc = self._coll.call(
                    what,
                    "find_one_and_update",
                    query,
                    [{"$set": stage}],
                    upsert=upsert,
                    return_document=ReturnDocument.AFTER,
                )
            except DuplicateKeyError:
                continue  # exists but did not match: maybe created by a racer; update only
            if doc is not None:
                if token is not None:
                    self._coll.drop_stale_slots(self._key(key), doc, now_ms, what)
                return WriteOutcome(True, item=CounterItem.from_item(doc, now_ms))
        current = self._coll.call(what, "find_one", self._key(key))
        if token is not None and token.applied(current):
            return WriteOutcome(True, item=CounterItem.from_item(current, now_ms))
        return WriteOutcome(False, current=CounterItem.from_item(current, now_ms))

    def _replace(
        self, key: str, fields: dict[str, Any], ttl_ms: int | None, now_ms: int, what: str
    ) -> WriteOutcome:
        doc: dict[str, Any] = {**self._key(key), **fields}
        if ttl_ms is not None:
            doc["expires_at_ms"] = now_ms + ttl_ms
            doc["expires_at"] = self._coll.gc_date(now_ms + ttl_ms, now_ms)
        if not self._coll.replace_if_free(self._key(key), doc, now_ms, what):
            current = self._coll.call(what, "find_one", self._key(key))
            return WriteOutcome(False, current=CounterItem.from_item(current, now_ms))
        return WriteOutcome(True, item=CounterItem.from_item(doc, now_ms))

    def add(self, key: str, by: int, ttl_ms: int | None, now_ms: int) -> WriteOutcome:
        if (
            not codec.INT64_MIN <= by <= codec.INT64_MAX
        ):  # a BSON counter is a signed 64-bit integer
            return WriteOutcome(False, out_of_range=codec.INT64_MAX)
        stage = {
            "kind": literal(COUNTER),
            "n": {"$add": [{"$ifNull": ["$n", 0]}, literal(by)]},
            **self._expiry_if_none(ttl_ms, now_ms),
        }
        # A sum outside int64 does not match (nothing written), then reads as out of range.
        limit: dict[str, Any] = {}
        if by > 0:
            limit = {"n": {"$not": {"$gt": codec.INT64_MAX - by}}}
        elif by < 0:
            limit = {"n": {"$not": {"$lt": codec.INT64_MIN - by}}}
        token = CountingToken(now_ms)
        try:
            outcome = self._in_place(
                key,
                {"kind": COUNTER, **live_filter(now_ms), **limit},
                stage,
                now_ms,
                "counter add",
                token=token,
            )
        finally:
            token.release()
        current = outcome.current
        if (
            not outcome.ok
            and current is not None
            and current.kind == COUNTER
            and not codec.INT64_MIN <= int(current.value) + by <= codec.INT64_MAX
        ):
            return WriteOutcome(False, current=current, out_of_range=codec.INT64_MAX)
        return outcome

    def restart(self, key: str, by: int, ttl_ms: int | None, now_ms: int) -> WriteOutcome:
        return self._replace(key, {"kind": COUNTER, "n": by}, ttl_ms, now_ms, "counter restart")

    def put_if_absent(
        self,
        key: str,
        kind: str,
        value: Any,
        ttl_ms: int | None,
        now_ms: int,
        token: str | None = None,
    ) -> bool:
        fields = value_fields(kind, value)
        if token is None:
            return self._replace(key, fields, ttl_ms, now_ms, "counter set_if_absent").ok
        # replace_if_free with the caller's token (kept across its attempts when a call
        # raised): the live document carrying it is this caller's write, applied
        what = "counter set_if_absent"
        doc: dict[str, Any] = {**self._key(key), **fields, "req": token}
        if ttl_ms is not None:
            doc["expires_at_ms"] = now_ms + ttl_ms
            doc["expires_at"] = self._coll.gc_date(now_ms + ttl_ms, now_ms)
        try:
            self._coll.call(
                what,
                "replace_one",
                {**self._key(key), "expires_at_ms": {"$lte": now_ms}},
                doc,
                upsert=True,
            )
        except DuplicateKeyError:
            current = self._coll.call(what, "find_one", self._key(key), {"req": 1})
            return current is not None and current.get("req") == token
        return True

    def get(self, key: str, now_ms: int) -> CounterItem | None:
        return CounterItem.from_item(
            self._coll.call("counter get", "find_one", self._key(key)), now_ms
        )

    def delete(self, key: str, now_ms: int) -> bool:
        # A counter or a flag is deleted in place: its value goes and it expires now, but the
        # document keeps its counting slots (``w``) until the TTL monitor removes it two windows
        # later, so an increment applied before the delete and retried after it finds its token
        # and is not applied again. A join (no slots) is deleted.
        old = self._coll.call(
            "counter delete",
            "find_one_and_update",
            {**self._key(key), "kind": {"$ne": JOIN}},
            {
                "$set": {
                    "expires_at_ms": now_ms,
                    "expires_at": self._coll.gc_date(now_ms, now_ms, 2 * COUNT_WINDOW_MS),
                },
                "$unset": {"n": "", "value": "", "last": ""},
            },
            return_document=ReturnDocument.BEFORE,
        )
        if old is None:  # a join, or nothing there
            old = self._coll.call("counter delete", "find_one_and_delete", self._key(key))
        return CounterItem.from_item(old, now_ms) is not None

    def extend(self, key: str, ttl_ms: int, now_ms: int) -> bool:
        expires = now_ms + ttl_ms
        result = self._coll.call(
            "counter extend",
            "update_one",
            {**self._key(key), **live_filter(now_ms)},
            {
                "$set": {
                    "expires_at_ms": expires,
                    "expires_at": self._coll.gc_date(expires, now_ms),
                }
            },
        )
        return bool(result.matched_count == 1)

    def join_add(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        # The member filter makes a redelivered arrival miss (and read back the state) instead of
        # counting twice, so the counts of successful adds are distinct.
        condition = {
            "kind": JOIN,
            "expected": expected,
            "members": {"$ne": member},
            **live_filter(now_ms),
        }
        stage = {
            "kind": literal(JOIN),
            "expected": literal(expected),
            "members": {"$concatArrays": [{"$ifNull": ["$members", []]}, literal([member])]},
            # the member that completed the join: arrivals beyond expected leave it alone
            "last": {
                "$cond": [
                    {"$lt": [{"$ifNull": ["$n", 0]}, expected]},
                    literal(member),
                    {"$ifNull": ["$last", None]},
                ]
            },
            "n": {"$add": [{"$ifNull": ["$n", 0]}, 1]},
            **self._expiry_if_none(ttl_ms, now_ms),
        }
        return self._in_place(key, condition, stage, now_ms, "join arrive")

    def join_restart(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        fields = {"kind": JOIN, "expected": expected, "members": [member], "n": 1, "last": member}
        return self._replace(key, fields, ttl_ms, now_ms, "join restart")
