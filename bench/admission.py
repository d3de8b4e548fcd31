"""Section 11: admission and leadership beside the peers (requests and units per call).

Each dynacoord call is measured on DynamoDB Local with :class:`bench._units.UnitMeter` (write
and read units by AWS's rules from the items before and after each request, not DynamoDB
Local's ``ConsumedCapacity``): the semaphore's acquire / renew / release, the rate limiter's
``try_acquire`` admitted and refused, leader election's campaign / renew / step-down, a
``fenced_update`` and a transaction guarded by ``lease.guard``. Unit counts are deterministic
(small items, one writer), so the scale changes nothing here.

Beside them, the peers, by the same meter where they are installed (the ``bench`` extra):
python-redis-lock and pottery's Redlock (round trips to one redis-server: neither has a counting
semaphore, so a lock is one permit), the ``limits`` package's moving and fixed windows on Redis
(round trips per ``hit``), and python-dynamodb-lock (the Python port of the DynamoDB lock
client's design, metered on DynamoDB Local). Peers that cannot run here (the AWS Step Functions
semaphore sample, the Java amazon-dynamodb-lock-client) are rows stated from their documented
design, marked as such.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any

from dynacoord import ManualClock

from ._harness import BenchEnv, RedisCommandCounter, unique
from ._units import UnitMeter

__all__ = ["STATED", "run"]

logger = logging.getLogger(__name__)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _metered(meter: UnitMeter, call: Callable[[], object]) -> dict[str, Any]:
    """The requests and units of one call, by AWS's rules."""
    before = meter.usage()
    call()
    spent = meter.usage() - before
    return {
        "requests": spent.total_requests,
        "apis": dict(spent.requests),
        "wcu": spent.wcu,
        "index_wcu": spent.index_wcu,
        "rcu": spent.rcu,
        "refusals": sum(spent.refusals.values()),
    }


def _row(
    primitive: str, operation: str, by: str, measured: dict[str, Any], note: str = ""
) -> dict[str, Any]:
    return {"primitive": primitive, "operation": operation, "by": by, **measured, "note": note}


# -- dynacoord on DynamoDB Local ---------------------------------------------------------------------


def _warm_up(backend: Any) -> None:
    """A backend's one-time requests (its first-use DescribeTable, the DescribeTimeToLive its
    retry window reads) go before the calls measured: they are no call's cost."""
    permit = backend.semaphore("warm-up", limit=1, ttl=5).acquire(blocking=False)
    permit.extend()
    permit.release()
    lease = backend.locks.acquire("warm-up", 5)
    if lease is not None:
        lease.release()


def _dynacoord_rows(env: BenchEnv) -> list[dict[str, Any]]:
    client = env.new_client(counted=False)
    peek = env.new_client(counted=False)
    meter = UnitMeter(client, peek, env.table)
    rows: list[dict[str, Any]] = []
    by = "dynacoord"
    try:
        backend = env.backend(namespace=unique("adm"), client=client)
        _warm_up(backend)

        # semaphore: limit 3, default owners (43 bytes), 30 s permits
        pool = backend.semaphore("exports", limit=3, ttl=30)
        box: list[Any] = []
        rows.append(
            _row(
                "semaphore",
                "acquire (first, by a new object)",
                by,
                _metered(meter, lambda: box.append(pool.acquire(blocking=False))),
            )
        )
        rows.append(
            _row(
                "semaphore",
                "acquire (the object's last write still current)",
                by,
                _metered(meter, lambda: box.append(pool.acquire(blocking=False))),
            )
        )
        rows.append(
            _row("semaphore", "renew (permit.extend)", by, _metered(meter, lambda: box[0].extend()))
        )
        rows.append(_row("semaphore", "release", by, _metered(meter, lambda: box[0].release())))
        box += [pool.acquire(blocking=False), pool.acquire(blocking=False)]  # all 3 held
        other = backend.semaphore("exports", limit=3, ttl=30)

        def refused_look() -> None:
            try:
                other.acquire(blocking=False)
            except Exception as exc:  # SemaphoreFullError: what is measured
                box.append(exc)

        rows.append(
            _row(
                "semaphore",
                "acquire refused (full, blocking=False, a new object)",
                by,
                _metered(meter, refused_look),
                "a look with one consistent read: a full semaphore is not written",
            )
        )
        for permit in box:
            if hasattr(permit, "release"):
                permit.release()

        # rate limiter: 10 a second, 2 at once, on a manual clock (the calls are the measure)
        clock = ManualClock()
        timed = env.backend(namespace=unique("adm"), client=client, clock=clock)
        _warm_up(timed)
        api = timed.rate_limiter("partner-api", rate=10, per=1, burst=2)
        calls = 6
        start = meter.usage()
        for _ in range(calls):
            assert api.try_acquire()
            clock.advance(api.interval)
        spent = meter.usage() - start
        rows.append(
            _row(
                "ratelimit",
                "try_acquire admitted (at the full rate, per call)",
                by,
                {
                    "requests": spent.total_requests / calls,
                    "apis": {k: v / calls for k, v in spent.requests.items()},
                    "wcu": spent.wcu / calls,
                    "index_wcu": spent.index_wcu / calls,
                    "rcu": spent.rcu / calls,
                    "refusals": sum(spent.refusals.values()) / calls,
                },
            )
        )
        api.try_acquire()
        api.try_acquire()  # the burst taken at one instant
        fresh = timed.rate_limiter("partner-api", rate=10, per=1, burst=2)
        rows.append(
            _row(
                "ratelimit",
                "try_acquire refused (first time for this object)",
                by,
                _metered(meter, fresh.try_acquire),
                "the refused write returns the item: it tells the wait, no read",
            )
        )
        rows.append(
            _row(
                "ratelimit",
                "try_acquire refused again (seen full)",
                by,
                _metered(meter, fresh.try_acquire),
                "decided from what the object saw",
            )
        )
        rows.append(_row("ratelimit", "available()", by, _metered(meter, api.available)))

        # leader election: the lock item leader:NAME, 30 s terms, renewals by hand
        leader = backend.leader("scheduler", ttl=30, owner="node-a")
        rival = backend.leader("scheduler", ttl=30, owner="node-b")
        rows.append(
            _row(
                "leader",
                "campaign (free seat)",
                by,
                _metered(meter, lambda: leader.campaign(timeout=0, heartbeat=False)),
            )
        )
        rows.append(
            _row(
                "leader",
                "renew",
                by,
                _metered(meter, leader.renew),
                "every renew_interval (ttl / 3) while it leads",
            )
        )
        rows.append(
            _row(
                "leader",
                "campaign refused (seat held), one attempt",
                by,
                _metered(meter, lambda: rival.campaign(timeout=0, heartbeat=False)),
                "the refusal returns the holder; a waiting candidate then reads about "
                "once a second (docs/leader.md)",
            )
        )
        rows.append(_row("leader", "step_down", by, _metered(meter, leader.step_down)))

        # fencing at the resource: an item of the application in the same table
        locks = backend.locks
        lease = locks.acquire("order-1", 30)
        assert lease is not None
        key = {"pk": f"APP#{unique('o')}", "sk": "ORDER"}
        rows.append(
            _row(
                "fencing",
                "fenced_update (one item of yours)",
                by,
                _metered(meter, lambda: lease.fenced_update(key, {"status": "packed"})),
            )
        )
        locks.force_release("order-1")  # stands in for the lease's TTL running out in a pause
        newer = locks.acquire("order-1", 30)
        assert newer is not None
        newer.fenced_update(key, {"status": "shipped"})

        def stale_write() -> None:
            try:
                lease.fenced_update(key, {"status": "packed again"})
            except Exception as exc:  # FenceRejectedError: what is measured
                box.append(exc)

        rows.append(
            _row(
                "fencing",
                "fenced_update refused (a stale fence)",
                by,
                _metered(meter, stale_write),
                "nothing is written",
            )
        )

        def one_update(guarded: bool) -> Callable[[], None]:
            def run() -> None:
                with backend.transaction() as tx:
                    tx.update(env.table, key, "SET qty = :n", values={":n": 1})
                    if guarded:
                        newer.guard(tx)

            return run

        plain = _metered(meter, one_update(False))
        guarded = _metered(meter, one_update(True))
        rows.append(_row("fencing", "transaction of 1 update, no guard", by, plain))
        rows.append(
            _row(
                "fencing",
                "the same + lease.guard(tx)",
                by,
                guarded,
                f"the guard adds {guarded['wcu'] - plain['wcu']} WCU (a ConditionCheck "
                f"is a transaction item: twice a write) and "
                f"{guarded['requests'] - plain['requests']} requests",
            )
        )
        newer.release()
    finally:
        meter.close()
    return rows


# -- peers measured ----------------------------------------------------------------------------------


def _trips(counter: RedisCommandCounter, call: Callable[[], object]) -> dict[str, Any]:
    """The Redis round trips of one call (units do not apply to Redis)."""
    with counter.measure() as n:
        call()
    return {"requests": n[0], "apis": {"Redis round trips": n[0]}, "wcu": None, "rcu": None}


def _redis_rows(env: BenchEnv) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    if env.redis is None:
        return rows, [f"Redis peers: no redis-server ({env.redis_error})"]

    version = _version("python-redis-lock")
    if version is None:
        errors.append("python-redis-lock: not installed (pip install -e '.[bench]')")
    else:
        import redis_lock

        counter = RedisCommandCounter()
        conn = counter.attach(env.redis_client())
        by = f"python-redis-lock {version} (Redis)"
        name = unique("rl")
        # the peers log every lock at INFO; the report has what matters
        logging.getLogger("redis_lock").setLevel(logging.WARNING)
        warm = redis_lock.Lock(conn, name, expire=30)  # loads its scripts once
        warm.acquire(blocking=False)
        warm.extend()
        warm.release()
        lock = redis_lock.Lock(conn, name, expire=30)
        rows.append(
            _row(
                "semaphore",
                "acquire (a lock: one permit)",
                by,
                _trips(counter, lambda: lock.acquire(blocking=False)),
                "no counting semaphore (python-redis-lock#42, open since 2016), no fencing token",
            )
        )
        rows.append(_row("semaphore", "renew (extend)", by, _trips(counter, lock.extend)))
        held = redis_lock.Lock(conn, name, expire=30)
        rows.append(
            _row(
                "semaphore",
                "acquire refused (held, blocking=False)",
                by,
                _trips(counter, lambda: held.acquire(blocking=False)),
            )
        )
        rows.append(_row("semaphore", "release", by, _trips(counter, lock.release)))
        conn.close()

    version = _version("pottery")
    if version is None:
        errors.append("pottery: not installed (pip install -e '.[bench]')")
    else:
        import json

        # Importing pottery replaces json.dumps for the whole process (its encoder by
        # default); put it back, so that nothing else in this run (or a test's) goes through it.
        dumps = json.dumps
        try:
            from pottery import Redlock
        finally:
            json.dumps = dumps

        counter = RedisCommandCounter()
        conn = counter.attach(env.redis_client())
        by = f"pottery {version} Redlock (1 master)"
        key = unique("redlock")
        logging.getLogger("pottery").setLevel(logging.WARNING)
        warm = Redlock(key=key, masters={conn}, auto_release_time=30)  # registers its scripts
        warm.acquire(blocking=False)
        warm.extend()
        warm.release()
        lock = Redlock(key=key, masters={conn}, auto_release_time=30)
        rows.append(
            _row(
                "semaphore",
                "acquire (a lock: one permit)",
                by,
                _trips(counter, lambda: lock.acquire(blocking=False)),
                "Redlock sends each call to every master (N masters: N round trips); "
                "no semaphore, no fencing token (its NextID is a separate counter)",
            )
        )
        rows.append(_row("semaphore", "renew (extend)", by, _trips(counter, lock.extend)))
        rows.append(_row("semaphore", "release", by, _trips(counter, lock.release)))
        conn.close()

    version = _version("limits")
    if version is None:
        errors.append("limits: not installed (pip install -e '.[bench]')")
    else:
        from limits import parse, storage, strategies

        store = storage.RedisStorage(env.redis.url)
        counter = RedisCommandCounter()
        counter.attach(store.storage)
        for strategy in (strategies.MovingWindowRateLimiter, strategies.FixedWindowRateLimiter):
            rows += _limits_rows(counter, strategy(store), parse("2/hour"), f"limits {version}")
        store.storage.close()
    return rows, errors


def _limits_rows(
    counter: RedisCommandCounter, limiter: Any, item: Any, by: str
) -> list[dict[str, Any]]:
    """One ``limits`` strategy: a hit admitted, one refused, and the stats a refusal needs."""
    by = f"{by} {type(limiter).__name__} (Redis)"
    key = unique("lim")
    warm = unique("warm")  # loads its scripts once
    limiter.hit(item, warm)
    limiter.get_window_stats(item, warm)
    rows = [_row("ratelimit", "hit admitted", by, _trips(counter, lambda: limiter.hit(item, key)))]
    limiter.hit(item, key)
    rows.append(
        _row(
            "ratelimit",
            "hit refused",
            by,
            _trips(counter, lambda: limiter.hit(item, key)),
            "a refusal says nothing of when to retry: get_window_stats is one more round trip",
        )
    )
    rows.append(
        _row(
            "ratelimit",
            "get_window_stats (the time to wait)",
            by,
            _trips(counter, lambda: limiter.get_window_stats(item, key)),
        )
    )
    return rows


def _dynamodb_lock_rows(env: BenchEnv) -> tuple[list[dict[str, Any]], list[str]]:
    version = _version("python-dynamodb-lock")
    if version is None:
        return [], ["python-dynamodb-lock: not installed (pip install -e '.[bench]')"]
    import boto3
    from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient

    table = unique("pylock")
    DynamoDBLockClient.create_dynamodb_table(env.new_client(counted=False), table_name=table)
    resource = boto3.resource(
        "dynamodb",
        endpoint_url=env.ddb.endpoint_url,
        aws_access_key_id="dynacoord",
        aws_secret_access_key="dynacoord",
        region_name="us-east-1",
    )
    meter = UnitMeter(resource.meta.client, env.new_client(counted=False), table)
    # heartbeats every second (close() waits for its thread to wake): they are sent only for a
    # lock held when the thread wakes, and the lock here is held for milliseconds
    lock_client = DynamoDBLockClient(
        resource, table_name=table, heartbeat_period=datetime.timedelta(seconds=1)
    )
    by = f"python-dynamodb-lock {version} (DynamoDB)"
    rows: list[dict[str, Any]] = []
    try:
        box: list[Any] = []
        rows.append(
            _row(
                "semaphore",
                "acquire (a lock: one permit)",
                by,
                _metered(meter, lambda: box.append(lock_client.acquire_lock("k"))),
                "the DynamoDB lock client's design (a port of amazon-dynamodb-lock-"
                "client): no fencing token, its record version is a random id",
            )
        )
        rows.append(
            _row(
                "semaphore",
                "release",
                by,
                _metered(meter, lambda: box[0].release(best_effort=False)),
            )
        )
    finally:
        lock_client.close()
        meter.close()
    return rows, []


# -- peers stated from their documented design ---------------------------------------------------------

#: rows that cannot be run here, each from its project's documented design
STATED: list[dict[str, Any]] = [
    {
        "primitive": "semaphore",
        "operation": "acquire",
        "by": "AWS Step Functions semaphore sample (stated)",
        "requests": "1 state machine execution + 1 UpdateItem",
        "wcu": ">= 1 (the item grows by one attribute per holder)",
        "note": "a conditional UpdateItem of a count and the execution's id, inside a Standard "
        "workflow billed per state transition; no lease: a holder that dies outside the "
        "workflow keeps its permit until a cleanup workflow runs, and permits leak after "
        "cleanup (aws-stepfunctions-examples#3); no start-rate cap (#5); no fence",
    },
    {
        "primitive": "semaphore",
        "operation": "release",
        "by": "AWS Step Functions semaphore sample (stated)",
        "requests": "1 UpdateItem (+ the workflow's transitions)",
        "wcu": ">= 1",
        "note": "",
    },
    {
        "primitive": "leader",
        "operation": "acquire / heartbeat / release",
        "by": "amazon-dynamodb-lock-client, Java (stated)",
        "requests": "GetItem + PutItem / UpdateItem / DeleteItem",
        "wcu": "1 each (small item) + 1 RCU for the read",
        "note": "no fencing token (amazon-dynamodb-lock-client#1, open since 2017): a paused "
        "leader's writes are not refused anywhere; a lock is taken over only after watching it "
        "unchanged for a whole lease",
    },
]


def run(env: BenchEnv) -> dict[str, Any]:
    rows = _dynacoord_rows(env)
    peers: list[dict[str, Any]] = []
    errors: list[str] = []
    for measure in (_redis_rows, _dynamodb_lock_rows):
        try:
            found, missing = measure(env)
        except Exception as exc:  # reported, the section goes on without that peer
            logger.exception("admission peer %s failed", measure.__name__)
            found, missing = [], [f"{measure.__name__}: {type(exc).__name__}: {exc}"]
        peers += found
        errors += missing
    return {"status": "ok", "rows": rows, "peers": peers, "stated": STATED, "errors": errors}
