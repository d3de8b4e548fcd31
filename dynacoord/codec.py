"""Value encoding shared by every backend.

Stored values are JSON text with three tagged forms, so that every supported Python value comes
back with the same type and value it went in with:

* ``bytes``             -> ``{"$b": "<base64>"}``
* ``decimal.Decimal``   -> ``{"$d": "<str(decimal)>"}`` (ints and floats stay JSON numbers, so an
  int never comes back as a Decimal or a float)
* a dict whose only key is one of the tags -> ``{"$$": {...}}`` (escaped, so user data that looks
  like a tag is not mistaken for one)

Floats round-trip exactly (JSON uses ``repr``). NaN and infinities, ints of more than
:data:`MAX_INT_DIGITS` digits (Python's default int/str conversion limit: a longer one could not
be read back by a process with the default setting), sets, objects, non-str dict keys and
recursive structures are refused with :class:`~dynacoord.errors.InvalidValueError` before
anything is written. Decimals are stored as text, so any finite Decimal is kept exactly. Tuples are stored as lists (and come back as lists), as with ``json``.
No pickle, ever: a value read from a shared table must never execute code.
"""

from __future__ import annotations

import base64
import decimal
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from .errors import InvalidValueError, ValueTooLargeError

__all__ = [
    "DYNAMODB_ITEM_LIMIT",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_INT_DIGITS",
    "JSONValue",
    "canonical",
    "check_item_size",
    "decode",
    "encode",
    "estimate_item_size",
]

JSONValue: TypeAlias = Any
"""int, float, str, bool, None, bytes, Decimal, and lists/dicts (str keys) of them."""

#: DynamoDB's item size limit in bytes (attribute names plus values).
DYNAMODB_ITEM_LIMIT = 400 * 1024

#: The signed 64-bit range: what Redis and MongoDB hold as a number (counters, cache ``incr``).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: The most digits of an int the codec stores (Python's default ``sys.get_int_max_str_digits()``).
MAX_INT_DIGITS = 4300
_INT_LIMIT = 10**MAX_INT_DIGITS
_INT_CHECK_BITS = 14000  # below this bit length an int has fewer than 4300 digits
_BITS = _INT_CHECK_BITS

_TAGS = frozenset({"$b", "$d", "$$"})
#: json's decoding scan (the C scanner where available), which decode calls directly
_SCAN_ONCE: Callable[[str, int], tuple[Any, int]]
_SCAN_ONCE = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _encoder(**options: Any) -> Callable[[Any, int], Sequence[str]]:
    """A JSON encoder made once for every call, as a function of (tree, 0) giving the text's
    chunks. ``JSONEncoder.encode`` builds its C encoder anew on each call; where the C
    accelerator exists it is built here once (with no circular-reference markers: the codec's
    walk bounds the depth before anything is encoded)."""
    encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, **options)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython has the accelerator
        return lambda tree, _: (encoder.encode(tree),)
    chunks: Callable[[Any, int], Sequence[str]] = make(
        None,
        encoder.default,
        json.encoder.encode_basestring,
        None,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        False,
        False,
    )
    return chunks


_ENCODE = _encoder(separators=(",", ":"))
#: the canonical form of :func:`canonical` (the key of a ``@cached`` call: keep it stable)
_CANONICAL = _encoder(sort_keys=True)
_MAX_DEPTH = 64


class _UnstorableError(Exception):
    """Internal: a value the codec cannot store. The path to it is collected on the way out (the
    containers add their keys), so a walk that finds nothing wrong formats no paths at all."""

    def __init__(self, message: Callable[[str], str]) -> None:
        super().__init__()
        self.message = message
        self.trail: list[Any] = []  # keys and indexes, innermost first

    def error(self, root: str) -> InvalidValueError:
        path = root + "".join(f"[{k!r}]" for k in reversed(self.trail))
        return InvalidValueError(self.message(path))


def _bad_key(key: Any) -> _UnstorableError:
    return _UnstorableError(
        lambda path: f"dict keys must be str, got {type(key).__name__} key {key!r} at {path}"
    )


def _to_jsonable(value: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise _UnstorableError(
            lambda path: (
                f"value nests deeper than {_MAX_DEPTH} levels at {path} (recursive structure?)"
            )
        )
    cls = type(value)
    if cls is str or value is None or cls is bool:
        return value
    # A container comes back as it is unless something in it had to change (a Decimal, bytes, a
    # tag-like key, a Mapping that is not a dict): most values are plain JSON already, and the
    # encoder takes them without a copy. str, bool, None and ints inside are checked in place
    # rather than by a call each.
    inline = depth < _MAX_DEPTH
    if cls is dict:
        changed: dict[str, Any] | None = None
        for k, v in value.items():
            if type(k) is not str and not isinstance(k, str):
                raise _bad_key(k)
            t = type(v)
            if inline and (
                t is str or v is None or t is bool or (t is int and v.bit_length() <= _BITS)
            ):
                continue
            try:
                converted = _to_jsonable(v, depth + 1)
            except _UnstorableError as bad:
                bad.trail.append(k)
                raise
            if converted is not v:
                if changed is None:
                    changed = dict(value)
                changed[k] = converted
        result = value if changed is None else changed
        if len(result) == 1 and next(iter(result)) in _TAGS:
            return {"$$": result}
        return result
    if cls is list or cls is tuple or isinstance(value, (list, tuple)):
        replaced: list[Any] | None = None
        for i, v in enumerate(value):
            t = type(v)
            if inline and (
                t is str or v is None or t is bool or (t is int and v.bit_length() <= _BITS)
            ):
                continue
            try:
                converted = _to_jsonable(v, depth + 1)
            except _UnstorableError as bad:
                bad.trail.append(i)
                raise
            if converted is not v:
                if replaced is None:
                    replaced = list(value)
                replaced[i] = converted
        return value if replaced is None else replaced
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if type(k) is not str and not isinstance(k, str):
                raise _bad_key(k)
            try:
                out[k] = _to_jsonable(v, depth + 1)
            except _UnstorableError as bad:
                bad.trail.append(k)
                raise
        if len(out) == 1 and next(iter(out)) in _TAGS:
            return {"$$": out}
        return out
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if value.bit_length() > _INT_CHECK_BITS and not -_INT_LIMIT < value < _INT_LIMIT:
            bits = value.bit_length()
            raise _UnstorableError(
                lambda path: (
                    f"int at {path} has more than {MAX_INT_DIGITS} digits ({bits} "
                    "bits), over the codec's int range; store it as a str or a Decimal"
                )
            )
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _UnstorableError(
                lambda path: f"value at {path} is {value!r}: NaN and infinity are not storable"
            )
        return value
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise _UnstorableError(
                lambda path: f"value at {path} is {value!r}: NaN and infinity are not storable"
            )
        return {"$d": str(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    raise _UnstorableError(
        lambda path: (
            f"value of type {type(value).__name__} at {path} is not storable: use int, "
            "float, str, bool, None, bytes, Decimal, list or dict with str keys"
        )
    )


def _from_jsonable(obj: Any) -> Any:
    # Top-down (not json's bottom-up object_hook): the contents of an escaped "$$" dict are user
    # data and must not be read as tags themselves.
    if isinstance(obj, list):
        return [_from_jsonable(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        ((tag, inner),) = obj.items()
        if tag == "$b":
            return base64.b64decode(inner)
        if tag == "$d":
            return decimal.Decimal(inner)
        if tag == "$$":
            return {k: _from_jsonable(v) for k, v in inner.items()}
    return {k: _from_jsonable(v) for k, v in obj.items()}


def encode(value: Any) -> str:
    """Encode ``value`` as JSON text; raise :class:`InvalidValueError` for unsupported values."""
    # A lone scalar (a context value, a flag, a result) as json writes it, without the walk
    cls = type(value)
    if cls is str:
        if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
            return f'"{value}"'  # nothing json escapes: printable ASCII without quote, backslash
    elif cls is int:
        if -_SMALL_INT < value < _SMALL_INT:
            return str(value)
    elif value is None:
        return "null"
    elif cls is bool:
        return "true" if value else "false"
    return _text(_ENCODE, value)


#: ints below this written by str() directly (far under any int_max_str_digits limit)
_SMALL_INT = 10**18


def _text(chunks: Callable[[Any, int], Sequence[str]], value: Any) -> str:
    """``value`` as JSON text written by ``chunks`` (an :func:`_encoder`), or
    :class:`InvalidValueError` naming where it is not storable."""
    try:
        tree = _to_jsonable(value, 0)
    except _UnstorableError as bad:
        raise bad.error("value") from None
    try:
        text = "".join(chunks(tree, 0))
    except ValueError as exc:  # an int over a lower sys.set_int_max_str_digits() of this process
        raise InvalidValueError(f"value cannot be encoded: {exc}") from exc
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidValueError(
                f"value contains a lone surrogate ({text[exc.start : exc.end]!r}), which is not "
                "valid UTF-8 text and cannot be stored"
            ) from exc
    return text


def canonical(value: Any) -> str:
    """The JSON text of ``value`` encoded as :func:`encode` does but with dict keys sorted and
    json's default separators: equal values give equal text, whatever their dict order.

    The same text as ``json.dumps(json.loads(encode(value)), sort_keys=True,
    ensure_ascii=False)``, without the round trip.
    """
    return _text(_CANONICAL, value)


def decode(text: str | bytes) -> Any:
    """Inverse of :func:`encode`."""
    if type(text) is str:
        try:
            tree, end = _SCAN_ONCE(text, 0)  # raw_decode's scan, without its Python frame
        except (StopIteration, ValueError):
            tree, end = None, -1
        if end != len(text):  # whitespace around it, or not JSON: json.loads decides
            tree = json.loads(text)
        # A tag is a dict key starting with "$": text without "$" (or escapes that could spell
        # one) holds no tag and needs no second walk.
        if "$" not in text and "\\u" not in text:
            return tree
        return _from_jsonable(tree)
    return _from_jsonable(json.loads(text))


def _attribute_size(value: Any) -> int:
    # Sizes follow DynamoDB's documented item-size rules closely enough to refuse an oversize item
    # before sending it (the service would refuse it anyway, but only after a round trip).
    cls = type(value)
    if cls is str:  # the common cases first, by exact type
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if cls is int:
        return 1 + (len(str(abs(value))) + 1) // 2
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (int, decimal.Decimal)):
        digits = len(str(value).lstrip("-").replace(".", ""))
        return 1 + (digits + 1) // 2
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, Mapping):
        return 3 + sum(_attribute_size(k) + _attribute_size(v) + 1 for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return 3 + sum(_attribute_size(v) + 1 for v in value)
    return len(str(value))


def estimate_item_size(item: Mapping[str, Any]) -> int:
    """Approximate DynamoDB size in bytes of an item given as plain Python values."""
    size = 0
    for name, value in item.items():
        size += (len(name) if name.isascii() else len(name.encode("utf-8"))) + _attribute_size(
            value
        )
    return size


def check_item_size(
    item: Mapping[str, Any], *, limit: int = DYNAMODB_ITEM_LIMIT, key: object = None
) -> None:
    """Raise :class:`ValueTooLargeError` if ``item`` would not fit in one stored item."""
    size = estimate_item_size(item)
    if size > limit:
        raise ValueTooLargeError(
            f"the item would be {size} bytes, over the {limit}-byte item limit; store large "
            "values elsewhere (for example S3) and keep a reference",
            size=size,
            limit=limit,
            key=key,
        )
