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

from ...checkpoints import (
    DELETE_BATCH,
    CheckpointFields,
    CheckpointPage,
    StoredCheckpoint,
    live_checkpoint,
)
from ...keys import checkpoint_key, checkpoint_prefix, parse_sk_sequence
from ._marshal import marshal, primary, to_av, unmarshal, unmarshal_only
from ._table import DynamoTable

#: what StoredCheckpoint.from_item reads (pk, ttl and the request token are left as they are)
_CHECKPOINT_ATTRIBUTES = ("sk", "data", "progress", "created_ms", "expires_at_ms")

__all__ = ["DynamoDBCheckpointStore"]


def _fields(task_id: str, raw: dict[str, Any]) -> CheckpointFields:
    """A stored item's fields as StoredCheckpoint.from_item reads them, straight from the
    attribute values (a page holds up to 100 checkpoints: no dict of Python values is built for
    each)."""
    data = raw.get("data")
    progress = raw.get("progress")
    created = raw.get("created_ms")
    expires = raw.get("expires_at_ms")
    try:
        sk: str = raw["sk"]["S"]
        return (
            # a well-formed sort key inline; parse_sk_sequence refuses any other
            int(sk[4:]) if sk.startswith("SEQ#") else parse_sk_sequence(sk),
            None if data is None else data["S"],
            # float() of a number's text rounds as float(Decimal(text)) does (Decimal converts
            # through its str); int() takes the digits of an integer. Any other form raises
            # ValueError, and the general path reads it through Decimal.
            None if progress is None else float(progress["N"]),
            0 if created is None else int(created["N"]),
            None if expires is None else int(expires["N"]),
        )
    except (KeyError, ValueError):
        pass  # an attribute of another type or form than dynacoord writes: the general path
    stored = StoredCheckpoint.from_item(task_id, unmarshal_only(raw, _CHECKPOINT_ATTRIBUTES))
    return (
        stored.sequence,
        stored.data_text,
        stored.progress,
        stored.created_ms,
        stored.expires_at_ms,
    )


class DynamoDBCheckpointStore:
    """A CheckpointStore, and CheckpointRows whose rows are CheckpointFields."""

    def __init__(self, table: DynamoTable, namespace: str) -> None:
        self._table = table
        self._ns = namespace

    def insert(self, checkpoint: StoredCheckpoint, now_ms: int) -> bool:
        fields = (
            checkpoint.sequence,
            checkpoint.data_text,
            checkpoint.progress,
            checkpoint.created_ms,
            checkpoint.expires_at_ms,
        )
        return self.insert_fields(checkpoint.task_id, fields, now_ms)

    def insert_fields(self, task_id: str, fields: CheckpointFields, now_ms: int) -> bool:
        sequence, data_text, progress, created_ms, expires_ms = fields
        k = checkpoint_key(self._ns, task_id, sequence)
        # Marshalled as it is built: a saved checkpoint has its text and integer times (a
        # keys-only row, without text, is never written).
        item: dict[str, Any] = {
            "pk": {"S": k.pk},
            "sk": {"S": k.sk},
            "data": {"S": data_text},
            "created_ms": {"N": str(created_ms)},
        }
        if progress is not None:
            # TypeSerializer refuses floats; str() of a float is its shortest exact repr.
            item["progress"] = to_av(decimal.Decimal(str(progress)))
        if expires_ms is not None:
            item["expires_at_ms"] = {"N": str(expires_ms)}
            item["ttl"] = {"N": str(math.ceil(expires_ms / 1000))}
        # Never overwrite a live checkpoint (closes the race of two savers that picked the same
        # next sequence); an expired one that the sweeper has not removed yet counts as absent.
        return self._table.put_item_if_free(item, now_ms)

    def highest_sequence(self, task_id: str) -> int | None:
        rows, _ = self.page_rows(task_id, newest_first=True, limit=1, cursor=None, projection="sk")
        return rows[0][0] if rows else None

    def get(self, task_id: str, sequence: int) -> StoredCheckpoint | None:
        fields = self.get_row(task_id, sequence)
        return None if fields is None else StoredCheckpoint(task_id, *fields)

    def get_row(self, task_id: str, sequence: int) -> CheckpointFields | None:
        k = checkpoint_key(self._ns, task_id, sequence)
        raw = self._table.get_raw(primary(k.pk, k.sk))
        return _fields(task_id, raw) if raw else None

    def page(
        self,
        task_id: str,
        *,
        newest_first: bool,
        limit: int,
        cursor: Any | None,
        keys_only: bool = False,
    ) -> CheckpointPage:
        rows, next_cursor = self.page_rows(
            task_id,
            newest_first=newest_first,
            limit=limit,
            cursor=cursor,
            projection="sk, expires_at_ms" if keys_only else None,
        )
        return CheckpointPage([StoredCheckpoint(task_id, *fields) for fields in rows], next_cursor)

    def page_rows(
        self,
        task_id: str,
        *,
        newest_first: bool,
        limit: int,
        cursor: Any | None,
        projection: str | None = None,
    ) -> tuple[list[CheckpointFields], Any | None]:
        """One Query page of the task's checkpoints; ``projection`` names the only attributes
        to read (a ProjectionExpression)."""
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :seq)",
            "ExpressionAttributeValues": {
                ":pk": {"S": checkpoint_prefix(self._ns, task_id)},
                ":seq": {"S": "SEQ#"},
            },
            "ConsistentRead": True,
            "ScanIndexForward": not newest_first,
            "Limit": limit,
        }
        if cursor is not None:
            kwargs["ExclusiveStartKey"] = cursor
        if projection is not None:
            kwargs["ProjectionExpression"] = projection
        response = self._table.call("query", **kwargs)
        rows = [_fields(task_id, raw) for raw in response.get("Items", [])]
        return rows, response.get("LastEvaluatedKey") or None

    live_checkpoint = staticmethod(live_checkpoint)

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
