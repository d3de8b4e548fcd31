"""Argument checks shared by every primitive: they run before anything is sent to a store."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from .errors import ConfigurationError, InvalidValueError

__all__ = [
    "MAX_TTL_SECONDS",
    "check_bool",
    "check_int",
    "check_iterable",
    "check_str",
    "check_utf8",
    "non_negative_seconds",
    "ttl_to_ms",
]

# Conventions: a value of the wrong *type* raises TypeError; a value of the right type that is out
# of range or malformed raises InvalidValueError, a DynacoordError that is also a ValueError (so
# ``except ValueError`` and ``except DynacoordError`` both catch it).

#: The longest TTL accepted anywhere (10 years): longer is almost always a unit mistake
#: (milliseconds passed as seconds) and risks overflowing epoch arithmetic in other tools.
MAX_TTL_SECONDS = 10 * 365 * 24 * 3600


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    as_float = float(value)
    if not math.isfinite(as_float):
        raise InvalidValueError(f"{name} must be finite, got {value!r}")
    return as_float


#: float TTLs already converted (callers pass the same few values on every call); bounded
_FLOAT_TTL_MS: dict[float, int] = {}


def ttl_to_ms(value: Any, name: str = "ttl") -> int:
    """Validate a TTL in seconds (int or float) and return whole milliseconds (at least 1)."""
    cls = type(value)
    if cls is int and 0 < value <= MAX_TTL_SECONDS:  # whole seconds: nothing to round
        return int(value) * 1000
    if cls is float:
        known = _FLOAT_TTL_MS.get(value)
        if known is not None:
            return known
    ms = _ttl_to_ms(value, name)
    if cls is float:
        if len(_FLOAT_TTL_MS) >= 256:
            _FLOAT_TTL_MS.clear()
        _FLOAT_TTL_MS[value] = ms
    return ms


def _ttl_to_ms(value: Any, name: str) -> int:
    seconds = _number(value, name)
    if seconds <= 0:
        raise InvalidValueError(f"{name} must be > 0 seconds, got {value!r}")
    if seconds > MAX_TTL_SECONDS:
        raise InvalidValueError(
            f"{name} must be at most {MAX_TTL_SECONDS} seconds (10 years), got {value!r}"
        )
    # round() first: 2.007 * 1000 is 2007.0000000000002 in binary floating point, and a bare ceil
    # would turn a 2007 ms TTL into 2008 ms.
    return max(1, math.ceil(round(seconds * 1000, 6)))


def non_negative_seconds(value: Any, name: str) -> float:
    """Validate a duration in seconds that may be zero (timeouts, intervals)."""
    seconds = _number(value, name)
    if seconds < 0:
        raise InvalidValueError(f"{name} must be >= 0 seconds, got {value!r}")
    if seconds > MAX_TTL_SECONDS:
        raise InvalidValueError(f"{name} must be at most {MAX_TTL_SECONDS} seconds, got {value!r}")
    return seconds


def check_int(
    value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """Validate an int parameter (bools are refused: ``True`` is not a count)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise InvalidValueError(f"{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidValueError(f"{name} must be <= {maximum}, got {value!r}")
    return value


def check_bool(value: Any, name: str) -> bool:
    """Validate a flag: only ``True`` or ``False``. A truthy stand-in (``"no"``, ``1``, ``None``)
    is refused because it would silently mean the opposite of what a caller may have meant."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r:.40}")
    return value


def check_iterable(value: Any, name: str, what: str, *, hint: str = "") -> list[Any]:
    """Materialise an iterable argument (``what`` names its items, e.g. ``"cache keys"``).

    A str or bytes is refused with a TypeError rather than iterated: ``get_many("user:1")`` would
    otherwise look up the keys ``"u"``, ``"s"``, ... and ``delete_many("abc")`` delete ``"a"``,
    ``"b"`` and ``"c"``. A non-iterable gets a TypeError that names the parameter instead of
    Python's bare "'int' object is not iterable". ``hint`` is appended to the str message.
    """
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        raise TypeError(
            f"{name} must be an iterable of {what}, not a {type(value).__name__}"
            + (f" ({hint})" if hint else "")
        )
    try:
        iterator = iter(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an iterable of {what}, got {type(value).__name__}"
        ) from None
    return list(iterator)


def check_str(value: Any, name: str) -> str:
    """Validate a non-empty str parameter that is not a key (owner names, reasons, ...)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidValueError(f"{name} must not be empty")
    return check_utf8(value, name)


def check_utf8(value: str, name: str) -> str:
    """Refuse a str with a lone surrogate: no store can hold it, and boto3 would fail mid-send
    with a bare ``UnicodeEncodeError``."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidValueError(
            f"{name} is not valid UTF-8 text (it contains a lone surrogate): {value!r}"
        ) from exc
    return value


_Options = TypeVar("_Options")


def option_names(cls: type) -> tuple[str, ...]:
    """The names an options dataclass takes, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def options_with(
    cls: type[_Options],
    base: _Options | None,
    values: Mapping[str, Any],
    *,
    what: str,
    hint: str = "",
) -> _Options:
    """``base`` (or ``cls``'s defaults) with ``values`` in place of its own, by name: the
    ``of`` of every options dataclass (a worker's, a breaker's, ``@idempotent``'s). An unknown
    name is refused with the list of the ``what`` options; ``hint`` follows a base that is not
    a ``cls``."""
    if base is not None and not isinstance(base, cls):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise TypeError(
            f"options must be {article} {cls.__name__}, got {type(base).__name__}{hint}"
        )
    names = option_names(cls)
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigurationError(
            f"unknown {what} option(s) {unknown}; the options are {', '.join(names)}"
        )
    if base is None:
        return cls(**values)
    return dataclasses.replace(base, **values) if values else base  # type: ignore[type-var]
