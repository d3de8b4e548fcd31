"""The DynamoDB backend: every primitive's store on one table with one GSI (``gsi1``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..._backend import Backend
from ..._clock import Clock
from ..._table_schema import DEFAULT_LAYOUT, TableLayout
from ...errors import ConfigurationError
from ...metrics import Metrics
from ._replication import GlobalTableWrites, check_global_table_writes
from ._verify import VerifiedTable, Verify, check_client, check_verify

if TYPE_CHECKING:
    from ...locks import LockStore
    from ...ratelimit import RateLimitStore
    from ...semaphore import SemaphoreStore
    from .transaction import Transaction

__all__ = ["DEFAULT_TABLE_NAME", "DynamoDBBackend", "TableLayout"]

DEFAULT_TABLE_NAME = "dynacoord"

#: the Transaction class once a transaction was made (its module is imported on first use)
_transaction_class: type[Transaction] | None = None


def _load_transaction_class() -> type[Transaction]:
    global _transaction_class
    from .transaction import Transaction

    _transaction_class = Transaction
    return Transaction


class DynamoDBBackend(Backend):
    """dynacoord on one DynamoDB table.

    ``client`` is a low-level ``boto3.client("dynamodb")``; dynacoord never creates one on import.
    Configure retries for throttling on the client (botocore's ``Config(retries=...)``): dynacoord
    does not swallow them. ``shards`` spreads listing indexes (cache keys, outbox due queue) over
    that many gsi1 partitions so one busy namespace does not make a hot partition.

    Before its first write the backend checks the table once (one DescribeTable per client
    and table): a missing table, another key schema or a missing ``gsi1`` raise
    :class:`~dynacoord.errors.ConfigurationError` naming the table, the problem and the command
    that fixes it, before anything is written. The check is sent with the first write, or, in a
    Lambda environment initialised ahead of its requests (provisioned concurrency), during init,
    so no request waits for it. ``verify="early"`` always sends it when the backend is made, on a
    thread of its own (the first write waits for its answer); ``verify="first-write"`` always
    with the first write; ``verify=False`` skips it (for an IAM policy without
    ``dynamodb:DescribeTable``).

    ``layout`` puts dynacoord in a single table of yours (:class:`TableLayout`: your key and
    index names, a key prefix that keeps its items apart from yours); the default is
    dynacoord's own schema, at no cost.

    On a DynamoDB global table in eventual consistency (MREC) a condition holds in one Region
    only, so the check makes every write that needs exclusivity (locks, claims, counts, state
    transitions) raise :class:`~dynacoord.errors.GlobalTableError` before it is sent.
    ``global_table_writes="single-region"`` is your promise that every writer of dynacoord's
    items runs in one Region, and lets them through. On a strongly consistent global table
    (MRSC) every primitive works except what needs a transaction. See docs/global-tables.md.
    """

    kind = "dynamodb"

    def __init__(
        self,
        client: Any,
        *,
        table_name: str = DEFAULT_TABLE_NAME,
        namespace: str = "default",
        clock: Clock | None = None,
        shards: int = 4,
        lock_fence_grace: int = 3600,
        metrics: Metrics | None = None,
        verify: Verify = True,
        layout: TableLayout | None = None,
        global_table_writes: GlobalTableWrites = "refuse",
    ) -> None:
        super().__init__(namespace=namespace, clock=clock, metrics=metrics)
        if client is None:
            raise ConfigurationError("client is required: pass boto3.client('dynamodb')")
        check_client(client)
        if not isinstance(table_name, str) or not 3 <= len(table_name) <= 255:
            raise ConfigurationError(
                f"table_name must be a str of 3 to 255 characters, got {table_name!r}"
            )
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 64:
            raise ConfigurationError(f"shards must be an int in 1..64, got {shards!r}")
        if (
            isinstance(lock_fence_grace, bool)
            or not isinstance(lock_fence_grace, int)
            or lock_fence_grace < 0
        ):
            # The grace keeps a released lock's item (and its fence) past its expiry; a negative
            # one would let the sweeper remove it early and weaken the fence guarantee.
            raise ConfigurationError(
                f"lock_fence_grace must be an int >= 0 (seconds), got {lock_fence_grace!r}"
            )
        if layout is None:
            layout = DEFAULT_LAYOUT
        elif not isinstance(layout, TableLayout):
            raise ConfigurationError(
                f"layout must be a dynacoord.TableLayout, got {type(layout).__name__}"
            )
        self.client = client
        self.table_name = table_name
        self.shards = shards
        self.lock_fence_grace = lock_fence_grace
        self.layout = layout
        #: "refuse", or "single-region": every writer of dynacoord's items runs in one Region
        self.global_table_writes = check_global_table_writes(global_table_writes)
        #: the table session every store sends through: first-use check, a global table's
        #: gate, layout translation, the request, error translation (missing credentials
        #: included), metrics (its ``call``)
        self.table = VerifiedTable(
            client,
            table_name,
            metrics=self.metrics,
            verify=check_verify(verify),
            layout=layout,
            global_table_writes=self.global_table_writes,
        )

    @classmethod
    def from_env(
        cls,
        *,
        client: Any = None,
        session: Any = None,
        clock: Clock | None = None,
        **kwargs: Any,
    ) -> DynamoDBBackend:
        """Build a backend from the environment.

        Reads ``DYNACOORD_TABLE`` (default ``dynacoord``), ``DYNACOORD_NAMESPACE`` (default
        ``default``), ``DYNACOORD_TABLE_LAYOUT`` (a :class:`TableLayout` as a JSON object, e.g.
        ``{"pk": "PK", "sk": "SK", "index": "GSI1", "index_pk": "GSI1PK", "index_sk":
        "GSI1SK", "prefix": "DC#"}``; unset: dynacoord's own schema) and
        ``DYNACOORD_ENDPOINT_URL`` (for DynamoDB Local), ``DYNACOORD_GLOBAL_TABLE_WRITES``
        (``single-region``: every writer of dynacoord's items runs in one Region; unset:
        ``refuse``, see the class), plus the usual AWS variables (region,
        credentials) through boto3. ``DYNACOORD_OUTBOX_LAG_METRICS`` (a CloudWatch namespace,
        set by the bundled stack on its sweeper) makes the outbox's sweep handler report the
        outbox lag as EMF metrics after each sweep (``_stack.py``). A given ``client`` wins over
        ``session``, which wins over boto3's default session. An endpoint without its scheme or no
        region is a :class:`ConfigurationError` naming the variable to set; nothing is sent.
        """
        from ..._backend import warn_unknown_variables

        warn_unknown_variables()
        if client is None:
            client = _client_from_env(session)
        kwargs.setdefault("table_name", os.environ.get("DYNACOORD_TABLE") or DEFAULT_TABLE_NAME)
        kwargs.setdefault("namespace", os.environ.get("DYNACOORD_NAMESPACE") or "default")
        if "layout" not in kwargs:
            text = os.environ.get("DYNACOORD_TABLE_LAYOUT")
            if text:
                try:
                    kwargs["layout"] = TableLayout.from_json(text)
                except ConfigurationError as exc:
                    raise ConfigurationError(f"DYNACOORD_TABLE_LAYOUT: {exc}") from exc
        writes = os.environ.get("DYNACOORD_GLOBAL_TABLE_WRITES")
        if writes and "global_table_writes" not in kwargs:
            try:
                kwargs["global_table_writes"] = check_global_table_writes(writes)
            except ConfigurationError as exc:
                raise ConfigurationError(f"DYNACOORD_GLOBAL_TABLE_WRITES: {exc}") from exc
        backend = cls(client, clock=clock, **kwargs)
        lag_namespace = os.environ.get("DYNACOORD_OUTBOX_LAG_METRICS")
        if lag_namespace:
            # the bundled stack's sweeper: its outbox reports the lag for the stack's alarms
            from ._stack import lag_outbox

            backend._facades["_outbox"] = lag_outbox(backend, lag_namespace)
        return backend

    def __repr__(self) -> str:
        layout = "" if self.layout.is_default else f", layout={self.layout!r}"
        return (
            f"DynamoDBBackend(table_name={self.table_name!r}, namespace={self.namespace!r}{layout})"
        )

    # -- store factories ------------------------------------------------------------------------

    def _lock_store(self, namespace: str) -> LockStore:
        from .locks import DynamoDBLockStore

        return DynamoDBLockStore(self.table, namespace, fence_grace_s=self.lock_fence_grace)

    if TYPE_CHECKING:
        from .breaker import DynamoDBBreakerStore
        from .cache import DynamoDBCacheStore

    def _cache_store(self, namespace: str) -> DynamoDBCacheStore:
        from .cache import DynamoDBCacheStore

        return DynamoDBCacheStore(self.table, namespace, shards=self.shards)

    def _breaker_store(self, namespace: str) -> DynamoDBBreakerStore:
        from .breaker import DynamoDBBreakerStore

        return DynamoDBBreakerStore(self.table, namespace)

    def _checkpoint_store(self, namespace: str) -> DynamoDBCheckpointStore:
        from .checkpoints import DynamoDBCheckpointStore

        return DynamoDBCheckpointStore(self.table, namespace)

    def _idempotency_store(self, namespace: str) -> DynamoDBIdempotencyStore:
        from .idempotency import DynamoDBIdempotencyStore

        return DynamoDBIdempotencyStore(self.table, namespace)

    if TYPE_CHECKING:
        from .checkpoints import DynamoDBCheckpointStore
        from .idempotency import DynamoDBIdempotencyStore

    if TYPE_CHECKING:
        from .outbox import DynamoDBOutboxStore

    def _outbox_store(self, namespace: str) -> DynamoDBOutboxStore:
        from .outbox import DynamoDBOutboxStore

        return DynamoDBOutboxStore(self.table, namespace, shards=self.shards)

    def transaction(self, *, client_request_token: str | None = None) -> Transaction:
        """``with backend.transaction() as tx:`` collects writes (``tx.put/update/delete/
        condition_check`` on any table) and outbox events (``tx.publish``) and commits them in
        one atomic write when the block ends; nothing is written if the block raises. See
        :class:`dynacoord.backends.dynamodb.transaction.Transaction`."""
        transaction_class = _transaction_class
        if transaction_class is None:
            transaction_class = _load_transaction_class()
        if client_request_token is not None and (
            not isinstance(client_request_token, str) or not 1 <= len(client_request_token) <= 36
        ):
            raise ConfigurationError(
                f"client_request_token must be a str of 1 to 36 characters, got "
                f"{client_request_token!r}"
            )
        if self.table.translator is not None:
            from .transaction import LayoutTransaction

            transaction_class = LayoutTransaction
        return transaction_class(
            self.table, outbox=self.outbox, client_request_token=client_request_token
        )

    def _counter_store(self, namespace: str) -> DynamoDBCounterStore:
        from .counters import DynamoDBCounterStore

        return DynamoDBCounterStore(self.table, namespace)

    def _run_store(self, namespace: str) -> DynamoDBRunStore:
        from .runs import DynamoDBRunStore

        return DynamoDBRunStore(self.table, namespace)

    def _semaphore_store(self, namespace: str) -> SemaphoreStore:
        from .semaphore import DynamoDBSemaphoreStore

        return DynamoDBSemaphoreStore(self.table, namespace, fence_grace_s=self.lock_fence_grace)

    def _rate_limit_store(self, namespace: str) -> RateLimitStore:
        from .ratelimit import DynamoDBRateLimitStore

        return DynamoDBRateLimitStore(self.table, namespace)

    if TYPE_CHECKING:
        from .counters import DynamoDBCounterStore
        from .runs import DynamoDBRunStore


def resilient_client_config() -> Any:
    """The botocore ``Config`` of the DynamoDB clients dynacoord makes itself (``from_env``, the
    CLI): 9 adaptive attempts ride out throttling; short timeouts (a DynamoDB request answers in
    milliseconds) keep the client's retry window, for which counting writes keep a slot per
    writer on the item, at 223 s instead of botocore's 60 s + 60 s per attempt (1,240 s)."""
    from botocore.config import Config

    return Config(
        connect_timeout=2, read_timeout=5, retries={"max_attempts": 8, "mode": "adaptive"}
    )


def _client_from_env(session: Any) -> Any:
    """The DynamoDB client of :meth:`DynamoDBBackend.from_env`; an endpoint or a region the
    environment got wrong is a :class:`ConfigurationError` naming the variable to fix (botocore
    says ``Invalid endpoint`` or ``You must specify a region``, naming none)."""
    import boto3
    from botocore.exceptions import NoRegionError

    endpoint = os.environ.get("DYNACOORD_ENDPOINT_URL") or None
    if endpoint is not None and "://" not in endpoint:
        raise ConfigurationError(
            f"DYNACOORD_ENDPOINT_URL {endpoint!r} has no scheme: set it to http://{endpoint} "
            f"(DynamoDB Local) or https://{endpoint}; nothing was sent"
        )
    config = resilient_client_config()
    factory = session.client if session is not None else boto3.client
    try:
        return factory("dynamodb", endpoint_url=endpoint, config=config)
    except NoRegionError as exc:
        raise ConfigurationError(
            "no AWS region for the DynamoDB client: set AWS_REGION or AWS_DEFAULT_REGION (or a "
            "region in the AWS_PROFILE's config), or pass client=boto3.client('dynamodb', "
            "region_name=...); nothing was sent"
        ) from exc
    except ValueError as exc:  # botocore's "Invalid endpoint: ..."
        given = [
            f"{name}={os.environ[name]!r}"
            for name in ("DYNACOORD_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL")
            if os.environ.get(name)
        ]
        raise ConfigurationError(
            f"the DynamoDB endpoint from the environment is not a URL ({', '.join(given) or exc}): "
            "write it with its scheme, e.g. http://127.0.0.1:8000; nothing was sent"
        ) from exc
