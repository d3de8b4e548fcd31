"""What a dynacoord table must look like, checked on a DescribeTable answer.

Shared by :func:`dynacoord.provision.verify_table` (the ``table verify`` command) and the
DynamoDB backend's check on first use, so both name a problem in the same words. Pure functions
over the ``Table`` dict: no request, no boto3 import.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "GSI_NAME",
    "TTL_ATTRIBUTE",
    "forget_verified",
    "is_verified",
    "key_schema_problems",
    "mark_verified",
    "schema_problems",
]

GSI_NAME = "gsi1"
TTL_ATTRIBUTE = "ttl"


def key_schema_problems(
    what: str,
    key_schema: Sequence[Mapping[str, Any]],
    hash_name: str,
    range_name: str,
    types: Mapping[str, str],
) -> list[str]:
    """The problems of one key schema (the table's or an index's): names, order and types."""
    problems: list[str] = []
    actual = [(k.get("AttributeName"), k.get("KeyType")) for k in key_schema]
    if actual != [(hash_name, "HASH"), (range_name, "RANGE")]:
        rendered = " + ".join(f"{name} ({kind})" for name, kind in actual) or "empty"
        problems.append(
            f"{what} key schema is {rendered}, expected {hash_name} (HASH) + {range_name} (RANGE)"
        )
    for name, _ in actual:
        if name in (hash_name, range_name) and types.get(str(name)) != "S":
            problems.append(
                f"{what} key attribute {name!r} has type {types.get(str(name))}, expected S"
            )
    return problems


def schema_problems(table: Mapping[str, Any], *, statuses: bool = True) -> list[str]:
    """The problems of a DescribeTable ``Table``: key schema and types, the index ``gsi1`` (key
    schema, projection ALL) and, with ``statuses``, the table's and the index's status."""
    problems: list[str] = []
    status = table.get("TableStatus")
    if statuses and status != "ACTIVE":
        problems.append(f"table status is {status}, expected ACTIVE")
    types = {
        str(a["AttributeName"]): str(a["AttributeType"])
        for a in table.get("AttributeDefinitions", [])
    }
    problems += key_schema_problems("table", table.get("KeySchema", []), "pk", "sk", types)
    indexes = {g.get("IndexName"): g for g in table.get("GlobalSecondaryIndexes", [])}
    gsi = indexes.get(GSI_NAME)
    if gsi is None:
        problems.append(f"global secondary index {GSI_NAME!r} is missing")
    else:
        problems += key_schema_problems(
            f"index {GSI_NAME}", gsi.get("KeySchema", []), "gsi1pk", "gsi1sk", types
        )
        projection = gsi.get("Projection", {}).get("ProjectionType")
        if projection != "ALL":
            problems.append(f"index {GSI_NAME} projection is {projection}, expected ALL")
        index_status = gsi.get("IndexStatus", "ACTIVE")
        if statuses and index_status != "ACTIVE":
            problems.append(f"index {GSI_NAME} status is {index_status}, expected ACTIVE")
    return problems


#: tables known to be right, per client (weakly: a dropped client frees its entry): checked by
#: the backend on first use, created or verified by dynacoord.provision with that client
_verified: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_verified_lock = threading.Lock()


def is_verified(client: Any, table_name: str) -> bool:
    """Whether ``table_name`` was found right through ``client`` in this process."""
    try:
        return table_name in _verified.get(client, ())
    except TypeError:  # a client that cannot be weakly referenced: checked per backend
        return False


def mark_verified(client: Any, table_name: str) -> None:
    """Remember that ``table_name`` was found (or made) right through ``client``."""
    with _verified_lock, contextlib.suppress(TypeError):
        _verified.setdefault(client, set()).add(table_name)


def forget_verified(client: Any, table_name: str) -> None:
    """Forget ``table_name`` (it was deleted through ``client``)."""
    with _verified_lock, contextlib.suppress(TypeError):
        _verified.get(client, set()).discard(table_name)
