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
    from collections.abc import Callable
    from typing import Any, TypeVar

    from typing_extensions import ParamSpec

    from .checkpoints import Checkpoints, CheckpointStore
    from .idempotency import Idempotency, IdempotencyStore
    from .locks import Locks, LockStore

    _P = ParamSpec("_P")
    _R = TypeVar("_R")

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
    if TYPE_CHECKING:
        from .breaker import BreakerStore, CircuitBreaker, TransitionCallback
        from .cache import Cache, CacheStore

    def _cache_store(self, namespace: str) -> CacheStore:
        """The cache store; backends without one raise NotSupportedError."""
        from .errors import NotSupportedError

        raise NotSupportedError(f"the {self.kind} backend has no cache")

    def _breaker_store(self, namespace: str) -> BreakerStore:
        """The circuit-breaker store; backends without one raise NotSupportedError."""
        from .errors import NotSupportedError

        raise NotSupportedError(f"the {self.kind} backend has no circuit breaker")

    # [store-factories:checkpoints-idempotency]
    def _checkpoint_store(self, namespace: str) -> CheckpointStore:
        from .errors import NotSupportedError

        raise NotSupportedError(f"{type(self).__name__} does not support checkpoints")

    def _idempotency_store(self, namespace: str) -> IdempotencyStore:
        from .errors import NotSupportedError

        raise NotSupportedError(f"{type(self).__name__} does not support idempotency")

    # [store-factories:outbox-transaction]
    if TYPE_CHECKING:
        from .outbox import Outbox, OutboxStore
        from .transaction import Transaction

    def _outbox_store(self, namespace: str) -> OutboxStore:
        """The outbox store; backends without one raise NotSupportedError."""
        from .errors import NotSupportedError

        raise NotSupportedError(f"the {self.kind} backend has no outbox")

    def _begin_transaction(self, client_request_token: str | None) -> Transaction:
        """A transaction collector; backends without multi-item transactions raise."""
        from .errors import NotSupportedError

        raise NotSupportedError(f"the {self.kind} backend has no transactions")

    # [store-factories:counters-runs]
    if TYPE_CHECKING:
        from .counters import Counters, CounterStore
        from .runs import Runs, RunStore

    def _counter_store(self, namespace: str) -> CounterStore:
        """The counter / flag / join store; backends without one raise NotSupportedError."""
        from .errors import NotSupportedError

        raise NotSupportedError(f"the {self.kind} backend has no counters")

    def _run_store(self, namespace: str) -> RunStore:
        """The workflow-run store; backends without one raise NotSupportedError."""
        from .errors import NotSupportedError

        raise NotSupportedError(f"the {self.kind} backend has no workflow runs")

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
    def cache(self, default_ttl: float | None = None, namespace: str | None = None) -> Cache:
        """A TTL cache in ``namespace`` (default: the backend's) with stampede protection.

        ``default_ttl`` (seconds) applies to writes without a ``ttl``; None: no expiry.
        """
        from .cache import Cache
        from .locks import Locks

        ns = self.namespace if namespace is None else keys.validate_namespace(namespace)
        store = self._cache_store(ns)
        return Cache(
            store,
            locks=Locks(self._lock_store(ns), clock=self.clock),
            default_ttl=default_ttl,
            clock=self.clock,
            namespace=ns,
        )

    def breaker(
        self,
        name: str,
        *,
        failure_threshold: int = 5,
        reset_timeout: float = 30.0,
        success_threshold: int = 1,
        half_open_max_calls: int = 1,
        ignore: type[BaseException] | tuple[type[BaseException], ...] = (),
        on_transition: TransitionCallback | None = None,
    ) -> CircuitBreaker:
        """A circuit breaker named ``name`` whose state every process shares (see breaker.py)."""
        from .breaker import CircuitBreaker

        return CircuitBreaker(
            self._breaker_store(self.namespace),
            name,
            failure_threshold=failure_threshold,
            reset_timeout=reset_timeout,
            success_threshold=success_threshold,
            half_open_max_calls=half_open_max_calls,
            ignore=ignore,
            on_transition=on_transition,
            clock=self.clock,
            namespace=self.namespace,
        )

    # [facade:checkpoints-idempotency]
    @property
    def checkpoints(self) -> Checkpoints:
        """Task checkpoints (save / load / load_latest / list / cleanup / task) in this namespace."""
        from .checkpoints import Checkpoints

        with self._facade_lock:
            existing = self.__dict__.get("_checkpoints")
            if not isinstance(existing, Checkpoints):
                existing = Checkpoints(self._checkpoint_store(self.namespace), clock=self.clock)
                self.__dict__["_checkpoints"] = existing
            return existing

    @property
    def idempotency(self) -> Idempotency:
        """Idempotency records (try_claim / complete / release / get / delete) in this namespace."""
        from .idempotency import Idempotency

        with self._facade_lock:
            existing = self.__dict__.get("_idempotency")
            if not isinstance(existing, Idempotency):
                existing = Idempotency(self._idempotency_store(self.namespace), clock=self.clock)
                self.__dict__["_idempotency"] = existing
            return existing

    def idempotent(
        self,
        *,
        key: str | Callable[..., Any],
        ttl: float = 3600,
        in_progress_ttl: float | None = None,
        payload: str | Callable[..., Any] | None = None,
        wait: bool = False,
        wait_timeout: float = 30.0,
        raise_on_no_key: bool = True,
    ) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
        """Decorator: run a function or Lambda handler once per key (see
        :meth:`dynacoord.idempotency.Idempotency.idempotent`)."""
        return self.idempotency.idempotent(
            key=key,
            ttl=ttl,
            in_progress_ttl=in_progress_ttl,
            payload=payload,
            wait=wait,
            wait_timeout=wait_timeout,
            raise_on_no_key=raise_on_no_key,
        )

    # [facade:outbox-transaction]
    @property
    def outbox(self) -> Outbox:
        """The transactional outbox of this backend's namespace (publish, workers, management)."""
        from .outbox import Outbox

        with self._facade_lock:
            existing: Outbox | None = self.__dict__.get("_outbox")
            if existing is None:
                existing = Outbox(self._outbox_store(self.namespace), clock=self.clock)
                self.__dict__["_outbox"] = existing
            return existing

    def transaction(self, *, client_request_token: str | None = None) -> Transaction:
        """``with backend.transaction() as tx:`` collects writes (``tx.put/update/delete/
        condition_check`` on any table) and outbox events (``tx.publish``) and commits them in
        one atomic write when the block ends; nothing is written if the block raises. See
        :class:`dynacoord.transaction.Transaction`."""
        return self._begin_transaction(client_request_token)

    # [facade:counters-runs]
    @property
    def counters(self) -> Counters:
        """Atomic counters, set-if-absent flags and idempotent fan-in joins."""
        from .counters import Counters

        with self._facade_lock:
            existing: Counters | None = self.__dict__.get("_counters")
            if existing is None:
                existing = Counters(self._counter_store(self.namespace), clock=self.clock)
                self.__dict__["_counters"] = existing
            return existing

    @property
    def runs(self) -> Runs:
        """Workflow-run state and the stalled-run reconciler (uses ``locks`` for reconcile)."""
        from .runs import Runs

        locks = self.locks  # outside the facade lock: the property takes it itself
        with self._facade_lock:
            existing: Runs | None = self.__dict__.get("_runs")
            if existing is None:
                existing = Runs(self._run_store(self.namespace), locks=locks, clock=self.clock)
                self.__dict__["_runs"] = existing
            return existing
