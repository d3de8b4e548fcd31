"""Section 9: what a write costs at a sustained rate (issue 29), by AWS's rules.

On DynamoDB Local, with a ManualClock advancing 1/rate s per call (so the table holds what a
real run at that rate leaves), units counted by AWS's rules from the requests sent and the items'
sizes read around every write (bench/_units.py; DynamoDB Local does not bill):

* ``counters.increment`` at 10, 100 and 1,000/s: WCU per increment, requests per increment and
  the item's size, beside a plain ``UpdateItem ADD`` (no recognition of a retried write) and the
  previous design (every token of the last one to two minutes on the item, rotating slots
  ``rq0..rq2``), whose steady state is seeded: its previous minute's slot holds ``60 * rate``
  tokens, as two minutes at that rate leave it (a seed over DynamoDB's 400 KB is reported as
  refused, as every increment then is);
* ``cache.incr``: table and index units apart (the index projects every attribute);
* the breaker after ``calls`` failures at 10 and 100/s: its item size and the read units of a
  closed call (eventually consistent by default, strongly consistent, and with a state cache);
* the join: WCU of the last arrival of a ``members``-member join;
* the cost per protected call of each breaker policy (consecutive failures, the default, and
  ``FailureRate``) at 10, 100 and 1,000 calls/s from one process and 100 calls/s from four,
  all calls succeeding or one in ten failing (never enough to trip): requests, RCU and WCU per
  call over the second half of the calls, and the item's size.

* the **writers table**: WCU per write and the item's size against the number of writers (1,
  10, 50, 200) of ``counters.increment`` and ``cache.incr``, as threads of one process writing
  at once, as processes (each with its own slot pool: a process id of its own, as a real
  process has), and as a new thread per request (threads that never overlap); and both breaker
  policies' cost per protected call from 1, 10 and 50 processes at 100 calls/s with one call in
  ten failing, with ``flush()`` after every call for ``FailureRate`` (what breaker.md advises at
  the end of a Lambda invocation).

Calls per rate are capped (``calls``): one writer's item holds one slot whatever the number of
calls, so the cap changes nothing for dynacoord; the simulated seconds are reported.
"""

from __future__ import annotations

import contextlib
import os
from binascii import b2a_base64
from typing import Any

from dynacoord import FailureRate, ManualClock

from ._harness import BenchEnv, unique
from ._units import UnitMeter, item_size

__all__ = ["run"]

RATES = (10, 100, 1000)


def _token() -> str:
    return b2a_base64(os.urandom(8), newline=False)[:11].decode("ascii")


def _previous_increment(client: Any, table: str, key: dict[str, Any], now_ms: int) -> None:
    """The previous design's ``counters.increment``: ADD the token to the slot of the minute,
    drop the slot of the next minute, refuse a token already in this or the previous slot."""
    bucket = now_ms // 60_000
    slots = (f"rq{bucket % 3}", f"rq{(bucket - 1) % 3}", f"rq{(bucket + 1) % 3}")
    token = _token()
    client.update_item(
        TableName=table,
        Key=key,
        UpdateExpression="SET #k = :kind ADD #n :by, #a :rqs REMOVE #c",
        ConditionExpression="NOT contains(#a, :rqt) AND NOT contains(#b, :rqt)",
        ExpressionAttributeNames={
            "#k": "kind",
            "#n": "n",
            "#a": slots[0],
            "#b": slots[1],
            "#c": slots[2],
        },
        ExpressionAttributeValues={
            ":kind": {"S": "counter"},
            ":by": {"N": "1"},
            ":rqs": {"SS": [token]},
            ":rqt": {"S": token},
        },
        ReturnValues="ALL_NEW",
    )


def _seed_previous(client: Any, table: str, key: dict[str, Any], rate: int, now_ms: int) -> str:
    """The previous design's item after two minutes at ``rate``: the previous minute's slot
    full (60 * rate tokens). Returns "" or why DynamoDB refused it."""
    bucket = now_ms // 60_000
    tokens = [_token() for _ in range(60 * rate)]
    try:
        client.put_item(
            TableName=table,
            Item={
                **key,
                "kind": {"S": "counter"},
                "n": {"N": str(120 * rate)},
                f"rq{(bucket - 1) % 3}": {"SS": tokens},
            },
        )
    except client.exceptions.ClientError as exc:
        return exc.response["Error"]["Message"]
    return ""


def _rate_rows(env: BenchEnv, calls: int) -> list[dict[str, Any]]:
    rows = []
    for rate in RATES:
        client = env.new_client(counted=False)
        peek = env.new_client(counted=False)
        clock = ManualClock()
        backend = env.backend(namespace=unique("wc"), client=client, clock=clock)
        counters = backend.counters
        meter = UnitMeter(client, peek, env.table)
        raw_key = {"pk": {"S": f"RAWCOUNTER#{unique('raw')}"}, "sk": {"S": "COUNTER"}}
        prev_key = {"pk": {"S": f"PREVCOUNTER#{unique('prev')}"}, "sk": {"S": "COUNTER"}}
        try:
            half = calls // 2
            for i in range(calls):
                if i == half:
                    start = meter.wcu
                counters.increment("hot")
                clock.advance(1 / rate)
            dyn_wcu = (meter.wcu - start) / (calls - half)
            requests = meter.requests["UpdateItem"] / calls
            dyn_size = meter.sizes[f"COUNTER#{backend.namespace}#hot"]
            start = meter.wcu
            for _ in range(half):
                client.update_item(
                    TableName=env.table,
                    Key=raw_key,
                    UpdateExpression="ADD n :one",
                    ExpressionAttributeValues={":one": {"N": "1"}},
                    ReturnValues="ALL_NEW",
                )
            raw_wcu = (meter.wcu - start) / half
            raw_size = meter.sizes[raw_key["pk"]["S"]]
            now = int(clock.time() * 1000)
            refused = _seed_previous(peek, env.table, prev_key, rate, now - now % 60_000)
            prev_wcu: float | None = None
            prev_size: int | None = None
            if not refused:
                start = meter.wcu
                for _ in range(half):
                    _previous_increment(client, env.table, prev_key, now - now % 60_000)
                prev_wcu = (meter.wcu - start) / half
                prev_size = meter.sizes[prev_key["pk"]["S"]]
            cache_meter_start = (meter.wcu, meter.index_wcu)
            cache = backend.cache()
            for _ in range(half):
                cache.incr("hot")
                clock.advance(1 / rate)
            cache_wcu = (meter.wcu - cache_meter_start[0]) / half
            cache_index = (meter.index_wcu - cache_meter_start[1]) / half
        finally:
            meter.close()
        rows.append(
            {
                "rate": rate,
                "calls": calls,
                "simulated_s": round(calls / rate, 1),
                "wcu": round(dyn_wcu, 3),
                "requests": round(requests, 3),
                "item_bytes": dyn_size,
                "raw_wcu": round(raw_wcu, 3),
                "raw_item_bytes": raw_size,
                "previous_wcu": None if prev_wcu is None else round(prev_wcu, 2),
                "previous_item_bytes": prev_size,
                "previous_refused": refused[:120] or None,
                "cache_incr_wcu": round(cache_wcu, 3),
                "cache_incr_index_wcu": round(cache_index, 3),
            }
        )
    return rows


def _breaker_rows(env: BenchEnv, calls: int) -> list[dict[str, Any]]:
    rows = []
    for rate in (10, 100):
        calls = calls or 120 * rate  # two minutes at the rate (full scale)
        client = env.new_client(counted=False)
        peek = env.new_client(counted=False)
        clock = ManualClock()
        backend = env.backend(namespace=unique("wb"), client=client, clock=clock)
        breaker = backend.breaker("svc", failure_threshold=10**9, reset_timeout=60)
        for _ in range(calls):
            breaker.record_failure()
            clock.advance(1 / rate)
        meter = UnitMeter(client, peek, env.table)
        try:
            closed_calls = 20
            for _ in range(closed_calls):
                breaker.call(lambda: None)
            eventual = meter.rcu / closed_calls
            start = meter.rcu
            strict = backend.breaker("svc", failure_threshold=10**9, consistent_reads=True)
            for _ in range(closed_calls):
                strict.call(lambda: None)
            consistent = (meter.rcu - start) / closed_calls
            start = meter.rcu
            cached = backend.breaker("svc", failure_threshold=10**9, state_cache=1.0)
            for _ in range(closed_calls):  # 20 calls in 1 s: one read
                cached.call(lambda: None)
                clock.advance(1 / closed_calls)
            with_cache = (meter.rcu - start) / closed_calls
        finally:
            meter.close()
        item = peek.get_item(
            TableName=env.table,
            Key={"pk": {"S": f"CB#{backend.namespace}#svc"}, "sk": {"S": "CB"}},
            ConsistentRead=True,
        )["Item"]
        rows.append(
            {
                "failures_per_s": rate,
                "failures": calls,
                "simulated_s": round(calls / rate, 1),
                "item_bytes": item_size(item),
                "rcu_per_closed_call": round(eventual, 3),
                "rcu_per_closed_call_consistent": round(consistent, 3),
                "rcu_per_closed_call_state_cache_1s": round(with_cache, 3),
            }
        )
    return rows


class _BoomError(Exception):
    pass


def _policy_row(
    env: BenchEnv, policy: str, rate: int, processes: int, fail_every: int, calls: int
) -> dict[str, Any]:
    """Per-call units of one breaker policy: ``calls`` calls at ``rate``/s spread round-robin
    over ``processes`` breakers (one store each, one name), every ``fail_every``-th failing."""
    client = env.new_client(counted=False)
    peek = env.new_client(counted=False)
    clock = ManualClock()
    namespace = unique("wr")
    breakers = []
    for _ in range(processes):
        backend = env.backend(namespace=namespace, client=client, clock=clock)
        if policy == "consecutive":
            breakers.append(backend.breaker("svc", failure_threshold=10**9, reset_timeout=60))
        else:
            rate_policy = FailureRate(threshold=0.5, minimum_calls=20, window=60.0)
            breakers.append(backend.breaker("svc", policy=rate_policy, reset_timeout=60))

    def fail() -> None:
        raise _BoomError

    meter = UnitMeter(client, peek, env.table)
    try:
        half = calls // 2
        for i in range(calls):
            if i == half:
                start = (
                    meter.rcu,
                    meter.wcu,
                    sum(meter.requests.values()),
                    meter.requests["UpdateItem"],
                )
            breaker = breakers[i % processes]
            if fail_every and i % fail_every == fail_every - 1:
                with contextlib.suppress(_BoomError):
                    breaker.call(fail)
            else:
                breaker.call(lambda: None)
            clock.advance(1 / rate)
        measured = calls - half
        rcu = (meter.rcu - start[0]) / measured
        wcu = (meter.wcu - start[1]) / measured
        requests = (sum(meter.requests.values()) - start[2]) / measured
        writes = (meter.requests["UpdateItem"] - start[3]) / measured
    finally:
        meter.close()
    item = peek.get_item(
        TableName=env.table,
        Key={"pk": {"S": f"CB#{namespace}#svc"}, "sk": {"S": "CB"}},
        ConsistentRead=True,
    ).get("Item")
    return {
        "policy": policy,
        "rate": rate,
        "processes": processes,
        "failing": round(1 / fail_every, 3) if fail_every else 0.0,
        "calls": calls,
        "simulated_s": round(calls / rate, 1),
        "requests_per_call": round(requests, 4),
        "writes_per_call": round(writes, 4),
        "rcu_per_call": round(rcu, 4),
        "wcu_per_call": round(wcu, 4),
        "item_bytes": item_size(item),
        "state": str(breakers[0].state),
    }


def _policy_rows(env: BenchEnv, tiny: bool) -> list[dict[str, Any]]:
    """The breaker's cost per call under each policy. FailureRate with its defaults (window 60 s
    in 10 buckets, minimum_calls 20, flush_interval 1 s): a process writes its counts once a
    second, so its writes per call fall with its call rate."""
    # (rate, processes, simulated seconds)
    shapes = (
        [(100, 4, 1.2)]
        if tiny
        else [
            (10, 1, 70.0),  # past one full 60 s window: the item's largest size
            (100, 1, 10.0),
            (1000, 1, 4.0),
            (100, 4, 10.0),
        ]
    )
    rows = []
    for rate, processes, seconds in shapes:
        for fail_every in (0, 10):
            for policy in ("consecutive", "failure_rate"):
                calls = int(rate * seconds)
                rows.append(_policy_row(env, policy, rate, processes, fail_every, calls))
    return rows


def _join_row(env: BenchEnv, members: int, id_bytes: int = 12) -> dict[str, Any]:
    """The last arrival of a ``members``-member join whose member ids are ``id_bytes`` long."""
    client = env.new_client(counted=False)
    peek = env.new_client(counted=False)
    backend = env.backend(namespace=unique("wj"), client=client)
    counters = backend.counters

    def member(i: int) -> str:
        return f"member-{i:05d}".ljust(id_bytes, "x")

    for i in range(members - 1):
        counters.join("fan", member(i), expected=members)
    meter = UnitMeter(client, peek, env.table)
    try:
        result = counters.join("fan", member(members - 1), expected=members)
    finally:
        meter.close()
    return {
        "members": members,
        "id_bytes": id_bytes,
        "fired": result.fired,
        "last_arrival_wcu": meter.wcu,
        "last_arrival_requests": sum(meter.requests.values()),
        "item_bytes": max(meter.sizes.values()),
    }


def _powertools_row(env: BenchEnv) -> dict[str, Any]:
    """The Powertools breaker (failures counted per execution environment, state written on a
    transition, eventual reads behind a 5 s local cache) beside dynacoord's default and its
    state_cache, on the same DynamoDB Local: units per closed call, per failure and per trip,
    and how many failures across 4 processes it takes to trip (threshold 5)."""
    try:
        from aws_lambda_powertools.utilities.circuit_breaker import (
            CircuitBreakerConfig,
            CircuitBreakerOpenError,
            circuit_breaker,
        )
        from aws_lambda_powertools.utilities.circuit_breaker.persistence import (
            CircuitBreakerDynamoDBPersistence,
        )
    except ImportError:
        return {"status": "not installed", "error": "pip install aws-lambda-powertools"}
    import importlib.metadata

    class BoomError(Exception):
        pass

    def fail() -> None:
        raise BoomError

    def measure(make: Any, open_error: type[BaseException]) -> dict[str, Any]:
        client = env.new_client(counted=False)
        peek = env.new_client(counted=False)
        processes = [make(client, i) for i in range(4)]  # (call_ok, call_fail) per process
        meter = UnitMeter(client, peek, env.table)
        try:
            for ok, _ in processes:  # warm: each process reads once
                ok()
            start = (meter.rcu, meter.wcu, sum(meter.requests.values()))
            closed = 40
            for i in range(closed):
                processes[i % 4][0]()
            closed_cost = [
                round((meter.rcu - start[0]) / closed, 3),
                round((meter.wcu - start[1]) / closed, 3),
                round((sum(meter.requests.values()) - start[2]) / closed, 3),
            ]
            failures = 0
            start = (meter.rcu, meter.wcu, sum(meter.requests.values()))
            tripped = False
            while failures < 40:
                # failures only, round-robin over the 4 processes (a success in between resets
                # a count in both designs), until a call is refused without being made
                _, bad = processes[failures % 4]
                try:
                    bad()
                except BoomError:
                    failures += 1
                    continue
                except open_error:
                    tripped = True
                break
            spent = (meter.rcu - start[0], meter.wcu - start[1])
        finally:
            meter.close()
        return {
            "closed_call_rcu": closed_cost[0],
            "closed_call_wcu": closed_cost[1],
            "closed_call_requests": closed_cost[2],
            "failures_to_trip": failures if tripped else None,
            "rcu_until_trip": round(spent[0], 2),
            "wcu_until_trip": spent[1],
        }

    def powertools(client: Any, i: int) -> tuple[Any, Any]:
        store = CircuitBreakerDynamoDBPersistence(
            table_name=env.table,
            key_attr="pk",
            sort_key_attr="sk",
            static_pk_value=f"PT#{name}",
            boto3_client=client,
        )
        config = CircuitBreakerConfig(failure_threshold=5, recovery_timeout=60)
        ok = circuit_breaker(name="svc", persistence_store=store, config=config)(lambda: None)
        bad = circuit_breaker(name="svc", persistence_store=store, config=config)(fail)
        return ok, bad

    def dynacoord(state_cache: float) -> Any:
        namespace = unique("wpb")

        def make(client: Any, i: int) -> tuple[Any, Any]:
            breaker = env.backend(namespace=namespace, client=client).breaker(
                "svc", failure_threshold=5, reset_timeout=60, state_cache=state_cache
            )
            return (lambda: breaker.call(lambda: None)), (lambda: breaker.call(fail))

        return make

    from dynacoord import CircuitOpenError

    name = unique("pt")
    return {
        "status": "ok",
        "peer": f"aws-lambda-powertools {importlib.metadata.version('aws-lambda-powertools')}",
        "powertools": measure(powertools, CircuitBreakerOpenError),
        "dynacoord": measure(dynacoord(0.0), CircuitOpenError),
        "dynacoord_state_cache_5s": measure(dynacoord(5.0), CircuitOpenError),
    }


WRITERS = (1, 10, 50, 100, 200)


class _Process:
    """A simulated process: its own slot pool (dynacoord._writers), swapped in for its calls,
    and, given the table session, its own memory of what its writes saw there (the session's
    ``state.stale_slots``, where versions before the churning-fleet rows kept it)."""

    def __init__(self, table: Any = None) -> None:
        from dynacoord import _writers

        self._writers = _writers
        self.pool = _writers._Pool()
        self._state = None if table is None else table.state
        self._memory: dict[str, Any] = {}

    @contextlib.contextmanager
    def active(self) -> Any:
        saved = self._writers._pool[0]
        self._writers._pool[0] = self.pool
        state = self._state
        # versions before the counting slots' memory moved to the slot pool kept it here
        remembers = state is not None and hasattr(state, "stale_slots")
        if remembers:
            saved_memory, state.stale_slots = state.stale_slots, self._memory
        try:
            yield
        finally:
            self._writers._pool[0] = saved
            if remembers:
                state.stale_slots = saved_memory


def _writers_row(env: BenchEnv, op: str, shape: str, writers: int, rounds: int) -> dict[str, Any]:
    """WCU per write of ``op`` (``increment`` or ``incr``) by ``writers`` writers of ``shape``:
    every writer writes once (so the item holds what they leave), then ``rounds`` more writes
    each, measured; the clock advances 10 ms per write (100/s)."""
    import threading

    from botocore.config import Config

    # DynamoDB Local's test client, with a connection per writer thread
    config = Config(
        retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=max(64, writers)
    )
    client = env.new_client(counted=False, config=config)
    peek = env.new_client(counted=False)
    clock = ManualClock()
    backend = env.backend(namespace=unique("ww"), client=client, clock=clock)
    if op == "increment":
        counters = backend.counters

        def write() -> None:
            counters.increment("hot")

        key = {"pk": {"S": f"COUNTER#{backend.namespace}#hot"}, "sk": {"S": "COUNTER"}}
    else:
        cache = backend.cache()

        def write() -> None:
            cache.incr("hot")

        key = {"pk": {"S": f"CACHE#{backend.namespace}#hot"}, "sk": {"S": "CACHE"}}

    def one_round() -> None:
        if shape == "threads":
            barrier = threading.Barrier(writers)

            def in_thread() -> None:
                barrier.wait()
                write()

            threads = [threading.Thread(target=in_thread) for _ in range(writers)]
        elif shape == "processes":
            threads = []
            for process in processes:
                with process.active():
                    write()
                clock.advance(0.01)
            return
        else:  # a new thread per request, one after the other
            threads = []
            for _ in range(writers):
                thread = threading.Thread(target=write)
                thread.start()
                thread.join()
                clock.advance(0.01)
            return
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        clock.advance(0.01 * writers)

    processes = [_Process() for _ in range(writers)] if shape == "processes" else []
    one_round()
    meter = UnitMeter(client, peek, env.table)
    try:
        for _ in range(rounds):
            one_round()
    finally:
        meter.close()
    item = peek.get_item(TableName=env.table, Key=key, ConsistentRead=True).get("Item") or {}
    writes = writers * rounds
    return {
        "op": op,
        "shape": shape,
        "writers": writers,
        "writes": writes,
        "wcu_per_write": round(meter.wcu / writes, 3),
        "index_wcu_per_write": round(meter.index_wcu / writes, 3),
        "slots": sum(1 for name in item if name.startswith("w:")),
        "item_bytes": item_size(item),
    }


def _writers_rows(env: BenchEnv, tiny: bool) -> list[dict[str, Any]]:
    rows = []
    for op in ("increment", "incr"):
        for shape in ("threads", "processes", "thread_per_request"):
            for writers in (1, 10) if tiny else WRITERS:
                rounds = 1 if tiny else max(2, 400 // writers)
                rows.append(_writers_row(env, op, shape, writers, rounds))
    return rows


def _breaker_process_row(
    env: BenchEnv,
    policy: str,
    processes: int,
    calls: int,
    fail_every: int = 10,
    *,
    flush_interval: float | None = None,
) -> dict[str, Any]:
    """Per-call units of one breaker policy at 100 calls/s spread round-robin over
    ``processes`` simulated processes (a breaker and a slot pool each), every
    ``fail_every``-th call failing. ``FailureRate`` flushes after every call (a Lambda
    invocation's end), or, with ``flush_interval`` given, writes only as its calls end once
    per interval (no ``flush()``)."""
    flush_every_call = policy == "failure_rate" and flush_interval is None
    client = env.new_client(counted=False)
    peek = env.new_client(counted=False)
    clock = ManualClock()
    namespace = unique("wp")
    members = []
    for _ in range(processes):
        backend = env.backend(namespace=namespace, client=client, clock=clock)
        if policy == "consecutive":
            breaker = backend.breaker("svc", failure_threshold=10**9, reset_timeout=60)
        else:
            rate_policy = FailureRate(
                threshold=0.5,
                minimum_calls=20,
                window=60.0,
                flush_interval=1.0 if flush_interval is None else flush_interval,
            )
            breaker = backend.breaker("svc", policy=rate_policy, reset_timeout=60)
        members.append((_Process(), breaker))

    def fail() -> None:
        raise _BoomError

    meter = UnitMeter(client, peek, env.table)
    try:
        half = calls // 2
        for i in range(calls):
            if i == half:
                start = (meter.wcu, meter.rcu, sum(meter.requests.values()))
            process, breaker = members[i % processes]
            with process.active():
                # each process fails one call in fail_every of its own
                if (i // processes) % fail_every == fail_every - 1:
                    with contextlib.suppress(_BoomError):
                        breaker.call(fail)
                else:
                    breaker.call(lambda: None)
                if flush_every_call:
                    breaker.flush()
            clock.advance(0.01)
        measured = calls - half
        wcu = (meter.wcu - start[0]) / measured
        rcu = (meter.rcu - start[1]) / measured
        requests = (sum(meter.requests.values()) - start[2]) / measured
    finally:
        meter.close()
    item = peek.get_item(
        TableName=env.table,
        Key={"pk": {"S": f"CB#{namespace}#svc"}, "sk": {"S": "CB"}},
        ConsistentRead=True,
    ).get("Item")
    return {
        "policy": policy,
        "processes": processes,
        "rate": 100,
        "failing": round(1 / fail_every, 3),
        "flush_every_call": flush_every_call,
        "flush_interval": flush_interval,
        "calls": calls,
        "requests_per_call": round(requests, 4),
        "wcu_per_call": round(wcu, 4),
        "rcu_per_call": round(rcu, 4),
        "item_bytes": item_size(item),
    }


def _breaker_process_rows(env: BenchEnv, tiny: bool) -> list[dict[str, Any]]:
    rows = [
        _breaker_process_row(env, policy, processes, 40 if tiny else 1000)
        for policy in ("consecutive", "failure_rate")
        for processes in ((1, 4) if tiny else (1, 10, 50))
    ]
    # a Lambda fleet's setting: no flush() per invocation, each environment writing its counts
    # once per 20 s as its calls end (two minutes of calls: six intervals)
    rows += [
        _breaker_process_row(
            env, "failure_rate", processes, 40 if tiny else 12_000, flush_interval=20.0
        )
        for processes in ((4,) if tiny else (10, 50))
    ]
    return rows


def run_writers(env: BenchEnv) -> dict[str, Any]:
    """The writers table alone (``python -m bench --only writecost`` runs all of section 9)."""
    tiny = env.scale.name == "tiny"
    return {
        "writers": _writers_rows(env, tiny),
        "breaker_processes": _breaker_process_rows(env, tiny),
    }


def run(env: BenchEnv) -> dict[str, Any]:
    tiny = env.scale.name == "tiny"
    calls = 40 if tiny else 1200
    return {
        "status": "ok",
        "counters": _rate_rows(env, calls),
        "breaker": _breaker_rows(env, 40 if tiny else 0),
        "breaker_policies": _policy_rows(env, tiny),
        "join": _join_row(env, 20 if tiny else 2000),
        "join_60_byte_ids": _join_row(env, 20 if tiny else 2000, id_bytes=60),
        "powertools": _powertools_row(env),
        **run_writers(env),
        "churning_fleet": run_churn(env),
        "delivery_lease_shapes": run_lease_shapes(env),
    }


# -- a churning fleet (issue 50): environments born and reclaimed, bursts, one-shot processes ------

#: botocore's default client: (60 + 60) s x 3 attempts + 2 x 20 s of backoff = a 400 s window
_DEFAULT_CLIENT: dict[str, Any] = {"retries": {"mode": "standard", "total_max_attempts": 3}}
#: DynamoDBBackend.from_env()'s client: adaptive, 9 attempts of 2 s connect + 5 s read: a 223 s
#: window (before issue 50's change, botocore's 60 s + 60 s: 1,240 s, "from_env_before")
_FROM_ENV_CLIENT: dict[str, Any] = {
    "connect_timeout": 2,
    "read_timeout": 5,
    "retries": {"mode": "adaptive", "total_max_attempts": 9},
}
_FROM_ENV_BEFORE: dict[str, Any] = {"retries": {"mode": "adaptive", "total_max_attempts": 9}}
#: short timeouts (what docs/counters.md suggests past the bound): 3 x (5 + 5) s + 2 x 20 s = 70 s
_SHORT_CLIENT: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 5,
    "retries": {"mode": "standard", "total_max_attempts": 3},
}
_CLIENTS = {
    "botocore_default": _DEFAULT_CLIENT,
    "from_env": _FROM_ENV_CLIENT,
    "from_env_before": _FROM_ENV_BEFORE,
    "short_timeouts": _SHORT_CLIENT,
}


def _fleet_backend(env: BenchEnv, retries: dict[str, Any]) -> tuple[Any, Any, ManualClock]:
    from botocore.config import Config

    client = env.new_client(counted=False, config=Config(max_pool_connections=64, **retries))
    clock = ManualClock()
    return env.backend(namespace=unique("fl"), client=client, clock=clock), client, clock


def _slot_item(peek: Any, table: str, pk: str, sk: str) -> dict[str, Any]:
    item = peek.get_item(
        TableName=table, Key={"pk": {"S": pk}, "sk": {"S": sk}}, ConsistentRead=True
    ).get("Item")
    return item or {}


def _churn_row(
    env: BenchEnv,
    op: str,
    *,
    alive: int,
    lifetime_s: float,
    rate: float,
    seconds: float,
    client: str = "botocore_default",
) -> dict[str, Any]:
    """``op`` (``increment``, ``incr`` or ``sharded``) by a Lambda-like fleet: ``alive``
    environments, each replaced ``lifetime_s`` after it started (staggered), ``rate`` calls/s
    spread round-robin over them, for ``seconds`` on the ManualClock; units per call over the
    last third (steady state: ``seconds`` x 2/3 past one window and one lifetime)."""
    retries = _CLIENTS[client]
    backend, metered, clock = _fleet_backend(env, retries)
    peek = env.new_client(counted=False)
    window_s = backend.table.count_window_ms / 1000
    if op == "increment":
        counters = backend.counters

        def call() -> None:
            counters.increment("orders")

        items = [(f"COUNTER#{backend.namespace}#orders", "COUNTER")]
    elif op == "incr":
        cache = backend.cache()

        def call() -> None:
            cache.incr("orders")

        items = [(f"CACHE#{backend.namespace}#orders", "CACHE")]
    else:
        hits = backend.counters.sharded("hits", shards=8)

        def call() -> None:
            hits.increment()

        items = [(f"COUNTER#{backend.namespace}#hits#shard{i}", "COUNTER") for i in range(8)]
    envs = [(_Process(backend.table), -i * lifetime_s / alive) for i in range(alive)]
    calls = int(seconds * rate)
    start_at = calls - calls // 3
    meter = UnitMeter(metered, peek, env.table)
    try:
        for i in range(calls):
            now = i / rate
            if i == start_at:
                start = meter.usage()
            at = i % alive
            if now - envs[at][1] >= lifetime_s:
                envs[at] = (_Process(backend.table), now)
            with envs[at][0].active():
                call()
            clock.advance(1 / rate)
        used = meter.usage()
    finally:
        meter.close()
    measured = calls - start_at
    found = [_slot_item(peek, env.table, pk, sk) for pk, sk in items]
    refused = sum(used.refusals.values()) - sum(start.refusals.values())
    return {
        "op": op,
        "client": client,
        "environments_alive": alive,
        "lifetime_s": lifetime_s,
        "window_s": window_s,
        "calls_per_s": rate,
        "simulated_s": seconds,
        "calls_measured": measured,
        "requests_per_call": round(
            (sum(used.requests.values()) - sum(start.requests.values())) / measured, 3
        ),
        "refused_per_call": round(refused / measured, 3),
        "wcu_per_call": round((used.wcu - start.wcu) / measured, 3),
        "index_wcu_per_call": round((used.index_wcu - start.index_wcu) / measured, 3),
        "slots": max(sum(1 for n in item if n.startswith("w:")) for item in found),
        "item_bytes": max(item_size(item) for item in found),
    }


def _burst_row(
    env: BenchEnv, shape: str, burst: int = 200, after: int = 60, client: str = "botocore_default"
) -> dict[str, Any]:
    """A burst of ``burst`` increments at once (threads of one process, or one call each from
    ``burst`` processes), then one writer at 1 call/s (the same process, or another one): WCU
    of each of the ``after`` calls that follow (within one window)."""
    import threading

    backend, metered, clock = _fleet_backend(env, _CLIENTS[client])
    peek = env.new_client(counted=False)
    counters = backend.counters
    writer = _Process(backend.table)
    if shape == "threads":
        barrier = threading.Barrier(burst)

        def call() -> None:
            barrier.wait()
            counters.increment("b")

        with writer.active():
            threads = [threading.Thread(target=call) for _ in range(burst)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    else:
        for _ in range(burst):
            with _Process(backend.table).active():
                counters.increment("b")
    per_call = []
    meter = UnitMeter(metered, peek, env.table)
    try:
        for _ in range(after):
            clock.advance(1)
            before = meter.wcu
            with writer.active():
                counters.increment("b")
            per_call.append(meter.wcu - before)
    finally:
        meter.close()
    item = _slot_item(peek, env.table, f"COUNTER#{backend.namespace}#b", "COUNTER")
    window_s = backend.table.count_window_ms / 1000
    return {
        "burst": burst,
        "shape": shape if client == "botocore_default" else f"{shape}, {client} ({window_s:.0f} s)",
        "client": client,
        "window_s": window_s,
        "wcu_first_5": per_call[:5],
        "wcu_per_call_after": round(sum(per_call) / len(per_call), 3),
        "slots_at_end": sum(1 for n in item if n.startswith("w:")),
        "item_bytes_at_end": item_size(item),
    }


def _one_shot_row(
    env: BenchEnv, processes: int, every_s: float, client: str = "botocore_default"
) -> dict[str, Any]:
    """``processes`` one-shot processes (a cron job, a CLI call), one every ``every_s`` s,
    each writing once: the item's largest size and slots, and WCU per call over the last
    half."""
    backend, metered, clock = _fleet_backend(env, _CLIENTS[client])
    peek = env.new_client(counted=False)
    counters = backend.counters
    pk = f"COUNTER#{backend.namespace}#cron"
    meter = UnitMeter(metered, peek, env.table)
    worst = 0
    try:
        for i in range(processes):
            if i == processes // 2:
                start = meter.usage()
            with _Process(backend.table).active():
                counters.increment("cron")
            clock.advance(every_s)
            if i % 50 == 49:
                worst = max(worst, item_size(_slot_item(peek, env.table, pk, "COUNTER")))
        used = meter.usage()
    finally:
        meter.close()
    measured = processes - processes // 2
    item = _slot_item(peek, env.table, pk, "COUNTER")
    worst = max(worst, item_size(item))
    return {
        "processes": processes,
        "every_s": every_s,
        "client": client,
        "window_s": backend.table.count_window_ms / 1000,
        "wcu_per_call": round((used.wcu - start.wcu) / measured, 3),
        "requests_per_call": round(
            (sum(used.requests.values()) - sum(start.requests.values())) / measured, 3
        ),
        "slots_at_end": sum(1 for n in item if n.startswith("w:")),
        "largest_item_bytes": worst,
    }


def _transaction_row(env: BenchEnv, threads: int, calls: int) -> dict[str, Any]:
    """Route (b), measured: an increment as a one-item TransactWriteItems with a
    ClientRequestToken (DynamoDB makes a re-sent request a no-op for 10 minutes), plus the
    consistent GetItem increment() would need to return a value, from ``threads`` threads at
    once on one key. Units by AWS's rules (a transaction item twice); cancellations counted.
    DynamoDB Local serializes transactions rather than cancelling them as the service does
    under contention, so its cancellations are a floor."""
    import threading

    client = env.new_client(counted=False)
    peek = env.new_client(counted=False)
    key = {"pk": {"S": f"COUNTER#{unique('tx')}#hot"}, "sk": {"S": "COUNTER"}}
    cancelled = [0]
    lock = threading.Lock()

    def work(n: int) -> None:
        for _ in range(n):
            try:
                client.transact_write_items(
                    TransactItems=[
                        {
                            "Update": {
                                "TableName": env.table,
                                "Key": key,
                                "UpdateExpression": "ADD n :one",
                                "ExpressionAttributeValues": {":one": {"N": "1"}},
                            }
                        }
                    ],
                    ClientRequestToken=os.urandom(16).hex(),
                )
            except client.exceptions.TransactionCanceledException:
                with lock:
                    cancelled[0] += 1
                continue
            client.get_item(TableName=env.table, Key=key, ConsistentRead=True)

    meter = UnitMeter(client, peek, env.table)
    try:
        workers = [threading.Thread(target=work, args=(calls // threads,)) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        used = meter.usage()
    finally:
        meter.close()
    total = (calls // threads) * threads
    return {
        "threads": threads,
        "calls": total,
        "requests_per_call": round(sum(used.requests.values()) / total, 3),
        "wcu_per_call": round(used.wcu / total, 3),
        "rcu_per_call": round(used.rcu / total, 3),
        "cancelled_per_call": round(cancelled[0] / total, 3),
    }


def run_churn(env: BenchEnv) -> dict[str, Any]:
    """The churning-fleet rows alone (section 9 includes them)."""
    tiny = env.scale.name == "tiny"
    if tiny:
        fleet = [
            _churn_row(env, "increment", alive=5, lifetime_s=30, rate=1, seconds=40),
        ]
        return {
            "fleet": fleet,
            "bursts": [_burst_row(env, "threads", burst=10, after=3)],
            "one_shot": [_one_shot_row(env, 20, 30)],
            "transactions": [_transaction_row(env, 2, 10)],
        }
    fleet = [
        # the fleet: 50 environments, each replaced after 300 s, 4 calls/s, botocore's
        # default client (400 s window): ~117 writers per window
        _churn_row(env, "increment", alive=50, lifetime_s=300, rate=4, seconds=1100),
        _churn_row(env, "incr", alive=50, lifetime_s=300, rate=4, seconds=1100),
        # the goal's fleet: ~120 writers per window whatever their lifetimes (environments
        # replaced after 240 s: 50 x (1 + 400 / 240) less those gone before their next call)
        _churn_row(env, "increment", alive=50, lifetime_s=240, rate=4, seconds=1100),
        # the issue's fleet at 1 call/s with from_env()'s client: its 1,240 s window kept ~250
        # writers per window; its 223 s window now ~90
        _churn_row(
            env, "increment", alive=50, lifetime_s=300, rate=1, seconds=2400, client="from_env"
        ),
        _churn_row(
            env,
            "increment",
            alive=50,
            lifetime_s=300,
            rate=1,
            seconds=2400,
            client="from_env_before",
        ),
        # 100 processes alive for the whole run on a counter of 8 shards
        _churn_row(env, "sharded", alive=100, lifetime_s=10**6, rate=10, seconds=300),
    ]
    return {
        "fleet": fleet,
        # 200 processes at once keep 200 slots until their window ends (no writer can know
        # that their calls returned): 3 WCU for 400 s with botocore's defaults, 223 s with
        # from_env()'s client
        "bursts": [
            _burst_row(env, "threads"),
            _burst_row(env, "processes"),
            _burst_row(env, "processes", client="from_env"),
        ],
        # a cron job every 10 s (40 per window), and one every 2 s (200 per 400 s window: past
        # the ~130 writers per window that fit in 2 KB; ~112 per window of from_env's client)
        "one_shot": [
            _one_shot_row(env, 1200, 10.0),
            _one_shot_row(env, 1200, 2.0),
            _one_shot_row(env, 1200, 2.0, client="from_env"),
        ],
        "transactions": [_transaction_row(env, threads, 400) for threads in (1, 8)],
    }


# -- delivery's lease shapes (issue 50): one lease per event held, or one per worker ---------------


def run_lease_shapes(env: BenchEnv) -> dict[str, Any]:
    """An event's whole life (publish, claim, outcome, polls, lease extensions) per event, by
    AWS's rules, with the default store (each event holds its lease in the index) beside the
    prototype ``WorkerLeaseOutboxStore`` (one lease item per worker), batches of 1, 10 and 25,
    handlers of 1 s and 5 s on a 6 s lease (bench/_delivery_shapes.py: one worker on a
    ManualClock, its lease keeper beaten every lease / 3)."""
    from ._delivery_shapes import SHAPES, life_cost

    tiny = env.scale.name == "tiny"
    client = env.new_client(counted=False)
    peek = env.new_client(counted=False)
    rows = []
    for shape in SHAPES:
        for batch in (5,) if tiny else (1, 10, 25):
            for handler_s in (1.0,) if tiny else (1.0, 5.0):
                rows.append(
                    life_cost(
                        client,
                        peek,
                        env.table,
                        shape=shape,
                        batch=batch,
                        handler_s=handler_s,
                        batches=2 if tiny else None,  # tiny: a few events (numbers mean nothing)
                    )
                )
    return {"lease_s": 6.0, "rows": rows}
