"""Reading stored items, the same on every backend.

Every backend stores the same field names (DynamoDB attributes, MongoDB document fields, Redis
hash fields), so the rules that turn one into a value live here once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, TypeVar

__all__ = ["is_live", "member_reader", "optional_int", "optional_str"]

E = TypeVar("E", bound=Enum)


def member_reader(cls: type[E]) -> Callable[[Any], E]:
    """A reader of a stored status as a member of ``cls``: a dict lookup by value first (an
    enum call costs a few Python frames on every item read), ``cls(str(value))`` otherwise (so
    an unknown value raises the enum's ValueError)."""
    by_value = {member.value: member for member in cls}

    def member(value: Any) -> E:
        found = by_value.get(value) if type(value) is str else None
        return found if found is not None else cls(str(value))

    return member


def is_live(item: Mapping[str, Any] | None, now_ms: int) -> bool:
    """True if ``item`` exists and has not expired: no ``expires_at_ms``, or ``now_ms`` before it.

    An item with ``now_ms >= expires_at_ms`` is absent even if the store has not removed it yet.
    """
    if not item:
        return False
    expires = item.get("expires_at_ms")
    return expires is None or int(expires) > now_ms


def optional_int(item: Mapping[str, Any], name: str) -> int | None:
    """``item[name]`` as an int, or None when the field is missing (or None)."""
    value = item.get(name)
    return None if value is None else int(value)


def optional_str(item: Mapping[str, Any], name: str) -> str | None:
    """``item[name]`` as a str, or None when the field is missing (or None)."""
    value = item.get(name)
    return None if value is None else str(value)
