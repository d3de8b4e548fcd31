"""Reading stored items, the same on every backend.

Every backend stores the same field names (DynamoDB attributes, MongoDB document fields, Redis
hash fields), so the rules that turn one into a value live here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["is_live", "optional_int", "optional_str"]


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
