"""What a test of the first-use check watches: the operations a client sends, by name, and a
second client that has not seen the table (so the backend's own client must find it)."""

from __future__ import annotations

from typing import Any

from dynacoord.testing import DUMMY_CREDENTIALS


def operation_names(client: Any) -> list[str]:
    """A list that ``client`` appends the name of each operation it sends to (``PutItem``)."""
    names: list[str] = []
    client.meta.events.register(
        "before-call.dynamodb.*", lambda model, **_: names.append(model.name)
    )
    return names


def other_client() -> Any:
    """A new DynamoDB client (in moto's mock when one is active) that has seen no table."""
    import boto3

    return boto3.client("dynamodb", **DUMMY_CREDENTIALS)
