"""Stand-ins for standard-library pieces: :class:`StrEnum` where Python (3.10) lacks it, and
:class:`Record`, a ``typing.NamedTuple`` that costs less to define. Private: import from here,
never re-export."""

from __future__ import annotations

import enum
import sys
from operator import itemgetter
from typing import TYPE_CHECKING, Any

__all__ = ["Record", "StrEnum"]


if sys.version_info >= (3, 11):
    from enum import StrEnum
else:
    # made only where it is needed: an enum class costs a millisecond of every cold start

    class StrEnum(str, enum.Enum):
        """What :class:`enum.StrEnum` (3.11+) does that matters here: members are ``str`` and
        ``str()``/``format()`` give the value (``"open"``, not ``"State.OPEN"``); ``auto()``
        gives the lower-cased member name."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, format_spec: str) -> str:
            return str.__format__(str(self), format_spec)

        @staticmethod
        def _generate_next_value_(name: str, start: int, count: int, last_values: list[str]) -> str:
            return name.lower()


if TYPE_CHECKING:
    # Type checkers see a NamedTuple: typed fields, _replace, unpacking.
    from typing import NamedTuple as Record
else:

    class _RecordType(type):
        """Makes a :class:`Record` subclass's annotated names its fields."""

        def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> type:
            if "__annotations__" not in namespace and any(getattr(b, "_fields", ()) for b in bases):
                # a subclass that adds methods keeps its base's fields, as a NamedTuple's does
                namespace.setdefault("__slots__", ())
                return super().__new__(mcls, name, bases, namespace)
            fields = tuple(namespace.get("__annotations__", {}))
            defaults: dict[str, Any] = {}
            for index, field in enumerate(fields):
                if field in namespace:
                    defaults[field] = namespace.pop(field)
                elif defaults:
                    raise TypeError(
                        f"{name}: field {field!r} without a default follows fields with one"
                    )
                namespace[field] = property(itemgetter(index), doc=f"Field {index}: {field}")
            namespace.update(
                __slots__=(),
                _fields=fields,
                _field_defaults=defaults,
                _trailing_defaults=tuple(defaults.values()),
                __match_args__=fields,
            )
            return super().__new__(mcls, name, bases, namespace)

    class Record(tuple, metaclass=_RecordType):
        """What ``typing.NamedTuple`` gives (a tuple with named fields, defaults, ``_fields``,
        ``_replace``, ``_asdict``, ``_make``, its repr, pickling) for a tenth of its cost to
        define: a NamedTuple class compiles its ``__new__`` from source, about 0.15 ms that
        every cold start importing it pays."""

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            fields = cls._fields
            missing = len(fields) - len(args)
            # Positional values, the rest left to their defaults: the way the library makes
            # its records, some on every call (a breaker's ticket), so without a loop.
            if not kwargs and 0 <= missing <= len(cls._trailing_defaults):
                if missing:
                    args += cls._trailing_defaults[-missing:]
                return tuple.__new__(cls, args)
            if len(args) > len(fields):
                raise TypeError(
                    f"{cls.__name__}() takes {len(fields)} arguments but {len(args)} were given"
                )
            if kwargs or len(args) < len(fields):
                values = list(args)
                for field in fields[len(args) :]:
                    if field in kwargs:
                        values.append(kwargs.pop(field))
                    elif field in cls._field_defaults:
                        values.append(cls._field_defaults[field])
                    else:
                        raise TypeError(f"{cls.__name__}() missing argument {field!r}")
                if kwargs:
                    raise TypeError(
                        f"{cls.__name__}() got an unexpected or repeated argument "
                        f"{next(iter(kwargs))!r}"
                    )
                args = tuple(values)
            return tuple.__new__(cls, args)

        @classmethod
        def _make(cls, iterable: Any) -> Any:
            values = tuple(iterable)
            if len(values) != len(cls._fields):
                raise TypeError(f"expected {len(cls._fields)} values, got {len(values)}")
            return tuple.__new__(cls, values)

        def _replace(self, **changes: Any) -> Any:
            return type(self)(**{**self._asdict(), **changes})

        def _asdict(self) -> dict[str, Any]:
            return dict(zip(self._fields, self, strict=True))

        def __getnewargs__(self) -> tuple[Any, ...]:
            return tuple(self)

        def __repr__(self) -> str:
            values = ", ".join(
                f"{field}={value!r}" for field, value in zip(self._fields, self, strict=True)
            )
            return f"{type(self).__name__}({values})"
