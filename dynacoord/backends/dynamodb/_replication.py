"""What the first-use check found of a table's replication, kept per client and table, and the
``global_table_writes`` choice: the part of the global-table gate every backend loads.

The gate itself, its words and :class:`~._global_tables.GlobalTable` are in
:mod:`._global_tables`, loaded only once a DescribeTable shows a replica or a witness: a table
in one Region, the common case, never pays for defining them (a cold start does not either).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from ...errors import ConfigurationError

if TYPE_CHECKING:
    from ._global_tables import GlobalTable
    from ._table import DynamoTable, Guard

__all__ = [
    "GLOBAL_TABLE_WRITES",
    "GlobalTableWrites",
    "check_global_table_writes",
    "is_global",
    "remember",
    "ttl_problem_on",
    "write_gate",
]

logger = logging.getLogger(__name__)

#: what the backend may do on an eventually consistent global table: refuse the writes that
#: need exclusivity (the default), or send them on the user's promise that every writer of
#: dynacoord's items runs in one Region
GlobalTableWrites = Literal["refuse", "single-region"]
GLOBAL_TABLE_WRITES: tuple[GlobalTableWrites, ...] = ("refuse", "single-region")


def check_global_table_writes(value: Any) -> GlobalTableWrites:
    """``value`` as a :data:`GlobalTableWrites`, or a :class:`ConfigurationError` naming the
    choices."""
    for choice in GLOBAL_TABLE_WRITES:
        if value == choice:
            return choice
    raise ConfigurationError(
        f"global_table_writes must be 'refuse' (the default: on an eventually consistent "
        f"global table, refuse the writes that need exclusivity) or 'single-region' (your "
        f"promise that every writer of dynacoord's items runs in one Region), got {value!r}"
    )


#: client -> table name -> what its first-use check found (None: not a global table)
_found: weakref.WeakKeyDictionary[Any, dict[str, GlobalTable | None]] = weakref.WeakKeyDictionary()
#: the same for a client that cannot be weakly referenced (a wrapper with ``__slots__``): kept
#: with the client itself, so its id is not reused while the entry lives
_found_strongly: dict[int, tuple[Any, dict[str, GlobalTable | None]]] = {}
_found_lock = threading.Lock()


def _findings(client: Any) -> dict[str, GlobalTable | None]:
    """The findings of ``client`` (``_found_lock`` held)."""
    try:
        return _found.setdefault(client, {})
    except TypeError:
        return _found_strongly.setdefault(id(client), (client, {}))[1]


def remember(client: Any, table_name: str, table: Mapping[str, Any]) -> GlobalTable | None:
    """Keep what the DescribeTable answer ``table`` shows of replication, for every backend
    of this client and table (:func:`write_gate` reads it)."""
    found = None
    if table.get("Replicas") or table.get("GlobalTableWitnesses"):
        from ._global_tables import global_table_of

        region = getattr(getattr(client, "meta", None), "region_name", None)
        found = global_table_of(table, region if isinstance(region, str) else None)
    with _found_lock:
        _findings(client)[table_name] = found
    if found is not None:
        logger.info("DynamoDB table %r is %s", table_name, found.describe())
    return found


def recorded(client: Any, table_name: str) -> GlobalTable | None:
    """What the check found of ``table_name``'s replication (None: one Region, or no check)."""
    with _found_lock:
        return _findings(client).get(table_name)


def is_global(client: Any, table_name: str) -> bool:
    """Whether the check found ``table_name`` replicated in another Region."""
    return recorded(client, table_name) is not None


def write_gate(table: DynamoTable, client: Any, writes: GlobalTableWrites) -> Guard | None:
    """The gate ``table``'s request path needs for what its check found
    (:class:`._global_tables.Gate`), or None (a table in one Region, or one the gate would let
    every write through)."""
    found = recorded(client, table.name)
    if found is None:
        return None
    from ._global_tables import gate_for

    return gate_for(table, client, writes, found)


def ttl_problem_on(client: Any, table_name: str, problem: str) -> str:
    """The TTL check's finding for this table: on an MRSC table, where AWS offers no TTL, what
    follows from that instead of advice to turn it on."""
    found = recorded(client, table_name)
    if found is None:
        return problem
    from ._global_tables import ttl_problem_of

    return ttl_problem_of(found, problem)
