"""What a DynamoDB global table lets dynacoord promise, read from the first-use check's
DescribeTable answer (``Replicas``, ``GlobalTableWitnesses``, ``MultiRegionConsistency``), and
the gate that refuses, before it is sent, a write the table could not keep exclusive.

Why a gate: on a global table in multi-Region *eventual* consistency (MREC, the default), a
conditional write is evaluated against the item in the writer's own Region, and two Regions'
writes to one item settle by last writer wins, unrecorded. Two processes in two Regions can then
both acquire one lock, both claim one idempotency key or outbox event, and both counts of an
``ADD`` are not kept: nothing fails, the promise silently holds per Region only. So on such a
table every write whose outcome depends on the item's current state (a ``ConditionExpression``,
any ``UpdateItem``, a transaction, a PartiQL write) is refused, unless the backend was built with
``global_table_writes="single-region"``: the user's promise that every writer of dynacoord's
items runs in one Region, where conditions do hold. Plain puts and deletes (a cache ``set``,
``delete``, ``clear``; dropping checkpoints) are last-writer-wins by nature and go.

On a global table in multi-Region *strong* consistency (MRSC) conditions are evaluated against
the latest version of the item in every Region, so every primitive keeps its promise; but AWS
runs no transaction there, and the gate refuses ``TransactWriteItems``, ``TransactGetItems`` and
``ExecuteTransaction`` with an error naming what needed one. A ``ReplicatedWriteConflictException``
(another Region is changing the item) is a refusal botocore retries by its own model; the write
was not applied, so sending it again is safe. MRSC tables have no TTL: expired items are never
swept (reads treat them as absent all the same), and the TTL check says so instead of advising
to turn TTL on.

The gate is a guard of the session's request path (:class:`Gate`, in
:attr:`DynamoTable.guards`, the first stage of :meth:`DynamoTable.call`). On a table with no
replica in another Region nothing is kept per request: there is no gate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..._compat import Record
from ...errors import GlobalTableError
from ...keys import Kind
from ._table import DynamoTable, Send

__all__ = [
    "Gate",
    "GlobalTable",
    "gate_for",
    "global_table_of",
    "ttl_problem_of",
    "what_works",
]


#: operations that read: never refused
_READS = frozenset({"get_item", "query", "scan", "batch_get_item", "transact_get_items"})
#: operations whose outcome never depends on the item's current state unless they carry a
#: condition (``BatchWriteItem`` carries none)
_PLAIN_WRITES = frozenset({"put_item", "delete_item"})
#: the transaction operations MRSC tables do not run
_TRANSACTIONS = frozenset({"transact_write_items", "transact_get_items", "execute_transaction"})
_OPERATION_NAMES = {
    "put_item": "PutItem",
    "update_item": "UpdateItem",
    "delete_item": "DeleteItem",
    "transact_write_items": "TransactWriteItems",
    "transact_get_items": "TransactGetItems",
    "execute_transaction": "ExecuteTransaction",
    "execute_statement": "ExecuteStatement",
    "batch_execute_statement": "BatchExecuteStatement",
}
#: what each item kind's state-dependent write would lose on an eventually consistent table
_AT_RISK = {
    Kind.LOCK: "a lock (two Regions could hold it at once)",
    Kind.IDEMPOTENCY: "an idempotency claim (two Regions could both run the call)",
    Kind.OUTBOX: "an outbox event's publication, claim or outcome (two Regions' workers could "
    "both deliver it)",
    Kind.COUNTER: "a counter, flag or join (two Regions' counts could overwrite each other)",
    Kind.BREAKER: "a circuit breaker's count or trial slot (two Regions could overwrite each "
    "other's failures and both take the trial)",
    Kind.RUN: "a run's transition (two Regions could both move it)",
    Kind.CHECKPOINT: "a checkpoint's sequence (a save in another Region could replace it)",
    Kind.CACHE: "a cache entry's add, incr or touch (only plain set and delete are "
    "last-writer-wins by nature)",
}


class GlobalTable(Record):
    """A table DescribeTable shows replicated to other Regions (a NamedTuple to a type checker,
    cheaper to define than one)."""

    #: ``"EVENTUAL"`` (MREC) or ``"STRONG"`` (MRSC)
    consistency: str
    #: the Regions of its replicas, as DescribeTable lists them
    regions: tuple[str, ...]
    #: the witness Region of an MRSC table with two replicas (empty otherwise)
    witnesses: tuple[str, ...] = ()

    @property
    def strong(self) -> bool:
        return self.consistency == "STRONG"

    def describe(self) -> str:
        """``"an eventually consistent global table (MREC) with replicas in ..."``."""
        mode = (
            "a strongly consistent global table (MRSC)"
            if self.strong
            else "an eventually consistent global table (MREC)"
        )
        where = ", ".join(self.regions) or "other Regions"
        witness = f" and a witness in {', '.join(self.witnesses)}" if self.witnesses else ""
        return f"{mode} with replicas in {where}{witness}"


def global_table_of(table: Mapping[str, Any], region: str | None = None) -> GlobalTable | None:
    """The global table a DescribeTable ``Table`` answer shows, or None for a table with no
    replica or witness in a Region other than ``region`` (the client's).

    Every listed replica counts, whatever its status: one being created already receives the
    table's writes, one being deleted may still take some. A ``MultiRegionConsistency`` other
    than ``STRONG`` (absent, ``EVENTUAL``, or a mode this code does not know) is taken as
    eventual, the one whose conditions hold in one Region only."""
    regions = _region_names(table.get("Replicas"))
    witnesses = _region_names(table.get("GlobalTableWitnesses"))
    if not [r for r in regions if r != region] and not witnesses:
        return None
    consistency = "STRONG" if table.get("MultiRegionConsistency") == "STRONG" else "EVENTUAL"
    return GlobalTable(consistency, regions, witnesses)


def _region_names(entries: Any) -> tuple[str, ...]:
    if not isinstance(entries, list):
        return ()
    names = {e.get("RegionName") for e in entries if isinstance(e, Mapping)}
    return tuple(sorted(n for n in names if isinstance(n, str) and n))


class Gate:
    """The guard a global table puts on its session's request path (:attr:`DynamoTable.guards`,
    after the first-use check): a write the table could not keep is refused before it is sent
    (:class:`~dynacoord.errors.GlobalTableError`); every other request goes on. It stays for the
    session's life: the table's replication does not change under a running process."""

    __slots__ = ("_client", "_found", "_refused", "_table_name")

    def __init__(
        self,
        table_name: str,
        client: Any,
        found: GlobalTable,
        refused: Callable[[str, Mapping[str, Any]], bool],
    ) -> None:
        self._table_name = table_name
        self._client = client
        self._found = found
        self._refused = refused

    def __call__(self, operation: str, kwargs: dict[str, Any], send: Send) -> dict[str, Any]:
        if self._refused(operation, kwargs):
            raise _refusal(self._table_name, self._client, self._found, operation, kwargs)
        return send(operation, kwargs)


def gate_for(table: DynamoTable, client: Any, writes: str, found: GlobalTable) -> Gate | None:
    """The gate ``found`` needs, if any: an eventually consistent global table's unless
    ``writes`` (``_replication.GlobalTableWrites``, checked when the backend was made) is
    ``"single-region"``, a strongly consistent one's always (for its transactions)."""
    refused: Callable[[str, Mapping[str, Any]], bool]
    if found.strong:
        refused = _transaction
    elif writes == "single-region":
        return None
    else:
        refused = _depends_on_state
    return Gate(table.name, client, found, refused)


def _transaction(operation: str, kwargs: Mapping[str, Any]) -> bool:
    return operation in _TRANSACTIONS


def _depends_on_state(operation: str, kwargs: Mapping[str, Any]) -> bool:
    """Whether a write's outcome depends on the item as this Region's replica holds it."""
    if operation in _READS or operation == "batch_write_item":
        return False
    if operation in _PLAIN_WRITES:
        return "ConditionExpression" in kwargs or "Expected" in kwargs
    if operation == "execute_statement":
        return not _select(kwargs.get("Statement"))
    if operation == "batch_execute_statement":
        return not all(_select(s.get("Statement")) for s in kwargs.get("Statements", ()))
    return True  # UpdateItem (it changes the item as found), transactions, anything else


def _select(statement: Any) -> bool:
    return isinstance(statement, str) and statement.lstrip()[:6].upper() == "SELECT"


def _kind(operation: str, kwargs: Mapping[str, Any]) -> Kind | None:
    """The item kind of the write's (first) item, from its ``pk`` (None if not dynacoord's)."""
    body: Any = kwargs
    if operation in ("transact_write_items", "transact_get_items"):
        items = kwargs.get("TransactItems") or [{}]
        body = next(iter(items[0].values()), {}) if isinstance(items[0], Mapping) else {}
    key = body.get("Key") or body.get("Item") or {}
    pk = key.get("pk", {}).get("S") if isinstance(key, Mapping) else None
    if not isinstance(pk, str):
        return None
    try:
        return Kind(pk.partition("#")[0])
    except ValueError:
        return None


def _refusal(
    table_name: str,
    client: Any,
    found: GlobalTable,
    operation: str,
    kwargs: Mapping[str, Any],
) -> GlobalTableError:
    name = _OPERATION_NAMES.get(operation, operation)
    kind = _kind(operation, kwargs)
    region = getattr(getattr(client, "meta", None), "region_name", None)
    here = f" (region {region})" if isinstance(region, str) and region else ""
    if found.strong:
        needs = (
            "this transaction"
            if kind is None
            else f"this transaction (its first item is dynacoord's {kind.name.lower()} item)"
        )
        message = (
            f"DynamoDB table {table_name!r}{here} is {found.describe()}: MRSC tables run no "
            f"transaction operations (AWS: they return an error), so {needs} cannot be sent. "
            f"{name} was refused before it was sent, so it wrote nothing. On MRSC, the "
            "single-item operations of every primitive work; backend.transaction(), publishing "
            "several outbox events in one call and ordered outbox groups need a transaction: "
            "run them on a single-Region table, or on an eventually consistent global table "
            "with every writer in one Region. See docs/global-tables.md"
        )
    else:
        at_risk = _AT_RISK.get(kind, "this write") if kind is not None else "this write"
        message = (
            f"DynamoDB table {table_name!r}{here} is {found.describe()}: a conditional write is "
            "checked against this Region's replica only and two Regions' writes to one item "
            f"resolve last-writer-wins, so {at_risk} would be exclusive within one Region only. "
            f"{name} was refused before it was sent, so it wrote nothing. Choose one: run every "
            "writer of dynacoord's items in one Region and say so with "
            "DynamoDBBackend(..., global_table_writes='single-region') (or "
            "DYNACOORD_GLOBAL_TABLE_WRITES=single-region); or keep dynacoord's items in a "
            "strongly consistent global table (MRSC) or a single-Region table. See "
            "docs/global-tables.md"
        )
    return GlobalTableError(
        message,
        table_name=table_name,
        consistency=found.consistency,
        regions=found.regions,
        operation=name,
    )


def what_works(found: GlobalTable) -> str:
    """What dynacoord does on ``found``, in a sentence (for ``dynacoord table verify``)."""
    if found.strong:
        return (
            f"{found.describe()}: every primitive works one item at a time; what needs a "
            "transaction is refused (backend.transaction(), several events in one publish, "
            "ordered outbox groups), and TTL is not supported there (expired items stay). See "
            "docs/global-tables.md"
        )
    return (
        f"{found.describe()}: conditions hold within one Region only, so the writes that need "
        "exclusivity (locks, claims, counts, transitions) are refused unless every writer of "
        "dynacoord's items runs in one Region and says so (global_table_writes='single-region' "
        "or DYNACOORD_GLOBAL_TABLE_WRITES=single-region). See docs/global-tables.md"
    )


def ttl_problem_of(found: GlobalTable, problem: str) -> str:
    """The TTL check's finding for a global table: on an MRSC table, where AWS offers no TTL,
    what follows from that instead of advice to turn it on."""
    if not found.strong or not problem.startswith("TTL is DISABLED"):
        return problem
    return (
        f"TTL is not supported on {found.describe()}: dynacoord's expired items are never "
        "swept (every read still treats them as absent), so they keep their storage"
    )
