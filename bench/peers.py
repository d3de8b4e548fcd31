"""Section 6: peers in the same run.

Each comparison times the dynacoord operation and the peer's equivalent interleaved A/B against
the same server, and counts the requests each side sends. Ratios are dynacoord / peer (below 1
means dynacoord is faster). A peer that is not installed, or that fails on this boto3/Python, is
reported with its error instead of a number.

* locks: ``python-dynamodb-lock`` (``DynamoDBLockClient`` on its own table, created with its own
  ``create_dynamodb_table``) vs ``backend.locks``: acquire + release of a free key.
* idempotency: Powertools for AWS Lambda (``idempotent_function`` + ``DynamoDBPersistenceLayer``
  on a table of the same shape as dynacoord's: pk/sk, the gsi1 index, TTL on) vs ``@backend.idempotent``: first call and replay.
* circuit breaker on Redis: ``pybreaker`` with ``CircuitRedisStorage`` vs dynacoord's breaker on
  the Redis backend: one protected call while the circuit is closed.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

from ._harness import (
    BenchEnv,
    RedisCommandCounter,
    interleaved,
    paired_ratio,
    paired_ratio_ci,
    ratio,
    stats,
    unique,
)

__all__ = ["run"]

logger = logging.getLogger(__name__)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _compare(
    env: BenchEnv,
    dyn: Callable[[int], object],
    peer: Callable[[int], object],
    count_dyn: Callable[[Callable[[], object]], int],
    count_peer: Callable[[Callable[[], object]], int],
    n: int,
    warmup: int,
) -> dict[str, Any]:
    """Time both interleaved; count requests on one extra call of each (index -1)."""
    requests_dyn = count_dyn(lambda: dyn(-1))
    requests_peer = count_peer(lambda: peer(-1))
    a, b = interleaved(dyn, peer, n, warmup)
    sa, sb = stats(a), stats(b)
    return {
        "dynacoord_stats": sa.as_dict(),
        "peer_stats": sb.as_dict(),
        "ratio_median": ratio(sa.median_ms, sb.median_ms),
        "ratio_p95": ratio(sa.p95_ms, sb.p95_ms),
        "ratio_paired": paired_ratio(a, b),
        "ratio_paired_ci95": paired_ratio_ci(a, b),
        "requests_dynacoord": requests_dyn,
        "requests_peer": requests_peer,
    }


def _ddb_counter(env: BenchEnv) -> Callable[[Callable[[], object]], int]:
    def count(call: Callable[[], object]) -> int:
        with env.counter.measure() as ops:
            call()
        return sum(ops.values())

    return count


# -- python-dynamodb-lock ---------------------------------------------------------------------------


def _locks_peer(env: BenchEnv) -> dict[str, Any]:
    version = _version("python-dynamodb-lock")
    base: dict[str, Any] = {
        "name": "locks: acquire + release (free key)",
        "peer": f"python-dynamodb-lock {version}" if version else "python-dynamodb-lock",
    }
    if version is None:
        return {**base, "status": "not installed", "error": "pip install python-dynamodb-lock"}
    import boto3
    from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient

    lock_table = unique("pylock")
    peer_client = env.new_client()
    resource = boto3.resource(
        "dynamodb",
        endpoint_url=env.ddb.endpoint_url,
        aws_access_key_id="dynacoord",
        aws_secret_access_key="dynacoord",
        region_name="us-east-1",
    )
    env.counter.attach(resource.meta.client)
    DynamoDBLockClient.create_dynamodb_table(peer_client, table_name=lock_table)
    # Its heartbeat threads only send for locks held at the moment they wake (every second
    # here: close() joins them); a lock is held for microseconds in this loop, so the requests
    # counted are the operation's own.
    lock_client = DynamoDBLockClient(
        resource,
        table_name=lock_table,
        heartbeat_period=datetime.timedelta(seconds=1),
    )
    locks = env.backend().locks
    try:

        def dyn(i: int) -> None:
            lease = locks.acquire(f"k{i}", ttl=60)
            assert lease is not None
            assert lease.release()

        def peer(i: int) -> None:
            lock = lock_client.acquire_lock(f"k{i}")
            lock.release(best_effort=False)

        counter = _ddb_counter(env)
        result = _compare(
            env, dyn, peer, counter, counter, env.scale.peer_samples, env.scale.warmup
        )
    finally:
        lock_client.close()
    note = (
        "python-dynamodb-lock acquires with a consistent GetItem then a conditional PutItem and "
        "releases with a DeleteItem; it has no fencing token and only takes over an abandoned "
        "lock after watching it unchanged for a whole lease"
    )
    return {**base, "status": "ok", **result, "note": note}


# -- Powertools idempotency -----------------------------------------------------------------------


def _idempotency_peer(env: BenchEnv) -> dict[str, Any]:
    version = _version("aws-lambda-powertools")
    base: dict[str, Any] = {
        "name": "idempotency: first call / replay",
        "peer": f"aws-lambda-powertools {version}" if version else "aws-lambda-powertools",
    }
    if version is None:
        return {**base, "status": "not installed", "error": "pip install aws-lambda-powertools"}
    backend = env.backend()
    if not hasattr(backend, "idempotent"):
        return {
            **base,
            "status": "not landed",
            "error": "backend.idempotent is not in this checkout",
        }
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
        idempotent_function,
    )

    from dynacoord.provision import create_table

    # The same table shape on both sides (pk/sk, the gsi1 index, TTL on): Powertools on an
    # id-only table of its own would write smaller index-free items and compare unlike things.
    peer_table = unique("powertools")
    create_table(env.client, peer_table)
    peer_client = env.new_client()
    persistence = DynamoDBPersistenceLayer(
        table_name=peer_table, boto3_client=peer_client, key_attr="pk", sort_key_attr="sk"
    )
    # No local cache: every call goes to DynamoDB, like dynacoord (which has none).
    config = IdempotencyConfig(event_key_jmespath="order_id", use_local_cache=False)

    @idempotent_function(  # type: ignore[untyped-decorator,unused-ignore]
        data_keyword_argument="order", persistence_store=persistence, config=config
    )
    def peer_handler(order: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "order_id": order["order_id"]}

    @backend.idempotent(key="order_id")
    def dyn_handler(order: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "order_id": order["order_id"]}

    counter = _ddb_counter(env)
    with warnings.catch_warnings():
        # Powertools warns on every call outside Lambda that it cannot read the remaining time
        warnings.simplefilter("ignore", UserWarning)
        return {**base, **_idempotency_runs(env, counter, dyn_handler, peer_handler)}


def _idempotency_runs(
    env: BenchEnv,
    counter: Callable[[Callable[[], object]], int],
    dyn_handler: Callable[..., Any],
    peer_handler: Callable[..., Any],
) -> dict[str, Any]:
    first = _compare(
        env,
        lambda i: dyn_handler({"order_id": f"first-{i}"}),
        lambda i: peer_handler(order={"order_id": f"first-{i}"}),
        counter,
        counter,
        env.scale.peer_samples,
        env.scale.warmup,
    )
    # replay: the same keys again (every one of them completed above)
    second = _compare(
        env,
        lambda i: dyn_handler({"order_id": f"first-{i}"}),
        lambda i: peer_handler(order={"order_id": f"first-{i}"}),
        counter,
        counter,
        env.scale.peer_samples,
        env.scale.warmup,
    )
    return {
        "status": "ok",
        "rows": [{"case": "first call", **first}, {"case": "replay", **second}],
        "note": (
            "Both on a table of the same shape (pk/sk, gsi1, TTL; Powertools with "
            "key_attr='pk', sort_key_attr='sk'). Powertools with use_local_cache=False (every "
            "call goes to DynamoDB, as in dynacoord without its local cache) and no Lambda "
            "context; it stores an MD5 of the "
            "selected key, dynacoord the key itself; neither validates the payload here. Same "
            "requests on both sides (a conditional PutItem claim, then an UpdateItem), but "
            "dynacoord's completion is conditional on its claim token (a call whose lease was "
            "taken over cannot overwrite the new owner's record) and Powertools' is not"
        ),
    }


# -- pybreaker on Redis -----------------------------------------------------------------------------


def _breaker_peer(env: BenchEnv) -> dict[str, Any]:
    version = _version("pybreaker")
    base: dict[str, Any] = {
        "name": "circuit breaker on Redis: protected call (closed)",
        "peer": f"pybreaker {version} (CircuitRedisStorage)" if version else "pybreaker",
    }
    if version is None:
        return {**base, "status": "not installed", "error": "pip install pybreaker"}
    if env.redis is None:
        return {**base, "status": "error", "error": f"no redis-server: {env.redis_error}"}
    try:
        from dynacoord.backends.redis import RedisBackend
    except ImportError as exc:
        return {**base, "status": "not landed", "error": f"dynacoord Redis backend: {exc}"}
    import pybreaker

    dyn_counter = RedisCommandCounter()
    peer_counter = RedisCommandCounter()
    dyn_client = dyn_counter.attach(env.redis_client())
    peer_client = peer_counter.attach(env.redis_client())
    name = unique("cb")
    breaker = RedisBackend(dyn_client, namespace=unique("ns")).breaker(
        name, failure_threshold=5, reset_timeout=30
    )
    peer_breaker = pybreaker.CircuitBreaker(
        fail_max=5,
        reset_timeout=30,
        state_storage=pybreaker.CircuitRedisStorage(
            pybreaker.STATE_CLOSED, peer_client, namespace=name
        ),
        name=name,
    )

    def ok() -> int:
        return 1

    # connections made (and their handshakes sent) before anything is counted
    breaker.call(ok)
    peer_breaker.call(ok)

    def count_with(counter: RedisCommandCounter) -> Callable[[Callable[[], object]], int]:
        def count(call: Callable[[], object]) -> int:
            with counter.measure() as n:
                call()
            return n[0]

        return count

    closed = _compare(
        env,
        lambda i: breaker.call(ok),
        lambda i: peer_breaker.call(ok),
        count_with(dyn_counter),
        count_with(peer_counter),
        env.scale.peer_samples,
        env.scale.warmup,
    )
    # the floor: the same no-op called bare, to show the per-call overhead of each breaker
    bare = [float(x) for x in interleaved(lambda i: ok(), lambda i: ok(), 50, 5)[0]]
    bare_ms = stats(bare).median_ms
    closed["overhead_ms_dynacoord"] = round(closed["dynacoord_stats"]["median_ms"] - bare_ms, 4)
    closed["overhead_ms_peer"] = round(closed["peer_stats"]["median_ms"] - bare_ms, 4)
    dyn_client.close()
    peer_client.close()
    return {
        **base,
        "status": "ok",
        **closed,
        "note": (
            "requests are Redis round trips; per closed, successful call pybreaker reads its "
            "state key (GET) and resets its failure counter (SET, a write on every success); "
            "dynacoord reads its one breaker hash (HGETALL) and writes only after failures"
        ),
    }


PEERS: list[Callable[[BenchEnv], dict[str, Any]]] = [
    _locks_peer,
    _idempotency_peer,
    _breaker_peer,
]


def run(env: BenchEnv) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for peer in PEERS:
        started = time.perf_counter()
        try:
            row = peer(env)
        except Exception as exc:
            logger.exception("peer comparison %r failed", peer.__name__)
            row = {
                "name": peer.__name__.strip("_"),
                "status": "error",
                "error": f"{type(exc).__name__}: {exc}",
            }
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append(row)
    return {"status": "ok", "rows": rows}
