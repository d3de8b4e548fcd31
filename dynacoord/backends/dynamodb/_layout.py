"""The one translation point of a :class:`~dynacoord.TableLayout` other than the default.

The stores write dynacoord's own schema (``pk``/``sk``, index ``gsi1`` on ``gsi1pk``/``gsi1sk``,
``ttl``, ``expires_at_ms``). For a table of yours named otherwise, the table session
(``_table.DynamoTable``) hands every request and answer to the :class:`Translator` here, so no
store knows about layouts:

* requests (:meth:`Translator.request_for`): attribute names in ``Key``, ``Item``,
  ``ExclusiveStartKey`` and in batch and transaction items; whole-word attribute names in the
  condition, update, key condition, filter and projection expressions (each becomes a
  placeholder, ``pk`` -> ``#Lpk`` with ``#Lpk: PK``, so a layout name that is a reserved word or
  holds any character works; ``#names`` and ``:values`` are left alone, names a ``#``
  placeholder stands for are renamed in ``ExpressionAttributeNames``); ``IndexName``; and the
  layout's ``prefix`` put before every partition key value: ``pk``/``gsi1pk`` in keys and
  items, and a ``:value`` an expression sets or compares them to (``gsi1pk = :gpk``); the
  outbox's PartiQL statements are built from the translated request;
* answers (:meth:`Translator.answer`): ``Item``, ``Items``, ``Attributes``,
  ``LastEvaluatedKey``, batch ``Responses`` (a statement's refused item too),
  ``UnprocessedItems``/``UnprocessedKeys``, and the items of a refusal (``ALL_OLD``, a
  transaction's ``CancellationReasons``) get dynacoord's names and lose the prefix;
* stream images, which the relay reads from a Lambda event and not through the client
  (:meth:`Translator.owns`, :meth:`Translator.item_in`).

The default layout never gets here: the session then calls the client itself, so the default
path costs nothing. What a layout costs is a dict copy per request and per returned item.

Items of your own in a ``backend.transaction()`` are never translated (they already use your
names): the transaction translates what dynacoord adds to it (outbox events) as it is added
(:meth:`Translator.transact_item`), collects everything in a :class:`LayoutItems` list, and the
session sends that as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..._table_schema import TableLayout

__all__ = ["LayoutItems", "Translator"]


class LayoutItems(list[dict[str, Any]]):
    """A transaction's items already in the layout's names (yours as you gave them,
    dynacoord's translated as they were added): the session sends them as they are."""

    __slots__ = ()


#: dynacoord's attribute names -> the placeholder that stands for the layout's name
_PLACEHOLDERS = {
    "pk": "#Lpk",
    "sk": "#Lsk",
    "gsi1pk": "#Lgpk",
    "gsi1sk": "#Lgsk",
    "ttl": "#Lttl",
    "expires_at_ms": "#Lexp",
}
_EXPRESSIONS = (
    "ConditionExpression",
    "UpdateExpression",
    "KeyConditionExpression",
    "FilterExpression",
    "ProjectionExpression",
)
#: a whole attribute name at the top of a path: not a ``#name``, a ``:value``, a map member
#: (``a.pk``) nor a part of a longer name
_NAME = re.compile(r"(?<![#:.\w])(pk|sk|gsi1pk|gsi1sk|ttl|expires_at_ms)(?![\w])")
#: a partition key compared with or set to a value: ``pk = :v``, ``:v = gsi1pk``, ``#x = :v``
_KEY_VALUE = re.compile(r"(#?\w+)\s*=\s*(:\w+)|(:\w+)\s*=\s*(#?\w+)")
_PARTITION_KEYS = ("pk", "gsi1pk")


class Translator:
    """The two-way translation of one layout on one table."""

    __slots__ = ("_from", "_names", "_prefix", "_to", "index", "table_name")

    def __init__(self, layout: TableLayout, table_name: str) -> None:
        names = layout.attribute_names()
        #: dynacoord name -> layout name, only those that differ
        self._to = {ours: theirs for ours, theirs in names.items() if ours != theirs}
        #: layout name -> dynacoord name, only those that differ
        self._from = {theirs: ours for ours, theirs in self._to.items()}
        self._names = names
        self._prefix = layout.prefix
        self.index = layout.index
        self.table_name = table_name

    # -- items ----------------------------------------------------------------------------------

    def item_out(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """An item or key in dynacoord's names -> the layout's, partition keys prefixed."""
        to = self._to
        prefix = self._prefix
        out: dict[str, Any] = {}
        for name, av in item.items():
            if prefix and name in _PARTITION_KEYS and "S" in av:
                av = {"S": prefix + av["S"]}
            out[to.get(name, name)] = av
        return out

    def item_in(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """An item or key in the layout's names -> dynacoord's, the prefix removed."""
        back = self._from
        prefix = self._prefix
        out: dict[str, Any] = {}
        for name, av in item.items():
            ours = back.get(name, name)
            if prefix and ours in _PARTITION_KEYS:
                text = av.get("S") if isinstance(av, Mapping) else None
                if isinstance(text, str) and text.startswith(prefix):
                    av = {"S": text[len(prefix) :]}
            out[ours] = av
        return out

    def owns(self, item: Mapping[str, Any]) -> bool:
        """Whether an item in the layout's names (a stream image) is one of dynacoord's: its
        partition key carries the prefix."""
        av = item.get(self._names["pk"])
        text = av.get("S") if isinstance(av, Mapping) else None
        return isinstance(text, str) and text.startswith(self._prefix)

    # -- requests -------------------------------------------------------------------------------

    def request_for(self, operation: str, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The parameters of ``operation`` in the layout's terms; None for a transaction whose
        items are so already (:class:`LayoutItems`). A ``BatchExecuteStatement``'s statements
        were built from translated requests (``DynamoTable.statement``)."""
        if operation == "transact_write_items":
            items = kwargs["TransactItems"]
            if type(items) is LayoutItems:
                return None
            return {**kwargs, "TransactItems": [self.transact_item(entry) for entry in items]}
        if operation == "batch_write_item":
            return {**kwargs, "RequestItems": self.batch_write(kwargs["RequestItems"])}
        if operation == "batch_get_item":
            return {**kwargs, "RequestItems": self.batch_get(kwargs["RequestItems"])}
        if operation == "batch_execute_statement":
            return kwargs
        return self.request(kwargs)

    def request(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """One request's (or one transaction item's) parameters in the layout's terms."""
        out = dict(kwargs)
        for field in ("Key", "Item", "ExclusiveStartKey"):
            value = out.get(field)
            if value is not None:
                out[field] = self.item_out(value)
        if out.get("IndexName") == "gsi1":
            out["IndexName"] = self.index
        names = out.get("ExpressionAttributeNames")
        # placeholder -> dynacoord's attribute it stands for (the caller's own placeholders)
        aliases = {
            placeholder: name for placeholder, name in (names or {}).items() if name in self._names
        }
        prefixed: set[str] = set()
        used: dict[str, str] = {}
        for field in _EXPRESSIONS:
            expression = out.get(field)
            if expression is None:
                continue
            if self._prefix:
                prefixed.update(_key_values(expression, aliases))
            if self._to:
                out[field] = _NAME.sub(lambda m: self._placeholder(m.group(1), used), expression)
        if aliases or used:
            renamed = dict(names or {})
            for placeholder, name in aliases.items():
                renamed[placeholder] = self._names[name]
            renamed.update(used)
            out["ExpressionAttributeNames"] = renamed
        if prefixed:
            values = dict(out.get("ExpressionAttributeValues") or {})
            for placeholder in prefixed:
                av = values.get(placeholder)
                if av is not None and "S" in av:
                    values[placeholder] = {"S": self._prefix + av["S"]}
            out["ExpressionAttributeValues"] = values
        return out

    def _placeholder(self, name: str, used: dict[str, str]) -> str:
        theirs = self._to.get(name)
        if theirs is None:
            return name  # this attribute keeps its name in the layout
        placeholder = _PLACEHOLDERS[name]
        used[placeholder] = theirs
        return placeholder

    def transact_item(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """One ``TransactItems`` entry (``{"Put": {...}}``) in the layout's terms, if it is
        on this table (an entry on another table is left as it is)."""
        ((action, op),) = entry.items()
        if op.get("TableName") != self.table_name:
            return dict(entry)
        return {action: self.request(op)}

    # -- answers --------------------------------------------------------------------------------

    def answer(self, response: dict[str, Any]) -> dict[str, Any]:
        """An answer (or a ClientError's response) back in dynacoord's terms, in place."""
        for field in ("Item", "Attributes", "LastEvaluatedKey"):
            value = response.get(field)
            if value:
                response[field] = self.item_in(value)
        items = response.get("Items")
        if items:
            response["Items"] = [self.item_in(i) for i in items]
        reasons = response.get("CancellationReasons")
        if reasons:
            response["CancellationReasons"] = self.reasons_in(reasons)
        batch = response.get("Responses")
        if isinstance(batch, list):  # BatchExecuteStatement: a refused statement's item
            response["Responses"] = [self._statement_in(r) for r in batch]
        elif isinstance(batch, dict):
            response["Responses"] = {
                table: [self.item_in(i) for i in found] if table == self.table_name else found
                for table, found in batch.items()
            }
        unprocessed_keys = response.get("UnprocessedKeys")
        if unprocessed_keys and self.table_name in unprocessed_keys:
            request = dict(unprocessed_keys[self.table_name])
            request["Keys"] = [self.item_in(k) for k in request.get("Keys", ())]
            response["UnprocessedKeys"] = {**unprocessed_keys, self.table_name: request}
        unprocessed = response.get("UnprocessedItems")
        if unprocessed and self.table_name in unprocessed:
            response["UnprocessedItems"] = {
                **unprocessed,
                self.table_name: [self._write_in(w) for w in unprocessed[self.table_name]],
            }
        return response

    def reasons_in(self, reasons: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A cancelled transaction's reasons, their items (``ALL_OLD``) in dynacoord's names."""
        return [{**r, "Item": self.item_in(r["Item"])} if r.get("Item") else r for r in reasons]

    def _statement_in(self, response: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(response)
        error = out.get("Error")
        if isinstance(error, Mapping) and error.get("Item"):
            out["Error"] = {**error, "Item": self.item_in(error["Item"])}
        if out.get("Item"):
            out["Item"] = self.item_in(out["Item"])
        return out

    def _write_in(self, write: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind, body in write.items():
            body = dict(body)
            for field in ("Item", "Key"):
                if field in body:
                    body[field] = self.item_in(body[field])
            out[kind] = body
        return out

    def _write_out(self, write: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind, body in write.items():
            body = dict(body)
            for field in ("Item", "Key"):
                if field in body:
                    body[field] = self.item_out(body[field])
            out[kind] = body
        return out

    def batch_write(self, request_items: Mapping[str, Any]) -> dict[str, Any]:
        return {
            table: [self._write_out(w) for w in writes] if table == self.table_name else writes
            for table, writes in request_items.items()
        }

    def batch_get(self, request_items: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for table, request in request_items.items():
            if table == self.table_name:
                translated = self.request({k: v for k, v in request.items() if k != "Keys"})
                translated["Keys"] = [self.item_out(k) for k in request.get("Keys", ())]
                request = translated
            out[table] = request
        return out


def _key_values(expression: str, aliases: Mapping[str, str]) -> set[str]:
    """The ``:values`` ``expression`` compares a partition key with or sets it to."""
    found: set[str] = set()
    for match in _KEY_VALUE.finditer(expression):
        name, value = (match.group(1), match.group(2)) if match.group(1) else match.group(4, 3)
        if aliases.get(name, name) in _PARTITION_KEYS:
            found.add(value)
    return found
