"""Writers of other processes, inside one test process.

A counting write leases its slot from its process's pool (dynacoord._writers): calls of one
process that never overlap share one slot, so a test that needs many slots on one item (many
processes, each with a call in flight within the window) runs each write as :class:`Process`
does: in a thread of its own, with the pool of that simulated process (a fresh process id).

Given the table session (``backend.table``), a :class:`Process` also has its own memory of
what its writes saw (the session's ``state.stale_slots``, where the library keeps any), as a
real process has: a one-shot process starts with nothing remembered.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dynacoord import _writers


class Process:
    """A simulated process: its own slot pool; :meth:`run` calls ``fn`` as that process would,
    :meth:`active` makes it the running process for the calls inside (threads included)."""

    def __init__(self, table: Any = None) -> None:
        pool = getattr(_writers, "_Pool", None)
        self._pool = None if pool is None else pool()
        self._state = None if table is None else getattr(table, "state", None)
        self._memory: dict[str, Any] = {}

    @contextmanager
    def active(self) -> Iterator[None]:
        saved_pool = None
        if self._pool is not None:
            saved_pool = _writers._pool[0]
            _writers._pool[0] = self._pool
        state = self._state
        remembers = state is not None and hasattr(state, "stale_slots")
        if remembers:
            saved_memory = state.stale_slots
            state.stale_slots = self._memory
        try:
            yield
        finally:
            if remembers:
                state.stale_slots = saved_memory
            if saved_pool is not None:
                _writers._pool[0] = saved_pool

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        result: list[Any] = []
        errors: list[BaseException] = []

        def target() -> None:
            try:
                result.append(fn(*args))
            except BaseException as exc:  # re-raised in the caller
                errors.append(exc)

        with self.active():
            thread = threading.Thread(target=target)
            thread.start()
            thread.join()
        if errors:
            raise errors[0]
        return result[0]


def stored_slots(backend: Any, kind: str, key: str) -> int:
    """How many counting slots the counter ``key`` of ``backend`` (a contract backend of
    ``kind``) holds in its store: DynamoDB attributes ``w:*``, the Redis hash ``{pk}|rq``, the
    MongoDB subdocument ``w``."""
    from dynacoord.keys import counter_key

    ident = counter_key(backend.namespace, key)
    if kind in ("redis", "redis_cluster"):
        return int(backend.client.hlen(f"{{{ident.pk}}}|rq"))
    if kind in ("mongo", "mongodb"):
        doc = backend.coll.collection.find_one(ident.primary) or {}
        return len(doc.get("w") or {})
    item = backend.client.get_item(
        TableName=backend.table_name,
        Key={"pk": {"S": ident.pk}, "sk": {"S": ident.sk}},
        ConsistentRead=True,
    ).get("Item")
    return sum(1 for name in item or {} if name.startswith("w:"))
