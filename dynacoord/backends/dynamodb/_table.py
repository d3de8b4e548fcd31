"""Low-level helpers shared by the DynamoDB stores: marshalling and the one error translation point.

Values are marshalled with boto3's own ``TypeSerializer``/``TypeDeserializer`` (never hand-written
``{"S": ...}``); every request goes through :meth:`DynamoTable.call`, which maps ``ClientError``
codes to dynacoord errors in one place.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any, cast

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from ...errors import (
    BackendError,
    TableNotReadyError,
    TransactionCancelledError,
    ValueTooLargeError,
)

__all__ = ["FREE", "LIVE", "ConditionFailedError", "DynamoTable"]

logger = logging.getLogger("dynacoord.backends.dynamodb")

#: The condition of a write that creates an item: no item, or an expired one (DynamoDB's TTL
#: sweeper may lag by days, so an expired item counts as absent). Needs ``:now``.
FREE = "attribute_not_exists(pk) OR expires_at_ms <= :now"
#: The item (if any) has not expired: no expiry, or one still ahead of ``:now``.
LIVE = "(attribute_not_exists(expires_at_ms) OR expires_at_ms > :now)"

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


class ConditionFailedError(Exception):
    """Internal: a condition expression was false. ``item`` is the item as it was, if returned."""

    def __init__(self, item: dict[str, Any] | None) -> None:
        super().__init__("conditional check failed")
        self.item = item


def to_av(value: Any) -> dict[str, Any]:
    """One Python value to a DynamoDB attribute value."""
    return cast("dict[str, Any]", _serializer.serialize(value))


def marshal(item: Mapping[str, Any]) -> dict[str, Any]:
    """A dict of Python values to a DynamoDB item (None values are dropped)."""
    return {k: _serializer.serialize(v) for k, v in item.items() if v is not None}


def unmarshal(item: Mapping[str, Any]) -> dict[str, Any]:
    """A DynamoDB item to a dict of Python values."""
    return {k: _deserializer.deserialize(v) for k, v in item.items()}


def values(**kwargs: Any) -> dict[str, Any]:
    """``ExpressionAttributeValues`` from keyword arguments: ``values(now=1)`` -> ``{":now": ..}``."""
    return {f":{k}": _serializer.serialize(v) for k, v in kwargs.items()}


class DynamoTable:
    """The table all stores share, with request helpers that each make exactly one request."""

    def __init__(self, client: Any, table_name: str) -> None:
        self.client = client
        self.name = table_name

    # -- the translation point --------------------------------------------------------------

    def call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """Call ``client.<operation>(TableName=..., **kwargs)`` and translate errors.

        Raises :class:`ConditionFailedError` (internal) for a false condition, carrying the old item
        when ``ReturnValuesOnConditionCheckFailure=ALL_OLD`` was asked for.
        """
        if operation not in ("transact_write_items", "batch_get_item", "batch_write_item"):
            kwargs.setdefault("TableName", self.name)
        try:
            response: dict[str, Any] = getattr(self.client, operation)(**kwargs)
        except ClientError as exc:
            raise self.translate(exc) from exc
        return response

    def translate(self, exc: ClientError) -> Exception:
        """Map a botocore ``ClientError`` to the exception dynacoord raises for it."""
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        message = error.get("Message", str(exc))
        if code == "ConditionalCheckFailedException":
            raw = cast("dict[str, Any] | None", exc.response.get("Item"))
            return ConditionFailedError(unmarshal(raw) if raw else None)
        if code == "ResourceNotFoundException":
            return TableNotReadyError(
                f"DynamoDB table {self.name!r} not found or not active: create it with "
                f"`dynacoord table create --table {self.name}` ({message})",
                table_name=self.name,
            )
        if code == "TransactionCanceledException":
            reasons = cast("list[dict[str, Any]]", exc.response.get("CancellationReasons", []))
            summary = ", ".join(
                f"{i}:{r.get('Code')}" for i, r in enumerate(reasons) if r.get("Code") != "None"
            )
            return TransactionCancelledError(
                f"transaction cancelled ({summary or message})", reasons=reasons
            )
        if (
            code == "ValidationException"
            and "size" in message.lower()
            and "item" in message.lower()
        ):
            return ValueTooLargeError(
                f"DynamoDB refused the item as too large: {message}", size=-1, limit=400 * 1024
            )
        return BackendError(f"DynamoDB {code}: {message}", code=code)

    # -- one-request helpers ----------------------------------------------------------------

    def get(self, key: Mapping[str, str], *, consistent: bool = True) -> dict[str, Any] | None:
        response = self.call("get_item", Key=marshal(key), ConsistentRead=consistent)
        raw = response.get("Item")
        return unmarshal(raw) if raw else None

    def put_if_free(self, item: Mapping[str, Any], now_ms: int) -> bool:
        """PutItem of ``item`` on condition :data:`FREE`; False (nothing written) when a live
        item holds its key."""
        try:
            self.call(
                "put_item",
                Item=marshal(item),
                ConditionExpression=FREE,
                ExpressionAttributeValues=values(now=now_ms),
            )
        except ConditionFailedError:
            return False
        return True

    def query_pages(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Yield every page of a Query (each page is one request), following LastEvaluatedKey."""
        while True:
            page = self.call("query", **kwargs)
            yield page
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            kwargs["ExclusiveStartKey"] = last
