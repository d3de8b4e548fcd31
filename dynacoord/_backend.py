"""The base every backend derives from: it turns stores into the public primitive objects.

A backend implements the ``_*_store`` factories (one store object per primitive and namespace);
everything users call (``backend.locks``, ``backend.cache(...)``, ...) is defined once here, so the
semantics cannot drift between DynamoDB, Redis and MongoDB.
"""

from __future__ import annotations

import abc
import threading
from typing import TYPE_CHECKING

from . import keys
from ._clock import Clock, SystemClock

if TYPE_CHECKING:
    from .locks import Locks, LockStore

__all__ = ["Backend"]


class Backend(abc.ABC):
    """Common surface of every dynacoord backend."""

    #: short backend name used in reprs, logs and test ids
    kind: str = "abstract"

    def __init__(self, *, namespace: str = "default", clock: Clock | None = None) -> None:
        self.namespace = keys.validate_namespace(namespace)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._facade_lock = threading.Lock()
        self._locks: Locks | None = None

    # -- store factories (one request per store method) ---------------------------------------

    @abc.abstractmethod
    def _lock_store(self, namespace: str) -> LockStore: ...

    # [store-factories:cache-breaker]
    # [store-factories:checkpoints-idempotency]
    # [store-factories:outbox-transaction]
    # [store-factories:counters-runs]

    # -- public primitives ------------------------------------------------------------------------

    @property
    def locks(self) -> Locks:
        """Distributed locks with fencing tokens in this backend's namespace."""
        from .locks import Locks

        with self._facade_lock:
            if self._locks is None:
                self._locks = Locks(self._lock_store(self.namespace), clock=self.clock)
            return self._locks

    # [facade:cache-breaker]

    # [facade:checkpoints-idempotency]

    # [facade:outbox-transaction]

    # [facade:counters-runs]
