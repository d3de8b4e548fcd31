"""Why an idempotent call's result could not be stored, and what to say about it: the advice a
refused result gets (too large, a number out of range, a type the codec does not know), the
marker stored in its place, and the error a replay of it raises. Apart from
:mod:`dynacoord.idempotency` because none of it runs unless a result was refused."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from . import codec
from ._typed import OutputType
from ._typed import output_type as output_type_of
from .errors import ConfigurationError, ValueTooLargeError

__all__ = [
    "CODEC_TYPES",
    "UNSTORABLE_PREFIX",
    "Refused",
    "fix_for",
    "holds_number_out_of_range",
    "not_replayable",
    "type_name",
    "unstorable_marker",
    "with_article",
]

#: ``result_text`` of a call whose result could not be stored, followed by the result's type
#: name, ``;`` and the advice its first call gave (a marker with the type name only still reads:
#: its duplicates are refused without advice). The codec only ever writes JSON text, which never
#: starts with ``!``.
UNSTORABLE_PREFIX = "!unstorable:"


def type_name(value: Any) -> str:
    cls = type(value)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def with_article(word: str) -> str:
    """``word`` with its indefinite article (an int, a dict)."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a result cannot be stored (the codec's or the size check's error) and what fixes it."""

    cause: Exception
    fix: str


#: the types the codec stores as they are: an output_type of one of them changes nothing
CODEC_TYPES = (int, float, str, bool, type(None), bytes, bytearray, Decimal, list, tuple, dict)


def fix_for(exc: Exception, output: OutputType | None, result: Any, data: Any) -> str:
    """The advice for a result that cannot be stored, by cause: too large, a number out of the
    codec's range (no output_type helps), or a type the codec does not know (output_type)."""
    if isinstance(exc, ValueTooLargeError):
        return (
            "the result is too large for one record (DynamoDB's "
            f"{codec.DYNAMODB_ITEM_LIMIT}-byte item limit, applied on every backend): return "
            "less, for example a reference to where the data is (an S3 key)"
        )
    if holds_number_out_of_range(data):
        return (
            "it holds a number out of range: the codec stores ints of at most "
            f"{codec.MAX_INT_DIGITS} digits and finite floats and Decimals (no NaN or "
            "infinity); return a smaller number, or the number in another form (a Decimal "
            "holds any finite value, a str any)"
        )
    if output is not None:
        return (
            f"return {with_article(output.name)} (the output_type), or fix the output_type's "
            "conversion"
        )
    cls = type(result)
    if not isinstance(result, CODEC_TYPES):
        try:
            output_type_of(cls)
        except ConfigurationError:
            pass
        else:
            return (
                f"pass output_type={cls.__qualname__} to @idempotent (a dataclass, a pydantic "
                "model, datetime, UUID, Enum, list[...] of them), or "
                "output_type=(to_store, from_store), or return a JSON-compatible value"
            )
    return (
        "return JSON-compatible values only (int, float, str, bool, None, bytes, Decimal, list, "
        "dict with str keys), or convert the result with a dataclass output_type or "
        "output_type=(to_store, from_store)"
    )


def holds_number_out_of_range(value: Any) -> bool:
    """Whether ``value`` (walked through lists, tuples and mappings) holds an int over the codec's
    digits, or a NaN or infinite float or Decimal. Only called on a value the codec refused."""
    stack = [value]
    seen: set[int] = set()
    while stack and len(seen) < 100_000:
        item = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            if (
                item.bit_length() > 3 * codec.MAX_INT_DIGITS
                and abs(item) >= 10**codec.MAX_INT_DIGITS
            ):
                return True
        elif isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, Decimal):
            if not item.is_finite():
                return True
        elif isinstance(item, (list, tuple, Mapping)) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(item.values() if isinstance(item, Mapping) else item)
    return False


def unstorable_marker(text: str | None) -> tuple[str, str | None] | None:
    """(type name, advice or None) of an unstorable marker, else None."""
    if text is None or not text.startswith(UNSTORABLE_PREFIX):
        return None
    kind, _, fix = text[len(UNSTORABLE_PREFIX) :].partition(";")
    return kind, fix or None


def not_replayable(key: str, kind: str, fix: str | None, *, duplicate: bool = False) -> str:
    who = "the first call" if duplicate else "the call"
    what = "this duplicate" if duplicate else "it"
    return (
        f"{who} with idempotency key {key!r} ran, but its result ({with_article(kind)}) could not be "
        f"stored, so {what} cannot be replayed"
        + ("; it is not run again either (its side effects happened once)" if duplicate else "")
        + (f". Fix: {fix}" if fix else "")
        + f". Then free the key: backend.idempotency.delete({key!r})"
    )
