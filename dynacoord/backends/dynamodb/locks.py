"""The lock store on the single table.

Item: ``pk=LOCK#{ns}#{key}``, ``sk=LOCK``, ``owner``, ``fence``, ``expires_at_ms``, ``ttl``.

Why a released lock is kept (``owner`` removed, ``expires_at_ms`` set to now) instead of deleted:
the fence must keep growing. While the item exists, the next acquire sets ``fence = fence + 1``.
Once DynamoDB's TTL sweeper has removed it, the next acquire starts from ``now_ms * 1000 + 1``,
which is above every fence ever handed out as long as the item outlived its expiry by more than the
clock skew between clients: ``ttl`` is therefore set ``fence_grace`` seconds (default one hour)
after the expiry, never at it.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from ...errors import FenceRejectedError, InvalidValueError
from ...keys import LOCK_SK, lock_pk
from ...locks import AcquireResult, LockInfo
from ._marshal import unmarshal, values
from ._table import FREE, ConditionFailedError, DynamoTable, request_token

__all__ = ["DynamoDBLockStore"]

#: lease.guard(tx): the lock item as the lease holds it (the condition of extend and release)
GUARD_CONDITION = "#owner = :owner AND fence = :fence AND expires_at_ms > :now"
#: a fenced write of the application's item: no fence there yet, or none larger than the write's
FENCED_CONDITION = "attribute_not_exists(#dcfence) OR #dcfence <= :dcfence"

#: force_release touches only an existing item (it never creates one), and only once per call: a
#: retry after a lost answer must not free a lock taken in the gap.
FORCE_RELEASE_CONDITION = (
    "attribute_exists(pk) AND (attribute_not_exists(released_by) OR released_by <> :token)"
)
#: It keeps the holder it freed (operands read the item before the update), so the retry of an
#: applied call answers as the call did.
FORCE_RELEASE_UPDATE = (
    "SET released_by = :token, released_owner = if_not_exists(#owner, :none), "
    "released_until = if_not_exists(expires_at_ms, :zero), expires_at_ms = :now, "
    "#ttl = :ttl REMOVE #owner"
)


class DynamoDBLockStore:
    def __init__(self, table: DynamoTable, namespace: str, *, fence_grace_s: int = 3600) -> None:
        self._table = table
        self._ns = namespace
        self._grace_s = fence_grace_s

    def _key(self, key: str) -> dict[str, Any]:
        # primary()'s dict, built here: a frame less on every request
        return {"pk": {"S": lock_pk(self._ns, key)}, "sk": {"S": LOCK_SK}}

    def _ttl(self, expires_at_ms: int) -> int:
        return math.ceil(expires_at_ms / 1000) + self._grace_s

    def _info(self, key: str, item: dict[str, Any] | None, now_ms: int) -> LockInfo | None:
        if not item or "owner" not in item:
            return None
        expires = int(item.get("expires_at_ms", 0))
        if expires <= now_ms:
            return None
        return LockInfo(key, str(item["owner"]), int(item["fence"]), expires)

    def try_acquire(self, key: str, owner: str, ttl_ms: int, now_ms: int) -> AcquireResult:
        expires = now_ms + ttl_ms
        try:
            response = self._table.call(
                "update_item",
                Key=self._key(key),
                # Free means: never created, swept, released, or expired (the sweeper may lag).
                ConditionExpression=FREE,
                UpdateExpression=(
                    "SET #owner = :owner, expires_at_ms = :exp, #ttl = :ttl, "
                    "fence = if_not_exists(fence, :base) + :one"
                ),
                ExpressionAttributeNames={"#owner": "owner", "#ttl": "ttl"},
                # what values() makes of them (the owner is a str, the rest ints of the clock)
                ExpressionAttributeValues={
                    ":now": {"N": str(now_ms)},
                    ":owner": {"S": owner},
                    ":exp": {"N": str(expires)},
                    ":ttl": {"N": str(self._ttl(expires))},
                    ":base": {"N": str(now_ms * 1000)},
                    ":one": {"N": "1"},
                },
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            return AcquireResult(None, self._raw_info(key, failed.raw, now_ms))
        # only the fence is read from the new item
        return AcquireResult(
            LockInfo(key, owner, int(Decimal(response["Attributes"]["fence"]["N"])), expires)
        )

    def _if_held(
        self,
        key: str,
        owner: str,
        fence: int,
        now_ms: int,
        update: str,
        ttl: int,
        exp: int | None = None,
        token: str | None = None,
    ) -> bool:
        """One UpdateItem, made only while ``owner`` holds the unexpired lock with ``fence``;
        ``update`` uses ``:ttl``, ``:exp`` and ``:token`` (if given). With ``token``, a refusal
        that shows ``released_by`` = ``token`` is this very write, applied, its answer lost."""
        # what values(owner=, fence=, now=, [exp=,] ttl=) makes of them, in that order
        attr_values = {
            ":owner": {"S": owner},
            ":fence": {"N": str(fence)},
            ":now": {"N": str(now_ms)},
        }
        if exp is not None:
            attr_values[":exp"] = {"N": str(exp)}
        attr_values[":ttl"] = {"N": str(ttl)}
        request: dict[str, Any] = {
            "Key": self._key(key),
            "ConditionExpression": GUARD_CONDITION,
            "UpdateExpression": update,
            "ExpressionAttributeNames": {"#owner": "owner", "#ttl": "ttl"},
            "ExpressionAttributeValues": attr_values,
        }
        if token is not None:
            attr_values[":token"] = {"S": token}
            request["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        try:
            self._table.call("update_item", **request)
        except ConditionFailedError as refused:
            return token is not None and (refused.raw or {}).get("released_by") == {"S": token}
        return True

    def extend(self, key: str, owner: str, fence: int, ttl_ms: int, now_ms: int) -> LockInfo | None:
        expires = now_ms + ttl_ms
        update = "SET expires_at_ms = :exp, #ttl = :ttl"
        if not self._if_held(
            key, owner, fence, now_ms, update, ttl=self._ttl(expires), exp=expires
        ):
            return None
        return LockInfo(key, owner, fence, expires)

    def release(
        self, key: str, owner: str, fence: int, now_ms: int, token: str | None = None
    ) -> bool:
        # released_by: the retry of a release whose answer was lost (the client's, or the
        # caller's own with the same token after the call raised) knows it applied
        update = "SET expires_at_ms = :now, #ttl = :ttl, released_by = :token REMOVE #owner"
        ttl = self._ttl(now_ms)
        token = request_token() if token is None else token
        return self._if_held(key, owner, fence, now_ms, update, ttl=ttl, token=token)

    def force_release(self, key: str, now_ms: int) -> bool:
        token = request_token()
        try:
            response = self._table.call(
                "update_item",
                Key=self._key(key),
                ConditionExpression=FORCE_RELEASE_CONDITION,
                UpdateExpression=FORCE_RELEASE_UPDATE,
                ExpressionAttributeNames={"#owner": "owner", "#ttl": "ttl"},
                ExpressionAttributeValues={
                    **values(now=now_ms, ttl=self._ttl(now_ms), token=token, zero=0),
                    ":none": {"NULL": True},
                },
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as refused:
            item = refused.raw
            if not item or item.get("released_by") != {"S": token}:
                return False
            # this very call, applied, its answer lost: was the lock it freed live?
            until = item.get("released_until", {}).get("N")
            return "S" in item.get("released_owner", {}) and int(until or 0) > now_ms
        return self._raw_info(key, response.get("Attributes"), now_ms) is not None

    def get(self, key: str, now_ms: int) -> LockInfo | None:
        return self._raw_info(key, self._table.get_raw(self._key(key)), now_ms)

    def _raw_info(self, key: str, raw: dict[str, Any] | None, now_ms: int) -> LockInfo | None:
        """:meth:`_info` of ``unmarshal(raw)``, read straight from the attribute values."""
        if not raw:
            return None
        try:
            owner = raw.get("owner")
            if owner is None:
                return None
            expires_at_ms = raw.get("expires_at_ms")
            expires = 0 if expires_at_ms is None else int(expires_at_ms["N"])
            if expires <= now_ms:
                return None
            return LockInfo(key, owner["S"], int(raw["fence"]["N"]), expires)
        except (KeyError, TypeError, ValueError):
            # not the attribute types the store writes: the general reader decides (or raises)
            return self._info(key, unmarshal(raw), now_ms)

    # -- fencing at the resource (dynacoord/fencing.py) ----------------------------------------

    def guard(self, tx: Any, key: str, owner: str, fence: int, now_ms: int) -> None:
        """Add to ``tx`` (a ``backend.transaction()``) one ConditionCheck of the lock item: the
        transaction commits only while (owner, fence) holds the unexpired lock. It closes the
        race of a holder paused past its TTL: if another acquired the lock meanwhile, the
        acquire changed owner and fence, the check fails and the whole transaction is
        cancelled (its writes to any table with it). Sends nothing itself."""
        add_guard = getattr(tx, "_add_guard", None)
        if add_guard is None:
            raise InvalidValueError(
                f"lease.guard() takes a backend.transaction() of a DynamoDB backend, got {tx!r}"
            )
        entry: dict[str, Any] = {
            "ConditionCheck": {
                "TableName": self._table.name,
                "Key": self._key(key),
                "ConditionExpression": GUARD_CONDITION,
                "ExpressionAttributeNames": {"#owner": "owner"},
                "ExpressionAttributeValues": {
                    ":owner": {"S": owner},
                    ":fence": {"N": str(fence)},
                    ":now": {"N": str(now_ms)},
                },
                # the lock as it is, so the error can say who holds it now
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        translator = self._table.translator
        if translator is not None:  # in the table's names: the transaction adds it as it is
            entry = translator.transact_item(entry)
        add_guard(entry, (key, owner, fence))

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
        """One UpdateItem of the application's item ``key`` in ``table`` (default: this
        backend's table, the item in your own names): SET ``values`` and ``attr = fence`` if
        the item has no ``attr`` or one no larger than ``fence``. Sent as it is (never through
        the table layout: the item is yours). A re-sent write (its answer lost) carries the
        same fence and applies again. Sent through the session (:meth:`DynamoTable.call_as_is`):
        timed by the metrics listener and refused by a global table's gate like any write of
        dynacoord's own items."""
        from ...fencing import check_values
        from .transaction import marshal_with_bound

        table_name = self._table.name if table is None else table
        if type(table_name) is not str or not table_name:
            raise InvalidValueError(f"table must be a table name (str) or None, got {table!r}")
        marshalled_key, _ = marshal_with_bound(key, "key")
        fields = check_values(values, attr, marshalled_key)
        names = {"#dcfence": attr}
        attr_values: dict[str, Any] = {":dcfence": {"N": str(fence)}}
        actions = ["#dcfence = :dcfence"]
        if fields:
            marshalled, _ = marshal_with_bound(fields, "values")
            for i, (name, av) in enumerate(marshalled.items()):
                names[f"#v{i}"] = name
                attr_values[f":v{i}"] = av
                actions.append(f"#v{i} = :v{i}")
        try:
            # through the session (guards, request, errors, metrics) but never the layout's
            # translation: the item and its names are the application's
            self._table.call_as_is(
                "update_item",
                TableName=table_name,
                Key=marshalled_key,
                UpdateExpression="SET " + ", ".join(actions),
                ConditionExpression=FENCED_CONDITION,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=attr_values,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as exc:
            stored = (exc.raw or {}).get(attr, {}).get("N")
            raise FenceRejectedError(
                f"write of {key!r} in {table_name!r} with fence {fence} (lock {lock_key!r}, "
                f"owner {owner!r}) refused: the item holds "
                + (f"fence {stored}" if stored is not None else f"a {attr!r} that is no number"),
                key=lock_key,
                owner=owner,
                fence=fence,
                stored_fence=None if stored is None else int(Decimal(stored)),
                resource=f"{table_name}:{key!r}",
            ) from exc
