"""DynamoDB's limits on what one request may carry, checked before it is sent: numbers DynamoDB
holds exactly, the size of an attribute value, an item and a transaction's items by DynamoDB's
documented rules, the items of one transaction (at most 100, 4 MB, each item once) and the most a
batch request takes. Used by ``backend.transaction()``, the outbox store and the batch engine, so
each limit is written once. Pure: no request, no boto3 import.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ...errors import InvalidValueError, TransactionTooLargeError

__all__ = [
    "CHAR_BYTES_BOUND",
    "MAX_BATCH_GET_KEYS",
    "MAX_BATCH_WRITES",
    "MAX_STATEMENTS",
    "MAX_TRANSACTION_BYTES",
    "MAX_TRANSACTION_ITEMS",
    "NUMBER_BYTES_BOUND",
    "NUMBER_LIMIT",
    "PK_SK",
    "Label",
    "av_size",
    "check_bytes",
    "check_distinct",
    "check_number",
    "check_transaction_items",
    "checked_numbers",
    "entry_size",
    "item_identity",
    "label_text",
    "map_size",
    "twice_error",
]

#: Upper bounds on DynamoDB's size of a character of a name or string (UTF-8) and of a number
#: (38 digits), so a writer can bound an item's bytes without estimating it.
CHAR_BYTES_BOUND = 4
NUMBER_BYTES_BOUND = 21
#: The most keys one BatchGetItem reads.
MAX_BATCH_GET_KEYS = 100
#: The most puts and deletes one BatchWriteItem sends.
MAX_BATCH_WRITES = 25
#: The most statements one BatchExecuteStatement runs.
MAX_STATEMENTS = 25
#: DynamoDB's limit on the items of one TransactWriteItems.
MAX_TRANSACTION_ITEMS = 100
#: DynamoDB's limit on the aggregate size of the items of one TransactWriteItems (4 MB).
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024

# DynamoDB numbers: at most 38 significant digits, magnitude 1E-130 to 9.99..E+125, or zero.
_MAX_DIGITS = 38
_MIN_ADJUSTED = -130
_MAX_ADJUSTED = 125
NUMBER_LIMIT = 10**_MAX_DIGITS


def _number_error(where: str, what: str) -> InvalidValueError:
    return InvalidValueError(
        f"{where}: {what}; DynamoDB holds numbers of at most {_MAX_DIGITS} significant digits "
        f"with a magnitude from 1E-130 to below 1E+126 (or zero), exactly or not at all"
    )


def check_number(value: int | Decimal, where: str) -> int | Decimal:
    """``value`` as DynamoDB will hold it exactly, or :class:`InvalidValueError`.

    The rule is boto3's: an int of at most 38 digits; a Decimal whose coefficient, *as written*,
    has at most 38 digits (so ``Decimal(10**40)`` is refused and ``Decimal("1E+40")`` is not:
    boto3 would raise ``decimal.Rounded`` for the first) and whose magnitude DynamoDB accepts
    (1E-130 to below 1E+126, checked here because boto3 lets ``1E+126`` and ``1E-131`` through
    to a ``ValidationException``). A zero of any exponent is sent as ``0``, which DynamoDB stores.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if -NUMBER_LIMIT < value < NUMBER_LIMIT:
            return value
        digits = f"{value.bit_length()}-bit" if value.bit_length() > 4000 else len(str(abs(value)))
        raise _number_error(where, f"an int of {digits} digits is out of range")
    if not value.is_finite():
        raise _number_error(where, f"{value} is not a number DynamoDB stores")
    if value.is_zero():
        return Decimal(0)
    coefficient = len(value.as_tuple().digits)
    if coefficient > _MAX_DIGITS:
        raise _number_error(
            where,
            f"a Decimal with {coefficient} significant digits as written cannot be held exactly "
            "(write trailing zeros as an exponent: Decimal('1E+40'), not Decimal(10**40))",
        )
    if not _MIN_ADJUSTED <= value.adjusted() <= _MAX_ADJUSTED:
        raise _number_error(where, f"{value} is out of range")
    return value


def checked_numbers(value: Any, where: str) -> Any:
    """``value`` with every number checked by :func:`check_number` (containers rebuilt only
    when a number in them changed)."""
    if isinstance(value, (int, Decimal)):
        return check_number(value, where)
    if isinstance(value, Mapping):
        return {k: checked_numbers(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [checked_numbers(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return {checked_numbers(v, f"{where} set member") for v in value}
    return value


# -- sizes and identities of transaction items --------------------------------------------------


def _n_size(text: str) -> int:
    if text.isdigit() and text.isascii():  # a plain non-negative integer (what dynacoord writes)
        return 1 + ((len(text.strip("0")) or 1) + 1) // 2
    mantissa = text.lstrip("+-").split("e")[0].split("E")[0].replace(".", "")
    digits = len(mantissa.strip("0")) or 1
    return 1 + (digits + 1) // 2


def av_size(av: Mapping[str, Any]) -> int:
    """DynamoDB's size of one attribute value (its documented item-size rules)."""
    ((tag, raw),) = av.items()
    if tag == "S":
        return len(raw) if raw.isascii() else len(raw.encode("utf-8", "surrogatepass"))
    if tag == "N":
        return _n_size(raw)
    if tag == "B":
        return len(raw)
    if tag in ("BOOL", "NULL"):
        return 1
    if tag == "SS":
        return sum(len(v.encode("utf-8", "surrogatepass")) for v in raw)
    if tag == "NS":
        return sum(_n_size(v) for v in raw)
    if tag == "BS":
        return sum(len(v) for v in raw)
    if tag == "M":
        return 3 + sum(
            len(k.encode("utf-8", "surrogatepass")) + av_size(v) + 1 for k, v in raw.items()
        )
    if tag == "L":
        return 3 + sum(av_size(v) + 1 for v in raw)
    return len(str(raw))


def map_size(item: Mapping[str, Any] | None) -> int:
    if not item:
        return 0
    size = 0
    for name, av in item.items():
        size += len(name) if name.isascii() else len(name.encode("utf-8", "surrogatepass"))
        size += av_size(av)
    return size


def entry_size(entry: Mapping[str, Any]) -> int:
    """The bytes an entry adds to the transaction: its item (Put) or key, plus expression values."""
    ((_, op),) = entry.items()
    return (
        map_size(op.get("Item"))
        + map_size(op.get("Key"))
        + map_size(op.get("ExpressionAttributeValues"))
    )


def _key_part(av: Mapping[str, Any]) -> Any:
    """A key attribute value as a comparable: (tag, value) for the key types S, N and B (equal
    exactly when their repr is), the repr of anything else."""
    if len(av) == 1:
        ((tag, raw),) = av.items()
        if tag in ("S", "N", "B"):
            return tag, raw
    return repr(av)


#: the key attribute names of the dynacoord table
PK_SK = frozenset({"pk", "sk"})


def item_identity(
    entry: Mapping[str, Any], key_names: Mapping[str, frozenset[str]]
) -> tuple[str, Any] | None:
    """(table, key) of the item an entry touches; None for a Put into a table whose key
    attributes are not known here (DynamoDB itself then refuses a duplicate)."""
    ((_, op),) = entry.items()
    table = str(op.get("TableName"))
    key = op.get("Key")
    if key is None:
        names = key_names.get(table)
        item = op.get("Item") or {}
        if names is PK_SK:
            # A Put into a table keyed like dynacoord's, string keys (every dynacoord item, and
            # usually the caller's): the general path's result, in sorted order, without it.
            pk, sk = item.get("pk"), item.get("sk")
            if pk is not None and sk is not None and len(pk) == len(sk) == 1:
                pk_s, sk_s = pk.get("S"), sk.get("S")
                if pk_s is not None and sk_s is not None:
                    return table, (("pk", ("S", pk_s)), ("sk", ("S", sk_s)))
        if not names or not names <= item.keys():
            return None
        pairs = [(name, item[name]) for name in names]
    else:
        pairs = list(key.items())
    parts = []
    for name, av in pairs:
        # a string key part (the usual kind) without the call
        parts.append((name, ("S", av["S"]) if len(av) == 1 and "S" in av else _key_part(av)))
    parts.sort()
    return table, tuple(parts)


def check_transaction_items(
    items: list[dict[str, Any]],
    labels: list[str] | None = None,
    *,
    key_names: Mapping[str, frozenset[str]] | None = None,
    max_items: int = MAX_TRANSACTION_ITEMS,
    max_bytes: int = MAX_TRANSACTION_BYTES,
) -> None:
    """Raise what DynamoDB would refuse ``TransactItems`` for, before it is sent: more than
    ``max_items`` (:class:`TransactionTooLargeError`), more than ``max_bytes`` of item data (the
    same), one item twice (:class:`InvalidValueError`). ``key_names`` maps table names to their
    key attribute names, so that Puts can be compared (Key-bearing operations teach the rest)."""
    if len(items) > max_items:
        raise TransactionTooLargeError(
            f"a transaction holds at most {max_items} items, this one would hold {len(items)}",
            size=len(items),
            limit=max_items,
        )
    check_bytes(sum(entry_size(entry) for entry in items), max_bytes)
    check_distinct(items, labels or [f"item #{i}" for i in range(len(items))], key_names or {})


def check_bytes(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise TransactionTooLargeError(
            f"a transaction holds at most 4 MB ({max_bytes} bytes) of item data, this one "
            f"would hold {size} bytes; split it, or store large values elsewhere (S3)",
            size=size,
            limit=max_bytes,
        )


#: what an added item is, for messages: (what is done, the table or the event id), written out
#: as ``put into 'orders'`` only when a message needs it
Label = tuple[str, str]


def label_text(label: Label) -> str:
    return f"{label[0]} {label[1]!r}"


def twice_error(first: str, second: str, identity: tuple[str, Any]) -> InvalidValueError:
    return InvalidValueError(
        f"one item appears twice in one transaction ({first} and {second}, the same key in "
        f"{identity[0]!r}): DynamoDB refuses a transaction with two operations on one item; "
        "nothing was sent"
    )


def check_distinct(
    items: list[dict[str, Any]], labels: list[str], key_names: Mapping[str, frozenset[str]]
) -> dict[tuple[str, Any], int]:
    """The index of each item by its identity; :class:`InvalidValueError` if one is there twice."""
    known = dict(key_names)
    for entry in items:
        ((_, op),) = entry.items()
        if "Key" in op:
            known.setdefault(str(op.get("TableName")), frozenset(op["Key"]))
    seen: dict[tuple[str, Any], int] = {}
    for index, entry in enumerate(items):
        identity = item_identity(entry, known)
        if identity is None:
            continue
        if identity in seen:
            raise twice_error(labels[seen[identity]], labels[index], identity)
        seen[identity] = index
    return seen
