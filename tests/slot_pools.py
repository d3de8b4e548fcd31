"""Writers of other processes, inside one test process.

A counting write leases its slot from its process's pool (dynacoord._writers): calls of one
process that never overlap share one slot, so a test that needs many slots on one item (many
processes, each with a call in flight within the window) runs each write as :class:`Process`
does: in a thread of its own, with the pool of that simulated process (a fresh process id).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dynacoord import _writers


class Process:
    """A simulated process: its own slot pool; :meth:`run` calls ``fn`` as that process would."""

    def __init__(self) -> None:
        pool = getattr(_writers, "_Pool", None)
        self._pool = None if pool is None else pool()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        result: list[Any] = []
        errors: list[BaseException] = []

        def target() -> None:
            try:
                result.append(fn(*args))
            except BaseException as exc:  # re-raised in the caller
                errors.append(exc)

        saved = None
        if self._pool is not None:
            saved = _writers._pool[0]
            _writers._pool[0] = self._pool
        try:
            thread = threading.Thread(target=target)
            thread.start()
            thread.join()
        finally:
            if saved is not None:
                _writers._pool[0] = saved
        if errors:
            raise errors[0]
        return result[0]
