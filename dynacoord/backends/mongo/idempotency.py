"""The idempotency store on MongoDB.

Document: ``pk=IDEMP#{ns}#{key}``, ``sk=IDEMP``, ``status``, ``expires_at_ms``, ``expires_at``
(TTL monitor only), ``token`` (in progress), ``payload_hash`` (optional), ``result`` (completed),
``created_ms``, ``completed_ms``, ``completed_by`` (the completing call's request token, which
its retry after a lost answer recognises).

Claim is one upserting ``replace_one`` whose filter says "free" (expired). If the record is live
the upsert's insert hits the unique (pk, sk) index: ``DuplicateKeyError`` means "taken", and the
record that refused the claim is read back. If that read finds the record expired (or gone) in the
meantime, the claim is retried instead of being reported as refused. Complete and release filter
on the claim token, so a call that lost its lease cannot touch the record of its successor.
"""

from __future__ import annotations

from typing import Any

from ...idempotency import Claim, ClaimResult, IdempotencyRecord, IdempotencyStatus
from ...keys import idempotency_key
from ._collection import MongoCollection, request_token

__all__ = ["MongoIdempotencyStore"]

_CLAIM_ATTEMPTS = 4


class MongoIdempotencyStore:
    def __init__(self, coll: MongoCollection, namespace: str) -> None:
        self._coll = coll
        self._ns = namespace

    def _filter(self, key: str) -> dict[str, Any]:
        return idempotency_key(self._ns, key).primary

    def claim(
        self, key: str, token: str, payload_hash: str | None, lease_ms: int, now_ms: int
    ) -> ClaimResult:
        expires = now_ms + lease_ms
        doc: dict[str, Any] = {
            **self._filter(key),
            "status": IdempotencyStatus.IN_PROGRESS.value,
            "token": token,
            "expires_at_ms": expires,
            "expires_at": self._coll.gc_date(expires, now_ms),
            "created_ms": now_ms,
        }
        if payload_hash is not None:
            doc["payload_hash"] = payload_hash
        existing: IdempotencyRecord | None = None
        for _ in range(_CLAIM_ATTEMPTS):
            if self._coll.replace_if_free(self._filter(key), doc, now_ms, "idempotency claim"):
                return ClaimResult(Claim(key, token, expires, payload_hash))
            existing = IdempotencyRecord.from_item(
                key, self._coll.call("idempotency get", "find_one", self._filter(key))
            )
            if existing is not None and existing.live(now_ms):
                return ClaimResult(None, existing)
        return ClaimResult(None, existing)

    def complete(self, key: str, token: str, result_text: str, ttl_ms: int, now_ms: int) -> bool:
        expires = now_ms + ttl_ms
        req = request_token()  # kept as completed_by: its retry after a lost answer knows it
        result = self._coll.call(
            "idempotency complete",
            "update_one",
            {
                **self._filter(key),
                "token": token,
                "status": IdempotencyStatus.IN_PROGRESS.value,
            },
            {
                "$set": {
                    "status": IdempotencyStatus.COMPLETED.value,
                    "result": result_text,
                    "expires_at_ms": expires,
                    "expires_at": self._coll.gc_date(expires, now_ms),
                    "completed_ms": now_ms,
                    "completed_by": req,
                },
                "$unset": {"token": ""},
            },
        )
        if result.matched_count == 1:
            return True
        # refused: by this very completion, applied, its answer lost (pymongo re-sent it)?
        doc = self._coll.call(
            "idempotency complete", "find_one", self._filter(key), {"completed_by": 1}
        )
        return doc is not None and doc.get("completed_by") == req

    def release(self, key: str, token: str) -> bool:
        result = self._coll.call(
            "idempotency release", "delete_one", {**self._filter(key), "token": token}
        )
        return bool(result.deleted_count == 1)

    def get(self, key: str) -> IdempotencyRecord | None:
        return IdempotencyRecord.from_item(
            key, self._coll.call("idempotency get", "find_one", self._filter(key))
        )

    def delete(self, key: str) -> bool:
        result = self._coll.call("idempotency delete", "delete_one", self._filter(key))
        return bool(result.deleted_count == 1)
