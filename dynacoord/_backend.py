"""The base every backend derives from: it turns stores into the public primitive objects.

A backend implements the ``_*_store`` factories (one store object per primitive and namespace);
everything users call (``backend.locks``, ``backend.cache(...)``, ...) is defined once here, so the
semantics cannot drift between DynamoDB, Redis and MongoDB.
"""

from __future__ import annotations

import abc
import difflib
import logging
import os
import threading
from typing import TYPE_CHECKING

from . import keys
from ._clock import Clock, SystemClock
from .errors import NotSupportedError
from .metrics import Metrics, MetricsScope, check_metrics

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    from typing_extensions import ParamSpec, Unpack

    from .breaker import (
        BreakerOptions,
        BreakerOptionValues,
        BreakerStore,
        CircuitBreaker,
        TransitionCallback,
    )
    from .cache import Cache, CacheStore
    from .checkpoints import Checkpoints, CheckpointStore
    from .counters import Counters, CounterStore
    from .idempotency import (
        Idempotency,
        IdempotencyOptions,
        IdempotencyOptionValues,
        IdempotencyStore,
    )
    from .leader import Leader
    from .locks import Locks, LockStore
    from .outbox import Outbox, OutboxStore
    from .ratelimit import RateLimiter, RateLimitStore
    from .runs import Runs, RunStore
    from .semaphore import Semaphore, SemaphoreStore

    _P = ParamSpec("_P")
    _R = TypeVar("_R")
    _T = TypeVar("_T")

__all__ = ["KNOWN_VARIABLES", "Backend", "unknown_variables", "warn_unknown_variables"]

#: every ``DYNACOORD_*`` environment variable dynacoord reads (the library, the CLI, the
#: bundled stack's functions, the examples); ``DYNACOORD_MODEL_*`` are the test suite's own
KNOWN_VARIABLES = frozenset(
    {
        "DYNACOORD_TABLE",
        "DYNACOORD_NAMESPACE",
        "DYNACOORD_TABLE_LAYOUT",
        "DYNACOORD_ENDPOINT_URL",
        "DYNACOORD_GLOBAL_TABLE_WRITES",
        "DYNACOORD_OUTBOX_LAG_METRICS",
        "DYNACOORD_OUTBOX_HANDLERS",
        "DYNACOORD_OUTBOX_OPTIONS",
        "DYNACOORD_HANDLER_SETTINGS",
        "DYNACOORD_RECONCILE_HANDLER",
        "DYNACOORD_RECONCILE_AFTER",
        "DYNACOORD_REDIS_URL",
        "DYNACOORD_REDIS_CLUSTER",
        "DYNACOORD_MONGODB_URI",
        "DYNACOORD_MONGODB_DATABASE",
        "DYNACOORD_MONGODB_COLLECTION",
        "DYNACOORD_TRACING",
        "DYNACOORD_DEMO_BACKEND",
    }
)
_env_logger = logging.getLogger("dynacoord.env")
_reported: set[str] = set()


def unknown_variables() -> list[str]:
    """The ``DYNACOORD_*`` variables of the environment that dynacoord does not read, sorted."""
    return sorted(
        name
        for name in os.environ
        if name.startswith("DYNACOORD_")
        and name not in KNOWN_VARIABLES
        and not name.startswith("DYNACOORD_MODEL_")
    )


def warn_unknown_variables() -> None:
    """Log a warning for each unknown ``DYNACOORD_*`` variable, once per process, with the
    closest known name: a misspelt ``DYNACOORD_NAMESAPCE`` is otherwise ignored silently and
    the code runs in namespace ``default``."""
    for name in unknown_variables():
        if name in _reported:
            continue
        _reported.add(name)
        close = difflib.get_close_matches(name, sorted(KNOWN_VARIABLES), n=1)
        _env_logger.warning(
            "environment variable %s is not one dynacoord reads%s: it is ignored",
            name,
            f" (did you mean {close[0]}?)" if close else "",
        )


class Backend(abc.ABC):
    """Common surface of every dynacoord backend."""

    #: short backend name used in reprs, logs and test ids
    kind: str = "abstract"

    def __init__(
        self,
        *,
        namespace: str = "default",
        clock: Clock | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.namespace = keys.validate_namespace(namespace)
        self.clock: Clock = clock if clock is not None else SystemClock()
        #: the metrics listener every primitive of this backend reports to (dynacoord.metrics)
        self.metrics: Metrics = check_metrics(metrics)
        self._facade_lock = threading.Lock()
        self._facades: dict[str, Any] = {}

    def _scope(self, primitive: str, namespace: str | None = None) -> MetricsScope:
        """The metrics reporter of one primitive in one namespace (the no-op one by default)."""
        return self.metrics.scope(
            Primitive=primitive, DynacoordNamespace=namespace or self.namespace
        )

    def _memo(self, name: str, build: Callable[[], _T]) -> _T:
        """Build a primitive object once per backend (thread-safe). The properties look in
        ``_facades`` first themselves: the lock, the import and the builder are paid once."""
        with self._facade_lock:
            if name not in self._facades:
                self._facades[name] = build()
            return self._facades[name]  # type: ignore[no-any-return]

    # -- store factories (one request per store method) ---------------------------------------
    # Only locks are mandatory; a backend that cannot offer a primitive with the promised
    # guarantees leaves its factory raising NotSupportedError.

    def _unsupported(self, what: str) -> NotSupportedError:
        return NotSupportedError(f"the {self.kind} backend does not support {what}")

    @abc.abstractmethod
    def _lock_store(self, namespace: str) -> LockStore: ...

    def _cache_store(self, namespace: str) -> CacheStore:
        """The cache store; backends without one raise NotSupportedError."""
        raise self._unsupported("cache")

    def _breaker_store(self, namespace: str) -> BreakerStore:
        """The circuit-breaker store; backends without one raise NotSupportedError."""
        raise self._unsupported("circuit breaker")

    def _checkpoint_store(self, namespace: str) -> CheckpointStore:
        raise self._unsupported("checkpoints")

    def _idempotency_store(self, namespace: str) -> IdempotencyStore:
        raise self._unsupported("idempotency")

    def _outbox_store(self, namespace: str) -> OutboxStore:
        """The outbox store; backends without one raise NotSupportedError."""
        raise self._unsupported("outbox")

    def _counter_store(self, namespace: str) -> CounterStore:
        """The counter / flag / join store; backends without one raise NotSupportedError."""
        raise self._unsupported("counters")

    def _run_store(self, namespace: str) -> RunStore:
        """The workflow-run store; backends without one raise NotSupportedError."""
        raise self._unsupported("workflow runs")

    def _semaphore_store(self, namespace: str) -> SemaphoreStore:
        """The semaphore store; backends without one raise NotSupportedError."""
        raise self._unsupported("semaphores")

    def _rate_limit_store(self, namespace: str) -> RateLimitStore:
        """The rate limiter store; backends without one raise NotSupportedError."""
        raise self._unsupported("rate limiters")

    # -- public primitives ------------------------------------------------------------------------

    @property
    def locks(self) -> Locks:
        """Distributed locks with fencing tokens in this backend's namespace."""
        facade = self._facades.get("_locks")
        if facade is not None:
            return facade  # type: ignore[no-any-return]
        from .locks import Locks

        return self._memo(
            "_locks",
            lambda: Locks(
                self._lock_store(self.namespace), clock=self.clock, metrics=self._scope("lock")
            ),
        )

    def cache(
        self,
        default_ttl: float | None = None,
        namespace: str | None = None,
        *,
        consistent_reads: bool = False,
        local_ttl: float | None = None,
        local_max: int = 1024,
    ) -> Cache:
        """A TTL cache in ``namespace`` (default: the backend's) with stampede protection.

        ``default_ttl`` (seconds) applies to writes without a ``ttl``; None: no expiry.
        ``consistent_reads``, ``local_ttl`` and ``local_max``: see :class:`~dynacoord.Cache`.
        """
        from .cache import Cache
        from .locks import Locks

        ns = self.namespace if namespace is None else keys.validate_namespace(namespace)
        store = self._cache_store(ns)
        return Cache(
            store,
            locks=Locks(self._lock_store(ns), clock=self.clock, metrics=self._scope("lock", ns)),
            default_ttl=default_ttl,
            clock=self.clock,
            namespace=ns,
            metrics=self._scope("cache", ns),
            consistent_reads=consistent_reads,
            local_ttl=local_ttl,
            local_max=local_max,
        )

    def breaker(
        self,
        name: str,
        options: BreakerOptions | None = None,
        *,
        on_transition: TransitionCallback | None = None,
        **option_values: Unpack[BreakerOptionValues],
    ) -> CircuitBreaker:
        """A circuit breaker named ``name`` whose state every process shares (see breaker.py):
        it trips after ``failure_threshold`` consecutive failures (default 5), or on the
        failure rate with ``policy=FailureRate(...)``. Its options are ``options`` (a
        :class:`~dynacoord.BreakerOptions`) with ``option_values`` in place of its own, by name;
        an unknown name is refused."""
        from .breaker import BreakerOptions, CircuitBreaker

        return CircuitBreaker(
            self._breaker_store(self.namespace),
            name,
            BreakerOptions.of(options, **option_values),
            on_transition=on_transition,
            clock=self.clock,
            namespace=self.namespace,
            metrics=self._scope("breaker"),
        )

    @property
    def checkpoints(self) -> Checkpoints:
        """Task checkpoints (save / load / load_latest / list / cleanup / task) in this namespace."""
        facade = self._facades.get("_checkpoints")
        if facade is not None:
            return facade  # type: ignore[no-any-return]
        from .checkpoints import Checkpoints

        return self._memo(
            "_checkpoints",
            lambda: Checkpoints(self._checkpoint_store(self.namespace), clock=self.clock),
        )

    @property
    def idempotency(self) -> Idempotency:
        """Idempotency records (try_claim / complete / release / get / delete) in this namespace."""
        facade = self._facades.get("_idempotency")
        if facade is not None:
            return facade  # type: ignore[no-any-return]
        from .idempotency import Idempotency

        return self._memo(
            "_idempotency",
            lambda: Idempotency(
                self._idempotency_store(self.namespace),
                clock=self.clock,
                metrics=self._scope("idempotency"),
            ),
        )

    def idempotent(
        self,
        options: IdempotencyOptions | None = None,
        *,
        key: str | Callable[..., Any],
        **option_values: Unpack[IdempotencyOptionValues],
    ) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
        """Decorator: run a function or Lambda handler once per ``key``, with ``options`` (an
        :class:`~dynacoord.IdempotencyOptions`) and ``option_values`` by name. The same as
        ``backend.idempotency.idempotent(...)``, where the options are described:
        :meth:`dynacoord.idempotency.Idempotency.idempotent`."""
        return self.idempotency.idempotent(options, key=key, **option_values)

    @property
    def outbox(self) -> Outbox:
        """The transactional outbox of this backend's namespace (publish, workers, management)."""
        facade = self._facades.get("_outbox")
        if facade is not None:
            return facade  # type: ignore[no-any-return]
        from .outbox import Outbox

        return self._memo(
            "_outbox",
            lambda: Outbox(
                self._outbox_store(self.namespace), clock=self.clock, metrics=self._scope("outbox")
            ),
        )

    @property
    def counters(self) -> Counters:
        """Atomic counters, set-if-absent flags and idempotent fan-in joins."""
        facade = self._facades.get("_counters")
        if facade is not None:
            return facade  # type: ignore[no-any-return]
        from .counters import Counters

        return self._memo(
            "_counters", lambda: Counters(self._counter_store(self.namespace), clock=self.clock)
        )

    def semaphore(self, name: str, *, limit: int, ttl: float) -> Semaphore:
        """A leased counting semaphore named ``name`` in this namespace: at most ``limit``
        permits held at once, each for ``ttl`` seconds unless renewed (see semaphore.py and
        docs/semaphore.md). Every process must give one semaphore the same ``limit``."""
        from .semaphore import Semaphore

        keys.semaphore_pk(self.namespace, name)  # a bad name is refused here, not at first use
        return Semaphore(
            self._semaphore_store(self.namespace),
            name,
            limit=limit,
            ttl=ttl,
            clock=self.clock,
            metrics=self._scope("semaphore"),
        )

    def rate_limiter(
        self,
        name: str,
        *,
        rate: float,
        per: float = 1.0,
        burst: int | None = None,
        shards: int = 1,
    ) -> RateLimiter:
        """A shared rate limiter named ``name`` in this namespace: ``rate`` calls per ``per``
        seconds, ``burst`` at once, over ``shards`` items (see ratelimit.py and
        docs/ratelimit.md). Every process must give one limiter the same settings."""
        from .ratelimit import RateLimiter

        keys.rate_key(self.namespace, name)  # a bad name is refused here, not at first use
        return RateLimiter(
            self._rate_limit_store(self.namespace),
            name,
            rate=rate,
            per=per,
            burst=burst,
            shards=shards,
            clock=self.clock,
            metrics=self._scope("ratelimit"),
        )

    def leader(
        self,
        name: str,
        *,
        ttl: float,
        owner: str | None = None,
        margin: float | None = None,
        renew_interval: float | None = None,
        on_elected: Callable[[int], None] | None = None,
        on_lost: Callable[[int], None] | None = None,
    ) -> Leader:
        """A candidate for the leadership of ``name`` in this namespace: ``campaign()``,
        ``is_leader``, ``term``, ``step_down()`` (see leader.py and docs/leader.md). Built on the
        lock store (the lock key ``leader:{name}``), so every backend with locks has it."""
        from .leader import Leader, leader_key

        keys.lock_pk(self.namespace, leader_key(name))  # a bad name is refused here
        return Leader(
            self._lock_store(self.namespace),
            name,
            ttl=ttl,
            owner=owner,
            margin=margin,
            renew_interval=renew_interval,
            on_elected=on_elected,
            on_lost=on_lost,
            clock=self.clock,
            metrics=self._scope("leader"),
        )

    @property
    def runs(self) -> Runs:
        """Workflow-run state and the stalled-run reconciler (uses ``locks`` for reconcile)."""
        facade = self._facades.get("_runs")
        if facade is not None:
            return facade  # type: ignore[no-any-return]
        from .runs import Runs

        locks = self.locks  # before _memo: building it takes the same (non-reentrant) lock
        return self._memo(
            "_runs",
            lambda: Runs(
                self._run_store(self.namespace),
                locks=locks,
                clock=self.clock,
                metrics=self._scope("runs"),
            ),
        )
