"""The semaphore store on the single table.

Item: ``pk=SEM#{ns}#{name}``, ``sk=SEM``, ``rev`` (bumped by every acquire), ``fence`` (the last
fence handed out), ``ttl``, and ``slots``, a map of permit token to ``{o: owner, f: fence,
e: expires_at_ms}``; a released slot keeps ``{f, e: release time, r: true}`` for the client's
retry window (so a release whose answer was lost knows it applied), at most ``limit`` of them.

DynamoDB cannot count a map's live entries in a condition, so an acquire is optimistic: it is
based on the item as last read (``seen``), decides in Python whether a slot is free, and sends one
UpdateItem conditioned on ``rev`` being the one read (no acquire applied in between) and on every
slot it drops being still expired (a holder with a slower clock may have renewed it). It adds its
own slot and drops up to :data:`~dynacoord.semaphore.PRUNE_PER_WRITE` expired ones and the
released ones past the window (:func:`~dynacoord.semaphore.plan_acquire` decides); an expired slot
it does not drop is counted as taken, so at most ``limit`` slots are held and the map never holds
more than ``2 * limit`` entries. Renewals and releases change only their own slot and do not bump
``rev``: they never conflict with an acquire (an acquire that missed a release counts that slot as
taken, never too few).

The item's ``ttl`` is set :data:`~dynacoord.semaphore.MAX_PERMIT_TTL` plus ``fence_grace`` past
every write, so it outlives every permit in it by the grace; once DynamoDB removed it, the next
acquire starts the fence from ``now_ms * 1000 + 1`` (above every earlier fence, as for locks).
"""

from __future__ import annotations

import math
from typing import Any

from ...keys import SEMAPHORE_SK, semaphore_pk
from ...semaphore import (
    MAX_PERMIT_TTL,
    AcquireAttempt,
    PermitInfo,
    SemaphoreSlot,
    SemaphoreState,
    plan_acquire,
)
from ._table import ConditionFailedError, DynamoTable

__all__ = ["DynamoDBSemaphoreStore"]

_NAMES = {"#slots": "slots", "#rev": "rev", "#fence": "fence", "#ttl": "ttl"}


def _state(raw: dict[str, Any] | None) -> SemaphoreState:
    """The state of an item as attribute values (a read, ALL_OLD or ALL_NEW)."""
    if not raw or "rev" not in raw:
        return SemaphoreState(None, int(raw["fence"]["N"]) if raw and "fence" in raw else 0)
    slots = tuple(
        SemaphoreSlot(
            token,
            entry["M"].get("o", {}).get("S", ""),
            int(entry["M"]["f"]["N"]),
            int(entry["M"]["e"]["N"]),
            "r" in entry["M"],
        )
        for token, entry in raw.get("slots", {}).get("M", {}).items()
    )
    return SemaphoreState(int(raw["rev"]["N"]), int(raw["fence"]["N"]), slots)


class DynamoDBSemaphoreStore:
    reads_first = True

    def __init__(self, table: DynamoTable, namespace: str, *, fence_grace_s: int = 3600) -> None:
        self._table = table
        self._ns = namespace
        self._grace_s = fence_grace_s
        #: released slots are kept this long: the client's own retry window
        self._keep_released_ms = table.count_window_ms

    def _key(self, name: str) -> dict[str, Any]:
        return {"pk": {"S": semaphore_pk(self._ns, name)}, "sk": {"S": SEMAPHORE_SK}}

    def _ttl(self, now_ms: int) -> int:
        return math.ceil(now_ms / 1000) + MAX_PERMIT_TTL + self._grace_s

    def read(self, name: str, now_ms: int) -> SemaphoreState:
        """One consistent GetItem (ceil(item size / 4 KB) read units)."""
        return _state(self._table.get_raw(self._key(name)))

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
        """One conditional UpdateItem, or none when ``seen`` shows this permit held already or
        every slot taken (write units: the larger of the item's sizes before and after, per KB).
        """
        mine = seen.permit(name, token, now_ms)
        if mine is not None:
            return AcquireAttempt(mine, seen)  # an earlier attempt of this permit applied
        plan = plan_acquire(seen, token, limit, now_ms, self._keep_released_ms)
        if plan is None:
            return AcquireAttempt(None, seen)
        expires = now_ms + ttl_ms
        fence = plan.fence
        entry = {"M": {"o": {"S": owner}, "f": {"N": str(fence)}, "e": {"N": str(expires)}}}
        names = dict(_NAMES)
        attr_values: dict[str, Any] = {
            ":fence": {"N": str(fence)},
            ":ttl": {"N": str(self._ttl(now_ms))},
            ":one": {"N": "1"},
        }
        if seen.revision is None:
            # no item (never made, or removed long after its last expiry): create it
            condition = "attribute_not_exists(pk)"
            update = "SET #slots = :slots, #rev = :one, #fence = :fence, #ttl = :ttl"
            attr_values[":slots"] = {"M": {token: entry}}
        else:
            # rev as read: no acquire applied since, so the slots counted are all there is (a
            # renewal or release since changes no count the plan relies on)
            names["#me"] = token
            clauses = ["#rev = :rev"]
            sets = ["#slots.#me = :entry", "#rev = #rev + :one", "#fence = :fence", "#ttl = :ttl"]
            removes = []
            for i, dropped in enumerate(plan.drop_expired):
                names[f"#d{i}"] = dropped
                # still expired at this write: a slower clock's renewal since keeps its slot
                clauses.append(f"#slots.#d{i}.e <= :now")
                removes.append(f"#slots.#d{i}")
            for i, dropped in enumerate(plan.drop_released):
                names[f"#r{i}"] = dropped  # released is final: no condition
                removes.append(f"#slots.#r{i}")
            condition = " AND ".join(clauses)
            update = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
            attr_values[":rev"] = {"N": str(seen.revision)}
            attr_values[":entry"] = entry
            if plan.drop_expired:
                attr_values[":now"] = {"N": str(now_ms)}
        try:
            response = self._table.call(
                "update_item",
                Key=self._key(name),
                ConditionExpression=condition,
                UpdateExpression=update,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=attr_values,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as refused:
            state = _state(refused.raw)
            # the refusal shows this token's slot: this very write applied and its answer was
            # lost (botocore sent it again, and the first attempt had bumped rev)
            applied = state.permit(name, token, now_ms)
            return AcquireAttempt(applied, state, conflict=applied is None)
        state = _state(response.get("Attributes"))
        return AcquireAttempt(PermitInfo(name, owner, fence, expires, token), state)

    def _own_slot(
        self, name: str, token: str, fence: int, now_ms: int, update: str, extra: dict[str, Any]
    ) -> dict[str, Any] | None:
        """One UpdateItem of the slot ``token``, made only while it holds ``fence``, unexpired and
        not released. None when it applied; on a refusal, ``{"refused": <the item as it was>}``."""
        try:
            self._table.call(
                "update_item",
                Key=self._key(name),
                ConditionExpression=(
                    "#slots.#me.f = :fence AND #slots.#me.e > :now "
                    "AND attribute_not_exists(#slots.#me.r)"
                ),
                UpdateExpression=update,
                ExpressionAttributeNames={"#slots": "slots", "#me": token, "#ttl": "ttl"},
                ExpressionAttributeValues={
                    ":fence": {"N": str(fence)},
                    ":now": {"N": str(now_ms)},
                    ":ttl": {"N": str(self._ttl(now_ms))},
                    **extra,
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as refused:
            return {"refused": refused.raw}
        return None

    def extend(self, name: str, token: str, fence: int, ttl_ms: int, now_ms: int) -> int | None:
        """One conditional UpdateItem (sent again by botocore, it applies the same)."""
        expires = now_ms + ttl_ms
        refused = self._own_slot(
            name,
            token,
            fence,
            now_ms,
            "SET #slots.#me.e = :exp, #ttl = :ttl",
            {":exp": {"N": str(expires)}},
        )
        return expires if refused is None else None

    def release(self, name: str, token: str, fence: int, now_ms: int) -> bool:
        """One conditional UpdateItem: the slot's expiry set to now and marked released (it is
        free from then; a later acquire drops it). A refusal that shows the slot released with
        this fence is this permit's own release, applied, its answer lost."""
        refused = self._own_slot(
            name,
            token,
            fence,
            now_ms,
            # the owner goes (a released slot is kept small), the fence stays for the retry
            "SET #slots.#me.e = :now, #slots.#me.r = :yes, #ttl = :ttl REMOVE #slots.#me.o",
            {":yes": {"BOOL": True}},
        )
        if refused is None:
            return True
        slot = _state(refused["refused"]).slot(token)
        return slot is not None and slot.released and slot.fence == fence
