"""The Redis backend: the same key schema and primitives as DynamoDB, on one Redis primary or on a
Redis Cluster (ElastiCache / MemoryDB cluster mode).

Install the extra: ``pip install 'dynacoord[redis]'``. Pass a ``redis.Redis`` client or a
``redis.cluster.RedisCluster`` client (with or without ``decode_responses``; the cluster is
detected, there is no option); dynacoord never opens a connection at import time::

    import redis
    from dynacoord.backends.redis import RedisBackend

    backend = RedisBackend(redis.Redis(host="localhost"), namespace="orders")
    with backend.locks.hold("nightly-report", ttl=30) as lease:
        ...

Items are hashes named by their DESIGN.md key strings inside a hash tag (``{pk}``,
``{pk}|{sk}``, or ``{shard tag}|{pk}`` for listed kinds); listings use sorted sets in the same
tags, so every script touches keys of one slot (docs/redis.md has the table). The layout is the
same on a single primary and on a cluster. Compare-and-set operations are Lua scripts, so a store
method is still one round trip and atomic. Redis replication is asynchronous, so a failover can
lose the last writes: see the README's backend comparison.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

try:
    import redis as _redis  # noqa: F401  (checked here so the error names the extra)
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError("RedisBackend needs redis-py: pip install 'dynacoord[redis]'") from exc

from ..._backend import Backend
from ..._clock import Clock
from ...errors import BackendError, ConfigurationError, NotSupportedError
from ...metrics import Metrics
from ._conn import RedisConn

if TYPE_CHECKING:
    from ...breaker import BreakerStore
    from ...cache import CacheStore
    from ...checkpoints import CheckpointStore
    from ...counters import CounterStore
    from ...idempotency import IdempotencyStore
    from ...locks import LockStore
    from ...outbox import OutboxStore
    from ...ratelimit import RateLimitStore
    from ...runs import RunStore
    from ...semaphore import SemaphoreStore

__all__ = ["RedisBackend"]


class RedisBackend(Backend):
    """dynacoord on Redis (``redis.Redis`` client, Redis >= 6.2).

    ``lock_fence_grace`` (seconds) keeps a released or expired lock's hash that long so fencing
    tokens keep growing from the stored value; ``gc_grace`` (seconds) is how long other expired
    items linger before Redis deletes them (they are treated as absent from their expiry on).
    """

    kind = "redis"

    def __init__(
        self,
        client: Any,
        *,
        namespace: str = "default",
        clock: Clock | None = None,
        lock_fence_grace: int = 3600,
        gc_grace: int = 60,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(namespace=namespace, clock=clock, metrics=metrics)
        if client is None:
            raise ConfigurationError("client is required: pass redis.Redis(...)")
        _check_client(client)
        for name, value in (("lock_fence_grace", lock_fence_grace), ("gc_grace", gc_grace)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"{name} must be an int >= 0 (seconds), got {value!r}")
        self.client = client
        self.lock_fence_grace = lock_fence_grace
        self.gc_grace = gc_grace
        self.conn = RedisConn(client, gc_grace_ms=gc_grace * 1000, metrics=self.metrics)
        if self.conn.cluster:
            _check_cluster_support()

    @classmethod
    def from_env(
        cls, *, client: Any = None, clock: Clock | None = None, **kwargs: Any
    ) -> RedisBackend:
        """Build a backend from the environment (as ``DynamoDBBackend.from_env``).

        Reads ``DYNACOORD_REDIS_URL`` (required unless ``client`` is given: ``redis://``,
        ``rediss://`` for TLS, ``unix://`` for a socket path; user and password in the URL),
        ``DYNACOORD_REDIS_CLUSTER`` (``1``/``true``/``yes``: a ``RedisCluster`` from the same
        URL; ``0``/``false``/``no`` or unset: one primary) and ``DYNACOORD_NAMESPACE`` (default
        ``default``). Other keyword arguments go to the constructor (``metrics=``,
        ``gc_grace=``...).

        A URL redis-py cannot use, or a cluster flag that is neither, raises
        :class:`~dynacoord.errors.ConfigurationError` naming the variable. A ``redis.Redis``
        client connects on first use; a ``RedisCluster`` connects here, at construction (it
        reads the cluster's slot map when built): a server without cluster mode raises
        ``ConfigurationError``, a node that does not answer raises
        :class:`~dynacoord.errors.BackendError` naming it.
        """
        import os

        if client is None:
            url = os.environ.get("DYNACOORD_REDIS_URL")
            if not url:
                raise ConfigurationError(
                    "DYNACOORD_REDIS_URL is not set: set it to the server's URL "
                    "(redis://host:6379/0, rediss:// for TLS) or pass client="
                )
            cluster = _cluster_flag(os.environ.get("DYNACOORD_REDIS_CLUSTER", ""))
            _check_url(url, cluster)
            client = _connect_cluster(url) if cluster else _standalone(url)
        kwargs.setdefault("namespace", os.environ.get("DYNACOORD_NAMESPACE") or "default")
        return cls(client, clock=clock, **kwargs)

    @property
    def cluster(self) -> bool:
        """Whether the client is a ``RedisCluster`` (detected from the client)."""
        return self.conn.cluster

    def __repr__(self) -> str:
        cluster = ", cluster=True" if self.conn.cluster else ""
        return f"RedisBackend(namespace={self.namespace!r}{cluster})"

    # -- store factories ------------------------------------------------------------------------

    def _lock_store(self, namespace: str) -> LockStore:
        from .locks import RedisLockStore

        return RedisLockStore(self.conn, namespace, fence_grace_s=self.lock_fence_grace)

    def _checkpoint_store(self, namespace: str) -> CheckpointStore:
        from .checkpoints import RedisCheckpointStore

        return RedisCheckpointStore(self.conn, namespace)

    def _idempotency_store(self, namespace: str) -> IdempotencyStore:
        from .idempotency import RedisIdempotencyStore

        return RedisIdempotencyStore(self.conn, namespace)

    def _cache_store(self, namespace: str) -> CacheStore:
        from .cache import RedisCacheStore

        return RedisCacheStore(self.conn, namespace, self.clock)

    def _breaker_store(self, namespace: str) -> BreakerStore:
        from .breaker import RedisBreakerStore

        return RedisBreakerStore(self.conn, namespace)

    def _counter_store(self, namespace: str) -> CounterStore:
        from .counters import RedisCounterStore

        return RedisCounterStore(self.conn, namespace)

    def _run_store(self, namespace: str) -> RunStore:
        from .runs import RedisRunStore

        return RedisRunStore(self.conn, namespace)

    def _semaphore_store(self, namespace: str) -> SemaphoreStore:
        from .semaphore import RedisSemaphoreStore

        return RedisSemaphoreStore(self.conn, namespace, fence_grace_s=self.lock_fence_grace)

    def _rate_limit_store(self, namespace: str) -> RateLimitStore:
        from .ratelimit import RedisRateLimitStore

        return RedisRateLimitStore(self.conn, namespace)

    def _outbox_store(self, namespace: str) -> OutboxStore:
        from .outbox import RedisOutboxStore

        return RedisOutboxStore(self.conn, namespace)

    def transaction(self, *, client_request_token: str | None = None) -> NoReturn:
        """Not available: ``backend.transaction()`` is DynamoDB-only (raises NotSupportedError)."""
        # Never a silent non-atomic fallback: refuse clearly instead.
        raise NotSupportedError(
            "backend.transaction() is DynamoDB-only: "
            "a Redis MULTI/EXEC cannot carry DynamoDB's conditional writes to other tables, and Lua scripts are not a general transaction API; publish events with backend.outbox.publish() (one atomic script for the whole batch)"
        )


#: URL schemes ``DYNACOORD_REDIS_URL`` may use (a cluster is reached over TCP only).
URL_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_URL_SCHEMES = ("redis", "rediss")

_TRUE = ("1", "true", "yes")
_FALSE = ("", "0", "false", "no")


def _cluster_flag(value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ConfigurationError(
        f"DYNACOORD_REDIS_CLUSTER={value!r} is neither on nor off: set it to 1 (a Redis Cluster) "
        "or 0 / leave it unset (one primary)"
    )


def _redacted(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def _check_url(url: str, cluster: bool) -> None:
    """Refuse a scheme redis-py would refuse (or a cluster cannot use), naming the variable."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    accepted = CLUSTER_URL_SCHEMES if cluster else URL_SCHEMES
    if scheme in accepted:
        return
    names = ", ".join(f"{name}://" for name in accepted)
    found = f"scheme {scheme!r}" if scheme else "no scheme"
    where = " with DYNACOORD_REDIS_CLUSTER=1" if cluster else ""
    raise ConfigurationError(
        f"DYNACOORD_REDIS_URL={_redacted(url)} has {found}: accepted schemes{where} are "
        f"{names} (rediss:// for TLS), e.g. redis://host:6379/0"
    )


def _bad_url(url: str, exc: ValueError) -> ConfigurationError:
    return ConfigurationError(
        f"DYNACOORD_REDIS_URL={_redacted(url)} is not a URL redis-py can use: {exc}"
    )


def _standalone(url: str) -> Any:
    """``redis.Redis.from_url(url)`` (it connects on first use)."""
    import redis

    try:
        return redis.Redis.from_url(url)
    except ValueError as exc:  # what redis-py's URL parser raises
        raise _bad_url(url, exc) from exc


def _connect_cluster(url: str) -> Any:
    """``RedisCluster.from_url(url)``, which connects now: its failures as dynacoord errors."""
    from urllib.parse import urlsplit

    import redis
    from redis.cluster import RedisCluster
    from redis.exceptions import RedisClusterException

    try:
        parts = urlsplit(url)
        node = f"{parts.hostname or 'localhost'}:{parts.port or 6379}"
        return RedisCluster.from_url(url)
    except ValueError as exc:
        raise _bad_url(url, exc) from exc
    except (RedisClusterException, redis.RedisError) as exc:
        text = str(exc)
        if "cluster mode is not enabled" in text.lower() or "cluster support disabled" in (
            text.lower()
        ):
            raise ConfigurationError(
                f"DYNACOORD_REDIS_CLUSTER=1 but the server at {node} (DYNACOORD_REDIS_URL) runs "
                "without cluster mode: unset DYNACOORD_REDIS_CLUSTER for one primary, or point "
                "DYNACOORD_REDIS_URL at a node of a cluster"
            ) from exc
        reason = text.rpartition("reachable node: ")[2] or type(exc).__name__
        raise BackendError(
            f"DYNACOORD_REDIS_CLUSTER=1: no Redis Cluster node answered at {node} "
            f"(DYNACOORD_REDIS_URL); a cluster client connects when it is built, to read the "
            f"slot map: {reason}",
            code=type(exc).__name__,
        ) from exc


#: redis-py runs MULTI/EXEC on a cluster (keys of one slot) from this version on.
CLUSTER_MIN_REDIS_PY = (6, 1)


def _check_cluster_support() -> None:
    from importlib.metadata import version

    text = version("redis")
    parts = tuple(int(p) for p in text.split(".")[:2] if p.isdigit())
    if parts < CLUSTER_MIN_REDIS_PY:
        need = ".".join(str(p) for p in CLUSTER_MIN_REDIS_PY)
        raise ConfigurationError(
            f"RedisBackend on a RedisCluster needs redis-py >= {need} (transactions on one slot), "
            f"found {text}: pip install 'redis>={need}'"
        )


def _check_client(client: Any) -> None:
    """Refuse what is not a synchronous redis-py client (``redis.Redis``, ``RedisCluster``),
    before a first call would fail on a missing method. Duck-typed on the methods the stores
    use, so an instrumented or wrapped client passes."""
    import inspect

    if type(client).__module__.startswith("redis.asyncio") or inspect.iscoroutinefunction(
        getattr(client, "execute_command", None)
    ):
        raise ConfigurationError(
            "RedisBackend needs a synchronous client, redis.Redis(...) or "
            f"redis.cluster.RedisCluster(...); got an asyncio client ({type(client).__name__})"
        )
    missing = [
        name
        for name in ("register_script", "pipeline", "execute_command")
        if not callable(getattr(client, name, None))
    ]
    if missing:
        hint = " (a URL: use RedisBackend.from_env() or redis.Redis.from_url(url))"
        raise ConfigurationError(
            "RedisBackend needs a redis-py client, redis.Redis(...) or "
            f"redis.cluster.RedisCluster(...); got a {type(client).__name__} without "
            f"{', '.join(missing)}{hint if isinstance(client, str) else ''}"
        )
