"""Section 10: what each operation costs on DynamoDB, and the ceiling of one key.

Every public operation runs on DynamoDB Local through a :class:`~bench._units.UnitMeter`, which
reads the items each request touches before and after it on an unmetered client and counts
units by AWS's rules (not DynamoDB Local's ``ConsumedCapacity``, which counts a transaction as
one item): requests, table WCU, index WCU, RCU per operation, per partition, and refused
conditional writes. From them:

* **cost**: requests, units and $ per million operations at on-demand prices, beside the peers
  doing the same job in the same run;
* **ceilings**: the highest sustained rate on one key (or one namespace, where a listing index
  partition is shared) that DynamoDB's per-partition limits allow (1,000 WCU/s, 3,000 RCU/s),
  from the measured units on the busiest partition per operation.

The outbox delivery rows run the worker's configuration of the day (whatever ``outbox.worker``
defaults to) and the per-event option if the worker still has one; nothing about the design is
assumed here: what is sent is what is counted.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import threading
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from ._harness import BenchEnv, unique
from ._units import UnitMeter, Usage

__all__ = [
    "PARTITION_RCU",
    "PARTITION_WCU",
    "PRICE_DATE",
    "PRICE_READ",
    "PRICE_WRITE",
    "ceiling",
    "measure",
    "run",
]

#: us-east-1 on-demand prices, $ per million request units
PRICE_WRITE = 0.625
PRICE_READ = 0.125
PRICE_DATE = "as of 2026-11 (us-east-1, on-demand)"
#: DynamoDB's limits per partition (table or index), per second
PARTITION_WCU = 1000
PARTITION_RCU = 3000
#: the payload of every outbox event here, JSON-encoded
EVENT_BYTES = 384
#: the plainest polling outbox, the floor of a design with claims (see _peer_naive)
NAIVE_PEER = "put, claim out of the index, delete (raw boto3)"

_SHARD = re.compile(r"#\d+$")
_TABLE_SHARD = re.compile(r"#shard\d+$")


def _payload() -> dict[str, str]:
    # {"b": "xxx..."} is 9 bytes of JSON around the string
    return {"b": "x" * (EVENT_BYTES - 9)}


def usd_per_million(table_wcu: float, index_wcu: float, rcu: float) -> float:
    """$ per million operations that each cost these units (on-demand)."""
    return (table_wcu + index_wcu) * PRICE_WRITE + rcu * PRICE_READ


def ceiling(usage: Usage, ops: int, namespace: str = "", scope: str = "key") -> dict[str, Any]:
    """The highest sustained rate of the operations that cost ``usage`` (``ops`` of them)
    before one partition reaches its limit.

    ``scope="key"``: the rate of the operation on one key: a table partition (one item's key)
    is loaded by what one operation on it costs it (its units over the operations that touched
    it, ``usage.touches``). ``scope="namespace"``: the rate of operations on any keys of one
    namespace: a partition is loaded by its units over all ``ops``. Either way, an index
    partition is shared by the namespace's keys (units over all ``ops``), and the partitions of
    one sharded key (``...#<n>`` on the index, ``...#shard<n>`` on the table) are taken as
    evenly loaded: their mean, not the luckiest draw of the sample."""

    def per_partition(units: Counter[str]) -> dict[str, float]:
        groups: dict[str, list[float]] = defaultdict(list)
        for partition, value in units.items():
            if not partition.startswith("table:"):
                label = _SHARD.sub("#{shard}", partition)
                groups[label].append(value / ops)
            elif _TABLE_SHARD.search(partition):
                groups[_TABLE_SHARD.sub("#shard{n}", partition)].append(value / ops)
            elif scope == "key":
                groups[partition].append(value / max(1, usage.touches.get(partition, ops)))
            else:
                groups[partition].append(value / ops)
        return {g: sum(v) / len(v) for g, v in groups.items()}

    def name(label: str) -> str:
        return label.replace(namespace, "{ns}") if namespace else label

    candidates: list[tuple[float, str, str]] = []
    for units, limit, kind in (
        (usage.partition_wcu, PARTITION_WCU, "WCU"),
        (usage.partition_rcu, PARTITION_RCU, "RCU"),
    ):
        loads = per_partition(units)
        if loads:
            label, load = max(loads.items(), key=lambda kv: kv[1])
            if load > 0:
                candidates.append((limit / load, name(label), f"{load:.3g} {kind}/op"))
    if not candidates:
        return {"per_s": None, "partition": None, "load": None}
    rate, busiest, busiest_load = min(candidates)
    return {"per_s": round(rate), "partition": busiest, "load": busiest_load}


class _Metered:
    """A metered client and a backend on it, plus an unmetered one for setting things up."""

    def __init__(self, env: BenchEnv, **backend_kwargs: Any) -> None:
        self.client = env.new_client(counted=False)
        self.peek = env.new_client(counted=False)
        self.meter = UnitMeter(self.client, self.peek)
        self.namespace = unique("cost")
        self.backend = env.backend(namespace=self.namespace, client=self.client, **backend_kwargs)
        self.plain = env.backend(namespace=self.namespace, client=self.peek, **backend_kwargs)
        self.table = env.table

    def measure(
        self,
        call: Callable[[int], object],
        reps: int,
        prepare: Callable[[int], object] | None = None,
    ) -> Usage:
        """The usage of ``call(i)`` for ``i`` in ``range(reps)`` (``prepare(i)`` not counted)."""
        total = Usage()
        for i in range(reps):
            if prepare is not None:
                prepare(i)
            start = self.meter.usage()
            call(i)
            total = total + _spent(self.meter, start)
        return total

    def close(self) -> None:
        self.meter.close()


def _spent(meter: UnitMeter, start: Usage) -> Usage:
    """The usage of one operation since ``start``, with the partitions it touched."""
    spent = meter.usage() - start
    spent.touches = Counter(set(spent.partition_wcu) | set(spent.partition_rcu))
    return spent


def _row(
    primitive: str,
    operation: str,
    usage: Usage,
    ops: int,
    *,
    note: str = "",
    peer: str | None = None,
    namespace: str = "",
    scope: str = "key",
    period: float | None = None,
) -> dict[str, Any]:
    """One row of the cost table. ``period``: the operation reads through a per-process cache
    of that many seconds, so its ceiling is a number of processes (each reading once a
    period), not a rate of calls."""
    table, index, rcu = usage.wcu / ops, usage.index_wcu / ops, usage.rcu / ops
    limit = ceiling(usage, ops, namespace, scope)
    if period is not None and limit["per_s"] is not None:
        # per_s is the rate of reads (one a touch); a process reads once a period
        limit = {
            "per_s": None,
            "processes": round(limit["per_s"] * period),
            "partition": limit["partition"],
            "load": limit["load"] + f" per process every {period:g} s",
        }
    return {
        "primitive": primitive,
        "operation": operation,
        "peer": peer,
        "ops": ops,
        "requests": round(usage.total_requests / ops, 3),
        "apis": {k: round(v / ops, 3) for k, v in sorted(usage.requests.items())},
        "table_wcu": round(table, 3),
        "index_wcu": round(index, 3),
        "rcu": round(rcu, 3),
        "usd_per_million": round(usd_per_million(table, index, rcu), 3),
        "refusals": round(sum(usage.refusals.values()) / ops, 3),
        "refused_items": round(usage.refused_items / ops, 3),
        "ceiling": limit,
        "note": note
        if peer is None or not limit.get("per_s")
        else f"{note}; ceiling {limit['per_s']:,}/s on `{limit['partition']}`".lstrip("; "),
    }


# -- dynacoord's operations -----------------------------------------------------------------------


def _locks(env: BenchEnv, reps: int) -> list[dict[str, Any]]:
    m = _Metered(env)
    rows = []
    try:
        locks = m.backend.locks
        leases: list[Any] = []
        usage = m.measure(lambda i: leases.append(locks.acquire(f"k{i}", ttl=60)), reps)
        rows.append(_row("locks", "acquire (free key)", usage, reps, namespace=m.namespace))
        usage = m.measure(lambda i: leases[i].extend(), reps)
        rows.append(_row("locks", "extend", usage, reps, namespace=m.namespace))
        usage = m.measure(lambda i: leases[i].release(), reps)
        rows.append(_row("locks", "release", usage, reps, namespace=m.namespace))

        def cycle(i: int) -> None:
            lease = locks.acquire("hot", ttl=60)
            assert lease is not None
            lease.release()

        usage = m.measure(cycle, reps)
        rows.append(
            _row(
                "locks",
                "acquire + release (one key, again and again)",
                usage,
                reps,
                namespace=m.namespace,
                note="the released item is kept (its fence), so a later acquire rewrites it",
            )
        )
        rows.append(_handoff(env, m, max(2, reps // 4)))
    finally:
        m.close()
    return rows


def _handoff(env: BenchEnv, m: _Metered, rounds: int) -> dict[str, Any]:
    """A blocking acquire of a key another process holds and releases after ``HOLD`` s: the
    waiter's requests and units per acquisition (the holder's are not counted)."""
    hold = 0.5
    holder = m.plain.locks  # another Locks object: no in-process hand-off between the two
    waiter = m.backend.locks
    waited: list[float] = []

    def wait(i: int) -> None:
        lease = holder.acquire(f"handoff{i}", ttl=30)
        assert lease is not None
        timer = threading.Timer(hold, lease.release)
        timer.start()
        start = time.perf_counter()
        got = waiter.acquire(f"handoff{i}", ttl=30, timeout=10)
        waited.append(time.perf_counter() - start)
        timer.join()
        assert got is not None
        got.release()

    usage = m.measure(wait, rounds)
    return _row(
        "locks",
        f"blocking acquire: hand-off wait (held, released after {hold} s)",
        usage,
        rounds,
        namespace=m.namespace,
        note=(
            f"per acquisition, the waiter's release included; waited {min(waited):.2f}-"
            f"{max(waited):.2f} s; the cost grows with the wait"
        ),
    )


def _breaker(env: BenchEnv, reps: int) -> list[dict[str, Any]]:
    m = _Metered(env)
    try:
        breaker = m.backend.breaker("svc", failure_threshold=10**6, reset_timeout=60)

        def fail(i: int) -> None:
            with contextlib.suppress(RuntimeError):
                breaker.call(_boom)

        failure = m.measure(fail, reps)
        breaker.call(lambda: None)  # the first success after failures resets the count (a write)
        closed = m.measure(lambda i: breaker.call(lambda: None), reps)
        cached = m.backend.breaker("svc", failure_threshold=10**6, state_cache=5.0)
        state_cache = m.measure(lambda i: cached.call(lambda: None), reps)
        return [
            _row("breaker", "protected call, closed", closed, reps, namespace=m.namespace),
            _row("breaker", "protected call, failure", failure, reps, namespace=m.namespace),
            _row(
                "breaker",
                "protected call, closed, state_cache=5",
                state_cache,
                reps,
                namespace=m.namespace,
                note=f"{reps} calls within 5 s in one process: one read",
                period=5.0,
            ),
        ]
    finally:
        m.close()


def _boom() -> None:
    raise RuntimeError("dependency down")


def _cache(env: BenchEnv, reps: int) -> list[dict[str, Any]]:
    m = _Metered(env)
    try:
        cache = m.backend.cache()
        for i in range(reps):
            m.plain.cache().set(f"hit{i}", {"v": i})
        m.plain.cache().set("hot", {"v": 1})
        rows = [
            _row(
                "cache",
                "get (hit)",
                m.measure(lambda i: cache.get(f"hit{i}"), reps),
                reps,
                namespace=m.namespace,
            ),
            _row(
                "cache",
                "set (one key, again and again)",
                m.measure(lambda i: cache.set("hot", {"v": i}), reps),
                reps,
                namespace=m.namespace,
            ),
            _row(
                "cache",
                "set (a new key each time)",
                m.measure(lambda i: cache.set(f"new{i}", {"v": i}), reps),
                reps,
                namespace=m.namespace,
                scope="namespace",
                note="each key's index entry lands on one of the namespace's index shards",
            ),
            _row(
                "cache",
                "get_or_set (miss: computes and stores)",
                m.measure(lambda i: cache.get_or_set(f"gos{i}", lambda: {"v": 1}), reps),
                reps,
                namespace=m.namespace,
            ),
            _row(
                "cache",
                "get_or_set (hit)",
                m.measure(lambda i: cache.get_or_set(f"gos{i}", lambda: {"v": 1}), reps),
                reps,
                namespace=m.namespace,
            ),
            _row(
                "cache",
                "get (one key, again and again)",
                m.measure(lambda i: cache.get("hot"), reps),
                reps,
                namespace=m.namespace,
            ),
        ]
        local = m.backend.cache(local_ttl=5)
        rows.append(
            _row(
                "cache",
                "get (one key), local_ttl=5",
                m.measure(lambda i: local.get("hot"), reps),
                reps,
                namespace=m.namespace,
                note=f"{reps} gets within 5 s in one process: one read",
                period=5.0,
            )
        )
        return rows
    finally:
        m.close()


def _checkpoints(env: BenchEnv, reps: int) -> list[dict[str, Any]]:
    m = _Metered(env)
    try:
        cps = m.backend.checkpoints
        m.plain.checkpoints.save("task", {"step": -1})
        save = m.measure(lambda i: cps.save("task", {"step": i}), reps)
        latest = m.measure(lambda i: cps.load_latest("task"), reps)
        return [
            _row(
                "checkpoints",
                "save (next sequence, one task)",
                save,
                reps,
                namespace=m.namespace,
            ),
            _row("checkpoints", "load_latest (one task)", latest, reps, namespace=m.namespace),
        ]
    finally:
        m.close()


def _idempotency(env: BenchEnv, reps: int) -> list[dict[str, Any]]:
    m = _Metered(env)
    try:

        @m.backend.idempotent(key="order_id")
        def handler(order: dict[str, Any]) -> dict[str, Any]:
            return {"ok": True, "order_id": order["order_id"]}

        first = m.measure(lambda i: handler({"order_id": f"o{i}"}), reps)
        replay = m.measure(lambda i: handler({"order_id": f"o{i}"}), reps)
        return [
            _row("idempotency", "@idempotent first call", first, reps, namespace=m.namespace),
            _row("idempotency", "@idempotent replay", replay, reps, namespace=m.namespace),
        ]
    finally:
        m.close()


def _counters(env: BenchEnv, reps: int) -> list[dict[str, Any]]:
    m = _Metered(env)
    try:
        counters = m.backend.counters
        m.plain.counters.increment("hot")
        increment = m.measure(lambda i: counters.increment("hot"), reps)
        sharded = counters.sharded("spread", shards=8)
        spread = m.measure(lambda i: sharded.increment(), reps * 8)
        expected = reps + 1
        m.plain.counters.join("fan", "warm", expected=expected)
        counters.join("other", "warm", expected=2)  # the join's generation read, once a process
        arrive = m.measure(lambda i: counters.join("fan", f"m{i}", expected=expected), reps)
        return [
            _row("counters", "increment (one key)", increment, reps, namespace=m.namespace),
            _row(
                "counters",
                "sharded(shards=8).increment",
                spread,
                reps * 8,
                namespace=m.namespace,
            ),
            _row(
                "counters",
                "join arrive (one join, a new member each)",
                arrive,
                reps,
                namespace=m.namespace,
                note="the first arrival of a process reads the join's generation once (not here)",
            ),
        ]
    finally:
        m.close()


def _runs(env: BenchEnv, reps: int) -> list[dict[str, Any]]:
    m = _Metered(env)
    try:
        runs = m.backend.runs
        start = m.measure(lambda i: runs.start(f"r{i}", context={"step": 0}), reps)
        heartbeat = m.measure(lambda i: runs.heartbeat(f"r{i}"), reps)
        complete = m.measure(lambda i: runs.complete(f"r{i}", {"ok": True}), reps)
        return [
            _row("runs", "start", start, reps, namespace=m.namespace, scope="namespace"),
            _row("runs", "heartbeat", heartbeat, reps, namespace=m.namespace, scope="namespace"),
            _row("runs", "complete", complete, reps, namespace=m.namespace, scope="namespace"),
        ]
    finally:
        m.close()


# -- the outbox -----------------------------------------------------------------------------------


def _publish(outbox: Any, n: int, per_call: int) -> list[str]:
    from dynacoord.outbox import Event

    ids: list[str] = []
    for offset in range(0, n, per_call):
        batch = [Event("bench.cost", _payload()) for _ in range(min(per_call, n - offset))]
        ids += outbox.publish(batch if per_call > 1 else batch[0])
    return ids


def _worker_options(outbox: Any) -> set[str]:
    """The worker options of the checkout measured (its WorkerOptions' names, or, before the
    options were an object, the keywords of ``outbox.worker``)."""
    try:
        from dynacoord.outbox.options import OPTION_NAMES
    except ImportError:
        return set(inspect.signature(outbox.worker).parameters)
    return set(OPTION_NAMES)


def _deliver(
    m: _Metered, ids: list[str], threads: int, options: dict[str, Any], delay: float = 0.0
) -> tuple[Usage, float, int]:
    """Deliver ``ids`` with ``threads`` workers of ``m.backend``'s outbox, each handler call
    taking ``delay`` seconds; (usage, seconds, duplicates)."""
    outbox = m.backend.outbox
    delivered: list[str] = []
    wanted = set(ids)

    def handler(event: Any) -> None:
        if delay:
            time.sleep(delay)
        delivered.append(event.id)

    stop = threading.Event()
    workers = [
        outbox.worker(handler, poll_interval=0.05, name=f"cost-{i}", **options)
        for i in range(threads)
    ]
    pool = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in workers]
    before = m.meter.usage()
    started = time.perf_counter()
    for thread in pool:
        thread.start()
    deadline = started + 60 + (0.1 + delay) * len(ids)
    while time.perf_counter() < deadline and not wanted <= set(delivered):
        time.sleep(0.01)
    stop.set()
    for thread in pool:
        thread.join(timeout=60)
    seconds = time.perf_counter() - started
    missing = wanted - set(delivered)
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(ids)} events not delivered in {seconds:.0f} s")
    counts = Counter(delivered)
    return m.meter.usage() - before, seconds, sum(c - 1 for c in counts.values() if c > 1)


def _stream_records(m: _Metered, ids: list[str]) -> list[dict[str, Any]]:
    """The stream's INSERT records of ``ids`` (new images read on the unmetered client)."""
    store: Any = m.plain.outbox._store
    records = []
    for seq, event_id in enumerate(ids):
        item = m.peek.get_item(TableName=m.table, Key=store._key(event_id), ConsistentRead=True)
        records.append(
            {
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "dynamodb": {
                    "NewImage": item["Item"],
                    "SequenceNumber": f"{seq:021d}",
                    "StreamViewType": "NEW_AND_OLD_IMAGES",
                },
            }
        )
    return records


def _outbox(env: BenchEnv, events: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"events": events, "event_payload_bytes": EVENT_BYTES}
    # publish: one event per call, and 25 per call
    m = _Metered(env)
    try:
        outbox = m.backend.outbox
        _publish(outbox, 1, 1)  # the store records the namespace's shard count once: not per event
        one = m.measure(lambda i: _publish(outbox, 1, 1), events)
        rows.append(
            _row(
                "outbox",
                "publish (1 event per call)",
                one,
                events,
                namespace=m.namespace,
                scope="namespace",
            )
        )
        many = m.measure(lambda i: _publish(outbox, 25, 25), max(1, events // 25))
        rows.append(
            _row(
                "outbox",
                "publish (25 events per call), per event",
                many,
                25 * max(1, events // 25),
                namespace=m.namespace,
                scope="namespace",
            )
        )
        publish_usage, publish_ops, publish_ns = one, events, m.namespace
    finally:
        m.close()
    options = _worker_options(env.backend().outbox)
    paths: list[tuple[str, dict[str, Any], int]] = [("default worker", {}, 1)]
    if "batch_claim" in options:
        paths.append(("worker, batch_claim=False", {"batch_claim": False}, 1))
    else:
        extra["per_event_option"] = "the worker has no batch_claim option in this checkout"
    paths.append(("default worker, 4 threads", {}, 4))
    for label, worker_options, threads in paths:
        m = _Metered(env)
        try:
            n = events * threads
            ids = _publish(m.plain.outbox, n, 25)
            usage, seconds, duplicates = _deliver(m, ids, threads, worker_options)
            row = _row(
                "outbox",
                f"delivery per event: {label}",
                usage,
                n,
                namespace=m.namespace,
                scope="namespace",
                note=f"{n} events, {seconds:.1f} s, duplicates {duplicates}; polls included",
            )
            row["threads"] = threads
            row["options"] = worker_options or "defaults"
            # the namespace's ceiling: publishing and delivering at the same rate
            row["ceiling"] = ceiling(
                _scaled(publish_usage, n / publish_ops, publish_ns, m.namespace) + usage,
                n,
                m.namespace,
                "namespace",
            )
            row["ceiling_note"] = "publish (1 event per call) + this delivery, per event"
            rows.append(row)
        finally:
            m.close()
    rows.append(_slow_handler(env, tiny=events < 25))
    rows += _transactional(env, events)
    m = _Metered(env)
    try:
        ids = _publish(m.plain.outbox, events, 25)
        relay = m.backend.outbox.stream_handler(lambda event: None)
        records = _stream_records(m, ids)
        before = m.meter.usage()
        for start in range(0, len(records), 100):  # Lambda's default batch size
            relay({"Records": records[start : start + 100]})
        usage = m.meter.usage() - before
        row = _row(
            "outbox",
            "delivery per event: stream relay (stream_handler)",
            usage,
            events,
            namespace=m.namespace,
            scope="namespace",
            note=(
                "the relay's claim and outcome writes; the stream's reads are not billed to "
                "the table (see the note)"
            ),
        )
        row["ceiling"] = ceiling(
            _scaled(publish_usage, events / publish_ops, publish_ns, m.namespace) + usage,
            events,
            m.namespace,
            "namespace",
        )
        row["ceiling_note"] = "publish (1 event per call) + this delivery, per event"
        rows.append(row)
    finally:
        m.close()
    return rows, extra


#: the slow-handler case: each handler call takes 1/60 of the worker's lease (0.5 s of the
#: default 30 s), in batches of 25, so the lease keeper extends the batch's leases while it runs
SLOW_HANDLER_LEASE_FRACTION = 1 / 60
SLOW_BATCH = 25
SLOW_OPERATION = "delivery per event: default worker, slow handler"
TX_OPERATION = "publish inside backend.transaction() (a business item + 1 event), per transaction"
TX_ALONE_OPERATION = "the same business item alone (PutItem), per write"
TX_SHARE_OPERATION = "publish inside backend.transaction(): the event's share"


def _slow_handler(env: BenchEnv, *, tiny: bool) -> dict[str, Any]:
    """The default worker with a handler that takes 1/60 of the lease per event (0.5 s of the
    default 30 s; 0.05 s of a 3 s lease on the tiny scale): one batch of 25."""
    lease = 3.0 if tiny else 30.0
    delay = lease * SLOW_HANDLER_LEASE_FRACTION
    m = _Metered(env)
    try:
        ids = _publish(m.plain.outbox, SLOW_BATCH, 25)
        usage, seconds, duplicates = _deliver(
            m, ids, 1, {"lease": lease, "batch_size": SLOW_BATCH}, delay=delay
        )
        row = _row(
            "outbox",
            SLOW_OPERATION,
            usage,
            SLOW_BATCH,
            namespace=m.namespace,
            scope="namespace",
            note=(
                f"{SLOW_BATCH} events, handler {delay:g} s each, lease {lease:g} s (a batch "
                f"outlives a third of its lease, so the lease keeper extends it); "
                f"{seconds:.1f} s, duplicates {duplicates}; polls included"
            ),
        )
        row["threads"] = 1
        row["options"] = {"lease": lease, "batch_size": SLOW_BATCH, "handler_s": delay}
        return row
    finally:
        m.close()


def _order_item(pk: str) -> dict[str, Any]:
    """A business item of ~250 bytes (an order), as the transactional publish writes it."""
    return {"pk": pk, "sk": "ORDER", "total": "12.50", "lines": "x" * 200}


def _transactional(env: BenchEnv, events: int) -> list[dict[str, Any]]:
    """The transactional outbox: a business item and one event in one
    ``backend.transaction()``, beside the business item written alone; their difference is
    what the event adds to the business write."""
    from dynacoord.outbox import Event

    m = _Metered(env)
    try:
        _publish(m.backend.outbox, 1, 1)  # the namespace's shard count, recorded once
        prefix = unique("ORDER#")

        def with_event(i: int) -> None:
            with m.backend.transaction() as tx:
                tx.put(m.table, _order_item(f"{prefix}#{i}"), condition="attribute_not_exists(pk)")
                tx.publish(Event("bench.cost", _payload()))

        def alone(i: int) -> None:
            item = _order_item(f"{prefix}#alone#{i}")
            m.client.put_item(
                TableName=m.table,
                Item={k: {"S": v} for k, v in item.items()},
                ConditionExpression="attribute_not_exists(pk)",
            )

        together = m.measure(with_event, events)
        single = m.measure(alone, events)
        share = together - single
        share.touches = together.touches
        return [
            _row(
                "outbox", TX_OPERATION, together, events, namespace=m.namespace, scope="namespace"
            ),
            _row("outbox", TX_ALONE_OPERATION, single, events, note="no event: the baseline"),
            _row(
                "outbox",
                TX_SHARE_OPERATION,
                share,
                events,
                namespace=m.namespace,
                scope="namespace",
                note="the transaction minus the business item alone: what the event adds",
            ),
        ]
    finally:
        m.close()


# -- the whole life of an event ---------------------------------------------------------------------

#: the parts of an event's life: (design, its publish row, its delivery row, its peers)
LIFE_DESIGNS: list[tuple[str, str, str, tuple[str, ...]]] = [
    (
        "polling worker (default)",
        "publish (1 event per call)",
        "delivery per event: default worker",
        ("polling publisher (raw boto3)", NAIVE_PEER),
    ),
    (
        "polling worker, slow handler (lease extensions)",
        "publish (1 event per call)",
        SLOW_OPERATION,
        (),
    ),
    (
        "stream relay (stream_handler, claim=False)",
        "publish (1 event per call)",
        "delivery per event: stream relay (stream_handler)",
        ("DynamoDB Streams + Lambda, no write-back",),
    ),
    (
        "publish inside backend.transaction(), polling worker",
        TX_SHARE_OPERATION,
        "delivery per event: default worker",
        (),
    ),
]
_LIFE_FIELDS = ("table_wcu", "index_wcu", "rcu", "requests", "refusals")


def whole_life(publish: dict[str, Any], delivery: dict[str, Any]) -> dict[str, Any]:
    """One event's whole life from its publish row and its delivery row (both per event):
    each part's table WCU, index WCU, RCU and requests, their sums, write units in all and
    $ per million events at on-demand prices."""
    parts = {
        name: {field: row.get(field, 0.0) for field in _LIFE_FIELDS}
        for name, row in (("publish", publish), ("delivery", delivery))
    }
    total = {field: round(sum(part[field] for part in parts.values()), 3) for field in _LIFE_FIELDS}
    return {
        **parts,
        **total,
        "wcu": round(total["table_wcu"] + total["index_wcu"], 3),
        "usd_per_million": round(
            usd_per_million(total["table_wcu"], total["index_wcu"], total["rcu"]), 3
        ),
    }


def _whole_lives(
    rows: list[dict[str, Any]], peers: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(the whole-life table, its rows for the cost table, its peers' rows)."""
    ours = {r["operation"]: r for r in rows if r["primitive"] == "outbox" and r["peer"] is None}
    theirs: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in peers:
        if r["primitive"] == "outbox":
            theirs[r["peer"]][r["operation"]] = r
    table: list[dict[str, Any]] = []
    life_rows: list[dict[str, Any]] = []
    peer_rows: list[dict[str, Any]] = []
    for design, publish, delivery, peers in LIFE_DESIGNS:
        if publish not in ours or delivery not in ours:
            continue
        life = whole_life(ours[publish], ours[delivery])
        entry: dict[str, Any] = {"design": design, "parts": [publish, delivery], **life}
        life_rows.append(_life_row(design, life, None))
        entry["peers"] = []
        for peer in peers:
            parts = theirs.get(peer, {})
            if {"publish (1 event per call)", "delivery per event"} <= set(parts):
                peer_life = whole_life(
                    parts["publish (1 event per call)"], parts["delivery per event"]
                )
                entry["peers"].append({"by": peer, **peer_life})
                peer_rows.append(_life_row(design, peer_life, peer))
        table.append(entry)
    return table, life_rows, peer_rows


def _life_row(design: str, life: dict[str, Any], peer: str | None) -> dict[str, Any]:
    """A whole life as a row of the cost table (per event)."""
    return {
        "primitive": "outbox",
        "operation": f"whole life per event: {design}",
        "peer": peer,
        "ops": 1,
        "requests": life["requests"],
        "apis": {},
        "table_wcu": life["table_wcu"],
        "index_wcu": life["index_wcu"],
        "rcu": life["rcu"],
        "usd_per_million": life["usd_per_million"],
        "refusals": life["refusals"],
        "refused_items": 0.0,
        "ceiling": {"per_s": None, "partition": None, "load": None},
        "note": (
            f"publish {life['publish']['table_wcu']:g} + {life['publish']['index_wcu']:g} "
            f"index, delivery {life['delivery']['table_wcu']:g} + "
            f"{life['delivery']['index_wcu']:g} index WCU; {life['wcu']:g} WCU in all"
        ),
    }


def _scaled(usage: Usage, factor: float, namespace: str, to: str) -> Usage:
    """``usage`` as if its operations had run ``factor`` times as often in namespace ``to``
    instead of ``namespace`` (so its partitions add up with those of ``to``)."""
    out = usage.copy()
    out.wcu = round(usage.wcu * factor)
    out.index_wcu = round(usage.index_wcu * factor)
    out.rcu = usage.rcu * factor
    for name in ("partition_wcu", "partition_rcu"):
        units: Counter[str] = getattr(usage, name)
        setattr(
            out, name, Counter({k.replace(namespace, to): v * factor for k, v in units.items()})
        )
    return out


# -- peers ----------------------------------------------------------------------------------------


def _peer_plain_add(env: BenchEnv, reps: int) -> dict[str, Any]:
    m = _Metered(env)
    try:
        key = {"pk": {"S": f"RAWCOUNTER#{unique('c')}"}, "sk": {"S": "COUNTER"}}
        usage = m.measure(
            lambda i: m.client.update_item(
                TableName=m.table,
                Key=key,
                UpdateExpression="ADD n :one",
                ExpressionAttributeValues={":one": {"N": "1"}},
                ReturnValues="UPDATED_NEW",
            ),
            reps,
        )
        return _row(
            "counters",
            "increment (one key)",
            usage,
            reps,
            peer="plain ADD (raw boto3 UpdateItem)",
            note="no recognition of its own retried write (a lost response can count twice)",
        )
    finally:
        m.close()


def _peer_lock(env: BenchEnv, reps: int) -> dict[str, Any]:
    import datetime

    import boto3
    from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient

    table = unique("pylock")
    setup = env.new_client(counted=False)
    DynamoDBLockClient.create_dynamodb_table(setup, table_name=table)
    resource = boto3.resource(
        "dynamodb",
        endpoint_url=env.ddb.endpoint_url,
        aws_access_key_id="dynacoord",
        aws_secret_access_key="dynacoord",
        region_name="us-east-1",
    )
    meter = UnitMeter(resource.meta.client, env.new_client(counted=False))
    lock_client = DynamoDBLockClient(
        resource, table_name=table, heartbeat_period=datetime.timedelta(seconds=1)
    )
    try:
        total = Usage()
        for i in range(reps):
            start = meter.usage()
            lock = lock_client.acquire_lock(f"k{i}")
            lock.release(best_effort=False)
            total = total + _spent(meter, start)
    finally:
        lock_client.close()
        meter.close()
    return _row(
        "locks",
        "acquire + release (free key)",
        total,
        reps,
        peer="python-dynamodb-lock",
        note="its own table (no index); no fencing token",
    )


def _peer_powertools(env: BenchEnv, reps: int) -> list[dict[str, Any]]:
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
        idempotent_function,
    )

    from dynacoord.provision import create_table

    table = unique("powertools")
    create_table(env.new_client(counted=False), table)
    client = env.new_client(counted=False)
    meter = UnitMeter(client, env.new_client(counted=False))
    persistence = DynamoDBPersistenceLayer(
        table_name=table, boto3_client=client, key_attr="pk", sort_key_attr="sk"
    )
    config = IdempotencyConfig(event_key_jmespath="order_id", use_local_cache=False)

    @idempotent_function(  # type: ignore[untyped-decorator,unused-ignore]
        data_keyword_argument="order", persistence_store=persistence, config=config
    )
    def handler(order: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "order_id": order["order_id"]}

    rows = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # no Lambda context here
            for case in ("first call", "replay"):
                total = Usage()
                for i in range(reps):
                    start = meter.usage()
                    handler(order={"order_id": f"o{i}"})
                    total = total + _spent(meter, start)
                rows.append(
                    _row(
                        "idempotency",
                        f"@idempotent {case}",
                        total,
                        reps,
                        peer="Powertools idempotency",
                        note="a table of dynacoord's shape (pk/sk, gsi1), no local cache",
                    )
                )
    finally:
        meter.close()
    return rows


def _raw_event_item(event_id: str, *, index: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "pk": {"S": f"RAWOUTBOX#{event_id}"},
        "sk": {"S": "EVENT"},
        "type": {"S": "bench.cost"},
        "payload": {"S": json.dumps(_payload())},
        "status": {"S": "pending"},
        "attempts": {"N": "0"},
        "created_ms": {"N": str(int(time.time() * 1000))},
    }
    if index is not None:
        item["gsi1pk"] = {"S": index}
        item["gsi1sk"] = {"S": f"{int(time.time() * 1000):015d}#{event_id}"}
    return item


def _peer_polling(env: BenchEnv, events: int) -> list[dict[str, Any]]:
    """A plain polling publisher on raw boto3: PutItem into a pending index partition; a worker
    Queries it (25 a page), claims each event with a conditional UpdateItem that moves it to the
    in-flight partition (for recovery of a dead worker's events), and completes it with an
    UpdateItem that takes it out of the index."""
    m = _Metered(env)
    prefix = unique("RAWOUTBOX")
    try:
        ids = [unique("e") for _ in range(events)]
        publish = m.measure(
            lambda i: m.client.put_item(
                TableName=m.table,
                Item=_raw_event_item(ids[i], index=f"{prefix}#pending"),
                ConditionExpression="attribute_not_exists(pk)",
            ),
            events,
        )
        before = m.meter.usage()
        done = 0
        while done < events:
            page = m.client.query(
                TableName=m.table,
                IndexName="gsi1",
                KeyConditionExpression="gsi1pk = :p",
                ExpressionAttributeValues={":p": {"S": f"{prefix}#pending"}},
                Limit=25,
            )["Items"]
            if not page:
                break
            for item in page:
                token = unique("t")
                now = int(time.time() * 1000)
                try:
                    m.client.update_item(
                        TableName=m.table,
                        Key={"pk": item["pk"], "sk": item["sk"]},
                        ConditionExpression="#s = :pending",
                        UpdateExpression=(
                            "SET #s = :in_flight, lease = :t, gsi1pk = :ipk, gsi1sk = :until "
                            "ADD attempts :one"
                        ),
                        ExpressionAttributeNames={"#s": "status"},
                        ExpressionAttributeValues={
                            ":pending": {"S": "pending"},
                            ":in_flight": {"S": "in_flight"},
                            ":t": {"S": token},
                            ":ipk": {"S": f"{prefix}#in_flight"},
                            ":until": {"S": f"{now + 30_000:015d}"},
                            ":one": {"N": "1"},
                        },
                    )
                except m.client.exceptions.ConditionalCheckFailedException:
                    continue
                m.client.update_item(
                    TableName=m.table,
                    Key={"pk": item["pk"], "sk": item["sk"]},
                    ConditionExpression="lease = :t",
                    UpdateExpression="SET #s = :done, #ttl = :ttl REMOVE gsi1pk, gsi1sk, lease",
                    ExpressionAttributeNames={"#s": "status", "#ttl": "ttl"},
                    ExpressionAttributeValues={
                        ":t": {"S": token},
                        ":done": {"S": "completed"},
                        ":ttl": {"N": str(now // 1000 + 7 * 86400)},
                    },
                )
                done += 1
        delivery = m.meter.usage() - before
        return [
            _row(
                "outbox",
                "publish (1 event per call)",
                publish,
                events,
                peer="polling publisher (raw boto3)",
                namespace=prefix,
                scope="namespace",
            ),
            _row(
                "outbox",
                "delivery per event",
                delivery,
                max(1, done),
                peer="polling publisher (raw boto3)",
                namespace=prefix,
                scope="namespace",
                note="Query 25 per page, a claim and a completion per event (1 thread)",
            ),
        ]
    finally:
        m.close()


def _peer_naive(env: BenchEnv, events: int) -> list[dict[str, Any]]:
    """The plainest polling outbox on raw boto3: PutItem into a sparse pending index
    partition; a worker Queries it (25 a page), claims each event with a conditional UpdateItem
    that takes it out of the index, and deletes it once handled. Nothing lists a claimed event,
    so one whose worker died is never delivered: the floor a design with recovery is set
    against."""
    m = _Metered(env)
    prefix = unique("RAWOUTBOX")
    try:
        ids = [unique("e") for _ in range(events)]
        publish = m.measure(
            lambda i: m.client.put_item(
                TableName=m.table,
                Item=_raw_event_item(ids[i], index=f"{prefix}#pending"),
                ConditionExpression="attribute_not_exists(pk)",
            ),
            events,
        )
        before = m.meter.usage()
        done = 0
        while done < events:
            page = m.client.query(
                TableName=m.table,
                IndexName="gsi1",
                KeyConditionExpression="gsi1pk = :p",
                ExpressionAttributeValues={":p": {"S": f"{prefix}#pending"}},
                Limit=25,
            )["Items"]
            if not page:
                break
            for item in page:
                token = unique("t")
                key = {"pk": item["pk"], "sk": item["sk"]}
                try:
                    m.client.update_item(
                        TableName=m.table,
                        Key=key,
                        ConditionExpression="#s = :pending",
                        UpdateExpression="SET #s = :in_flight, lease = :t REMOVE gsi1pk, gsi1sk",
                        ExpressionAttributeNames={"#s": "status"},
                        ExpressionAttributeValues={
                            ":pending": {"S": "pending"},
                            ":in_flight": {"S": "in_flight"},
                            ":t": {"S": token},
                        },
                    )
                except m.client.exceptions.ConditionalCheckFailedException:
                    continue
                m.client.delete_item(
                    TableName=m.table,
                    Key=key,
                    ConditionExpression="lease = :t",
                    ExpressionAttributeValues={":t": {"S": token}},
                )
                done += 1
        delivery = m.meter.usage() - before
        return [
            _row(
                "outbox",
                "publish (1 event per call)",
                publish,
                events,
                peer=NAIVE_PEER,
                namespace=prefix,
                scope="namespace",
            ),
            _row(
                "outbox",
                "delivery per event",
                delivery,
                max(1, done),
                peer=NAIVE_PEER,
                namespace=prefix,
                scope="namespace",
                note=(
                    "Query 25 per page, a claim that leaves the index and a delete per event "
                    "(1 thread); no lease recovery: a dead worker's events are never delivered"
                ),
            ),
        ]
    finally:
        m.close()


def _peer_streams(env: BenchEnv, events: int) -> list[dict[str, Any]]:
    """DynamoDB Streams + Lambda, no write-back: a PutItem of the event (no index), and the
    Lambda trigger delivers from the stream without writing to the table."""
    m = _Metered(env)
    try:
        publish = m.measure(
            lambda i: m.client.put_item(
                TableName=m.table,
                Item=_raw_event_item(unique("e"), index=None),
                ConditionExpression="attribute_not_exists(pk)",
            ),
            events,
        )
        peer = "DynamoDB Streams + Lambda, no write-back"
        return [
            _row("outbox", "publish (1 event per call)", publish, events, peer=peer),
            _row(
                "outbox",
                "delivery per event",
                Usage(),
                1,
                peer=peer,
                note=(
                    "0 table requests: no claim and no outcome stored, so a retried stream "
                    "batch delivers again, a failed event has no record and no retry schedule"
                ),
            ),
        ]
    finally:
        m.close()


def _peers(env: BenchEnv, reps: int, events: int) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    for name, make in (
        ("plain ADD", lambda: [_peer_plain_add(env, reps)]),
        ("python-dynamodb-lock", lambda: [_peer_lock(env, reps)]),
        ("Powertools idempotency", lambda: _peer_powertools(env, reps)),
        ("polling publisher", lambda: _peer_polling(env, events)),
        ("put, claim, delete", lambda: _peer_naive(env, events)),
        ("DynamoDB Streams + Lambda", lambda: _peer_streams(env, events)),
    ):
        try:
            rows += make()
        except Exception as exc:  # a peer that is missing or fails is reported, not fatal
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    return rows, errors


# -- the ceilings ---------------------------------------------------------------------------------

#: (primitive, operation row, scope, what the docs state (per s, page), what lifts it)
CEILINGS: list[tuple[str, str, str, int | None, str, str]] = [
    (
        "locks",
        "acquire + release (one key, again and again)",
        "one key",
        None,
        "locks.md states none",
        "one lock per resource (keys are independent partitions)",
    ),
    ("locks", "extend", "one key", None, "locks.md states none", "a longer ttl (fewer extends)"),
    (
        "breaker",
        "protected call, closed",
        "one breaker name",
        6000,
        "breaker.md: ~6,000 closed calls/s",
        "state_cache (one read per process per period); a breaker name per dependency shard",
    ),
    (
        "breaker",
        "protected call, closed, state_cache=5",
        "one breaker name, one process",
        None,
        "breaker.md: no limit from reads",
        "already lifted: one read per process per state_cache seconds",
    ),
    (
        "breaker",
        "protected call, failure",
        "one breaker name",
        1000,
        "breaker.md: ~1,000 failures/s",
        "a breaker name per dependency shard",
    ),
    (
        "cache",
        "get (one key, again and again)",
        "one key",
        6000,
        "cache.md: ~6,000 gets/s",
        "local_ttl (one read per process per period)",
    ),
    (
        "cache",
        "get (one key), local_ttl=5",
        "one key, per process",
        None,
        "cache.md: one read per process per local_ttl",
        "already lifted: one read per process per local_ttl seconds",
    ),
    (
        "cache",
        "set (one key, again and again)",
        "one key",
        1000,
        "cache.md: ~1,000 writes/s",
        "fewer writes of one key; counters.sharded for counts",
    ),
    (
        "cache",
        "set (a new key each time)",
        "one namespace (index shards)",
        None,
        "cache.md states none for a namespace",
        "more shards (DynamoDBBackend(shards=...)), more namespaces",
    ),
    (
        "checkpoints",
        "save (next sequence, one task)",
        "one task",
        None,
        "checkpoints.md states none",
        "one task id per independent stream of work",
    ),
    (
        "checkpoints",
        "load_latest (one task)",
        "one task",
        None,
        "checkpoints.md states none",
        "keep the latest in memory while the task runs",
    ),
    (
        "idempotency",
        "@idempotent replay",
        "one key",
        None,
        "idempotency.md states none",
        "a key is called once in normal use",
    ),
    (
        "outbox",
        "delivery per event: default worker",
        "one namespace",
        2000,
        "outbox.md: shards x 500 events/s (4 shards: ~2,000/s)",
        "more shards on publishers (DynamoDBBackend(shards=...)), more namespaces",
    ),
    (
        "outbox",
        "delivery per event: stream relay (stream_handler)",
        "one namespace",
        2000,
        "outbox.md: shards x 500 events/s (4 shards: ~2,000/s)",
        "more shards on publishers, more namespaces",
    ),
    (
        "counters",
        "increment (one key)",
        "one key",
        1000,
        "counters.md: ~1,000/s",
        "counters.sharded(key, shards=N)",
    ),
    (
        "counters",
        "sharded(shards=8).increment",
        "one sharded counter",
        8000,
        "counters.md: ~1,000/s per shard",
        "more shards",
    ),
    (
        "counters",
        "join arrive (one join, a new member each)",
        "one join",
        500,
        "counters.md: ~500 arrivals/s",
        "a tree of joins (joins of joins)",
    ),
    ("runs", "start", "one namespace", None, "runs.md states none", "more namespaces"),
    (
        "runs",
        "heartbeat",
        "one namespace",
        500,
        "runs.md: ~500 heartbeats/s",
        "heartbeat less often; spread runs over namespaces",
    ),
]


def _ceilings(rows: list[dict[str, Any]], shards: int) -> list[dict[str, Any]]:
    by = {(r["primitive"], r["operation"]): r for r in rows if r.get("peer") is None}
    out = []
    for primitive, operation, scope, stated, stated_text, lift in CEILINGS:
        row = by.get((primitive, operation))
        if row is None:
            continue
        computed = row["ceiling"]
        agrees: bool | None = None
        if computed.get("processes"):
            agrees = True if stated_text.endswith("no limit from reads") else None
        if stated is not None and computed["per_s"]:
            expected = stated if "shards x" not in stated_text else 500 * shards
            agrees = abs(computed["per_s"] - expected) <= 0.15 * expected
        out.append(
            {
                "primitive": primitive,
                "operation": operation,
                "scope": scope,
                "per_s": computed["per_s"],
                "processes": computed.get("processes"),
                "partition": computed["partition"],
                "load": computed["load"],
                "measured_on": row.get("ceiling_note") or "this operation",
                "docs": stated_text,
                "agrees": agrees,
                "lifted_by": lift,
            }
        )
    return out


def run(env: BenchEnv) -> dict[str, Any]:
    tiny = env.scale.name == "tiny"
    return measure(env, reps=3 if tiny else 12, events=12 if tiny else 100)


def measure(env: BenchEnv, *, reps: int, events: int) -> dict[str, Any]:
    """The section: ``reps`` calls of each operation, ``events`` events per outbox path (4
    times as many with 4 threads)."""
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    outbox_info: dict[str, Any] = {}
    for name, make in (
        ("locks", lambda: _locks(env, reps)),
        ("breaker", lambda: _breaker(env, reps)),
        ("cache", lambda: _cache(env, reps)),
        ("checkpoints", lambda: _checkpoints(env, reps)),
        ("idempotency", lambda: _idempotency(env, reps)),
        ("counters", lambda: _counters(env, reps)),
        ("runs", lambda: _runs(env, reps)),
    ):
        try:
            rows += make()
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    try:
        outbox_rows, outbox_info = _outbox(env, events)
        rows += outbox_rows
    except Exception as exc:
        errors.append(f"outbox: {type(exc).__name__}: {exc}")
    peer_rows, peer_errors = _peers(env, reps, events)
    lives, life_rows, life_peers = _whole_lives(rows, peer_rows)
    rows += life_rows
    peer_rows += life_peers
    shards = env.backend().shards
    return {
        "status": "ok",
        "prices": {
            "write_per_million_units": PRICE_WRITE,
            "read_per_million_units": PRICE_READ,
            "as_of": PRICE_DATE,
        },
        "partition_limits": {"wcu_per_s": PARTITION_WCU, "rcu_per_s": PARTITION_RCU},
        "shards": shards,
        "rows": rows,
        "peers": peer_rows,
        "ceilings": _ceilings(rows, shards),
        "outbox": outbox_info,
        # an event's whole life per delivery design: publish + delivery, table and index
        "whole_life": lives,
        "errors": errors + peer_errors,
        "note": (
            "Units by AWS's rules from the requests sent and the items read around them "
            "(bench/_units.py), not DynamoDB Local's ConsumedCapacity. Stream reads: a Lambda "
            "trigger's GetRecords on a DynamoDB stream is not billed; the Lambda invocations "
            "are (not counted here), the same for the stream relay and the no-write-back peer."
        ),
    }
