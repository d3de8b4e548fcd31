"""The semaphore store on MongoDB.

Document: ``pk=SEM#{ns}#{name}``, ``sk=SEM``, ``rev`` (bumped by every acquire), ``fence`` (the
last fence handed out), ``expires_at`` (TTL monitor only) and ``slots``, a map of permit token to
``{o: owner, f: fence, e: expires_at_ms}``; a released slot keeps ``{f, e: release time,
r: true}`` for the client's retry window, at most ``limit`` of them (as on DynamoDB).

As on DynamoDB, an acquire is optimistic: it decides from the document as last read (``seen``)
whether a slot is free and sends one ``find_one_and_update`` whose filter holds ``rev`` as read
(no acquire applied in between) and every slot it drops as still expired (a holder with a slower
clock may have renewed it). A filter that does not match is followed by one read, which tells a
conflict from this very write applied earlier (pymongo re-sent it: the read shows the token's
slot). The first acquire of a semaphore inserts the document; the unique (pk, sk) index refuses
a second one.

``expires_at`` is :data:`~dynacoord.semaphore.MAX_PERMIT_TTL` plus ``fence_grace`` past every
write, so the document outlives every permit in it; once the TTL monitor removed it, the fence
restarts from ``now_ms * 1000 + 1``.
"""

from __future__ import annotations

from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from ...keys import semaphore_key
from ...semaphore import (
    MAX_PERMIT_TTL,
    AcquireAttempt,
    PermitInfo,
    SemaphoreSlot,
    SemaphoreState,
    plan_acquire,
)
from ._collection import COUNT_WINDOW_MS, MongoCollection

__all__ = ["MongoSemaphoreStore"]


def _state(doc: dict[str, Any] | None) -> SemaphoreState:
    if not doc or "rev" not in doc:
        return SemaphoreState(None, int(doc["fence"]) if doc and "fence" in doc else 0)
    slots = tuple(
        SemaphoreSlot(token, str(s.get("o", "")), int(s["f"]), int(s["e"]), bool(s.get("r", False)))
        for token, s in (doc.get("slots") or {}).items()
    )
    return SemaphoreState(int(doc["rev"]), int(doc["fence"]), slots)


class MongoSemaphoreStore:
    reads_first = True

    def __init__(self, coll: MongoCollection, namespace: str, *, fence_grace_s: int = 3600) -> None:
        self._coll = coll
        self._ns = namespace
        self._grace_ms = fence_grace_s * 1000

    def _filter(self, name: str) -> dict[str, Any]:
        return semaphore_key(self._ns, name).primary

    def _gc(self, now_ms: int) -> Any:
        return self._coll.gc_date(now_ms + MAX_PERMIT_TTL * 1000, now_ms, self._grace_ms)

    def read(self, name: str, now_ms: int) -> SemaphoreState:
        """One ``find_one``."""
        return _state(self._coll.call("semaphore read", "find_one", self._filter(name)))

    def try_acquire(
        self,
        name: str,
        token: str,
        owner: str,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        seen: SemaphoreState,
    ) -> AcquireAttempt:
        """One ``find_one_and_update`` (an ``insert_one`` for a new semaphore), plus one read
        when it is refused; none when ``seen`` shows this permit held or every slot taken."""
        mine = seen.permit(name, token, now_ms)
        if mine is not None:
            return AcquireAttempt(mine, seen)  # an earlier attempt of this permit applied
        plan = plan_acquire(seen, token, limit, now_ms, COUNT_WINDOW_MS)
        if plan is None:
            return AcquireAttempt(None, seen)
        expires = now_ms + ttl_ms
        fence = plan.fence
        entry = {"o": owner, "f": fence, "e": expires}
        permit = PermitInfo(name, owner, fence, expires, token)
        if seen.revision is None:
            doc = {
                **self._filter(name),
                "rev": 1,
                "fence": fence,
                "slots": {token: entry},
                "expires_at": self._gc(now_ms),
            }
            try:
                self._coll.call("semaphore acquire", "insert_one", doc)
            except DuplicateKeyError:
                return self._refused(name, token, now_ms)
            return AcquireAttempt(permit, _state(doc))
        # rev as read: no acquire applied since, so the slots counted above are all there is
        query: dict[str, Any] = {**self._filter(name), "rev": seen.revision}
        for dropped in plan.drop_expired:
            # still expired at this write: a slower clock's renewal since keeps its slot
            query[f"slots.{dropped}.e"] = {"$lte": now_ms}
        update: dict[str, Any] = {
            "$set": {f"slots.{token}": entry, "fence": fence, "expires_at": self._gc(now_ms)},
            "$inc": {"rev": 1},
        }
        drop = (*plan.drop_expired, *plan.drop_released)  # released is final: no condition
        if drop:
            update["$unset"] = {f"slots.{dropped}": "" for dropped in drop}
        after = self._coll.call(
            "semaphore acquire",
            "find_one_and_update",
            query,
            update,
            return_document=ReturnDocument.AFTER,
        )
        if after is None:
            return self._refused(name, token, now_ms)
        return AcquireAttempt(permit, _state(after))

    def _refused(self, name: str, token: str, now_ms: int) -> AcquireAttempt:
        """The write did not match: read once. The token's slot there means this very write
        applied and its answer was lost (pymongo sent it again); else the document changed."""
        state = self.read(name, now_ms)
        applied = state.permit(name, token, now_ms)
        return AcquireAttempt(applied, state, conflict=applied is None)

    def _own_slot(self, name: str, token: str, fence: int, now_ms: int) -> dict[str, Any]:
        """The filter of the slot ``token`` held with ``fence``, unexpired and not released."""
        return {
            **self._filter(name),
            f"slots.{token}.f": fence,
            f"slots.{token}.e": {"$gt": now_ms},
            f"slots.{token}.r": {"$exists": False},
        }

    def extend(self, name: str, token: str, fence: int, ttl_ms: int, now_ms: int) -> int | None:
        """One ``update_one`` (sent again after a lost answer, it applies the same)."""
        expires = now_ms + ttl_ms
        result = self._coll.call(
            "semaphore extend",
            "update_one",
            self._own_slot(name, token, fence, now_ms),
            {"$set": {f"slots.{token}.e": expires, "expires_at": self._gc(now_ms)}},
        )
        return expires if result.matched_count == 1 else None

    def release(self, name: str, token: str, fence: int, now_ms: int) -> bool:
        """One ``update_one``, plus one read when it is refused (was it this permit's own
        release, applied, its answer lost?)."""
        result = self._coll.call(
            "semaphore release",
            "update_one",
            self._own_slot(name, token, fence, now_ms),
            {
                "$set": {
                    f"slots.{token}.e": now_ms,
                    f"slots.{token}.r": True,
                    "expires_at": self._gc(now_ms),
                },
                # the owner goes (a released slot is kept small), the fence stays
                "$unset": {f"slots.{token}.o": ""},
            },
        )
        if result.matched_count == 1:
            return True
        slot = self.read(name, now_ms).slot(token)
        return slot is not None and slot.released and slot.fence == fence
