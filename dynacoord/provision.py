"""Create, check and deploy the dynacoord table (directly or with the bundled CloudFormation stack)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .errors import BackendError, TableNotReadyError

__all__ = [
    "GSI_NAME",
    "create_table",
    "ensure_table",
    "table_definition",
]

logger = logging.getLogger(__name__)

GSI_NAME = "gsi1"
TTL_ATTRIBUTE = "ttl"

Progress = Callable[[str], None]


def _noop(_: str) -> None:
    return None


def table_definition(
    table_name: str,
    *,
    billing_mode: str = "PAY_PER_REQUEST",
    read_capacity: int = 5,
    write_capacity: int = 5,
    deletion_protection: bool = False,
) -> dict[str, Any]:
    """The ``CreateTable`` request for the dynacoord table (same schema as the bundled template)."""
    if billing_mode not in ("PAY_PER_REQUEST", "PROVISIONED"):
        raise ValueError(
            f"billing_mode must be PAY_PER_REQUEST or PROVISIONED, got {billing_mode!r}"
        )
    gsi: dict[str, Any] = {
        "IndexName": GSI_NAME,
        "KeySchema": [
            {"AttributeName": "gsi1pk", "KeyType": "HASH"},
            {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "ALL"},
    }
    request: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": "S"}
            for name in ("pk", "sk", "gsi1pk", "gsi1sk")
        ],
        "KeySchema": [
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [gsi],
        "BillingMode": billing_mode,
        "DeletionProtectionEnabled": deletion_protection,
    }
    if billing_mode == "PROVISIONED":
        throughput = {"ReadCapacityUnits": read_capacity, "WriteCapacityUnits": write_capacity}
        request["ProvisionedThroughput"] = throughput
        gsi["ProvisionedThroughput"] = dict(throughput)
    return request


def create_table(
    client: Any,
    table_name: str,
    *,
    wait: bool = True,
    progress: Progress = _noop,
    **options: Any,
) -> None:
    """Create the table and enable TTL on ``ttl``. Fails if the table exists (see ensure_table)."""
    from botocore.exceptions import ClientError

    try:
        client.create_table(**table_definition(table_name, **options))
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        raise BackendError(f"cannot create table {table_name!r}: {exc}", code=code) from exc
    progress(f"creating table {table_name} ...")
    if wait:
        _wait_active(client, table_name, progress)
    _enable_ttl(client, table_name, progress)


def ensure_table(
    client: Any,
    table_name: str,
    *,
    progress: Progress = _noop,
    timeout: float = 300.0,
    **options: Any,
) -> bool:
    """Make sure the table exists, is ACTIVE and has TTL on. Idempotent. True if it was created."""
    from botocore.exceptions import ClientError

    created = False
    try:
        client.describe_table(TableName=table_name)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
            raise BackendError(f"cannot describe table {table_name!r}: {exc}") from exc
        try:
            client.create_table(**table_definition(table_name, **options))
            created = True
            progress(f"creating table {table_name} ...")
        except ClientError as create_exc:
            # Another process may have created it between our describe and create.
            if create_exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
                raise BackendError(
                    f"cannot create table {table_name!r}: {create_exc}"
                ) from create_exc
    _wait_active(client, table_name, progress, timeout=timeout)
    _enable_ttl(client, table_name, progress)
    return created


def _wait_active(
    client: Any, table_name: str, progress: Progress, *, timeout: float = 300.0
) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        table = client.describe_table(TableName=table_name)["Table"]
        gsis = table.get("GlobalSecondaryIndexes", [])
        if table.get("TableStatus") == "ACTIVE" and all(
            g.get("IndexStatus", "ACTIVE") == "ACTIVE" for g in gsis
        ):
            return
        if time.monotonic() > deadline:
            raise TableNotReadyError(
                f"table {table_name!r} not ACTIVE after {timeout}s (status "
                f"{table.get('TableStatus')})",
                table_name=table_name,
            )
        progress(f"waiting for table {table_name} ({table.get('TableStatus')}) ...")
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def _enable_ttl(client: Any, table_name: str, progress: Progress) -> None:
    from botocore.exceptions import ClientError

    try:
        status = client.describe_time_to_live(TableName=table_name)["TimeToLiveDescription"]
    except ClientError as exc:
        raise BackendError(f"cannot read TTL settings of {table_name!r}: {exc}") from exc
    if (
        status.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
        and status.get("AttributeName") == TTL_ATTRIBUTE
    ):
        return
    progress(f"enabling TTL on {table_name}.{TTL_ATTRIBUTE} ...")
    client.update_time_to_live(
        TableName=table_name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
    )
