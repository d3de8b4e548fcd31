"""Section 1: requests per operation, counted on the wire with a botocore ``before-send`` hook.

Every public operation of every primitive that exists in this checkout is called a few times;
each call's requests are counted. ``minimum`` is the fewest requests the operation can take with
its semantics on DynamoDB (the reason is in ``why``); a row whose count is above it is flagged.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ._harness import BenchEnv, RedisCommandCounter, unique

__all__ = ["run"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Op:
    primitive: str
    operation: str
    call: Callable[[int], object]
    minimum: int
    why: str = ""
    #: run before each counted call, not counted (fills what the call consumes)
    prepare: Callable[[int], object] | None = None


def _count(env: BenchEnv, op: Op, reps: int) -> dict[str, Any]:
    totals: list[int] = []
    apis: Counter[str] = Counter()
    for i in range(reps):
        if op.prepare is not None:
            op.prepare(i)
        with env.counter.measure() as ops:
            op.call(i)
        totals.append(sum(ops.values()))
        apis = ops
    requests = max(totals)
    return {
        "primitive": op.primitive,
        "operation": op.operation,
        "requests": requests,
        "varies": min(totals) != requests,
        "apis": dict(sorted(apis.items())),
        "minimum": op.minimum,
        "above_minimum": requests > op.minimum,
        "why": op.why,
    }


# -- per primitive: the operations and their minimum ---------------------------------------------


def _must(value: T | None) -> T:
    """The setup step's result, which must be there (a bench bug otherwise)."""
    if value is None:
        raise RuntimeError("benchmark setup step returned None")
    return value


def _lock_ops(env: BenchEnv, reps: int) -> list[Op]:
    locks = env.backend().locks
    n = reps + 1
    for i in range(n):
        _must(locks.acquire(f"held{i}", ttl=60))
        _must(locks.acquire(f"own{i}", ttl=60, owner=f"owner{i}"))
        _must(locks.acquire(f"force{i}", ttl=60))
    leases = [_must(locks.acquire(f"mine{i}", ttl=60)) for i in range(n)]
    released = [_must(locks.acquire(f"rel{i}", ttl=60)) for i in range(n)]

    def hold(i: int) -> None:
        with locks.hold(f"hold{i}", ttl=60, heartbeat=False):
            pass

    return [
        Op(
            "locks",
            "acquire (free key)",
            lambda i: locks.acquire(f"free{i}", ttl=60),
            1,
            "one conditional UpdateItem",
        ),
        Op(
            "locks",
            "acquire (held by another owner, timeout=0)",
            lambda i: locks.acquire(f"held{i}", ttl=60),
            1,
            "the failed conditional write returns the holder (ReturnValuesOnConditionCheckFailure)",
        ),
        Op(
            "locks",
            "re-acquire by the same owner",
            lambda i: locks.acquire(f"own{i}", ttl=60, owner=f"owner{i}"),
            2,
            "keeping the fence needs a second, differently conditioned write",
        ),
        Op("locks", "lease.extend", lambda i: leases[i].extend(), 1, "one conditional UpdateItem"),
        Op("locks", "lease.is_held", lambda i: leases[i].is_held(), 1, "one consistent GetItem"),
        Op("locks", "locked", lambda i: locks.locked(f"held{i}"), 1, "one consistent GetItem"),
        Op("locks", "get", lambda i: locks.get(f"held{i}"), 1, "one consistent GetItem"),
        Op(
            "locks",
            "lease.release",
            lambda i: released[i].release(),
            1,
            "one conditional UpdateItem (the item is kept for the fence)",
        ),
        Op(
            "locks",
            "force_release",
            lambda i: locks.force_release(f"force{i}"),
            1,
            "one conditional UpdateItem",
        ),
        Op("locks", "hold() enter + exit (no heartbeat due)", hold, 2, "acquire + release"),
    ]


def _cache_ops(env: BenchEnv, reps: int) -> list[Op]:
    backend = env.backend()
    shards = getattr(backend, "shards", 1)
    cache = backend.cache(default_ttl=600)
    n = reps + 1
    for i in range(n):
        cache.set(f"hit{i}", {"v": i})
        cache.set(f"del{i}", i)
        cache.set(f"touch{i}", i)
        cache.incr(f"ctr{i}")
        cache.set(f"present{i}", i)
    hundred = [f"many{j}" for j in range(100)]
    cache.set_many({k: j for j, k in enumerate(hundred)})
    listing = backend.cache(default_ttl=600, namespace=backend.namespace + "list")
    listing.set_many({f"user:{j}": j for j in range(100)})

    def fill(i: int) -> None:
        c = backend.cache(default_ttl=600, namespace=f"{backend.namespace}clr{i}")
        c.set_many({f"x{j}": j for j in range(100)})

    def clear(i: int) -> None:
        backend.cache(namespace=f"{backend.namespace}clr{i}").clear()

    @cache.cached(ttl=600)
    def cached_fn(x: int) -> int:
        return x * 2

    for i in range(n):
        cached_fn(i)

    return [
        Op("cache", "set", lambda i: cache.set(f"new{i}", {"v": i}), 1, "one PutItem"),
        Op("cache", "get (hit)", lambda i: cache.get(f"hit{i}"), 1, "one consistent GetItem"),
        Op("cache", "get (miss)", lambda i: cache.get(f"absent{i}"), 1, "one consistent GetItem"),
        Op("cache", "has", lambda i: cache.has(f"hit{i}"), 1, "one consistent GetItem"),
        Op(
            "cache",
            "add (absent)",
            lambda i: cache.add(f"added{i}", i),
            1,
            "one conditional PutItem",
        ),
        Op(
            "cache",
            "add (present)",
            lambda i: cache.add(f"present{i}", i),
            1,
            "one conditional PutItem (refused)",
        ),
        Op("cache", "delete", lambda i: cache.delete(f"del{i}"), 1, "one conditional DeleteItem"),
        Op(
            "cache",
            "touch",
            lambda i: cache.touch(f"touch{i}", 600),
            1,
            "one conditional UpdateItem",
        ),
        Op("cache", "incr (existing)", lambda i: cache.incr(f"ctr{i}"), 1, "one atomic ADD"),
        Op(
            "cache",
            "incr (new key)",
            lambda i: cache.incr(f"newctr{i}"),
            1,
            "one UpdateItem: the ADD creates a missing item, its expiry set with if_not_exists; "
            "only an expired item needs a second write",
        ),
        Op(
            "cache",
            "get_many (100 keys)",
            lambda i: cache.get_many(hundred),
            1,
            "one BatchGetItem holds 100 keys",
        ),
        Op(
            "cache",
            "set_many (100 entries)",
            lambda i: cache.set_many({f"sm{i}-{j}": j for j in range(100)}),
            4,
            "BatchWriteItem takes 25 items",
        ),
        Op(
            "cache",
            "delete_many (100 keys)",
            lambda i: cache.delete_many([f"sm{i}-{j}" for j in range(100)]),
            4,
            "BatchWriteItem takes 25 items",
        ),
        Op(
            "cache",
            "keys('user:*') (100 live)",
            lambda i: listing.keys("user:*"),
            shards,
            f"one gsi1 Query per shard ({shards})",
        ),
        Op(
            "cache",
            "clear() (100 entries)",
            clear,
            shards + 4,
            f"a gsi1 Query per shard ({shards}) + BatchWriteItem of 25 deletes",
            prepare=fill,
        ),
        Op(
            "cache",
            "get_or_set (hit)",
            lambda i: cache.get_or_set(f"hit{i}", lambda: 0),
            1,
            "one consistent GetItem",
        ),
        Op(
            "cache",
            "get_or_set (miss)",
            lambda i: cache.get_or_set(f"gos{i}", lambda: i),
            5,
            "read, lock, re-check read under the lock, write, unlock",
        ),
        Op("cache", "@cached (hit)", lambda i: cached_fn(i), 1, "one consistent GetItem"),
        Op(
            "cache",
            "@cached .invalidate",
            lambda i: cast("Any", cached_fn).invalidate(i),
            1,
            "one DeleteItem",
        ),
    ]


def _breaker_ops(env: BenchEnv, reps: int) -> list[Op]:
    import time

    backend = env.backend()
    closed = backend.breaker("closed", failure_threshold=1000)
    flaky = backend.breaker("flaky", failure_threshold=1000)
    opened = backend.breaker("opened", reset_timeout=3600)
    opened.trip()
    recovering = [backend.breaker(f"rec{i}", reset_timeout=0.05) for i in range(reps + 1)]

    def ok() -> int:
        return 1

    def boom() -> None:
        raise RuntimeError("dependency down")

    def fail(i: int) -> None:
        with contextlib.suppress(RuntimeError):
            flaky.call(boom)

    def success_after_failure(i: int) -> None:
        flaky.call(ok)

    def call_open(i: int) -> None:
        from dynacoord import CircuitOpenError

        try:
            opened.call(ok)
        except CircuitOpenError:
            return
        raise AssertionError("the open breaker let a call through")

    def trial(i: int) -> None:
        recovering[i].call(ok)

    def prepare_trial(i: int) -> None:
        recovering[i].trip()

    for i in range(reps + 1):
        prepare_trial(i)
    time.sleep(0.06)
    return [
        Op(
            "breaker",
            "protected call, closed, success",
            lambda i: closed.call(ok),
            1,
            "the state must be read (one consistent GetItem) to honour another process's trip",
        ),
        Op("breaker", "protected call, closed, failure", fail, 2, "read + atomic ADD"),
        Op(
            "breaker",
            "protected call, closed, success after a failure",
            success_after_failure,
            2,
            "read + reset of the failure count",
            prepare=lambda i: flaky.record_failure(),
        ),
        Op("breaker", "protected call, open (CircuitOpenError)", call_open, 1, "one read"),
        Op(
            "breaker",
            "trial call, half-open -> closed",
            trial,
            3,
            "read + conditional trial-slot write + conditional close",
        ),
        Op("breaker", "status()", lambda i: closed.status(), 1, "one consistent GetItem"),
        Op("breaker", "trip()", lambda i: opened.trip(), 1, "one UpdateItem"),
        Op("breaker", "reset()", lambda i: closed.reset(), 1, "one write"),
    ]


def _checkpoint_ops(env: BenchEnv, reps: int) -> list[Op]:
    cps = env.backend().checkpoints
    n = reps + 1
    first_ids = []
    for i in range(n):
        for j in range(10):
            saved = cps.save(f"task{i}", {"step": j}, progress=j * 10)
            if j == 0:
                first_ids.append(saved.id)
            cps.save(f"clean{i}", {"step": j})
            cps.save(f"all{i}", {"step": j})
    return [
        Op(
            "checkpoints",
            "save (next sequence)",
            lambda i: cps.save(f"task{i}", {"step": "x"}),
            2,
            "read the highest sequence + conditional PutItem (as a counter item would cost)",
        ),
        Op(
            "checkpoints",
            "save (explicit sequence)",
            lambda i: cps.save(f"seq{i}", {"s": 1}, sequence=7),
            1,
            "one conditional PutItem",
        ),
        Op(
            "checkpoints", "load(id)", lambda i: cps.load(first_ids[i]), 1, "one consistent GetItem"
        ),
        Op(
            "checkpoints",
            "load_latest",
            lambda i: cps.load_latest(f"task{i}"),
            1,
            "one Query, newest first, Limit 1",
        ),
        Op(
            "checkpoints",
            "list (10 checkpoints)",
            lambda i: cps.list(f"all{i}"),
            1,
            "one Query page",
        ),
        Op(
            "checkpoints",
            "cleanup(keep=5) of 10",
            lambda i: cps.cleanup(f"clean{i}", 5),
            2,
            "one keys-only Query + one BatchWriteItem",
        ),
        Op(
            "checkpoints",
            "delete_all (10)",
            lambda i: cps.delete_all(f"all{i}"),
            2,
            "one keys-only Query + one BatchWriteItem",
        ),
    ]


def _idempotency_ops(env: BenchEnv, reps: int) -> list[Op]:
    backend = env.backend()
    idem = backend.idempotency
    n = reps + 1

    @backend.idempotent(key="order_id")
    def handler(order: dict[str, Any]) -> dict[str, Any]:
        return {"charged": order["order_id"]}

    for i in range(n):
        handler({"order_id": f"done{i}"})
    claims = [_must(idem.try_claim(f"claimed{i}").claim) for i in range(n)]
    released = [_must(idem.try_claim(f"rel{i}").claim) for i in range(n)]
    return [
        Op(
            "idempotency",
            "@idempotent first call",
            lambda i: handler({"order_id": f"new{i}"}),
            2,
            "claim (conditional write) + complete (conditional write)",
        ),
        Op(
            "idempotency",
            "@idempotent replay",
            lambda i: handler({"order_id": f"done{i}"}),
            1,
            "the refused claim returns the stored result (ReturnValuesOnConditionCheckFailure)",
        ),
        Op(
            "idempotency",
            "try_claim",
            lambda i: idem.try_claim(f"tc{i}"),
            1,
            "one conditional write",
        ),
        Op(
            "idempotency",
            "complete",
            lambda i: idem.complete(claims[i], {"ok": i}),
            1,
            "one conditional write",
        ),
        Op(
            "idempotency",
            "release",
            lambda i: idem.release(released[i]),
            1,
            "one conditional DeleteItem",
        ),
        Op("idempotency", "get", lambda i: idem.get(f"done{i}"), 1, "one consistent GetItem"),
        Op("idempotency", "delete", lambda i: idem.delete(f"done{i}"), 1, "one DeleteItem"),
    ]


def _outbox_ops(env: BenchEnv, reps: int) -> list[Op]:
    from dynacoord.outbox import Event

    backend = env.backend()
    outbox = backend.outbox
    shards = getattr(backend, "shards", 1)
    n = reps + 1
    # (this first publish also records the namespace's shard count, once per publisher)
    ids = outbox.publish([Event("bench.created", {"i": i}) for i in range(n)])

    # events that fail live in their own namespace, so the worker that fails them sees no others
    doomed = env.backend(namespace=backend.namespace + "f").outbox
    # A store reads the namespace's recorded shard count once (one GetItem), then lists and
    # counts from it: read it here, so the rows below show what every later call costs.
    doomed.stats()

    def fail_one(i: int) -> str:
        (event_id,) = doomed.publish(Event("bench.doomed", {"i": i}))
        doomed.worker({}, on_missing_handler="fail", heartbeat=False).run_once()
        return event_id

    failed_ids: dict[int, str] = {}

    def in_transaction(i: int) -> None:
        with backend.transaction() as tx:
            tx.put(env.table, {"pk": f"ORDER#{i}", "sk": "ORDER", "total": 42})
            tx.publish(Event("order.created", {"order": i}))

    def make_failed(i: int) -> None:
        failed_ids[i] = fail_one(i)

    deliver_ns = [f"{backend.namespace}d{i}" for i in range(n)]

    def publish_25_due(i: int) -> None:
        box = env.backend(namespace=deliver_ns[i]).outbox
        box.publish([Event("bench.tick", {"j": j}) for j in range(25)])

    def deliver_25(i: int) -> None:
        box = env.backend(namespace=deliver_ns[i]).outbox
        worker = box.worker(lambda event: None, batch_size=25, heartbeat=False)
        assert worker.run_once() == 25

    return [
        Op(
            "outbox",
            "publish (1 event)",
            lambda i: outbox.publish(Event("bench.one", i)),
            1,
            "one conditional PutItem",
        ),
        Op(
            "outbox",
            "publish (25 events)",
            lambda i: outbox.publish([Event("bench.many", j) for j in range(25)]),
            1,
            "one TransactWriteItems",
        ),
        Op(
            "outbox",
            "publish (100 events)",
            lambda i: outbox.publish([Event("bench.many", j) for j in range(100)]),
            1,
            "one TransactWriteItems (its 100-item limit)",
        ),
        Op("outbox", "get", lambda i: outbox.get(ids[i]), 1, "one consistent GetItem"),
        Op(
            "outbox",
            "transaction(): 1 business put + publish 1 event",
            in_transaction,
            1,
            "one TransactWriteItems",
        ),
        Op(
            "outbox",
            "pending()",
            lambda i: doomed.pending(),
            shards + 1,
            f"the namespace's shard count (1 GetItem: a long-lived reader sees a publisher with "
            f"more shards) and one gsi1 Query per shard ({shards})",
        ),
        Op(
            "outbox",
            "worker.run_once: 25 due events delivered",
            deliver_25,
            2 * shards + 3,
            "a new worker's first poll: the expired-lease scan of every shard's in_flight queue "
            f"({shards}) and the namespace's shard count (1 GetItem), the pending queues until "
            f"a batch is found (25 events spread over {shards} shards), one TransactWriteItems "
            "claiming the 25 and one storing their completions (a later poll skips the scan "
            "for lease/2)",
            prepare=publish_25_due,
        ),
        Op(
            "outbox",
            "retry(id) of a failed event",
            lambda i: doomed.retry(failed_ids[i]),
            1,
            "one conditional UpdateItem",
            prepare=make_failed,
        ),
        Op(
            "outbox",
            "failed()",
            lambda i: doomed.failed(),
            shards + 1,
            f"the namespace's shard count (1 GetItem) and one gsi1 Query per shard ({shards})",
        ),
        Op(
            "outbox",
            "stats()",
            lambda i: doomed.stats(),
            6 * shards + 1,
            f"the namespace's shard count (1 GetItem), a COUNT Query per shard ({shards}) for "
            "pending, due, in_flight, failed, and a one-item Query per shard for the oldest due "
            "event and the earliest expired lease (the lag)",
        ),
    ]


def _counter_ops(env: BenchEnv, reps: int) -> list[Op]:
    counters = env.backend().counters
    n = reps + 1
    for i in range(n):
        counters.increment(f"c{i}")
        counters.set_if_absent(f"flag{i}", "on")
        counters.join(f"join{i}", "first", expected=3)
        counters.increment(f"del{i}")
    return [
        Op(
            "counters",
            "increment (existing)",
            lambda i: counters.increment(f"c{i}"),
            1,
            "one atomic UpdateItem ADD",
        ),
        Op(
            "counters",
            "increment (new key, ttl)",
            lambda i: counters.increment(f"n{i}", ttl=600),
            1,
            "one atomic UpdateItem ADD",
        ),
        Op(
            "counters",
            "set_if_absent (absent)",
            lambda i: counters.set_if_absent(f"f{i}", "x"),
            1,
            "one conditional PutItem",
        ),
        Op(
            "counters",
            "set_if_absent (present)",
            lambda i: counters.set_if_absent(f"flag{i}", "x"),
            1,
            "one conditional PutItem",
        ),
        Op("counters", "get", lambda i: counters.get(f"c{i}"), 1, "one consistent GetItem"),
        Op("counters", "item", lambda i: counters.item(f"c{i}"), 1, "one consistent GetItem"),
        Op(
            "counters",
            "extend_ttl",
            lambda i: counters.extend_ttl(f"c{i}", 600),
            1,
            "one conditional UpdateItem",
        ),
        Op(
            "counters",
            "join arrive (new member)",
            lambda i: counters.join(f"join{i}", f"m{i}", expected=3),
            2,
            "the member's bucket, then its count carried to the join item (2 WCU whatever "
            "the member count; the join's generation read once per process)",
        ),
        Op(
            "counters",
            "join arrive (redelivered member)",
            lambda i: counters.join(f"join{i}", "first", expected=3),
            2,
            "the bucket refuses (member in it), the carry refuses and returns the state (it "
            "repairs a count a crash left uncarried)",
        ),
        Op(
            "counters",
            "delete",
            lambda i: counters.delete(f"del{i}"),
            1,
            "one UpdateItem: a counter or flag is deleted in place, keeping its counting slots "
            "until the TTL sweeper removes it (a join: DeleteItem after it)",
        ),
    ]


def _run_ops(env: BenchEnv, reps: int) -> list[Op]:
    import time

    runs = env.backend().runs
    n = reps + 1
    for i in range(n):
        runs.start(f"r{i}", context={"step": 0})
        runs.start(f"done{i}")
        runs.start(f"failed{i}")
    for i in range(3):
        runs.start(f"stalled{i}")
    time.sleep(0.05)
    stalled_ns = env.backend().namespace

    def one_stalled(i: int) -> None:
        env.backend(namespace=f"{stalled_ns}rc{i}").runs.start(f"stuck{i}")
        time.sleep(0.02)

    def reconcile(i: int) -> None:
        done = env.backend(namespace=f"{stalled_ns}rc{i}").runs.reconcile(0.01, lambda run: None)
        assert done.reconciled == 1, done

    return [
        Op(
            "runs",
            "reconcile (1 stalled run)",
            reconcile,
            5,
            "gsi1 Query + lock acquire + consistent re-read + touch + lock release",
            prepare=one_stalled,
        ),
        Op(
            "runs",
            "start",
            lambda i: runs.start(f"new{i}", context={"step": 0}),
            1,
            "one conditional PutItem",
        ),
        Op("runs", "get", lambda i: runs.get(f"r{i}"), 1, "one consistent GetItem"),
        Op("runs", "set", lambda i: runs.set(f"r{i}", "step", 1), 1, "one conditional UpdateItem"),
        Op("runs", "heartbeat", lambda i: runs.heartbeat(f"r{i}"), 1, "one conditional UpdateItem"),
        Op(
            "runs",
            "complete",
            lambda i: runs.complete(f"done{i}", {"ok": True}),
            1,
            "one conditional UpdateItem",
        ),
        Op(
            "runs",
            "fail",
            lambda i: runs.fail(f"failed{i}", "boom"),
            1,
            "one conditional UpdateItem",
        ),
        Op(
            "runs",
            "list('running', limit=10)",
            lambda i: list(runs.list("running", limit=10)),
            1,
            "one gsi1 Query",
        ),
        Op(
            "runs",
            "stalled(older_than=0.01)",
            lambda i: list(runs.stalled(0.01, limit=10)),
            1,
            "one gsi1 Query",
        ),
    ]


PRIMITIVES: list[tuple[str, Callable[[BenchEnv, int], list[Op]]]] = [
    ("locks", _lock_ops),
    ("cache", _cache_ops),
    ("breaker", _breaker_ops),
    ("checkpoints", _checkpoint_ops),
    ("idempotency", _idempotency_ops),
    ("outbox", _outbox_ops),
    ("counters", _counter_ops),
    ("runs", _run_ops),
]


class _RedisEnv:
    """Stands in for :class:`BenchEnv` so the same operations run on the Redis backend, counted in
    round trips (a pipeline or a script call is one)."""

    def __init__(self, env: BenchEnv, *, cluster: bool = False) -> None:
        from dynacoord.backends.redis import RedisBackend

        self._backend_class = RedisBackend
        self.scale = env.scale
        self.table = env.table
        self._counter = RedisCommandCounter()
        if cluster:
            # One pool per node: each node's connections count (a per-node pipeline is one).
            self._client = env.redis_cluster_client()
            for node in self._client.get_nodes():
                self._counter.attach(node.redis_connection)
                # The client's start-up left connections of the uncounted class in the pool.
                node.redis_connection.connection_pool.reset()
                node.redis_connection.ping()  # the handshake is not an operation's
        else:
            self._client = self._counter.attach(env.redis_client())
            self._client.ping()  # the connection handshake is not an operation's
        self.counter = self

    def backend(self, *, namespace: str | None = None, **_: Any) -> Any:
        return self._backend_class(self._client, namespace=namespace or unique("ns"))

    @contextlib.contextmanager
    def measure(self) -> Iterator[Counter[str]]:
        ops: Counter[str] = Counter()
        with self._counter.measure() as box:
            yield ops
        ops["round trips"] = box[0]

    def close(self) -> None:
        self._client.close()


def _redis_rows(
    env: BenchEnv, reps: int, *, cluster: bool = False
) -> tuple[list[dict[str, Any]], str | None]:
    """Round trips per operation on the Redis backend (no minimums: they are DynamoDB's), on
    the single redis-server or (``cluster``) the 3-primary Redis Cluster."""
    if cluster and env.redis_cluster is None:
        return [], f"no Redis Cluster: {env.redis_cluster_error}"
    if not cluster and env.redis is None:
        return [], f"no redis-server: {env.redis_error}"
    try:
        redis_env = _RedisEnv(env, cluster=cluster)
    except ImportError as exc:
        return [], f"Redis backend not available: {exc}"
    rows: list[dict[str, Any]] = []
    try:
        for _, make_ops in PRIMITIVES:
            # A first pass loads the Lua scripts into the server (EVALSHA -> NOSCRIPT -> SCRIPT
            # LOAD happens once per script); only the second pass is counted.
            for counted in (False, True):
                try:
                    ops = make_ops(redis_env, reps)  # type: ignore[arg-type]
                except Exception:
                    break
                for op in ops:
                    try:
                        row = _count(redis_env, op, reps)  # type: ignore[arg-type]
                    except Exception as exc:
                        row = {
                            "primitive": op.primitive,
                            "operation": op.operation,
                            "error": f"{type(exc).__name__}: {exc}",
                        }
                    if counted:
                        rows.append(row)
    finally:
        redis_env.close()
    return rows, None


def run(env: BenchEnv) -> dict[str, Any]:
    reps = env.scale.count_reps
    rows: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    for name, make_ops in PRIMITIVES:
        try:
            ops = make_ops(env, reps)
        except Exception as exc:
            logger.exception("request counts for %r could not be set up", name)
            missing[name] = f"{type(exc).__name__}: {exc}"
            continue
        for op in ops:
            try:
                rows.append(_count(env, op, reps))
            except Exception as exc:
                logger.exception("request count of %r failed", op.operation)
                rows.append(
                    {
                        "primitive": op.primitive,
                        "operation": op.operation,
                        "error": f"{type(exc).__name__}: {exc}",
                        "minimum": op.minimum,
                    }
                )
    redis_rows, redis_error = _redis_rows(env, reps)
    cluster_rows, cluster_error = _redis_rows(env, reps, cluster=True)
    return {
        "status": "ok" if rows else "error",
        "rows": rows,
        "redis_rows": redis_rows,
        "redis_error": redis_error,
        "redis_cluster_rows": cluster_rows,
        "redis_cluster_error": cluster_error,
        "missing": missing,
        "flagged": [r["operation"] for r in rows if r.get("above_minimum")],
    }
