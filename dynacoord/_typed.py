"""Typed results: ``output_type=`` of ``@idempotent`` turns a result into codec data and back.

The codec stores JSON-compatible values, bytes and Decimal, and nothing else, on purpose (no
pickle: a value read from a shared table must never execute code). A function returning a
dataclass, a pydantic model, a datetime or a UUID names its type instead, and the type says how
to rebuild the value::

    @backend.idempotent(key="order_id", output_type=Receipt)   # a dataclass
    def charge(event): return Receipt(id=..., at=datetime.now(timezone.utc))

Supported ``output_type`` values (resolved once, when the decorator is built, so an unsupported
annotation fails at import time, not on the first replay):

* a ``(to_store, from_store)`` pair of callables: ``to_store(result)`` returns codec data,
  ``from_store(data)`` rebuilds the result;
* a pydantic model class (v2 ``model_dump(mode="json")`` / ``model_validate``; v1 ``.json()`` /
  ``parse_obj``), found by duck typing: pydantic is never imported by dynacoord;
* a dataclass: its ``init`` fields, each converted by its annotation (nested dataclasses,
  pydantic models, ``list[X]``, ``tuple[X, ...]``, ``set[X]``, ``dict[str, X]``, ``X | None``,
  enums, ``datetime``/``date``/``time`` as ISO 8601 text, ``UUID`` as text, and the codec's own
  types). A stored field missing on read takes the field's default (a field added later); a
  stored field the class no longer has is ignored;
* any of those annotations on its own (``output_type=list[Receipt]``, ``output_type=datetime``).

None (the result, or any value inside it) is stored as None whatever the annotation.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError, InvalidValueError

__all__ = ["OutputType", "output_type"]

Convert = Callable[[Any], Any]

#: types the codec stores as they are
_NATIVE: tuple[type, ...] = (str, int, float, bool, type(None), bytes, decimal.Decimal)


def _same(value: Any) -> Any:
    return value


class OutputType:
    """A resolved ``output_type``: ``to_store(result)`` -> codec data, ``from_store(data)``."""

    __slots__ = ("_from", "_to", "name")

    def __init__(self, name: str, to_store: Convert, from_store: Convert) -> None:
        self.name = name
        self._to = to_store
        self._from = from_store

    def to_store(self, value: Any) -> Any:
        return None if value is None else self._to(value)

    def from_store(self, data: Any) -> Any:
        return None if data is None else self._from(data)

    def __repr__(self) -> str:
        return f"OutputType({self.name})"


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return f"{tp.__module__}.{tp.__qualname__}" if tp.__module__ != "builtins" else tp.__name__
    return repr(tp)


def output_type(spec: Any) -> OutputType:
    """Resolve an ``output_type`` argument (see the module docstring); ConfigurationError if it
    is none of the supported forms."""
    if isinstance(spec, tuple):
        if len(spec) != 2 or not all(callable(f) for f in spec):
            raise ConfigurationError(
                "output_type as a tuple must be a (to_store, from_store) pair of callables"
            )
        to_store, from_store = spec
        name = getattr(to_store, "__qualname__", "to_store")
        return OutputType(f"({name}, ...)", to_store, from_store)
    to_store, from_store = _converter(spec, "output_type")
    return OutputType(_type_name(spec), to_store, from_store)


def _is_pydantic(tp: Any) -> bool:
    return isinstance(tp, type) and (
        (hasattr(tp, "model_validate") and hasattr(tp, "model_dump"))
        or (hasattr(tp, "parse_obj") and hasattr(tp, "__fields__") and hasattr(tp, "json"))
    )


def _converter(tp: Any, where: str) -> tuple[Convert, Convert]:
    """(to_store, from_store) for an annotation; ConfigurationError if it is not supported.
    None stays None whatever the annotation (``kind: Kind = None`` is common enough)."""
    return _optional(*_resolve(tp, where))


def _resolve(tp: Any, where: str) -> tuple[Convert, Convert]:
    if tp is Any or tp is object:
        return _same, _same
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return _same, _same
    if origin is typing.Union or origin is types.UnionType:
        members = [m for m in typing.get_args(tp) if m is not type(None)]
        if len(members) == 1:
            return _resolve(members[0], where)
        if all(m in _NATIVE for m in members):
            return _same, _same
        raise ConfigurationError(
            f"{where}: {tp!r} is a union dynacoord cannot rebuild (which member would a stored "
            "value be?); use one type, X | None, or a (to_store, from_store) pair"
        )
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset, dict):
        return _sequence(tp, origin or tp, where)
    if origin is dict:
        key_type, value_type = typing.get_args(tp) or (str, Any)
        if key_type is not str:
            raise ConfigurationError(f"{where}: {tp!r}: only dicts with str keys can be stored")
        to_v, from_v = _converter(value_type, f"{where}[...]")
        return (
            lambda d: {k: to_v(v) for k, v in _checked(d, dict, tp).items()},
            lambda d: {k: from_v(v) for k, v in d.items()},
        )
    if not isinstance(tp, type):
        raise ConfigurationError(
            f"{where}: {tp!r} is not a type dynacoord can store; pass a (to_store, from_store) "
            "pair of callables"
        )
    if _is_pydantic(tp):
        return _pydantic(tp)
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp)
    if issubclass(tp, enum.Enum):
        return (lambda v: _checked(v, tp, tp).value), tp
    if tp is datetime.datetime:
        return (lambda v: _checked(v, tp, tp).isoformat()), datetime.datetime.fromisoformat
    if tp is datetime.date:
        return (lambda v: _checked(v, tp, tp).isoformat()), datetime.date.fromisoformat
    if tp is datetime.time:
        return (lambda v: _checked(v, tp, tp).isoformat()), datetime.time.fromisoformat
    if tp is uuid.UUID:
        return (lambda v: str(_checked(v, tp, tp))), uuid.UUID
    if tp in _NATIVE:
        return _same, _same
    raise ConfigurationError(
        f"{where}: {_type_name(tp)} is not a type dynacoord knows how to store (dataclass, "
        "pydantic model, datetime/date/time, UUID, Enum, list/tuple/set/dict of them, or the "
        "codec's JSON-compatible types); pass a (to_store, from_store) pair of callables"
    )


def _checked(value: Any, cls: type, tp: Any) -> Any:
    if not isinstance(value, cls):
        raise InvalidValueError(
            f"expected {_type_name(tp)} (the output_type), got {type(value).__name__} {value!r}"
        )
    return value


def _optional(to_v: Convert, from_v: Convert) -> tuple[Convert, Convert]:
    return (
        lambda v: None if v is None else to_v(v),
        lambda d: None if d is None else from_v(d),
    )


def _sequence(tp: Any, kind: Any, where: str) -> tuple[Convert, Convert]:
    args = typing.get_args(tp)
    if kind is dict:  # a bare dict
        return _same, _same
    if kind is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        # a fixed-shape tuple: tuple[int, datetime]
        parts = [_converter(a, f"{where}[{i}]") for i, a in enumerate(args)]

        def to_fixed(v: Any) -> Any:
            _checked(v, tuple, tp)
            if len(v) != len(parts):
                raise InvalidValueError(f"expected {tp!r}, got a tuple of {len(v)} items")
            return [p[0](x) for p, x in zip(parts, v, strict=True)]

        return to_fixed, lambda d: tuple(p[1](x) for p, x in zip(parts, d, strict=True))
    to_v, from_v = _converter(args[0], f"{where}[...]") if args else (_same, _same)
    build: Callable[[Any], Any] = kind
    accepted: type | tuple[type, ...] = (set, frozenset) if kind in (set, frozenset) else kind
    if kind in (set, frozenset):
        # a stable stored order: the same set stores the same text (and the same payload hash)
        return (
            lambda v: sorted((to_v(x) for x in _checked(v, accepted, tp)), key=repr),  # type: ignore[arg-type]
            lambda d: build(from_v(x) for x in d),
        )
    return (
        lambda v: [to_v(x) for x in _checked(v, accepted, tp)],  # type: ignore[arg-type]
        lambda d: build(from_v(x) for x in d),
    )


def _pydantic(tp: type) -> tuple[Convert, Convert]:
    if hasattr(tp, "model_validate"):  # pydantic v2
        return (
            lambda v: _checked(v, tp, tp).model_dump(mode="json"),
            tp.model_validate,
        )
    import json  # pydantic v1: .json() is its JSON-safe form

    return (lambda v: json.loads(_checked(v, tp, tp).json()), tp.parse_obj)  # type: ignore[attr-defined]


def _dataclass(tp: type) -> tuple[Convert, Convert]:
    try:
        hints = typing.get_type_hints(tp)
    except Exception as exc:  # a forward reference that does not resolve
        raise ConfigurationError(
            f"output_type {_type_name(tp)}: cannot resolve its field annotations ({exc})"
        ) from exc
    fields = [f for f in dataclasses.fields(tp) if f.init]
    convert = {
        f.name: _converter(hints.get(f.name, Any), f"{_type_name(tp)}.{f.name}") for f in fields
    }

    def to_store(value: Any) -> Any:
        _checked(value, tp, tp)
        return {name: conv[0](getattr(value, name)) for name, conv in convert.items()}

    def from_store(data: Any) -> Any:
        if not isinstance(data, dict):
            raise InvalidValueError(f"stored value for {_type_name(tp)} is not a dict: {data!r}")
        return tp(**{n: convert[n][1](v) for n, v in data.items() if n in convert})

    return to_store, from_store
