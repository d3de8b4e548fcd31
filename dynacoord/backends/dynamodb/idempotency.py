"""The idempotency store on the single table.

Item: ``pk=IDEMP#{ns}#{key}``, ``sk=IDEMP``, ``status`` (IN_PROGRESS / COMPLETED),
``expires_at_ms`` (the lease while in progress, the result's expiry once completed), ``ttl``
(epoch seconds, for DynamoDB's sweeper), ``token`` (the claim, while in progress),
``payload_hash`` (optional), ``result`` (codec text, once completed), ``created_ms``,
``completed_ms``, ``completed_by`` (the completing call's request token, which its retry after a
lost answer recognises).
"""

from __future__ import annotations

import math
from typing import Any

from ...idempotency import Claim, ClaimResult, IdempotencyRecord, IdempotencyStatus, _status
from ...keys import IDEMPOTENCY_SK, idempotency_pk
from ._marshal import to_av, unmarshal, values
from ._table import ConditionFailedError, DynamoTable, request_token

__all__ = ["DynamoDBIdempotencyStore"]

_NAMES = {"#status": "status", "#token": "token", "#result": "result", "#ttl": "ttl"}
_IN_PROGRESS = IdempotencyStatus.IN_PROGRESS.value
_COMPLETED = IdempotencyStatus.COMPLETED.value


class DynamoDBIdempotencyStore:
    def __init__(self, table: DynamoTable, namespace: str) -> None:
        self._table = table
        self._ns = namespace

    def _key(self, key: str) -> dict[str, Any]:
        # primary()'s dict, built here: a frame less on every request
        return {"pk": {"S": idempotency_pk(self._ns, key)}, "sk": {"S": IDEMPOTENCY_SK}}

    def claim(
        self, key: str, token: str, payload_hash: str | None, lease_ms: int, now_ms: int
    ) -> ClaimResult:
        expires = now_ms + lease_ms
        # Marshalled as it is built (what marshal() makes of it): the strs and the ints of the
        # clock, attribute by attribute in the same order.
        item = {
            "pk": {"S": idempotency_pk(self._ns, key)},
            "sk": {"S": IDEMPOTENCY_SK},
            "status": {"S": _IN_PROGRESS},
            "token": {"S": token},
            "expires_at_ms": {"N": str(expires)},
            "ttl": {"N": str(math.ceil(expires / 1000))},
        }
        if payload_hash is not None:
            item["payload_hash"] = {"S": payload_hash}
        item["created_ms"] = {"N": str(now_ms)}
        try:
            # Free means: never claimed, released, swept, or expired (a completed result past its
            # TTL, or the lease of a crashed call). Exactly one of two racing claims wins, and a
            # refused claim returns the record that refused it: a replay is one request.
            self._table.put_free(item, now_ms)
        except ConditionFailedError as failed:
            return ClaimResult(None, IdempotencyRecord.from_item(key, failed.item))
        return ClaimResult(Claim(key, token, expires, payload_hash))

    def complete(self, key: str, token: str, result_text: str, ttl_ms: int, now_ms: int) -> bool:
        expires = now_ms + ttl_ms
        req = request_token()
        try:
            self._table.call(
                "update_item",
                Key=self._key(key),
                # Only our own claim: a call that lost its lease must not overwrite the record of
                # the call that took the key over. A record carries a token only while in
                # progress (the claim writes both, this completion removes the token), so the
                # token alone says the claim is still ours and open. ``completed_by`` keeps this
                # call's request token: its retry after a lost answer knows it applied (another
                # completion by the same claim is still refused).
                ConditionExpression="#token = :token",
                UpdateExpression=(
                    "SET #status = :completed, #result = :result, expires_at_ms = :exp, "
                    "#ttl = :ttl, completed_ms = :now, completed_by = :req REMOVE #token"
                ),
                ExpressionAttributeNames=_NAMES,
                # what values() makes of them: the codec's text, the ints of the clock and (from
                # a Claim anyone can build) the token, which values() marshals unless a str
                ExpressionAttributeValues={
                    ":token": {"S": token} if type(token) is str else to_av(token),
                    ":completed": {"S": _COMPLETED},
                    ":result": {"S": result_text},
                    ":exp": {"N": str(expires)},
                    ":ttl": {"N": str(math.ceil(expires / 1000))},
                    ":now": {"N": str(now_ms)},
                    ":req": {"S": req},
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as refused:
            # this very completion, applied, its answer lost (botocore re-sent it)?
            return (refused.raw or {}).get("completed_by") == {"S": req}
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
        # the raw item read as from_item reads its unmarshal
        raw = self._table.get_raw(self._key(key))
        if not raw:
            return None
        try:
            status = raw.get("status")
            if status is None:
                return None
            expires_at_ms = raw.get("expires_at_ms")
            payload_hash = raw.get("payload_hash")
            result = raw.get("result")
            token = raw.get("token")
            return IdempotencyRecord(
                key,
                _status(status["S"]),
                0 if expires_at_ms is None else int(expires_at_ms["N"]),
                None if payload_hash is None else payload_hash["S"] or None,
                None if result is None else result["S"],
                None if token is None else token["S"],
            )
        except (KeyError, TypeError, ValueError):
            # not the attribute types the store writes: the general reader decides (or raises)
            return IdempotencyRecord.from_item(key, unmarshal(raw))

    def delete(self, key: str) -> bool:
        response = self._table.call("delete_item", Key=self._key(key), ReturnValues="ALL_OLD")
        return bool(response.get("Attributes"))
