"""The idempotency store on the single table.

Item: ``pk=IDEMP#{ns}#{key}``, ``sk=IDEMP``, ``status`` (IN_PROGRESS / COMPLETED),
``expires_at_ms`` (the lease while in progress, the result's expiry once completed), ``ttl``
(epoch seconds, for DynamoDB's sweeper), ``token`` (the claim, while in progress),
``payload_hash`` (optional), ``result`` (codec text, once completed), ``created_ms``,
``completed_ms``.
"""

from __future__ import annotations

import math
from typing import Any

from ...idempotency import Claim, ClaimResult, IdempotencyRecord, IdempotencyStatus
from ...keys import IDEMPOTENCY_SK, idempotency_pk
from ._table import FREE, ConditionFailedError, DynamoTable, marshal, primary, values

__all__ = ["DynamoDBIdempotencyStore"]

_NAMES = {"#status": "status", "#token": "token", "#result": "result", "#ttl": "ttl"}
_IN_PROGRESS = IdempotencyStatus.IN_PROGRESS.value
_COMPLETED = IdempotencyStatus.COMPLETED.value


class DynamoDBIdempotencyStore:
    def __init__(self, table: DynamoTable, namespace: str) -> None:
        self._table = table
        self._ns = namespace

    def _key(self, key: str) -> dict[str, Any]:
        return primary(idempotency_pk(self._ns, key), IDEMPOTENCY_SK)

    def claim(
        self, key: str, token: str, payload_hash: str | None, lease_ms: int, now_ms: int
    ) -> ClaimResult:
        expires = now_ms + lease_ms
        item = {
            "pk": idempotency_pk(self._ns, key),
            "sk": IDEMPOTENCY_SK,
            "status": _IN_PROGRESS,
            "token": token,
            "expires_at_ms": expires,
            "ttl": math.ceil(expires / 1000),
            "payload_hash": payload_hash,  # None is dropped by marshal
            "created_ms": now_ms,
        }
        try:
            self._table.call(
                "put_item",
                Item=marshal(item),
                # Free means: never claimed, released, swept, or expired (a completed result past
                # its TTL, or the lease of a crashed call). Exactly one of two racing claims wins.
                ConditionExpression=FREE,
                ExpressionAttributeValues=values(now=now_ms),
                # A refused claim returns the record that refused it: a replay is one request.
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            return ClaimResult(None, IdempotencyRecord.from_item(key, failed.item))
        return ClaimResult(Claim(key, token, expires, payload_hash))

    def complete(self, key: str, token: str, result_text: str, ttl_ms: int, now_ms: int) -> bool:
        expires = now_ms + ttl_ms
        try:
            self._table.call(
                "update_item",
                Key=self._key(key),
                # Only our own claim: a call that lost its lease must not overwrite the record of
                # the call that took the key over. A record carries a token only while in
                # progress (the claim writes both, this completion removes the token), so the
                # token alone says the claim is still ours and open.
                ConditionExpression="#token = :token",
                UpdateExpression=(
                    "SET #status = :completed, #result = :result, expires_at_ms = :exp, "
                    "#ttl = :ttl, completed_ms = :now REMOVE #token"
                ),
                ExpressionAttributeNames=_NAMES,
                ExpressionAttributeValues=values(
                    token=token,
                    completed=_COMPLETED,
                    result=result_text,
                    exp=expires,
                    ttl=math.ceil(expires / 1000),
                    now=now_ms,
                ),
            )
        except ConditionFailedError:
            return False
        return True

    def release(self, key: str, token: str) -> bool:
        try:
            self._table.call(
                "delete_item",
                Key=self._key(key),
                ConditionExpression="#token = :token",
                ExpressionAttributeNames={"#token": "token"},
                ExpressionAttributeValues=values(token=token),
            )
        except ConditionFailedError:
            return False
        return True

    def get(self, key: str) -> IdempotencyRecord | None:
        return IdempotencyRecord.from_item(key, self._table.get_item(self._key(key)))

    def delete(self, key: str) -> bool:
        response = self._table.call("delete_item", Key=self._key(key), ReturnValues="ALL_OLD")
        return bool(response.get("Attributes"))
