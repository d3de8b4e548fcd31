"""Standard-library pieces by one name on every supported Python: :class:`StrEnum` (a stand-in
where Python 3.10 lacks it) and :class:`Record`, which is ``typing.NamedTuple`` itself (the name
the library's records were first written against). Private: import from here, never re-export."""

from __future__ import annotations

import enum
import sys
from typing import NamedTuple as Record

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
