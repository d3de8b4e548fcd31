"""``with backend.transaction() as tx:`` — your writes and outbox events in one TransactWriteItems.

The collector marshals every operation as it is added (plain Python values, through boto3's
``TypeSerializer``), so bad input fails at the line that added it; nothing is sent until the block
ends without an exception. Then one ``TransactWriteItems`` writes everything or nothing::

    with backend.transaction() as tx:
        tx.put("orders", {"pk": "order#1", "total": Decimal("9.90")},
               condition="attribute_not_exists(pk)")
        tx.update("stock", {"sku": "A-1"}, "SET qty = qty - :n",
                  condition="qty >= :n", values={":n": 1})
        tx.publish(Event("order.created", {"order": "1"}))

DynamoDB's transaction limits are checked as operations are added, so nothing is sent that
DynamoDB would refuse for them: at most 100 items (the 101st add raises
:class:`~dynacoord.errors.TransactionTooLargeError` at once), at most 4 MB of item data in all
(the add that would cross it raises the same error, ``size`` and ``limit`` then in bytes), and
each item at most once: a second operation on an item already in the transaction (the same
event published twice, a put and an update of one key) raises
:class:`~dynacoord.errors.InvalidValueError`. An add that raises adds nothing; the transaction is
discarded when the block exits with the error. Numbers must be ones DynamoDB holds exactly (see
:func:`._limits.check_number`): anything else is an ``InvalidValueError`` at the line that added it, never
a ``decimal.Inexact``/``Rounded``/``Overflow``. A refused transaction raises
:class:`~dynacoord.errors.TransactionCancelledError` whose ``reasons`` has one entry per added item,
in the order they were added, each with ``Code`` (``"None"`` for the items that were fine),
``Message``, ``Operation`` (what was added, e.g. ``"put into 'orders'"``) and, for a failed
condition, ``Item`` (the item as it was, as Python values). An event id that already exists makes
it a :class:`~dynacoord.errors.DuplicateEventError` (a subclass).

botocore gives every ``TransactWriteItems`` call a ``ClientRequestToken``, so its own retries after
a lost response are idempotent for 10 minutes; pass ``client_request_token=`` to
``backend.transaction()`` to extend that to your own retries of the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ...errors import (
    DuplicateEventError,
    InvalidValueError,
    LockLostError,
    TableNotReadyError,
    TransactionCancelledError,
    TransactionTooLargeError,
)
from ._limits import (
    CHAR_BYTES_BOUND,
    MAX_TRANSACTION_BYTES,
    MAX_TRANSACTION_ITEMS,
    NUMBER_BYTES_BOUND,
    NUMBER_LIMIT,
    PK_SK,
    Label,
    av_size,
    check_bytes,
    check_distinct,
    checked_numbers,
    entry_size,
    item_identity,
    label_text,
    map_size,
    twice_error,
)

if TYPE_CHECKING:
    from ...outbox import Event, Outbox
    from ._table import DynamoTable

__all__ = ["LayoutTransaction", "Transaction"]

logger = logging.getLogger(__name__)


def _check_str(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidValueError(f"{name} must be a non-empty str, got {value!r}")
    return value


def _serialize(value: Any, where: str) -> dict[str, Any]:
    from ._marshal import to_av

    value = checked_numbers(value, where)
    try:
        return to_av(value)
    except InvalidValueError:
        raise
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise InvalidValueError(
            f"{where}: {exc} (DynamoDB numbers must be int or decimal.Decimal, not float)"
        ) from exc


def marshal_with_bound(values: Any, what: str) -> tuple[dict[str, Any], int]:
    """``values`` marshalled, and an upper bound on their bytes (4 a character of a name or
    string, 21 a number: so the 4 MB check need not estimate them; other values exactly)."""
    if (type(values) is not dict and not isinstance(values, Mapping)) or not values:
        raise InvalidValueError(f"{what} must be a non-empty dict of attribute values")
    out: dict[str, Any] = {}
    chars = 0
    exact = 0
    for name, value in values.items():
        if type(name) is not str or not name:
            _check_str(name, f"{what} attribute name")
        chars += len(name)
        cls = type(value)
        # strings and ints of at most 38 digits directly: most attributes are one of them
        if cls is str:
            out[name] = {"S": value}
            chars += len(value)
        elif cls is int and -NUMBER_LIMIT < value < NUMBER_LIMIT:
            out[name] = {"N": str(value)}
            exact += NUMBER_BYTES_BOUND
        else:
            av = out[name] = _serialize(value, f"{what} attribute {name!r}")
            exact += av_size(av)
    return out, CHAR_BYTES_BOUND * chars + exact


#: the states in which a transaction takes nothing more
_CLOSED = ("committed", "discarded")


class Transaction:
    """Collects writes and events; commits them in one ``TransactWriteItems`` on exit.

    Made by ``backend.transaction()``. ``table`` arguments are table names (any table the client
    can reach, not only the dynacoord table); items and keys are plain Python dicts. ``condition``
    and ``update_expression`` are DynamoDB expression strings; ``names`` and ``values`` are their
    ``ExpressionAttributeNames`` (``{"#s": "status"}``) and ``ExpressionAttributeValues``
    (``{":s": "paid"}``, Python values).
    """

    # slots: a transaction is made per request, and a plain object is cheaper to fill and read
    __slots__ = (
        "_after_commit",
        "_bound_bytes",
        "_event_ids",
        "_exact_bytes",
        "_guards",
        "_items",
        "_key_names",
        "_labels",
        "_max_bytes",
        "_max_items",
        "_outbox",
        "_seen",
        "_state",
        "_table",
        "_token",
    )

    def __init__(
        self,
        table: Any,
        *,
        outbox: Outbox | None = None,
        client_request_token: str | None = None,
        max_items: int = MAX_TRANSACTION_ITEMS,
        max_bytes: int = MAX_TRANSACTION_BYTES,
    ) -> None:
        self._table = table
        self._outbox = outbox
        self._token = client_request_token
        self._max_items = max_items
        self._max_bytes = max_bytes
        # The 4 MB check sums cheap bounds until they no longer prove the items fit; from then on
        # it sums exact estimates (``_exact_bytes``, None until needed).
        self._bound_bytes = 0
        self._exact_bytes: int | None = None
        self._items: list[dict[str, Any]] = []
        self._labels: list[Label] = []
        self._event_ids: dict[int, str] = {}
        # Key attribute names per table, so a Put can be compared with the other items; the
        # dynacoord table's are known, others are learned from Key-bearing operations.
        name = getattr(table, "name", None)
        self._key_names: dict[str, frozenset[str]] = {name: PK_SK} if isinstance(name, str) else {}
        # The identity (table, key) of each collected item whose key is known -> its index, so
        # an add compares only its own entries with what is collected.
        self._seen: dict[tuple[str, Any], int] = {}
        self._state = "new"  # new -> open -> committed | discarded
        self._after_commit: list[Callable[[], object]] | None = None
        # index of a lease's condition check (lease.guard) -> (lock key, owner, fence)
        self._guards: dict[int, tuple[str, str, int]] | None = None

    # -- collecting -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    @property
    def committed(self) -> bool:
        return self._state == "committed"

    def _check_open(self) -> None:
        if self._state in ("committed", "discarded"):
            raise RuntimeError(f"this transaction is already {self._state}")

    def _on_commit(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once this transaction has committed (never if it is discarded or
        refused): how the outbox counts the events it added (``OutboxPublished``)."""
        if self._after_commit is None:
            self._after_commit = []
        self._after_commit.append(callback)

    def _collect_entries(
        self, entries: list[tuple[Label, str | None, dict[str, Any], int | None]]
    ) -> None:
        """Add (label, event id or None, TransactItem, bound) entries, all or none (DynamoDB's
        limits checked: item count, 4 MB, one item once). ``bound`` is an upper bound on the
        entry's bytes when its maker knows one (the outbox does), else None: then the entry is
        estimated exactly."""
        if self._state in _CLOSED:
            self._check_open()
        size = len(self._items) + len(entries)
        if size > self._max_items:
            raise TransactionTooLargeError(
                f"a transaction holds at most {self._max_items} items; adding "
                f"{len(entries)} to the {len(self._items)} already collected would make {size}",
                size=size,
                limit=self._max_items,
            )
        bounds = 0
        for _, _, entry, bound in entries:
            bounds += entry_size(entry) if bound is None else bound
        exact = self._exact_bytes
        if exact is not None or self._bound_bytes + bounds > self._max_bytes:
            if exact is None:
                exact = sum(entry_size(entry) for entry in self._items)
            exact += sum(entry_size(entry) for _, _, entry, _ in entries)
            check_bytes(exact, self._max_bytes)
        # the last check: nothing below can fail, so the entries go in whole or not at all
        self._seen = self._distinct_after(entries)
        self._bound_bytes += bounds
        self._exact_bytes = exact
        items = self._items
        for label, event_id, entry, _ in entries:
            if event_id is not None:
                self._event_ids[len(items)] = event_id
            items.append(entry)
            self._labels.append(label)

    def _collect_entry(
        self, label: Label, event_id: str | None, entry: dict[str, Any], bound: int
    ) -> None:
        """:meth:`_collect_entries` of one entry, the usual add."""
        self._collect_entries([(label, event_id, entry, bound)])

    #: What the outbox calls to add its entries (dynacoord's own items, the
    #: :class:`~dynacoord.outbox.store.OutboxStore` protocol); your put/update/delete/
    #: condition_check collect theirs directly. The same methods here; a table layout's
    #: transaction (:class:`LayoutTransaction`) translates dynacoord's entries first.
    _add_entry = _collect_entry
    _add_entries = _collect_entries

    def _distinct_after(
        self, entries: list[tuple[Label, str | None, dict[str, Any], int | None]]
    ) -> dict[tuple[str, Any], int]:
        """The identities of the collected items and ``entries``, or :class:`InvalidValueError`
        if one item would be there twice (the last check of an add: the key names of tables
        first seen in ``entries`` are learned only once it passes)."""
        key_names = self._key_names
        learned = False
        for _, _, entry, _ in entries:
            ((_, op),) = entry.items()
            if "Key" in op and str(op.get("TableName")) not in key_names:
                learned = True
        if learned:
            # A table's key names learned now can make earlier Puts into it comparable: check
            # everything again (rare: the first keyed operation on another table).
            items = [*self._items, *(entry for _, _, entry, _ in entries)]
            labels = [label_text(label) for label in self._labels]
            labels += [label_text(label) for label, _, _, _ in entries]
            seen = check_distinct(items, labels, key_names)
            for entry in items:
                ((_, op),) = entry.items()
                if "Key" in op:
                    key_names.setdefault(str(op.get("TableName")), frozenset(op["Key"]))
            return seen
        if len(entries) == 1:
            # The usual add: one entry, compared in place (it is the last check, so what is
            # collected changes only if it passes).
            label, _, entry, _ = entries[0]
            seen = self._seen
            identity = item_identity(entry, key_names)
            if identity is not None:
                first = seen.get(identity)
                if first is not None:
                    raise twice_error(label_text(self._labels[first]), label_text(label), identity)
                seen[identity] = len(self._items)
            return seen
        seen = dict(self._seen)
        for offset, (label, _, entry, _) in enumerate(entries):
            identity = item_identity(entry, key_names)
            if identity is None:
                continue
            if identity in seen:
                first = seen[identity]
                every = [*self._labels, *(label for label, _, _, _ in entries)]
                raise twice_error(label_text(every[first]), label_text(label), identity)
            seen[identity] = len(self._items) + offset
        return seen

    @staticmethod
    def _expression_parts(
        condition: str | None,
        names: Mapping[str, str] | None,
        values: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        parts: dict[str, Any] = {}
        if condition is not None:
            parts["ConditionExpression"] = _check_str(condition, "condition")
        if names:
            for placeholder, name in names.items():
                if not isinstance(placeholder, str) or not placeholder.startswith("#"):
                    raise InvalidValueError(f"names keys must start with '#', got {placeholder!r}")
                _check_str(name, f"names[{placeholder!r}]")
            parts["ExpressionAttributeNames"] = dict(names)
        if values:
            marshalled = {}
            for placeholder, value in values.items():
                if not isinstance(placeholder, str) or not placeholder.startswith(":"):
                    raise InvalidValueError(f"values keys must start with ':', got {placeholder!r}")
                marshalled[placeholder] = _serialize(value, f"values[{placeholder!r}]")
            parts["ExpressionAttributeValues"] = marshalled
        return parts

    def _add_operation(
        self,
        action: str,
        label: Label,
        op: dict[str, Any],
        condition: str | None,
        names: Mapping[str, str] | None,
        values: Mapping[str, Any] | None,
        bound: int,
    ) -> None:
        """Add one ``{action: op}`` item, with its condition expression parts, as ``label``;
        ``bound`` is an upper bound on the bytes of its item or key."""
        if condition is not None or names or values:
            parts = self._expression_parts(condition, names, values)
            op.update(parts)
            bound += map_size(parts.get("ExpressionAttributeValues"))
        self._collect_entry(label, None, {action: op}, bound)

    def put(
        self,
        table: str,
        item: Mapping[str, Any],
        *,
        condition: str | None = None,
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """Add a PutItem of ``item`` (a whole item, key attributes included) to ``table``."""
        if type(table) is not str or not table:
            _check_str(table, "table")
        marshalled, bound = marshal_with_bound(item, "item")
        op = {"TableName": table, "Item": marshalled}
        if condition is None and not names and not values:  # a plain put: nothing more to add
            self._collect_entry(("put into", table), None, {"Put": op}, bound)
        else:
            self._add_operation("Put", ("put into", table), op, condition, names, values, bound)

    def update(
        self,
        table: str,
        key: Mapping[str, Any],
        update_expression: str,
        *,
        condition: str | None = None,
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """Add an UpdateItem of the item with ``key`` in ``table``."""
        _check_str(table, "table")
        marshalled, bound = marshal_with_bound(key, "key")
        op = {
            "TableName": table,
            "Key": marshalled,
            "UpdateExpression": _check_str(update_expression, "update_expression"),
        }
        self._add_operation("Update", ("update in", table), op, condition, names, values, bound)

    def delete(
        self,
        table: str,
        key: Mapping[str, Any],
        *,
        condition: str | None = None,
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """Add a DeleteItem of the item with ``key`` in ``table``."""
        _check_str(table, "table")
        marshalled, bound = marshal_with_bound(key, "key")
        op = {"TableName": table, "Key": marshalled}
        self._add_operation("Delete", ("delete from", table), op, condition, names, values, bound)

    def condition_check(
        self,
        table: str,
        key: Mapping[str, Any],
        condition: str,
        *,
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """Add a check that ``condition`` holds for the item with ``key`` (nothing is written)."""
        _check_str(table, "table")
        marshalled, bound = marshal_with_bound(key, "key")
        op = {"TableName": table, "Key": marshalled}
        label = ("condition check in", table)
        self._add_operation("ConditionCheck", label, op, condition, names, values, bound)

    def _add_guard(self, entry: dict[str, Any], lease: tuple[str, str, int]) -> None:
        """Add a lease's condition check on its lock item (``entry``, already in the table's
        names), remembered so that its refusal raises ``LockLostError``."""
        index = len(self._items)
        label = ("lock guard in", entry["ConditionCheck"]["TableName"])
        self._collect_entries([(label, None, entry, None)])
        if self._guards is None:
            self._guards = {}
        self._guards[index] = lease

    def publish(self, events: Event | Iterable[Event]) -> list[str]:
        """Add outbox events (of the backend this transaction came from); return their ids."""
        if self._outbox is None:
            raise RuntimeError("this transaction has no outbox to publish to")
        return self._outbox.publish(events, tx=self)

    # -- committing -------------------------------------------------------------------------------

    def __enter__(self) -> Transaction:
        if self._state != "new":
            raise RuntimeError("a transaction can be entered only once")
        self._state = "open"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            if self._state == "open":
                self._state = "discarded"
                logger.debug("transaction of %d items discarded: the block raised", len(self))
            return
        self._commit()

    def _commit(self) -> None:
        """Send the collected items in one TransactWriteItems (none: nothing is sent)."""
        if self._state in _CLOSED:
            self._check_open()
        if not self._items:
            self._state = "committed"
            return
        request: dict[str, Any] = {"TransactItems": self._items}
        if self._token is not None:
            request["ClientRequestToken"] = self._token
        try:
            self._table.call("transact_write_items", **request)
        except TransactionCancelledError as cancelled:
            self._state = "discarded"
            raise self._explain(cancelled) from cancelled
        except TableNotReadyError as missing:
            self._state = "discarded"
            raise self._missing_table(missing) from missing
        except BaseException:
            self._state = "discarded"
            raise
        self._state = "committed"
        if self._after_commit is not None:
            for callback in self._after_commit:
                callback()

    def _missing_table(self, error: TableNotReadyError) -> TableNotReadyError:
        """DynamoDB says only "resource not found": name the table of this transaction that is
        missing (one DescribeTable per table, on this error path only)."""
        names: list[str] = []
        for entry in self._items:
            for operation in entry.values():
                name = operation.get("TableName")
                if isinstance(name, str) and name not in names:
                    names.append(name)
        client_error = self._table._client_error
        for name in names:
            try:
                self._table.client.describe_table(TableName=name)
            except client_error as exc:
                code = getattr(exc, "response", {}).get("Error", {}).get("Code")
                if code == "ResourceNotFoundException":
                    return TableNotReadyError(
                        f"DynamoDB table {name!r} used in this transaction does not exist "
                        "(nothing was written)",
                        table_name=name,
                    )
        return error

    def _explain(self, cancelled: TransactionCancelledError) -> TransactionCancelledError:
        from ._marshal import unmarshal

        reasons: list[dict[str, Any]] = []
        failures: list[str] = []
        duplicate_ids: list[str] = []
        other_failure = False
        for index, raw in enumerate(cancelled.reasons):
            reason = {k: v for k, v in raw.items() if k != "Item"}
            label = (
                label_text(self._labels[index]) if index < len(self._labels) else f"item {index}"
            )
            reason["Operation"] = label
            if raw.get("Item"):
                reason["Item"] = unmarshal(raw["Item"])
            reasons.append(reason)
            code = raw.get("Code") or "None"
            if code == "None":
                continue
            failures.append(f"#{index} {label}: {code}")
            if index in self._event_ids and code == "ConditionalCheckFailed":
                duplicate_ids.append(self._event_ids[index])
            else:
                other_failure = True
        summary = "; ".join(failures) or str(cancelled)
        if self._guards:
            lost = self._lock_lost(reasons, summary)
            if lost is not None:
                return lost
        if duplicate_ids and not other_failure:
            return DuplicateEventError(
                f"transaction cancelled, nothing written: event id(s) {duplicate_ids!r} already "
                f"exist ({summary})",
                event_ids=duplicate_ids,
                reasons=reasons,
            )
        return TransactionCancelledError(
            f"transaction cancelled, nothing written: {summary}", reasons=reasons
        )

    def _lock_lost(self, reasons: list[dict[str, Any]], summary: str) -> LockLostError | None:
        """The :class:`LockLostError` of a refused lease guard (the first), or None."""
        for index, (key, owner, fence) in (self._guards or {}).items():
            reason = reasons[index] if index < len(reasons) else {}
            if reason.get("Code") != "ConditionalCheckFailed":
                continue
            item = reason.get("Item") or {}
            holder = item.get("owner")
            stored = item.get("fence")
            stored_fence = int(stored) if stored is not None else None
            if holder is None:
                now = "released or gone"
            elif holder == owner and stored_fence == fence:
                now = "expired by this process's clock when guarded"
            else:
                now = f"held by {holder!r} with fence {stored_fence}"
            return LockLostError(
                f"transaction cancelled, nothing written: the lease of lock {key!r} (owner "
                f"{owner!r}, fence {fence}) no longer holds it (the lock is {now}; {summary})",
                key=key,
                owner=owner,
                fence=fence,
                holder=None if holder is None else str(holder),
                stored_fence=stored_fence,
                reasons=reasons,
            )
        return None

    def __repr__(self) -> str:
        return f"Transaction(items={len(self)}, state={self._state!r})"


class LayoutTransaction(Transaction):
    """``backend.transaction()`` on a table with a layout: what dynacoord adds (outbox events,
    through ``_add_entry``/``_add_entries``) is translated as it is added, by the table
    session's translator; what you add with put/update/delete/condition_check is yours, in
    your names. The items are collected in a ``_layout.LayoutItems`` list, which the session
    sends as it is."""

    __slots__ = ("_extra", "_translator")

    def __init__(
        self,
        table: DynamoTable,
        *,
        outbox: Outbox | None = None,
        client_request_token: str | None = None,
    ) -> None:
        from ._layout import LayoutItems

        super().__init__(table, outbox=outbox, client_request_token=client_request_token)
        translator = table.translator
        assert translator is not None, "a LayoutTransaction is made on a table with a layout"
        self._translator = translator
        self._items = LayoutItems()
        layout = table.layout
        # what translation may add to an entry's bytes (the prefix on pk and gsi1pk, longer
        # names), so the outbox's bounds still bound the entries sent (the 4 MB check)
        self._extra = 2 * len(layout.prefix.encode("utf-8")) + sum(
            max(0, len(theirs.encode("utf-8")) - len(ours))
            for ours, theirs in layout.attribute_names().items()
        )
        # the key of the table in the layout's names, so that Puts into it can be compared
        self._key_names = {table.name: frozenset({layout.pk, layout.sk})}

    def _add_entry(
        self, label: Label, event_id: str | None, entry: dict[str, Any], bound: int
    ) -> None:
        entry = self._translator.transact_item(entry)
        self._collect_entry(label, event_id, entry, bound + self._extra)

    def _add_entries(
        self, entries: list[tuple[Label, str | None, dict[str, Any], int | None]]
    ) -> None:
        transact_item = self._translator.transact_item
        extra = self._extra
        self._collect_entries(
            [
                (label, event_id, transact_item(entry), None if bound is None else bound + extra)
                for label, event_id, entry, bound in entries
            ]
        )

    def _explain(self, cancelled: TransactionCancelledError) -> TransactionCancelledError:
        # dynacoord's refused items (the events) back in its names; yours stay in yours
        reasons = [
            {**r, "Item": self._translator.item_in(r["Item"])}
            if (i in self._event_ids or (self._guards and i in self._guards)) and r.get("Item")
            else r
            for i, r in enumerate(cancelled.reasons)
        ]
        cancelled.reasons = reasons
        return super()._explain(cancelled)
