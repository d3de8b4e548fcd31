"""DynamoDB stream records as Lambda hands them to the relay, built from a stored item."""

from __future__ import annotations

from typing import Any


def insert_record(client: Any, table: str, key: dict[str, Any], seq: int) -> dict[str, Any]:
    """The INSERT record of the item at ``key`` as it is stored now (read consistently), with
    stream position ``seq``."""
    image = client.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
    return {
        "eventName": "INSERT",
        "eventSource": "aws:dynamodb",
        "dynamodb": {
            "NewImage": image,
            "SequenceNumber": f"{seq:021d}",
            "StreamViewType": "NEW_IMAGE",
        },
    }
