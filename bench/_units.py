"""Write and read units by AWS's rules, counted from the requests sent and the items' sizes.

DynamoDB Local reports a transaction's ``ConsumedCapacity`` as if it held one item, and moto
reports none, so the cost tests and the bench count units themselves:

* an item's size is the sum of its attribute names and values (a string's UTF-8 bytes, a number
  1 byte per two significant digits plus 1, a binary's bytes, a bool or null 1 byte, a set the
  sum of its members, a map or list 3 bytes plus its contents, a list 1 byte more per element);
* a write costs 1 WCU per started KB of the larger of the item before and after it (a write
  that is refused costs the same, by the item it read); an item of a transaction (a
  ``ConditionCheck`` included) costs twice; a ``BatchWriteItem`` costs each of its writes;
* a global secondary index (projection ALL: an index entry is the whole item) is written when
  the item is in it before or after the write: a put of the new entry when it enters, a delete
  when it leaves, an update when it stays under the same index key and changed, **a delete and
  a put** when its index key changed; nothing when the item did not change (a refused write).
  An index write is a plain write even inside a transaction (the index is updated
  asynchronously, after the commit);
* a strongly consistent read costs 1 RCU per started 4 KB of the item (an absent item still
  costs the minimum), an eventually consistent read half that; a ``Query`` costs by the sum of
  the items it read (whatever its ``ProjectionExpression`` or ``Select``), rounded up once per
  request; a ``Query`` of an index is always eventually consistent; a ``TransactGetItems`` item
  costs twice.

:class:`UnitMeter` wraps one client: every request's items are read before and after on a
second, unmetered client (so the sizes are the table's own), and its units are added up, in
total and per partition (``table:<partition key>`` and ``<index>:<index partition key>``), so
the per-partition ceilings follow from what was sent. It also counts refusals (conditional
checks that failed, cancelled transactions) from the responses.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "IndexSpec",
    "UnitMeter",
    "Usage",
    "index_writes",
    "item_size",
    "partiql_target",
    "query_units",
    "read_units",
    "write_units",
]

Item = Mapping[str, Any]


def _value_size(av: Mapping[str, Any]) -> int:
    ((tag, raw),) = av.items()
    if tag == "S":
        return len(raw.encode("utf-8"))
    if tag == "N":
        digits = raw.lstrip("-").replace(".", "").strip("0") or "0"
        return (len(digits) + 1) // 2 + 1
    if tag == "B":
        return len(raw)
    if tag in ("BOOL", "NULL"):
        return 1
    if tag == "SS":
        return sum(len(x.encode("utf-8")) for x in raw)
    if tag == "NS":
        return sum(_value_size({"N": x}) for x in raw)
    if tag == "BS":
        return sum(len(x) for x in raw)
    if tag == "M":
        return 3 + sum(len(k.encode("utf-8")) + _value_size(v) for k, v in raw.items())
    if tag == "L":
        return 3 + sum(1 + _value_size(v) for v in raw)
    raise ValueError(f"unknown attribute type {tag!r}")


def item_size(item: Item | None) -> int:
    """The size in bytes of a DynamoDB item (attribute values) by AWS's rules; 0 for none."""
    if not item:
        return 0
    return sum(len(name.encode("utf-8")) + _value_size(av) for name, av in item.items())


def write_units(before: int, after: int, *, transaction: bool = False) -> int:
    """WCU of one write of an item of ``before`` bytes that leaves ``after`` bytes."""
    units = max(1, math.ceil(max(before, after) / 1024))
    return 2 * units if transaction else units


def read_units(size: int, *, consistent: bool) -> float:
    """RCU of one GetItem of an item of ``size`` bytes."""
    units = max(1, math.ceil(size / 4096))
    return float(units) if consistent else units / 2


def query_units(sizes: list[int], *, consistent: bool) -> float:
    """RCU of one Query (or Scan page) that read items of ``sizes`` bytes: their sum, rounded up
    to 4 KB once for the request (an empty result still costs the minimum)."""
    return read_units(sum(sizes), consistent=consistent)


@dataclass(frozen=True, slots=True)
class IndexSpec:
    """A global secondary index: its name, key attributes (partition key first) and projection.

    ``projection`` is DynamoDB's ``ProjectionType``: ``ALL`` (the index entry is the whole
    item), ``KEYS_ONLY`` (the table's and the index's keys: ``table_keys`` and ``keys``) or
    ``INCLUDE`` (those and ``include``)."""

    name: str
    keys: tuple[str, ...]
    projection: str = "ALL"
    table_keys: tuple[str, ...] = ()
    include: tuple[str, ...] = ()

    def entry(self, item: Item) -> Item:
        """The index entry of ``item`` (an item in the index): what the projection copies."""
        if self.projection == "ALL":
            return item
        names = set(self.keys) | set(self.table_keys)
        if self.projection == "INCLUDE":
            names |= set(self.include)
        return {k: v for k, v in item.items() if k in names}


def index_writes(
    before: Item | None, after: Item | None, index: IndexSpec
) -> list[tuple[str, int]]:
    """The index writes one table write causes: ``[(index partition key, WCU), ...]``.

    By AWS's rules: an item that enters the index puts its entry, one that leaves it deletes
    it, one whose index key changes does both; one that stays under the same key writes its
    entry only if the entry changed (an attribute the projection copies), and nothing if only
    attributes outside the projection changed. Each costs 1 WCU per started KB of the entry
    (the larger of before and after for an update in place)."""

    def entry(item: Item | None) -> tuple[Any, ...] | None:
        if not item or any(k not in item for k in index.keys):
            return None  # sparse: the item is not in the index
        return tuple(json.dumps(item[k], sort_keys=True) for k in index.keys)

    def partition(item: Item) -> str:
        ((_, value),) = item[index.keys[0]].items()
        return f"{index.name}:{value}"

    old, new = entry(before), entry(after)
    if old is None and new is None:
        return []
    if new is None:
        assert before is not None
        gone = index.entry(before)
        return [(partition(before), write_units(item_size(gone), 0))]  # leaves the index
    if old is None:
        assert after is not None
        put = index.entry(after)
        return [(partition(after), write_units(0, item_size(put)))]  # enters it
    assert before is not None and after is not None
    was, now = index.entry(before), index.entry(after)
    if old == new:
        if dict(was) == dict(now):
            return []  # the entry is unchanged (a refused write, or outside the projection)
        return [(partition(after), write_units(item_size(was), item_size(now)))]
    # The index key changed: the old entry is deleted and the new one put.
    return [
        (partition(before), write_units(item_size(was), 0)),
        (partition(after), write_units(0, item_size(now))),
    ]


@dataclass
class Usage:
    """Units and requests added up (a snapshot of a meter, or the difference of two)."""

    requests: Counter[str] = field(default_factory=Counter)
    wcu: int = 0
    index_wcu: int = 0
    rcu: float = 0.0
    #: units per partition: ``table:<pk>`` and ``<index>:<index pk>`` -> WCU, and -> RCU
    partition_wcu: Counter[str] = field(default_factory=Counter)
    partition_rcu: Counter[str] = field(default_factory=Counter)
    #: refused requests by error code; ``refused_items``: items a cancelled transaction's
    #: reasons show as ``ConditionalCheckFailed``
    refusals: Counter[str] = field(default_factory=Counter)
    refused_items: int = 0
    #: how many measured operations touched each partition (set by whoever measures them)
    touches: Counter[str] = field(default_factory=Counter)

    def copy(self) -> Usage:
        return Usage(
            Counter(self.requests),
            self.wcu,
            self.index_wcu,
            self.rcu,
            Counter(self.partition_wcu),
            Counter(self.partition_rcu),
            Counter(self.refusals),
            self.refused_items,
            Counter(self.touches),
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.requests + other.requests,
            self.wcu + other.wcu,
            self.index_wcu + other.index_wcu,
            self.rcu + other.rcu,
            self.partition_wcu + other.partition_wcu,
            self.partition_rcu + other.partition_rcu,
            self.refusals + other.refusals,
            self.refused_items + other.refused_items,
            self.touches + other.touches,
        )

    def __sub__(self, other: Usage) -> Usage:
        def minus(a: Counter[str], b: Counter[str]) -> Counter[str]:
            out = Counter(a)
            out.subtract(b)
            return Counter({k: v for k, v in out.items() if v})

        return Usage(
            minus(self.requests, other.requests),
            self.wcu - other.wcu,
            self.index_wcu - other.index_wcu,
            self.rcu - other.rcu,
            minus(self.partition_wcu, other.partition_wcu),
            minus(self.partition_rcu, other.partition_rcu),
            minus(self.refusals, other.refusals),
            self.refused_items - other.refused_items,
            minus(self.touches, other.touches),
        )

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())


_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"}
_READS = {"GetItem", "Query", "BatchGetItem", "TransactGetItems", "Scan"}
#: PartiQL: each statement of a batch alone (plain prices), of a transaction twice
_PARTIQL = {"ExecuteStatement": False, "BatchExecuteStatement": False, "ExecuteTransaction": True}
_REFUSALS = {"ConditionalCheckFailedException", "TransactionCanceledException"}
_KEY_CONDITION = re.compile(r"([#\w.]+)\s*=\s*(:\w+)")
_PARTIQL_TABLE = re.compile(
    r'^\s*(?:(UPDATE)|(DELETE)\s+FROM|(INSERT)\s+INTO|(SELECT)\b.*?\bFROM)\s+"?([^"\s]+)"?',
    re.IGNORECASE | re.DOTALL,
)
_PARTIQL_STRING = re.compile(r"'(?:[^']|'')*'")


def partiql_target(
    statement: str, parameters: list[Any], key_names: tuple[str, ...]
) -> tuple[str, str, dict[str, Any]] | None:
    """``(kind, table, key)`` of a PartiQL statement on one item (kind: ``UPDATE``, ``DELETE``,
    ``INSERT`` or ``SELECT``), or None if its key is not given in full (a scan or a query)."""
    match = _PARTIQL_TABLE.match(statement)
    if match is None:
        return None
    kind = next(g for g in match.groups()[:4] if g).upper()
    table = match.group(5)
    # Strings blanked out (same length, no '?'), so a '?' inside one is not a parameter.
    blank = _PARTIQL_STRING.sub(lambda m: "'" + "_" * (len(m.group()) - 2) + "'", statement)
    key: dict[str, Any] = {}
    for name in key_names:
        pattern = (
            rf"'{re.escape(name)}'\s*:\s*(\?|'(?:[^']|'')*')"
            if kind == "INSERT"
            else rf'(?<![\w"])"?{re.escape(name)}"?\s*=\s*(\?|\'(?:[^\']|\'\')*\')'
        )
        found = re.search(pattern, statement if kind == "INSERT" else blank)
        if found is None:
            return None
        if found.group(1) == "?":
            key[name] = parameters[blank[: found.start(1)].count("?")]
        else:
            key[name] = {"S": statement[found.start(1) + 1 : found.end(1) - 1].replace("''", "'")}
    return kind, table, key


class UnitMeter:
    """Adds up the write and read units of the requests ``client`` sends.

    ``peek`` is a second client on the same store (not metered) that reads each written item
    before and after the write, and the items a read touched. ``wcu``, ``index_wcu``, ``rcu``,
    ``requests`` (by operation, on the wire: a retry counts again) and ``sizes`` (the last size
    of each item written, by partition key) grow as requests are sent; :meth:`usage` is a
    snapshot with the per-partition units and the refusals. Thread-safe: each thread's request
    is measured on its own (items another thread writes in between may blur a size)."""

    def __init__(self, client: Any, peek: Any, table: str | None = None) -> None:
        self.client = client
        self.peek = peek
        self.table = table
        self.sizes: dict[str, int] = {}
        self._usage = Usage()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._schemas: dict[str, tuple[tuple[str, ...], tuple[IndexSpec, ...]]] = {}
        events = client.meta.events
        events.register("before-call.dynamodb", self._before, unique_id=f"units-b-{id(self)}")
        events.register("after-call.dynamodb", self._after, unique_id=f"units-a-{id(self)}")
        events.register("before-send.dynamodb", self._sent, unique_id=f"units-s-{id(self)}")
        events.register("after-call-error.dynamodb", self._lost, unique_id=f"units-e-{id(self)}")

    # -- totals (the attributes the older sections read) -------------------------------------------

    @property
    def wcu(self) -> int:
        return self._usage.wcu

    @property
    def index_wcu(self) -> int:
        return self._usage.index_wcu

    @property
    def rcu(self) -> float:
        return self._usage.rcu

    @property
    def requests(self) -> Counter[str]:
        return self._usage.requests

    def usage(self) -> Usage:
        with self._lock:
            return self._usage.copy()

    def close(self) -> None:
        events = self.client.meta.events
        events.unregister("before-call.dynamodb", unique_id=f"units-b-{id(self)}")
        events.unregister("after-call.dynamodb", unique_id=f"units-a-{id(self)}")
        events.unregister("before-send.dynamodb", unique_id=f"units-s-{id(self)}")
        events.unregister("after-call-error.dynamodb", unique_id=f"units-e-{id(self)}")

    def _lost(self, **_: Any) -> None:
        # No response (a connection error): nothing is known of the request's effect.
        if not self._peeking():
            stack = self._local.__dict__.get("pending") or []
            if stack:
                stack.pop()

    # -- the peek client ---------------------------------------------------------------------------

    def _peeking(self) -> bool:
        return bool(getattr(self._local, "peeking", False))

    def _peek(self, operation: str, **params: Any) -> Any:
        self._local.peeking = True  # ``peek`` may be the metered client itself
        try:
            return getattr(self.peek, operation)(**params)
        finally:
            self._local.peeking = False

    def _schema(self, table: str) -> tuple[tuple[str, ...], tuple[IndexSpec, ...]]:
        if table not in self._schemas:
            desc = self._peek("describe_table", TableName=table)["Table"]
            keys = tuple(
                k["AttributeName"]
                for k in sorted(desc["KeySchema"], key=lambda k: k["KeyType"] != "HASH")
            )
            indexes = tuple(
                IndexSpec(
                    gsi["IndexName"],
                    tuple(
                        k["AttributeName"]
                        for k in sorted(gsi["KeySchema"], key=lambda k: k["KeyType"] != "HASH")
                    ),
                    projection=gsi.get("Projection", {}).get("ProjectionType", "ALL"),
                    table_keys=keys,
                    include=tuple(gsi.get("Projection", {}).get("NonKeyAttributes", ())),
                )
                for gsi in desc.get("GlobalSecondaryIndexes", ())
            )
            self._schemas[table] = (keys, indexes)
        return self._schemas[table]

    def _get_many(self, table: str, keys: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        """The items at ``keys`` (consistent), in order; one request per 100 distinct keys."""
        names, _ = self._schema(table)
        found: dict[str, dict[str, Any]] = {}
        distinct = list({json.dumps(k, sort_keys=True): k for k in keys}.values())
        for start in range(0, len(distinct), 100):
            request = {table: {"Keys": distinct[start : start + 100], "ConsistentRead": True}}
            while request:
                response = self._peek("batch_get_item", RequestItems=request)
                for item in response.get("Responses", {}).get(table, ()):
                    found[json.dumps({n: item[n] for n in names}, sort_keys=True)] = item
                request = response.get("UnprocessedKeys") or {}
        return [found.get(json.dumps(k, sort_keys=True)) for k in keys]

    # -- the hooks ---------------------------------------------------------------------------------

    def _sent(self, event_name: str = "", **_: Any) -> None:
        if self._peeking():
            return
        operation = event_name.rsplit(".", 1)[-1]
        with self._lock:
            self._usage.requests[operation] += 1

    def _before(self, model: Any, params: Mapping[str, Any], **_: Any) -> None:
        if self._peeking():
            return
        name = model.name
        body = params.get("body") or b"{}"
        request = json.loads(body if isinstance(body, str) else body.decode("utf-8"))
        stack = self._local.__dict__.setdefault("pending", [])
        if name in _PARTIQL:
            stack.append((name, request, self._partiql_before(name, request)))
            return
        if name not in _WRITES:
            stack.append((name, request, []))
            return
        writes: list[tuple[str, dict[str, Any], bool]] = []  # table, key, transactional
        if name == "TransactWriteItems":
            for entry in request["TransactItems"]:
                ((_kind, part),) = entry.items()
                writes.append((part["TableName"], self._key_of(part), True))
        elif name == "BatchWriteItem":
            for table, entries in request["RequestItems"].items():
                for entry in entries:
                    ((_kind, part),) = entry.items()
                    writes.append((table, self._key_of(part, table), False))
        else:
            writes.append((request["TableName"], self._key_of(request), False))
        before = self._items([(t, k) for t, k, _ in writes])
        stack.append((name, request, [(t, k, tx, b) for (t, k, tx), b in zip(writes, before)]))

    def _partiql_before(self, name: str, request: Mapping[str, Any]) -> list[Any]:
        """The statements' items before, as ``(table, key, transactional, before, kind,
        consistent)``; a statement that is not on one item is left out (not priced)."""
        if name == "ExecuteTransaction":
            statements = request["TransactStatements"]
        elif name == "BatchExecuteStatement":
            statements = request["Statements"]
        else:
            statements = [request]
        targets = []
        for entry in statements:
            text = entry["Statement"]
            match = _PARTIQL_TABLE.match(text)
            if match is None:
                continue
            names, _ = self._schema(match.group(5))
            target = partiql_target(text, entry.get("Parameters") or [], names)
            if target is not None:
                consistent = bool(entry.get("ConsistentRead", request.get("ConsistentRead")))
                targets.append((*target, consistent))
        before = self._items([(t, k) for _, t, k, _ in targets])
        return [
            (table, key, _PARTIQL[name], item, kind, consistent)
            for (kind, table, key, consistent), item in zip(targets, before)
        ]

    def _partiql_cost(
        self, name: str, statements: list[Any], parsed: Mapping[str, Any]
    ) -> tuple[int, int, float, Counter[str]]:
        writes = [(t, k, tx, b) for t, k, tx, b, kind, _ in statements if kind != "SELECT"]
        wcu, index_wcu, partitions = self._write_cost(writes) if writes else (0, 0, Counter())
        rcu = 0.0
        for table, key, transaction, item, kind, consistent in statements:
            if kind != "SELECT":
                continue
            names, _ = self._schema(table)
            units = (2 if transaction else 1) * read_units(
                item_size(item), consistent=consistent or transaction
            )
            rcu += units
            partitions[f"table:{next(iter(key[names[0]].values()))}"] += units
        return wcu, index_wcu, rcu, partitions

    def _key_of(self, part: Mapping[str, Any], table: str | None = None) -> dict[str, Any]:
        if "Key" in part:
            return dict(part["Key"])
        names, _ = self._schema(table or part["TableName"])
        return {n: part["Item"][n] for n in names}

    def _items(self, keys: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any] | None]:
        by_table: dict[str, list[int]] = {}
        for i, (table, _) in enumerate(keys):
            by_table.setdefault(table, []).append(i)
        out: list[dict[str, Any] | None] = [None] * len(keys)
        for table, positions in by_table.items():
            if len(positions) == 1:
                (i,) = positions
                got = self._peek("get_item", TableName=table, Key=keys[i][1], ConsistentRead=True)
                out[i] = got.get("Item")
                continue
            for i, item in zip(positions, self._get_many(table, [keys[i][1] for i in positions])):
                out[i] = item
        return out

    def _after(self, model: Any, parsed: Mapping[str, Any] | None = None, **_: Any) -> None:
        if self._peeking():
            return
        stack = self._local.__dict__.get("pending") or []
        if not stack:
            return
        name, request, writes = stack.pop()
        parsed = parsed or {}
        code = (parsed.get("Error") or {}).get("Code")
        refused_items = 0
        if code == "TransactionCanceledException":
            refused_items = sum(
                1
                for r in parsed.get("CancellationReasons") or ()
                if r.get("Code") == "ConditionalCheckFailed"
            )
        statement_codes = [
            (r.get("Error") or {}).get("Code")
            for r in parsed.get("Responses") or ()
            if name == "BatchExecuteStatement"
        ]
        statement_codes = [c for c in statement_codes if c]
        if name in _PARTIQL:
            wcu, index_wcu, rcu, partition_wcu = self._partiql_cost(name, writes, parsed)
            partition_rcu = Counter[str]()
        elif name in _WRITES:
            wcu, index_wcu, partition_wcu = self._write_cost(writes)
            rcu, partition_rcu = 0.0, Counter[str]()
        elif name in _READS and code is None:
            wcu, index_wcu, partition_wcu = 0, 0, Counter[str]()
            rcu, partition_rcu = self._read_cost(name, request, parsed)
        else:
            return
        with self._lock:
            usage = self._usage
            usage.wcu += wcu
            usage.index_wcu += index_wcu
            usage.rcu += rcu
            usage.partition_wcu.update(partition_wcu)
            usage.partition_rcu.update(partition_rcu)
            if code in _REFUSALS:
                usage.refusals[code] += 1
                usage.refused_items += refused_items
            for statement_code in statement_codes:
                # a statement of a batch refused alone (the others still ran)
                usage.refusals[f"{statement_code} (batch statement)"] += 1
                usage.refused_items += statement_code == "ConditionalCheckFailed"

    def _write_cost(
        self, writes: list[tuple[str, dict[str, Any], bool, dict[str, Any] | None]]
    ) -> tuple[int, int, Counter[str]]:
        after = self._items([(t, k) for t, k, _, _ in writes])
        wcu = index_wcu = 0
        partitions: Counter[str] = Counter()
        for (table, key, transaction, before), now in zip(writes, after):
            names, indexes = self._schema(table)
            units = write_units(item_size(before), item_size(now), transaction=transaction)
            wcu += units
            pk = next(iter(key[names[0]].values()))
            partitions[f"table:{pk}"] += units
            for index in indexes:
                for partition, index_units in index_writes(before, now, index):
                    index_wcu += index_units
                    partitions[partition] += index_units
            self.sizes[pk] = item_size(now)
        return wcu, index_wcu, partitions

    def _read_cost(
        self, name: str, request: Mapping[str, Any], parsed: Mapping[str, Any]
    ) -> tuple[float, Counter[str]]:
        partitions: Counter[str] = Counter()
        rcu = 0.0
        if name == "GetItem":
            table = request["TableName"]
            (item,) = self._items([(table, dict(request["Key"]))])
            names, _ = self._schema(table)
            rcu = read_units(item_size(item), consistent=bool(request.get("ConsistentRead")))
            partitions[f"table:{next(iter(request['Key'][names[0]].values()))}"] += rcu
        elif name in ("BatchGetItem", "TransactGetItems"):
            if name == "BatchGetItem":
                gets = [
                    (table, dict(key), bool(spec.get("ConsistentRead")), 1)
                    for table, spec in request["RequestItems"].items()
                    for key in spec["Keys"]
                ]
            else:
                gets = [
                    (e["Get"]["TableName"], dict(e["Get"]["Key"]), True, 2)
                    for e in request["TransactItems"]
                ]
            items = self._items([(t, k) for t, k, _, _ in gets])
            for (table, key, consistent, factor), item in zip(gets, items):
                names, _ = self._schema(table)
                units = factor * read_units(item_size(item), consistent=consistent)
                rcu += units
                partitions[f"table:{next(iter(key[names[0]].values()))}"] += units
        elif name in ("Query", "Scan"):
            rcu, partition = self._query_cost(name, request)
            partitions[partition] += rcu
        return rcu, partitions

    def _query_cost(self, name: str, request: Mapping[str, Any]) -> tuple[float, str]:
        """Run the same request again on ``peek`` for whole items (a projection or a count
        still reads, and pays for, the whole items)."""
        again = {
            k: v
            for k, v in request.items()
            if k not in ("ProjectionExpression", "Select", "ReturnConsumedCapacity")
        }
        names = dict(again.pop("ExpressionAttributeNames", None) or {})
        used = " ".join(
            str(again.get(k, ""))
            for k in ("KeyConditionExpression", "FilterExpression", "ConditionExpression")
        )
        names = {k: v for k, v in names.items() if k in used}
        if names:
            again["ExpressionAttributeNames"] = names
        index = again.get("IndexName")
        consistent = bool(again.get("ConsistentRead")) and index is None
        response = self._peek(name[0].lower() + name[1:], **again)
        sizes = [item_size(item) for item in response.get("Items", ())]
        table = request["TableName"]
        label = "table" if index is None else index
        partition = f"{label}:?"
        if name == "Query":
            _, indexes = self._schema(table)
            keys = self._schema(table)[0]
            key_name = (
                keys[0] if index is None else next(i.keys[0] for i in indexes if i.name == index)
            )
            for left, placeholder in _KEY_CONDITION.findall(
                str(again.get("KeyConditionExpression"))
            ):
                if names.get(left, left) == key_name:
                    value = again.get("ExpressionAttributeValues", {}).get(placeholder, {})
                    partition = f"{label}:{next(iter(value.values()), '?')}"
        return query_units(sizes, consistent=consistent), partition


class RefusalCounter:
    """Counts refusals in the responses of the clients it is attached to, nothing else (cheap
    enough for a throughput run): requests refused by a failed condition
    (``ConditionalCheckFailedException``), cancelled transactions, and the items a cancelled
    transaction's reasons show as ``ConditionalCheckFailed``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refusals: Counter[str] = Counter()
        self.refused_items = 0
        self._clients: list[Any] = []

    def attach(self, client: Any) -> Any:
        client.meta.events.register(
            "after-call.dynamodb", self._after, unique_id=f"refusals-{id(self)}"
        )
        self._clients.append(client)
        return client

    def detach(self) -> None:
        for client in self._clients:
            client.meta.events.unregister("after-call.dynamodb", unique_id=f"refusals-{id(self)}")
        self._clients.clear()

    def reset(self) -> None:
        with self._lock:
            self.refusals.clear()
            self.refused_items = 0

    @property
    def total(self) -> int:
        return sum(self.refusals.values())

    def _after(self, parsed: Mapping[str, Any] | None = None, **_: Any) -> None:
        code = ((parsed or {}).get("Error") or {}).get("Code")
        statements = [
            (r.get("Error") or {}).get("Code") for r in (parsed or {}).get("Responses") or ()
        ]
        statements = [c for c in statements if c]
        if statements:
            with self._lock:
                for statement_code in statements:
                    self.refusals[f"{statement_code} (batch statement)"] += 1
                    self.refused_items += statement_code == "ConditionalCheckFailed"
        if code not in _REFUSALS:
            return
        items = sum(
            1
            for r in (parsed or {}).get("CancellationReasons") or ()
            if r.get("Code") == "ConditionalCheckFailed"
        )
        with self._lock:
            self.refusals[code] += 1
            self.refused_items += items if code != "ConditionalCheckFailedException" else 1
