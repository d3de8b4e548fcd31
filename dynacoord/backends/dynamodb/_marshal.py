"""Python values to DynamoDB attribute values and back, for every DynamoDB store.

Values are marshalled by a direct fast path for the attribute types dynacoord writes (S, N as int
of at most 38 digits, BOOL, NULL, M, L) and by boto3's own ``TypeSerializer``/``TypeDeserializer``
for everything else (Decimal, bytes, sets, out-of-range ints: their errors stay boto3's). The fast
path is tested value-for-value and type-for-type against boto3's (``tests/test_marshal.py``) and
exists because boto3's Decimal-context deserializer costs ~4x more per item (``make bench``).
This module is where such hand-written attribute values may live (docs/architecture.md).

No boto3/botocore import at module level: this module is imported deep inside the lazy-import
chain on a Lambda cold start, where module-level imports of boto3's regex-heavy modules cost
several times more than at the top level.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, cast

__all__ = [
    "exact_sum",
    "marshal",
    "primary",
    "sum_limit",
    "to_av",
    "unmarshal",
    "unmarshal_only",
    "values",
]

#: ints whose decimal form has at most 38 digits are exact DynamoDB numbers
_N_LIMIT = 10**38

_boto3_types: Any = None


def sum_limit(path: str, by: int) -> tuple[str, dict[str, Any]]:
    """The condition part (`` AND ...``) that keeps the number at ``path`` plus ``by`` within
    DynamoDB's 38 significant digits (past them DynamoDB would store it rounded), and its
    ``:lim`` value; nothing for ``by == 0``."""
    if by > 0:
        return f" AND (attribute_not_exists({path}) OR {path} <= :lim)", {"lim": _N_LIMIT - 1 - by}
    if by < 0:
        return f" AND (attribute_not_exists({path}) OR {path} >= :lim)", {"lim": 1 - _N_LIMIT - by}
    return "", {}


def exact_sum(n: int, by: int) -> bool:
    """Whether ``n + by`` is a number DynamoDB holds exactly (at most 38 digits)."""
    return -_N_LIMIT < n + by < _N_LIMIT


def _boto3() -> Any:
    """boto3's serializer and deserializer, made on first use (see the module docstring)."""
    global _boto3_types
    if _boto3_types is None:
        from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

        _boto3_types = (TypeSerializer(), TypeDeserializer())
    return _boto3_types


def _serialize(value: Any) -> dict[str, Any]:
    cls = type(value)
    if cls is str:
        return {"S": value}
    if cls is int:
        if -_N_LIMIT < value < _N_LIMIT:
            return {"N": str(value)}
    elif cls is bool:
        return {"BOOL": value}
    elif value is None:
        return {"NULL": True}
    elif cls is dict:
        return {"M": {k: _serialize(v) for k, v in value.items()}}
    elif cls is list:
        return {"L": [_serialize(v) for v in value]}
    elif cls is set and value and all(type(v) is str for v in value):
        return {"SS": list(value)}  # the request tokens of counting writes
    return cast("dict[str, Any]", _boto3()[0].serialize(value))


def _deserialize(av: Mapping[str, Any]) -> Any:
    if len(av) == 1:
        # S and N first, by key lookup: most attributes are one of them
        if "S" in av:
            return av["S"]
        if "N" in av:
            return Decimal(av["N"])
        ((tag, raw),) = av.items()
        if tag == "BOOL":
            return raw
        if tag == "NULL":
            return None
        if tag == "M":
            return unmarshal(raw)
        if tag == "L":
            return [_deserialize(v) for v in raw]
        if tag == "SS":
            return set(raw)
    return _boto3()[1].deserialize(av)


def primary(pk: str, sk: str) -> dict[str, Any]:
    """The ``Key`` of GetItem/UpdateItem/DeleteItem for ``pk``/``sk``, already marshalled."""
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def to_av(value: Any) -> dict[str, Any]:
    """One Python value to a DynamoDB attribute value."""
    return _serialize(value)


def marshal(item: Mapping[str, Any]) -> dict[str, Any]:
    """A dict of Python values to a DynamoDB item (None values are dropped)."""
    out: dict[str, Any] = {}
    for name, value in item.items():
        # str and int inline (most attributes): no call per attribute, no comprehension frame
        cls = type(value)
        if cls is str:
            out[name] = {"S": value}
        elif cls is int and -_N_LIMIT < value < _N_LIMIT:
            out[name] = {"N": str(value)}
        elif value is not None:
            out[name] = _serialize(value)
    return out


def unmarshal(item: Mapping[str, Any]) -> dict[str, Any]:
    """A DynamoDB item to a dict of Python values."""
    out: dict[str, Any] = {}
    for name, av in item.items():
        # _deserialize's S and N cases inline: a call per attribute is most of the cost
        if len(av) == 1:
            if "S" in av:
                out[name] = av["S"]
                continue
            if "N" in av:
                out[name] = Decimal(av["N"])
                continue
        out[name] = _deserialize(av)
    return out


def unmarshal_only(item: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The attributes ``names`` of a DynamoDB item (those it has) as Python values: a reader
    that needs a few attributes of a wide item skips converting the rest."""
    out: dict[str, Any] = {}
    for name in names:
        av = item.get(name)
        if av is not None:
            out[name] = _deserialize(av)
    return out


def values(**kwargs: Any) -> dict[str, Any]:
    """``ExpressionAttributeValues`` from keyword arguments: ``values(now=1)`` -> ``{":now": ..}``."""
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        cls = type(value)
        if cls is str:
            out[":" + name] = {"S": value}
        elif cls is int and -_N_LIMIT < value < _N_LIMIT:
            out[":" + name] = {"N": str(value)}
        else:
            out[":" + name] = _serialize(value)
    return out
