"""The checkpoint store on MongoDB.

Document: ``pk=CHECKPOINT#{ns}#{task_id}``, ``sk=SEQ#{sequence:020d}``, ``data`` (codec text),
``progress`` (optional), ``created_ms`` and, with a TTL, ``expires_at_ms`` and ``expires_at``
(TTL monitor only). Reads use the unique (pk, sk) index: a task's checkpoints are one index range,
never a collection scan.

Insert is one upserting ``replace_one`` whose filter says "this (pk, sk) is expired"; when a live
checkpoint (or one without TTL) holds the key, the filter does not match, the upsert's insert hits
the unique index and ``DuplicateKeyError`` means "exists": nothing is overwritten.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pymongo

from ...checkpoints import DELETE_BATCH, CheckpointPage, StoredCheckpoint
from ...keys import checkpoint_key, checkpoint_prefix, parse_sk_sequence
from ._collection import MongoCollection

__all__ = ["MongoCheckpointStore"]

#: every checkpoint sort key lies in this range ("$" follows "#")
_SK_RANGE = {"$gte": "SEQ#", "$lt": "SEQ$"}


class MongoCheckpointStore:
    def __init__(self, coll: MongoCollection, namespace: str) -> None:
        self._coll = coll
        self._ns = namespace

    def insert(self, checkpoint: StoredCheckpoint, now_ms: int) -> bool:
        k = checkpoint_key(self._ns, checkpoint.task_id, checkpoint.sequence)
        doc: dict[str, Any] = {
            **k.primary,
            "data": checkpoint.data_text,
            "created_ms": checkpoint.created_ms,
        }
        if checkpoint.progress is not None:
            doc["progress"] = float(checkpoint.progress)
        if checkpoint.expires_at_ms is not None:
            doc["expires_at_ms"] = checkpoint.expires_at_ms
            doc["expires_at"] = self._coll.gc_date(checkpoint.expires_at_ms, now_ms)
        return self._coll.replace_if_free(k.primary, doc, now_ms, "checkpoint insert")

    def highest_sequence(self, task_id: str) -> int | None:
        doc = self._coll.call(
            "checkpoint highest_sequence",
            "find_one",
            {"pk": checkpoint_prefix(self._ns, task_id), "sk": _SK_RANGE},
            {"sk": 1, "_id": 0},
            sort=[("sk", pymongo.DESCENDING)],
        )
        return None if doc is None else parse_sk_sequence(str(doc["sk"]))

    def get(self, task_id: str, sequence: int) -> StoredCheckpoint | None:
        doc = self._coll.call(
            "checkpoint get", "find_one", checkpoint_key(self._ns, task_id, sequence).primary
        )
        return None if doc is None else StoredCheckpoint.from_item(task_id, doc)

    def page(
        self,
        task_id: str,
        *,
        newest_first: bool,
        limit: int,
        cursor: Any | None,
        keys_only: bool = False,
    ) -> CheckpointPage:
        sk_filter: dict[str, Any] = dict(_SK_RANGE)
        if cursor is not None and newest_first:
            sk_filter = {"$gte": "SEQ#", "$lt": str(cursor)}
        elif cursor is not None:
            sk_filter = {"$gt": str(cursor), "$lt": "SEQ$"}
        projection = {"_id": 0, "sk": 1, "created_ms": 1, "expires_at_ms": 1}
        if not keys_only:
            projection.update(data=1, progress=1)
        direction = pymongo.DESCENDING if newest_first else pymongo.ASCENDING
        docs = self._coll.find(
            "checkpoint page",
            {"pk": checkpoint_prefix(self._ns, task_id), "sk": sk_filter},
            projection,
            sort=("sk", direction),
            limit=limit + 1,  # one more than asked tells whether a next page exists
        )
        items = [StoredCheckpoint.from_item(task_id, d) for d in docs[:limit]]
        more = len(docs) > limit
        return CheckpointPage(items, str(docs[limit - 1]["sk"]) if more and limit else None)

    def delete_batch(self, task_id: str, sequences: Sequence[int]) -> list[int]:
        if not sequences:
            return []
        if len(sequences) > DELETE_BATCH:
            raise ValueError(f"at most {DELETE_BATCH} deletes per batch, got {len(sequences)}")
        sks = [checkpoint_key(self._ns, task_id, seq).sk for seq in sequences]
        self._coll.call(
            "checkpoint delete_batch",
            "delete_many",
            {"pk": checkpoint_prefix(self._ns, task_id), "sk": {"$in": sks}},
        )
        return []
