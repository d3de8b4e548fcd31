"""Fencing enforced at the resource: the pieces of a write that refuses a stale lease's fence.

A lease's ``fence`` only helps if the resource refuses a smaller one. Kleppmann's history::

    A acquires (fence 7) ... paused past its TTL ......................... A writes, fence 7
                             lease expires, B acquires (fence 8), B writes, fence 8

A's write must be refused where it lands. Two ways, on the application's own items:

* **The item keeps the fence** (every backend): the write stores the fence in an attribute of
  the item it writes and is refused when the item holds a larger one. ``lease.fenced_update``
  sends such a write (one request); :func:`fence_condition` gives the pieces to merge into a
  request of your own (boto3 low-level client, resource API, ``backend.transaction()``, a
  pymongo filter). An *equal* fence is accepted: the holder may write the item many times,
  and a write re-sent by the client after a lost answer applies again (make it idempotent:
  SET, not ADD). Only a write of the item itself is fenced; an item that was never written
  with a fence accepts any.
* **The transaction checks the lock** (DynamoDB): ``lease.guard(tx)`` adds to your
  ``backend.transaction()`` a condition check on the lock item (owner and fence as held, not
  expired), so every write in the transaction, in any table, is refused with the lease: the
  whole transaction is cancelled and :class:`~dynacoord.errors.LockLostError` raised.

This module holds the backend-neutral pieces; each backend's lock store sends the write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import InvalidValueError

__all__ = ["FENCE_ATTRIBUTE", "FenceCondition", "FencingStore", "fence_condition"]

#: the attribute (field) an item's fence is kept in unless another is named
FENCE_ATTRIBUTE = "fence"

#: placeholders of the fence condition in a DynamoDB expression (unlikely to clash with yours)
_NAME = "#dcfence"
_VALUE = ":dcfence"


class FencingStore(Protocol):
    """What a lock store offers for fencing at the resource (every backend's has it)."""

    def fenced_update(
        self,
        table: Any,
        key: Any,
        values: Mapping[str, Any],
        attr: str,
        fence: int,
        *,
        lock_key: str,
        owner: str,
    ) -> None:
        """One conditional write of the application's item ``key`` (in ``table``): set
        ``values`` and ``attr = fence`` unless the item holds a larger fence in ``attr``; then
        raise :class:`~dynacoord.errors.FenceRejectedError` (nothing written)."""
        ...


def check_fence(fence: Any) -> int:
    if type(fence) is not int or fence < 0:
        raise InvalidValueError(f"fence must be a non-negative int (lease.fence), got {fence!r}")
    return fence


def check_attr(attr: Any) -> str:
    if type(attr) is not str or not attr or attr.startswith("$") or "." in attr:
        raise InvalidValueError(
            f"the fence attribute must be a non-empty str without '.' or a leading '$', "
            f"got {attr!r}"
        )
    return attr


def check_values(values: Any, attr: str, key: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The attributes a fenced write sets: a dict of str names, none of them the fence
    attribute (the write sets it) nor a key attribute (a key is not updated)."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise InvalidValueError(f"values must be a dict of attributes to set, got {values!r}")
    out: dict[str, Any] = {}
    for name, value in values.items():
        if type(name) is not str or not name:
            raise InvalidValueError(f"attribute names must be non-empty str, got {name!r}")
        if name == attr:
            raise InvalidValueError(
                f"values must not set the fence attribute {attr!r}: the fenced write sets it"
            )
        if key is not None and name in key:
            raise InvalidValueError(f"values must not set the key attribute {name!r}")
        out[name] = value
    return out


@dataclass(frozen=True, slots=True)
class FenceCondition:
    """The pieces of a write that stores ``fence`` in the item's ``attr`` and is refused when
    the item holds a larger one. Made by :func:`fence_condition` (or ``lease.fence_condition()``).

    DynamoDB, the low-level client (what most boto3 code uses)::

        fc = lease.fence_condition()
        client.update_item(**fc.update_item(
            TableName="orders", Key={"id": {"S": "1"}},
            UpdateExpression="SET #s = :s", ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":s": {"S": "paid"}}))
        # refused: botocore's ConditionalCheckFailedException

    Inside ``backend.transaction()`` (Python values)::

        tx.update("orders", {"id": "1"}, **fc.update_args("SET #s = :s",
                  names={"#s": "status"}, values={":s": "paid"}))

    The resource API: ``ConditionExpression=fc.attr_condition()`` (a ``boto3.dynamodb.conditions``
    object), with ``fc.set_action`` in the ``UpdateExpression`` and ``fc.names``/``fc.values``
    merged into yours. MongoDB: ``coll.update_one(fc.mongo_filter({"_id": 1}),
    {"$set": {"status": "paid", **fc.mongo_set()}})`` (matched_count 0, or
    ``DuplicateKeyError`` with ``upsert=True``, when refused).
    """

    fence: int
    attr: str = FENCE_ATTRIBUTE

    def __post_init__(self) -> None:
        check_fence(self.fence)
        check_attr(self.attr)

    # -- DynamoDB expression pieces ----------------------------------------------------------------

    @property
    def condition(self) -> str:
        """``ConditionExpression``: no fence stored yet, or one no larger than this one."""
        return f"(attribute_not_exists({_NAME}) OR {_NAME} <= {_VALUE})"

    @property
    def set_action(self) -> str:
        """The action of an ``UpdateExpression``'s SET clause that stores the fence."""
        return f"{_NAME} = {_VALUE}"

    @property
    def names(self) -> dict[str, str]:
        """``ExpressionAttributeNames`` of :attr:`condition` and :attr:`set_action`."""
        return {_NAME: self.attr}

    @property
    def values(self) -> dict[str, int]:
        """``ExpressionAttributeValues`` as Python values (the resource API, transactions)."""
        return {_VALUE: self.fence}

    @property
    def attribute_values(self) -> dict[str, dict[str, str]]:
        """``ExpressionAttributeValues`` as the low-level client takes them."""
        return {_VALUE: {"N": str(self.fence)}}

    def attr_condition(self) -> Any:
        """:attr:`condition` as a ``boto3.dynamodb.conditions`` object (the resource API)."""
        from boto3.dynamodb.conditions import Attr

        return Attr(self.attr).not_exists() | Attr(self.attr).lte(self.fence)

    def update_item(self, **request: Any) -> dict[str, Any]:
        """``request`` (keyword arguments of the low-level ``client.update_item``) with the
        fence condition ANDed to its ``ConditionExpression`` and the fence set by its
        ``UpdateExpression`` (a SET clause added if it has none)."""
        out = self._merged(request, self.attribute_values)
        out["UpdateExpression"] = with_set_action(request.get("UpdateExpression"), self.set_action)
        return out

    def put_item(self, **request: Any) -> dict[str, Any]:
        """``request`` (keyword arguments of the low-level ``client.put_item``) with the fence
        in its ``Item`` and the fence condition ANDed to its ``ConditionExpression``."""
        item = request.get("Item")
        if not isinstance(item, Mapping):
            raise InvalidValueError("put_item needs Item= (a dict of attribute values)")
        if self.attr in item:
            raise InvalidValueError(f"Item must not hold the fence attribute {self.attr!r}")
        out = self._merged(request, self.attribute_values)
        out["Item"] = {**item, self.attr: {"N": str(self.fence)}}
        return out

    def update_args(
        self,
        update_expression: str | None = None,
        *,
        condition: str | None = None,
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Keyword arguments for ``tx.update(table, key, **...)`` (``backend.transaction()``,
        Python values): your update, condition, names and values with the fence's merged."""
        merged = self._merged(
            {
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
            },
            self.values,
        )
        return {
            "update_expression": with_set_action(update_expression, self.set_action),
            "condition": merged["ConditionExpression"],
            "names": merged["ExpressionAttributeNames"],
            "values": merged["ExpressionAttributeValues"],
        }

    def _merged(
        self, request: Mapping[str, Any], fence_values: Mapping[str, Any]
    ) -> dict[str, Any]:
        out = dict(request)
        names = dict(request.get("ExpressionAttributeNames") or {})
        values = dict(request.get("ExpressionAttributeValues") or {})
        if _NAME in names or _VALUE in values:
            raise InvalidValueError(
                f"the placeholders {_NAME} and {_VALUE} are the fence's: use others in your "
                "expressions"
            )
        names.update(self.names)
        values.update(fence_values)
        mine = request.get("ConditionExpression")
        if mine is not None and not isinstance(mine, str):
            raise InvalidValueError(
                "ConditionExpression must be a str here (for a boto3 conditions object use "
                "attr_condition() with the resource API)"
            )
        out["ConditionExpression"] = (
            self.condition if not mine else f"({mine}) AND {self.condition}"
        )
        out["ExpressionAttributeNames"] = names
        out["ExpressionAttributeValues"] = values
        return out

    # -- MongoDB filter pieces ---------------------------------------------------------------------

    def mongo_filter(self, key: Mapping[str, Any]) -> dict[str, Any]:
        """``key`` (a filter of equality fields, e.g. ``{"_id": ...}``) that also asks for no
        fence, or one no larger than this one, in the document."""
        if not isinstance(key, Mapping) or not key:
            raise InvalidValueError(f"key must be a non-empty dict of fields, got {key!r}")
        for name in key:
            if type(name) is not str or name.startswith("$"):
                raise InvalidValueError(f"key fields must be field names, not {name!r}")
        return {
            **key,
            "$or": [{self.attr: {"$exists": False}}, {self.attr: {"$lte": self.fence}}],
        }

    def mongo_set(self) -> dict[str, int]:
        """The fields a ``$set`` adds to store the fence."""
        return {self.attr: self.fence}


def fence_condition(fence: int, attr: str = FENCE_ATTRIBUTE) -> FenceCondition:
    """The pieces of a write that keeps ``fence`` in the item's ``attr`` and is refused when
    the item holds a larger one (:class:`FenceCondition`)."""
    return FenceCondition(fence, attr)


def with_set_action(expression: Any, action: str) -> str:
    """``expression`` (an ``UpdateExpression`` or None) that also does ``action`` in its SET
    clause. SET is a reserved word, so a bare ``SET`` in an expression is always the clause's
    keyword (an attribute of that name must be written through a ``#`` placeholder)."""
    if expression is None:
        return f"SET {action}"
    if type(expression) is not str or not expression.strip():
        raise InvalidValueError(
            f"the update expression must be a non-empty str, got {expression!r}"
        )
    import re

    found = re.search(r"(?i)(?<![#:\w])SET(?!\w)", expression)
    if found is None:
        return f"SET {action} {expression}"
    return f"{expression[: found.end()]} {action},{expression[found.end() :]}"
