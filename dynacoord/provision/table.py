"""The table itself, straight through DynamoDB: create, ensure (create what is missing), verify
and delete (scripts, tests, DynamoDB Local; the stack is the other way, :mod:`.stack`).

Waits (until the table and ``gsi1`` are ACTIVE, until a deleted table is gone) poll with a
doubling delay on the caller's clock (``clock=``, e.g. the backend's): a test's
:class:`~dynacoord.ManualClock` makes them instant.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .._clock import Clock
from .._table_schema import (
    DEFAULT_LAYOUT,
    GSI_NAME,
    TTL_ATTRIBUTE,
    TableLayout,
    key_schema_problems,
    schema_problems,
    ttl_problem,
)
from .._table_state import forget_verified, mark_verified
from ..errors import BackendError, ConfigurationError, TableNotReadyError
from ._aws import Progress, Refusal, call, noop, request, wait_for

__all__ = [
    "GSI_NAME",
    "TTL_ATTRIBUTE",
    "create_table",
    "delete_table",
    "ensure_table",
    "is_warning",
    "table_definition",
    "verify_table",
]

logger = logging.getLogger("dynacoord.provision")


def table_definition(
    table_name: str,
    *,
    billing_mode: str = "PAY_PER_REQUEST",
    read_capacity: int = 5,
    write_capacity: int = 5,
    deletion_protection: bool = False,
    layout: TableLayout | None = None,
) -> dict[str, Any]:
    """The ``CreateTable`` request for the dynacoord table (same schema as the bundled template),
    in ``layout``'s names (default: dynacoord's own)."""
    layout = _layout(layout)
    if billing_mode not in ("PAY_PER_REQUEST", "PROVISIONED"):
        raise ValueError(
            f"billing_mode must be PAY_PER_REQUEST or PROVISIONED, got {billing_mode!r}"
        )
    gsi: dict[str, Any] = {
        "IndexName": layout.index,
        "KeySchema": [
            {"AttributeName": layout.index_pk, "KeyType": "HASH"},
            {"AttributeName": layout.index_sk, "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "ALL"},
    }
    definition: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": "S"}
            for name in (layout.pk, layout.sk, layout.index_pk, layout.index_sk)
        ],
        "KeySchema": [
            {"AttributeName": layout.pk, "KeyType": "HASH"},
            {"AttributeName": layout.sk, "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [gsi],
        "BillingMode": billing_mode,
        "DeletionProtectionEnabled": deletion_protection,
    }
    if billing_mode == "PROVISIONED":
        throughput = {"ReadCapacityUnits": read_capacity, "WriteCapacityUnits": write_capacity}
        definition["ProvisionedThroughput"] = throughput
        gsi["ProvisionedThroughput"] = dict(throughput)
    return definition


def _layout(layout: TableLayout | None) -> TableLayout:
    if layout is None:
        return DEFAULT_LAYOUT
    if not isinstance(layout, TableLayout):
        raise ValueError(f"layout must be a dynacoord.TableLayout, got {type(layout).__name__}")
    return layout


def create_table(
    client: Any,
    table_name: str,
    *,
    wait: bool = True,
    progress: Progress = noop,
    clock: Clock | None = None,
    layout: TableLayout | None = None,
    **options: Any,
) -> None:
    """Create the table and enable TTL on ``ttl`` (the layout's names, with ``layout``). Fails
    if the table exists (see ensure_table)."""
    layout = _layout(layout)
    request(
        client,
        "create_table",
        f"create table {table_name!r}",
        **table_definition(table_name, layout=layout, **options),
    )
    progress(f"creating table {table_name} ...")
    # made here as dynacoord needs it: no check on first use
    mark_verified(client, table_name, layout)
    if wait:
        _wait_active(client, table_name, progress, clock=clock)
    _enable_ttl(client, table_name, progress, layout)


def ensure_table(
    client: Any,
    table_name: str,
    *,
    progress: Progress = noop,
    timeout: float = 300.0,
    clock: Clock | None = None,
    layout: TableLayout | None = None,
    **options: Any,
) -> bool:
    """Make sure the table exists, has the index ``gsi1``, is ACTIVE and has TTL on ``ttl``
    (the layout's names, with ``layout``).

    Idempotent; creates only what is missing and never alters what exists with another shape
    (:func:`verify_table` reports that). True if the table was created.
    """
    layout = _layout(layout)
    created = False
    found = call(
        client,
        "describe_table",
        f"describe table {table_name!r}",
        expect=lambda r: r.not_found,
        TableName=table_name,
    )
    if isinstance(found, Refusal):
        made = call(
            client,
            "create_table",
            f"create table {table_name!r}",
            # Another process may have created it between our describe and create.
            expect=lambda r: r.code == "ResourceInUseException",
            **table_definition(table_name, layout=layout, **options),
        )
        if not isinstance(made, Refusal):
            created = True
            mark_verified(client, table_name, layout)
            progress(f"creating table {table_name} ...")
    table = _wait_active(client, table_name, progress, timeout=timeout, clock=clock)
    if not created:
        # Pointed at the wrong table (a typo, a wrong variable): change nothing there. Adding an
        # index and TTL on an attribute that means something else would delete someone's data.
        types = {
            str(d.get("AttributeName")): str(d.get("AttributeType"))
            for d in table.get("AttributeDefinitions", [])
        }
        problems = key_schema_problems(
            "table", table.get("KeySchema", []), layout.pk, layout.sk, types
        )
        if problems:
            raise ConfigurationError(
                f"table {table_name!r} is not a dynacoord table ({'; '.join(problems)}); "
                "nothing was changed: check the table name"
                + ("" if layout.is_default else " and the table layout")
            )
    if not created and _add_missing_index(client, table, progress, options, layout):
        _wait_active(client, table_name, progress, timeout=timeout, clock=clock)
    _enable_ttl(client, table_name, progress, layout)
    return created


def _add_missing_index(
    client: Any,
    table: Mapping[str, Any],
    progress: Progress,
    options: Mapping[str, Any],
    layout: TableLayout,
) -> bool:
    """Add ``gsi1`` to an existing ACTIVE ``table`` (its description) that lacks it (one
    UpdateTable). True if it was added.

    An index that exists with other keys is not touched: replacing it would drop what its users
    rely on, so :func:`verify_table` reports it instead.
    """
    table_name = str(table["TableName"])
    index_name = layout.index
    if any(g.get("IndexName") == index_name for g in table.get("GlobalSecondaryIndexes", [])):
        return False
    definition = table_definition(table_name, layout=layout, **options)
    gsi = dict(definition["GlobalSecondaryIndexes"][0])
    # The index follows the table's billing mode, whatever ensure_table was asked to create.
    billing = table.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED")
    if billing == "PROVISIONED":
        throughput = table.get("ProvisionedThroughput", {})
        gsi["ProvisionedThroughput"] = {
            "ReadCapacityUnits": throughput.get("ReadCapacityUnits") or 5,
            "WriteCapacityUnits": throughput.get("WriteCapacityUnits") or 5,
        }
    else:
        gsi.pop("ProvisionedThroughput", None)
    index_attributes = {layout.index_pk, layout.index_sk}
    request(
        client,
        "update_table",
        f"add index {index_name} to table {table_name!r}",
        TableName=table_name,
        AttributeDefinitions=[
            a for a in definition["AttributeDefinitions"] if a["AttributeName"] in index_attributes
        ],
        GlobalSecondaryIndexUpdates=[{"Create": gsi}],
    )
    progress(f"adding index {index_name} to {table_name} ...")
    return True


def _describe(client: Any, table_name: str) -> dict[str, Any] | Refusal:
    """The table's description, or the refusal when it does not exist."""
    found = call(
        client,
        "describe_table",
        f"describe table {table_name!r}",
        expect=lambda r: r.not_found,
        TableName=table_name,
    )
    return found if isinstance(found, Refusal) else dict(found["Table"])


def _wait_active(
    client: Any,
    table_name: str,
    progress: Progress,
    *,
    timeout: float = 300.0,
    clock: Clock | None = None,
) -> dict[str, Any]:
    """Wait until the table and its indexes are ACTIVE; return the last description."""

    def probe() -> tuple[dict[str, Any] | None, str]:
        table = dict(
            request(
                client, "describe_table", f"describe table {table_name!r}", TableName=table_name
            )["Table"]
        )
        gsis = table.get("GlobalSecondaryIndexes", [])
        ready = table.get("TableStatus") == "ACTIVE" and all(
            g.get("IndexStatus", "ACTIVE") == "ACTIVE" for g in gsis
        )
        return (table if ready else None), str(table.get("TableStatus"))

    return wait_for(
        probe,
        what=f"table {table_name}",
        clock=clock,
        timeout=timeout,
        progress=progress,
        timed_out=lambda status: TableNotReadyError(
            f"table {table_name!r} not ACTIVE after {timeout}s (status {status})",
            table_name=table_name,
        ),
    )


def _enable_ttl(client: Any, table_name: str, progress: Progress, layout: TableLayout) -> None:
    attribute = layout.ttl
    status = request(
        client,
        "describe_time_to_live",
        f"read TTL settings of {table_name!r}",
        TableName=table_name,
    )["TimeToLiveDescription"]
    if (
        status.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
        and status.get("AttributeName") == attribute
    ):
        return
    if status.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
        # DynamoDB allows one TTL attribute per table and the application's items expire by it:
        # dynacoord takes that attribute (its layout's ttl), never the other way round.
        raise TableNotReadyError(
            f"table {table_name!r}: {ttl_problem(status, layout)}", table_name=table_name
        )
    progress(f"enabling TTL on {table_name}.{attribute} ...")
    request(
        client,
        "update_time_to_live",
        f"enable TTL on {table_name}.{attribute}",
        TableName=table_name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": attribute},
    )


def _refused_for_protection(refusal: Refusal) -> bool:
    return "DeletionProtection" in refusal.message or "deletion protection" in (
        refusal.message.lower()
    )


# --- verify / delete the table ---------------------------------------------------------------


def is_warning(problem: str) -> bool:
    """Whether a :func:`verify_table` finding leaves the table usable: only TTL off, or on the
    application's own attribute (every read treats expired items as absent; dynacoord's are
    just never garbage-collected, as the backend's own warning says)."""
    return problem.startswith(("TTL is DISABLED", "TTL is DISABLING", "TTL is enabled on"))


def verify_table(client: Any, table_name: str, *, layout: TableLayout | None = None) -> list[str]:
    """Check that ``table_name`` is a usable dynacoord table; return the problems found.

    An empty list means the table is ACTIVE, keyed ``pk``/``sk`` (strings), has the index
    ``gsi1`` on ``gsi1pk``/``gsi1sk`` (strings, projection ALL, ACTIVE) and TTL enabled on the
    attribute ``ttl`` (with ``layout``: its names). Each problem is one sentence naming what is
    wrong. Only a failing request (other than "table not found") raises
    :class:`~dynacoord.errors.BackendError`.
    """
    layout = _layout(layout)
    table = _describe(client, table_name)
    if isinstance(table, Refusal):
        return [f"table {table_name!r} does not exist"]
    problems = schema_problems(table, layout=layout)
    if not problems:
        mark_verified(client, table_name, layout)
    ttl = request(
        client,
        "describe_time_to_live",
        f"read TTL settings of {table_name!r}",
        TableName=table_name,
    )["TimeToLiveDescription"]
    problem = ttl_problem(ttl, layout)
    if problem is not None:
        problems.append(problem)
    return problems


def delete_table(
    client: Any,
    table_name: str,
    *,
    wait: bool = True,
    progress: Progress = noop,
    timeout: float = 300.0,
    disable_deletion_protection: bool = False,
    clock: Clock | None = None,
) -> bool:
    """Delete the table and (with ``wait``) wait until it is gone. False if it did not exist.

    A table with deletion protection is refused with a :class:`BackendError` that says so,
    unless ``disable_deletion_protection``: then protection is turned off first (one
    UpdateTable, only when the DeleteTable was refused for it) and the table deleted. That is
    how a table kept by ``stack delete`` is removed. Do not use this on a table that a
    CloudFormation stack still owns: delete the stack first.
    """
    what = f"delete table {table_name!r}"

    def delete() -> Refusal | None:
        done = call(
            client,
            "delete_table",
            what,
            expect=lambda r: r.not_found or _refused_for_protection(r),
            TableName=table_name,
        )
        return done if isinstance(done, Refusal) else None

    refused = delete()
    if refused is not None and not refused.not_found and disable_deletion_protection:
        progress(f"turning off deletion protection of {table_name} ...")
        request(
            client,
            "update_table",
            f"turn off deletion protection of table {table_name!r}",
            TableName=table_name,
            DeletionProtectionEnabled=False,
        )
        logger.info("turned off deletion protection of %r", table_name)
        _wait_active(client, table_name, progress, timeout=timeout, clock=clock)
        refused = delete()
    if refused is not None:
        if refused.not_found:
            return False
        raise BackendError(
            f"cannot {what}: deletion protection is enabled; turn it off first: `dynacoord "
            "table delete --yes --disable-deletion-protection` (or the stack parameter "
            "DeletionProtection=false while a stack owns the table)",
            code=refused.code,
        ) from refused.cause
    forget_verified(client, table_name)
    logger.info("deleting table %r", table_name)
    progress(f"deleting table {table_name} ...")
    if not wait:
        return True

    def gone() -> tuple[bool | None, str]:
        table = _describe(client, table_name)
        if isinstance(table, Refusal):
            return True, "gone"
        return None, str(table.get("TableStatus"))

    return wait_for(
        gone,
        what=f"table {table_name} to be deleted",
        clock=clock,
        timeout=timeout,
        progress=progress,
        timed_out=lambda status: TableNotReadyError(
            f"table {table_name!r} still exists {timeout}s after DeleteTable (status {status})",
            table_name=table_name,
        ),
    )
