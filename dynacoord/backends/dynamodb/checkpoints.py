"""The checkpoint store on the single table.

Item: ``pk=CHECKPOINT#{ns}#{task_id}``, ``sk=SEQ#{sequence:020d}``, ``data`` (codec text),
``progress`` (N, optional), ``created_ms``, and for checkpoints with a TTL ``expires_at_ms`` and
``ttl`` (epoch seconds, for DynamoDB's sweeper). Every read is a GetItem or a Query on the task's
partition (``begins_with(sk, "SEQ#")``): never a Scan.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Sequence
from typing import Any

from ...checkpoints import DELETE_BATCH, CheckpointPage, StoredCheckpoint
from ...keys import checkpoint_key, checkpoint_prefix, parse_sk_sequence
from ._table import DynamoTable, marshal, unmarshal, unmarshal_only, values

#: what StoredCheckpoint.from_item reads (pk, ttl and the request token are left as they are)
_CHECKPOINT_ATTRIBUTES = ("sk", "data", "progress", "created_ms", "expires_at_ms")

__all__ = ["DynamoDBCheckpointStore"]


def _int(number: str) -> int:
    """The int a DynamoDB number holds: its plain digits as DynamoDB returns an integer, or
    any other form through Decimal."""
    try:
        return int(number)
    except ValueError:
        return int(decimal.Decimal(number))


def _stored(task_id: str, raw: dict[str, Any]) -> StoredCheckpoint:
    """A queried item as StoredCheckpoint.from_item reads it, straight from the attribute values
    (a page holds up to 100 checkpoints: no dict of Python values is built for each)."""
    data = raw.get("data")
    progress = raw.get("progress")
    created = raw.get("created_ms")
    expires = raw.get("expires_at_ms")
    try:
        return StoredCheckpoint(
            task_id,
            parse_sk_sequence(raw["sk"]["S"]),
            None if data is None else data["S"],
            None if progress is None else float(decimal.Decimal(progress["N"])),
            0 if created is None else _int(created["N"]),
            None if expires is None else _int(expires["N"]),
        )
    except KeyError:  # an attribute of another type than dynacoord writes: the general path
        return StoredCheckpoint.from_item(task_id, unmarshal_only(raw, _CHECKPOINT_ATTRIBUTES))


class DynamoDBCheckpointStore:
    def __init__(self, table: DynamoTable, namespace: str) -> None:
        self._table = table
        self._ns = namespace

    def _query(self, task_id: str, **kwargs: Any) -> dict[str, Any]:
        return self._table.call(
            "query",
            KeyConditionExpression="pk = :pk AND begins_with(sk, :seq)",
            ExpressionAttributeValues=values(pk=checkpoint_prefix(self._ns, task_id), seq="SEQ#"),
            ConsistentRead=True,
            **kwargs,
        )

    def insert(self, checkpoint: StoredCheckpoint, now_ms: int) -> bool:
        k = checkpoint_key(self._ns, checkpoint.task_id, checkpoint.sequence)
        item: dict[str, Any] = {
            **k.primary,
            "data": checkpoint.data_text,
            "created_ms": checkpoint.created_ms,
        }
        if checkpoint.progress is not None:
            # TypeSerializer refuses floats; str() of a float is its shortest exact repr.
            item["progress"] = decimal.Decimal(str(checkpoint.progress))
        if checkpoint.expires_at_ms is not None:
            item["expires_at_ms"] = checkpoint.expires_at_ms
            item["ttl"] = math.ceil(checkpoint.expires_at_ms / 1000)
        # Never overwrite a live checkpoint (closes the race of two savers that picked the same
        # next sequence); an expired one that the sweeper has not removed yet counts as absent.
        return self._table.put_if_free(item, now_ms)

    def highest_sequence(self, task_id: str) -> int | None:
        response = self._query(task_id, ScanIndexForward=False, Limit=1, ProjectionExpression="sk")
        items = response.get("Items", [])
        if not items:
            return None
        return parse_sk_sequence(str(unmarshal(items[0])["sk"]))

    def get(self, task_id: str, sequence: int) -> StoredCheckpoint | None:
        item = self._table.get(checkpoint_key(self._ns, task_id, sequence).primary)
        return None if item is None else StoredCheckpoint.from_item(task_id, item)

    def page(
        self,
        task_id: str,
        *,
        newest_first: bool,
        limit: int,
        cursor: Any | None,
        keys_only: bool = False,
    ) -> CheckpointPage:
        kwargs: dict[str, Any] = {"ScanIndexForward": not newest_first, "Limit": limit}
        if cursor is not None:
            kwargs["ExclusiveStartKey"] = cursor
        if keys_only:
            kwargs["ProjectionExpression"] = "sk, expires_at_ms"
        response = self._query(task_id, **kwargs)
        items = [_stored(task_id, raw) for raw in response.get("Items", [])]
        return CheckpointPage(items, response.get("LastEvaluatedKey") or None)

    def delete_batch(self, task_id: str, sequences: Sequence[int]) -> list[int]:
        if not sequences:
            return []
        if len(sequences) > DELETE_BATCH:
            raise ValueError(f"at most {DELETE_BATCH} deletes per batch, got {len(sequences)}")
        requests = [
            {"DeleteRequest": {"Key": marshal(checkpoint_key(self._ns, task_id, seq).primary)}}
            for seq in sequences
        ]
        response = self._table.call("batch_write_item", RequestItems={self._table.name: requests})
        unprocessed = response.get("UnprocessedItems", {}).get(self._table.name, [])
        return [
            parse_sk_sequence(str(unmarshal(entry["DeleteRequest"]["Key"])["sk"]))
            for entry in unprocessed
        ]
