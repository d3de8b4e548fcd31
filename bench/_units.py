"""Write and read units by AWS's rules, counted from the requests sent and the items' sizes.

DynamoDB Local reports a transaction's ``ConsumedCapacity`` as if it held one item, and moto
reports none, so the cost tests and the bench count units themselves:

* an item's size is the sum of its attribute names and values (a string's UTF-8 bytes, a number
  1 byte per two significant digits plus 1, a binary's bytes, a bool or null 1 byte, a set the
  sum of its members, a map or list 3 bytes plus its contents, a list 1 byte more per element);
* a write costs 1 WCU per started KB of the larger of the item before and after it (a write
  that is refused costs the same, by the item it read); an item of a transaction costs twice;
* a strongly consistent read costs 1 RCU per started 4 KB of the item, an eventually consistent
  read half that.

:class:`UnitMeter` wraps one client: every write request's item is read before and after on a
second, unmetered client (so the sizes are the table's own), and its units are added up.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

__all__ = ["UnitMeter", "item_size", "read_units", "write_units"]


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


def item_size(item: Mapping[str, Any] | None) -> int:
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


_WRITES = {
    "PutItem": "put",
    "UpdateItem": "update",
    "DeleteItem": "delete",
    "TransactWriteItems": "transaction",
}
_READS = {"GetItem"}


class UnitMeter:
    """Adds up the write and read units of the requests ``client`` sends to ``table``.

    ``peek`` is a second client on the same store (not metered) that reads each written item
    before and after the write. ``wcu``, ``rcu``, ``requests`` (by operation) and ``sizes`` (the
    last size of each item written, by pk) grow as requests are sent; ``index_wcu`` counts the
    units the write costs again on the GSI when the item carries ``gsi1pk`` (an index that
    projects every attribute writes the whole item again)."""

    def __init__(self, client: Any, peek: Any, table: str) -> None:
        self.client = client
        self.peek = peek
        self.table = table
        self.wcu = 0
        self.index_wcu = 0
        self.rcu = 0.0
        self.requests: Counter[str] = Counter()
        self.sizes: dict[str, int] = {}
        self._peeking = threading.local()
        self._pending: list[tuple[str, list[tuple[dict[str, Any], int, bool]]]] = []
        client.meta.events.register("before-parameter-build.dynamodb", self._before)
        client.meta.events.register("after-call.dynamodb", self._after)

    def close(self) -> None:
        self.client.meta.events.unregister("before-parameter-build.dynamodb", self._before)
        self.client.meta.events.unregister("after-call.dynamodb", self._after)

    def _get(self, table: str, key: dict[str, Any]) -> dict[str, Any] | None:
        self._peeking.on = True
        try:
            item: dict[str, Any] | None = self.peek.get_item(
                TableName=table, Key=key, ConsistentRead=True
            ).get("Item")
        finally:
            self._peeking.on = False
        return item

    def _before(self, model: Any, params: Mapping[str, Any], **_: Any) -> None:
        if getattr(self._peeking, "on", False):
            return  # the meter's own read (``peek`` may be the metered client itself)
        name = model.name
        self.requests[name] += 1
        if name in _READS:
            item = self._get(params["TableName"], params["Key"])
            self.rcu += read_units(
                item_size(item), consistent=bool(params.get("ConsistentRead", False))
            )
            return
        if name not in _WRITES:
            return
        parts: list[tuple[dict[str, Any], int, bool]] = []
        if name == "TransactWriteItems":
            for entry in params["TransactItems"]:
                ((_kind, body),) = entry.items()
                key = body.get("Key") or {k: body["Item"][k] for k in ("pk", "sk")}
                parts.append((dict(key, _table=body["TableName"]), 0, True))
        else:
            key = params.get("Key") or {k: params["Item"][k] for k in ("pk", "sk")}
            parts.append((dict(key, _table=params["TableName"]), 0, False))
        measured = []
        for key, _, transaction in parts:
            table = key.pop("_table")
            before = self._get(table, key)
            measured.append((dict(key, _table=table), item_size(before), transaction))
            key["_table"] = table
        self._pending.append((name, measured))

    def _after(self, model: Any, **_: Any) -> None:
        if getattr(self._peeking, "on", False):
            return
        if model.name not in _WRITES or not self._pending:
            return
        _, measured = self._pending.pop()
        for key, before, transaction in measured:
            table = key.pop("_table")
            item = self._get(table, key)
            after = item_size(item)
            self.wcu += write_units(before, after, transaction=transaction)
            if item is not None and "gsi1pk" in item:
                self.index_wcu += write_units(0, after)
            self.sizes[key["pk"]["S"]] = after
