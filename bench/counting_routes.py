"""Issue 50: the routes for exact counting, measured on the histories a fleet brings.

``python -m bench.counting_routes [--quick]`` prints one JSON document. On DynamoDB Local with a
ManualClock, each simulated process with its own slot pool and memory (bench/writecost.py's
``_Process``), units by AWS's rules (bench/_units.py; a transaction item counts twice):

routes
  * ``slots``: today's ``counters.increment`` (a slot per call in flight, kept for the client's
    retry window), with three clients: botocore's defaults (400 s window), the client
    ``DynamoDBBackend.from_env()`` makes (adaptive, 9 attempts: 1,240 s) and a from_env-like
    client with short timeouts (adaptive, 9 attempts, connect 2 s, read 5 s: 223 s);
  * ``txn``: a one-item ``TransactWriteItems`` (``ADD n :by``) with a ``ClientRequestToken``
    (DynamoDB makes a re-sent request with the same token a no-op for 10 minutes) and the
    consistent ``GetItem`` that ``increment()`` needs to return a value;
  * ``hybrid`` (simulated, not built): a process whose slot is on the item, or that saw the item
    (its last answer) small enough for its slot within 1 KB, increments with its slot; any other
    (a process new to the item included) by a token transaction and the read, which shows it the
    item. What a process saw may be old: others' slots take the item past 1 KB, where a
    transaction bills 4 WCU;
  * ``hybrid_cap``: the same decided on the item as it is at the call (a cap the store enforces,
    less the refused slot write that enforcing it costs: a lower bound).

histories
  * ``steady``: one process at 1 call/s;
  * ``churn120``: 50 environments alive, each replaced after 240 s, 4 calls/s (~120 writers in
    a 400 s window);
  * ``fleet_1cps``: the issue's from_env fleet: 50 environments replaced after 300 s, 1 call/s;
  * ``burst200``: 200 processes once each, then another process at 1 call/s (its 60 calls are
    measured);
  * ``oneshot2s``: a one-shot process every 2 s (1,200 of them; the last half measured).

Exactness under lost responses (``exactness``): an increment applied and re-sent by botocore
(the same request: the same slot token, or the same ClientRequestToken) and applied then
raised, through tests/lossy.py's DynamoDB client; transactions at a hot key (``conflicts``):
threads writing one key at once (DynamoDB Local runs transactions one after another where the
service cancels concurrent ones with TransactionConflict, so its count is a floor).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from botocore.config import Config

from dynacoord import ManualClock

from ._harness import BenchEnv, unique
from ._units import UnitMeter, item_size
from .writecost import _Process

#: a slot's bytes (``w:`` + a 6-character process id + a serial, and a 6-byte token)
_SLOT_BYTES = 16

CLIENTS: dict[str, dict[str, Any]] = {
    "botocore_default": {"retries": {"mode": "standard", "total_max_attempts": 3}},
    "from_env": {"retries": {"mode": "adaptive", "total_max_attempts": 9}},
    "from_env_short": {
        "connect_timeout": 2,
        "read_timeout": 5,
        "retries": {"mode": "adaptive", "total_max_attempts": 9},
    },
}


def _history(name: str, quick: bool) -> tuple[list[tuple[float, int]], int]:
    """(time s, process number) of each call, and the index of the first call measured. A
    process number never seen before is a new process."""
    scale = 4 if quick else 1
    calls: list[tuple[float, int]] = []
    if name == "steady":
        calls = [(float(i), 0) for i in range(600 // scale)]
        return calls, len(calls) * 2 // 3
    if name in ("churn120", "fleet_1cps"):
        alive, lifetime, rate, seconds = (
            (50, 240.0, 4.0, 1100.0) if name == "churn120" else (50, 300.0, 1.0, 2400.0)
        )
        seconds /= scale
        born = [-i * lifetime / alive for i in range(alive)]
        ident = list(range(alive))
        made = alive
        n = int(seconds * rate)
        for i in range(n):
            now = i / rate
            at = i % alive
            if now - born[at] >= lifetime:
                born[at], ident[at], made = now, made, made + 1
            calls.append((now, ident[at]))
        return calls, n - n // 3
    if name == "burst200":
        calls = [(0.0, p) for p in range(200)]
        calls += [(1.0 + i, 200) for i in range(60 // scale)]
        return calls, 200
    if name == "oneshot2s":
        n = 1200 // scale
        return [(i * 2.0, i) for i in range(n)], n // 2
    raise ValueError(name)


def _slots_call(backend: Any) -> Callable[[], None]:
    counters = backend.counters
    return lambda: counters.increment("k")


def _txn_call(client: Any, table: str, pk: str) -> Callable[[], None]:
    key = {"pk": {"S": pk}, "sk": {"S": "COUNTER"}}

    def call() -> None:
        client.transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": table,
                        "Key": key,
                        # the item a counting write leaves (kind), so slot writes follow
                        "UpdateExpression": "SET #kind = :kind ADD n :by",
                        "ExpressionAttributeNames": {"#kind": "kind"},
                        "ExpressionAttributeValues": {":by": {"N": "1"}, ":kind": {"S": "counter"}},
                    }
                }
            ],
            ClientRequestToken=os.urandom(16).hex(),
        )
        # increment() returns a value: the only way after a transaction is a read, which shows
        # other callers' increments too
        client.get_item(TableName=table, Key=key, ConsistentRead=True)

    return call


def run_row(
    env: BenchEnv, route: str, client_name: str, history: str, quick: bool
) -> dict[str, Any]:
    client = env.new_client(
        counted=False, config=Config(max_pool_connections=64, **CLIENTS[client_name])
    )
    peek = env.new_client(counted=False)
    clock = ManualClock()
    backend = env.backend(namespace=unique("rt"), client=client, clock=clock)
    pk = f"COUNTER#{backend.namespace}#k"
    slot_call = _slots_call(backend)
    txn_call = _txn_call(client, env.table, pk)
    #: hybrid: process -> the item's size it last saw, and whether its slot was on it
    seen: dict[int, tuple[int, bool]] = {}

    def read() -> dict[str, Any]:
        found = peek.get_item(
            TableName=env.table, Key={"pk": {"S": pk}, "sk": {"S": "COUNTER"}}, ConsistentRead=True
        ).get("Item")
        return found or {}

    def call(ident: int) -> None:
        if route == "slots":
            slot_call()
            return
        if route == "txn":
            txn_call()
            return
        size, has_slot = seen.get(ident, (None, False))
        if route == "hybrid_cap":
            # a cap the store enforces, at no cost: decided on the item as it is now (a lower
            # bound: an enforced cap refuses a slot write, billed, before the transaction)
            now_item = read()
            size = item_size(now_item)
            has_slot = any(n.startswith(f"w:{processes[ident].pool.process}") for n in now_item)
        if size is not None and (has_slot or size + _SLOT_BYTES <= 1024):
            slot_call()
        else:
            txn_call()
        # what the process learns: the slot write's answer (ALL_NEW), or the read after the
        # transaction (read again here, unmetered, as the same item)
        item = read()
        pool_process = processes[ident].pool.process
        mine = any(n.startswith(f"w:{pool_process}") for n in item)
        seen[ident] = (item_size(item), mine)

    calls, start_at = _history(history, quick)
    processes: dict[int, Any] = {}
    meter = UnitMeter(client, peek, env.table)
    biggest = 0
    started = time.monotonic()
    try:
        last_t = 0.0
        for i, (t, ident) in enumerate(calls):
            clock.advance(max(0.0, t - last_t))
            last_t = t
            if i == start_at:
                start = meter.usage()
            process = processes.get(ident)
            if process is None:
                # a one-shot or replaced process is gone for good: keep only the live ones
                processes[ident] = process = _Process(backend.table)
            with process.active():
                call(ident)
            if i >= start_at and (i % 25 == 0 or i == len(calls) - 1):
                item = peek.get_item(
                    TableName=env.table,
                    Key={"pk": {"S": pk}, "sk": {"S": "COUNTER"}},
                    ConsistentRead=True,
                ).get("Item")
                biggest = max(biggest, item_size(item))
        used = meter.usage()
    finally:
        meter.close()
    item = (
        peek.get_item(
            TableName=env.table, Key={"pk": {"S": pk}, "sk": {"S": "COUNTER"}}, ConsistentRead=True
        ).get("Item")
        or {}
    )
    measured = len(calls) - start_at
    used = used - start
    return {
        "route": route,
        "client": client_name if route != "txn" else "-",
        "window_s": backend.table.count_window_ms / 1000,
        "history": history,
        "calls_measured": measured,
        "wcu_per_call": round(used.wcu / measured, 3),
        "rcu_per_call": round(used.rcu / measured, 3),
        "requests_per_call": round(used.total_requests / measured, 3),
        "refused_per_call": round(sum(used.refusals.values()) / measured, 3),
        "slots_at_end": sum(1 for n in item if n.startswith("w:")),
        "largest_item_bytes": biggest,
        "count_exact": int(item.get("n", {"N": "0"})["N"]) == len(calls),
        "seconds": round(time.monotonic() - started, 1),
    }


def _exactness(env: BenchEnv) -> list[dict[str, Any]]:
    """Each route's count after one increment applied and re-sent, and after one applied and
    raised then called again by its caller (the caller's retry: a new call)."""
    from botocore.exceptions import EndpointConnectionError

    from tests.lossy import _dynamodb_lossy_client, _Faults

    rows = []
    for route in ("slots", "txn"):
        for fault in ("resent", "raised"):
            faults = _Faults()
            client = _dynamodb_lossy_client(env.ddb, faults)
            backend = env.backend(namespace=unique("ex"), client=client)
            pk = f"COUNTER#{backend.namespace}#k"
            call = _slots_call(backend) if route == "slots" else _txn_call(client, env.table, pk)
            call()  # the item exists: the fault hits the plain path
            op = "UpdateItem" if route == "slots" else "TransactWriteItems"
            faults.arm(1, op, None, fault)
            raised = False
            try:
                call()
            except Exception as exc:  # the applied-then-raised write
                raised = isinstance(exc, EndpointConnectionError) or "Endpoint" in repr(exc)
                call()  # the caller's next attempt: a new call
            item = env.client.get_item(
                TableName=env.table,
                Key={"pk": {"S": pk}, "sk": {"S": "COUNTER"}},
                ConsistentRead=True,
            )["Item"]
            rows.append(
                {
                    "route": route,
                    "fault": fault,
                    "lost": faults.lost,
                    "raised": raised,
                    "count": int(item["n"]["N"]),
                    "expected": 3 if fault == "raised" else 2,
                }
            )
    return rows


def _conflicts(env: BenchEnv, threads: int, calls: int) -> dict[str, Any]:
    """``threads`` threads sending token transactions to one key at once: the errors (a
    cancelled transaction raises TransactionCanceledException)."""
    client = env.new_client(counted=False, config=Config(max_pool_connections=64))
    backend = env.backend(namespace=unique("cf"), client=client)
    pk = f"COUNTER#{backend.namespace}#k"
    txn = _txn_call(client, env.table, pk)
    errors: dict[str, int] = {}
    lock = threading.Lock()

    def work() -> None:
        for _ in range(calls // threads):
            try:
                txn()
            except Exception as exc:
                with lock:
                    name = type(exc).__name__
                    errors[name] = errors.get(name, 0) + 1

    started = time.monotonic()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    return {
        "threads": threads,
        "calls": (calls // threads) * threads,
        "calls_per_s": round((calls // threads) * threads / elapsed, 1),
        "errors": errors,
    }


def main(argv: list[str]) -> int:
    from dynacoord.provision import create_table
    from dynacoord.testing import DynamoDBLocal

    from ._harness import DUMMY_CREDENTIALS, FULL, RequestCounter

    quick = "--quick" in argv
    only = [a for a in argv if not a.startswith("--")]
    for name, value in {
        "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
        "AWS_DEFAULT_REGION": DUMMY_CREDENTIALS["region_name"],
    }.items():
        os.environ.setdefault(name, value)
    server = DynamoDBLocal().start()
    try:
        counter = RequestCounter()
        client = counter.attach(server.client())
        table = unique("routes")
        create_table(client, table)
        env = BenchEnv(scale=FULL, ddb=server, client=client, table=table, counter=counter)
        out: dict[str, Any] = {"rows": []}
        histories = ("steady", "churn120", "fleet_1cps", "burst200", "oneshot2s")
        plan = [("slots", c, h) for c in CLIENTS for h in histories]
        plan += [("txn", "botocore_default", h) for h in histories]
        plan += [("hybrid", "botocore_default", h) for h in histories]
        plan += [("hybrid_cap", "botocore_default", h) for h in histories]
        for route, client_name, history in plan:
            if only and route not in only:
                continue
            row = run_row(env, route, client_name, history, quick)
            print(json.dumps(row), file=sys.stderr, flush=True)
            out["rows"].append(row)
        if not only:
            out["exactness"] = _exactness(env)
            out["conflicts"] = [_conflicts(env, t, 400) for t in (2, 16)]
        print(json.dumps(out, indent=1))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
