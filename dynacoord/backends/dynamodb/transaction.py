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

DynamoDB allows 100 items per transaction: the 101st add raises
:class:`~dynacoord.errors.TransactionTooLargeError` at once (the transaction is then discarded when
the block exits with it). A refused transaction raises
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
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ...errors import (
    DuplicateEventError,
    InvalidValueError,
    TransactionCancelledError,
    TransactionTooLargeError,
)

if TYPE_CHECKING:
    from ...outbox import Event, Outbox

__all__ = ["MAX_TRANSACTION_ITEMS", "Transaction"]

logger = logging.getLogger(__name__)

#: DynamoDB's limit on the items of one TransactWriteItems.
MAX_TRANSACTION_ITEMS = 100


def _check_str(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidValueError(f"{name} must be a non-empty str, got {value!r}")
    return value


def _serialize(value: Any, where: str) -> dict[str, Any]:
    from ._table import to_av

    try:
        return to_av(value)
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(
            f"{where}: {exc} (DynamoDB numbers must be int or decimal.Decimal, not float)"
        ) from exc


def _item(values: Any, what: str) -> dict[str, Any]:
    if not isinstance(values, Mapping) or not values:
        raise InvalidValueError(f"{what} must be a non-empty dict of attribute values")
    out: dict[str, Any] = {}
    for name, value in values.items():
        _check_str(name, f"{what} attribute name")
        out[name] = _serialize(value, f"{what} attribute {name!r}")
    return out


class Transaction:
    """Collects writes and events; commits them in one ``TransactWriteItems`` on exit.

    Made by ``backend.transaction()``. ``table`` arguments are table names (any table the client
    can reach, not only the dynacoord table); items and keys are plain Python dicts. ``condition``
    and ``update_expression`` are DynamoDB expression strings; ``names`` and ``values`` are their
    ``ExpressionAttributeNames`` (``{"#s": "status"}``) and ``ExpressionAttributeValues``
    (``{":s": "paid"}``, Python values).
    """

    def __init__(
        self,
        table: Any,
        *,
        outbox: Outbox | None = None,
        client_request_token: str | None = None,
        max_items: int = MAX_TRANSACTION_ITEMS,
    ) -> None:
        self._table = table
        self._outbox = outbox
        self._token = client_request_token
        self._max_items = max_items
        self._items: list[dict[str, Any]] = []
        self._labels: list[str] = []
        self._event_ids: dict[int, str] = {}
        self._state = "new"  # new -> open -> committed | discarded

    # -- collecting -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    @property
    def committed(self) -> bool:
        return self._state == "committed"

    def _check_open(self) -> None:
        if self._state in ("committed", "discarded"):
            raise RuntimeError(f"this transaction is already {self._state}")

    def _add_entries(self, entries: list[tuple[str, str | None, dict[str, Any]]]) -> None:
        """Add (label, event id or None, TransactItem) entries, all or none (limit checked)."""
        self._check_open()
        size = len(self._items) + len(entries)
        if size > self._max_items:
            raise TransactionTooLargeError(
                f"a transaction holds at most {self._max_items} items; adding "
                f"{len(entries)} to the {len(self._items)} already collected would make {size}",
                size=size,
                limit=self._max_items,
            )
        for label, event_id, entry in entries:
            if event_id is not None:
                self._event_ids[len(self._items)] = event_id
            self._items.append(entry)
            self._labels.append(label)

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
        label: str,
        op: dict[str, Any],
        condition: str | None,
        names: Mapping[str, str] | None,
        values: Mapping[str, Any] | None,
    ) -> None:
        """Add one ``{action: op}`` item, with its condition expression parts, as ``label``."""
        op.update(self._expression_parts(condition, names, values))
        self._add_entries([(label, None, {action: op})])

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
        _check_str(table, "table")
        op = {"TableName": table, "Item": _item(item, "item")}
        self._add_operation("Put", f"put into {table!r}", op, condition, names, values)

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
        op = {
            "TableName": table,
            "Key": _item(key, "key"),
            "UpdateExpression": _check_str(update_expression, "update_expression"),
        }
        self._add_operation("Update", f"update in {table!r}", op, condition, names, values)

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
        op = {"TableName": table, "Key": _item(key, "key")}
        self._add_operation("Delete", f"delete from {table!r}", op, condition, names, values)

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
        op = {"TableName": table, "Key": _item(key, "key")}
        label = f"condition check in {table!r}"
        self._add_operation("ConditionCheck", label, op, condition, names, values)

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
        except BaseException:
            self._state = "discarded"
            raise
        self._state = "committed"

    def _explain(self, cancelled: TransactionCancelledError) -> TransactionCancelledError:
        from ._table import unmarshal

        reasons: list[dict[str, Any]] = []
        failures: list[str] = []
        duplicate_ids: list[str] = []
        other_failure = False
        for index, raw in enumerate(cancelled.reasons):
            reason = {k: v for k, v in raw.items() if k != "Item"}
            label = self._labels[index] if index < len(self._labels) else f"item {index}"
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

    def __repr__(self) -> str:
        return f"Transaction(items={len(self)}, state={self._state!r})"
