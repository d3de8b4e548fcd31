"""What this process knows about one DynamoDB table through one client, kept in one place.

Every backend object, store and provisioning call on the same client and table finds the same
:class:`TableState` (:func:`table_state`), so what one of them learnt the others do not ask
again: a process that builds a backend per request still checks its table once. The map holds
clients weakly: a client that is dropped takes its tables' states with it. A client that cannot
be weakly referenced gets a state of its own per call (the DynamoDB backend keeps the one it got
for its life).

Here rather than in the backend because :mod:`dynacoord.provision` marks the tables it creates
or verifies (:func:`mark_verified`), and nothing below the CLI imports a backend.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from ._table_schema import TableLayout

__all__ = ["TableState", "forget_verified", "mark_verified", "table_state", "table_states"]

#: the most items a state remembers per kind of memory (cleared when full: each is a cache whose
#: loss costs one request, never a wrong answer)
MAX_REMEMBERED = 4096


class TableState:
    """One (client, table)'s memory in this process.

    * ``verified``: the layouts the table was found right for (by the backend's first-use check,
      or made or verified so by :mod:`dynacoord.provision`): no DescribeTable again.
    * ``check_lock``: one first-use check at a time, so threads making their first writes at once
      (concurrent invocations) wait for one DescribeTable instead of each sending its own.
    * ``partiql``: whether the endpoint runs conditional PartiQL batches, and when it said so by
      the monotonic clock (None: not asked yet); a "no" is asked again later.
    * ``join_gens``: partition key -> (generation, expected, expires_at_ms) of the joins seen,
      so an arrival reads its join's generation once per process.

    (The counting slots a process's writes saw are kept with its slot pool,
    :mod:`dynacoord._writers`, not here: a forked child makes its pool afresh.)
    """

    __slots__ = ("check_lock", "join_gens", "partiql", "verified")

    def __init__(self) -> None:
        self.check_lock = threading.Lock()
        self.verified: set[TableLayout] = set()
        self.partiql: tuple[bool, float] | None = None
        self.join_gens: dict[str, tuple[str, int, int | None]] = {}

    def forget(self) -> None:
        """Forget everything: the table as a fresh process finds it (the test hook)."""
        self.verified = set()
        self.partiql = None
        self.join_gens = {}


_states: weakref.WeakKeyDictionary[Any, dict[str, TableState]] = weakref.WeakKeyDictionary()
_states_guard = threading.Lock()


def table_state(client: Any, table_name: str) -> TableState:
    """The state of ``table_name`` through ``client`` (made on first use)."""
    with _states_guard:
        try:
            tables = _states.get(client)
            if tables is None:
                tables = _states[client] = {}
        except TypeError:  # a client that cannot be weakly referenced: nothing is shared
            return TableState()
        state = tables.get(table_name)
        if state is None:
            state = tables[table_name] = TableState()
        return state


def table_states(client: Any) -> list[TableState]:
    """The states of every table known through ``client`` so far."""
    with _states_guard:
        try:
            return list(_states.get(client, {}).values())
        except TypeError:
            return []


def mark_verified(client: Any, table_name: str, layout: TableLayout) -> None:
    """Remember that ``table_name`` was found (or made) right for ``layout`` through
    ``client``."""
    table_state(client, table_name).verified.add(layout)


def forget_verified(client: Any, table_name: str) -> None:
    """Forget ``table_name`` under every layout (it was deleted through ``client``)."""
    table_state(client, table_name).verified = set()


def _after_fork_in_child() -> None:
    """A forked child's locks are new: a check another thread of the parent was making when it
    forked (a backend's early check, say) holds its copy of the lock, and no thread of the
    child would ever let it go. What the parent had learnt stays."""
    global _states_guard
    _states_guard = threading.Lock()
    for tables in list(_states.values()):
        for state in tables.values():
            state.check_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
