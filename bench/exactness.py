"""Section 7: the cost of exact counting under lost responses.

Counting writes (``counters.increment``, ``cache.incr``, breaker failures) carry a request token
so that a retry of an applied write counts once (docs/guarantees.md, "Lost responses"). On
DynamoDB the tokens of the last one to two minutes live on the item, so the cost is in item size
(and so in WCU, one per started KB) rather than in requests. This section measures, on DynamoDB
Local, for a counter incremented at a steady rate for a while:

* requests per increment (must stay 1),
* the counter item's size in bytes at the end (DynamoDB's item-size rules: names plus values),
* the write capacity DynamoDB Local reports per increment (``ReturnConsumedCapacity``),
* the median latency of the increment against a raw ``UpdateItem ADD`` of the same counter
  without tokens (the previous design), interleaved in the same run.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ._harness import BenchEnv, unique

__all__ = ["run"]


def _item_bytes(item: dict[str, Any]) -> int:
    """DynamoDB's item size: attribute names plus values (S/N by length, sets by their members)."""
    total = 0
    for name, av in item.items():
        total += len(name.encode())
        ((tag, raw),) = av.items()
        if tag in ("S", "N"):
            total += len(str(raw).encode())
        elif tag in ("SS", "NS"):
            total += sum(len(str(x).encode()) for x in raw)
        else:
            total += 8
    return total


def _wcu(client: Any, table: str, call: Any) -> float:
    consumed: list[float] = []

    def hook(parsed: Any, **_: Any) -> None:
        capacity = parsed.get("ConsumedCapacity") if isinstance(parsed, dict) else None
        if capacity:
            consumed.append(float(capacity.get("CapacityUnits", 0)))

    def add_param(params: Any, **_: Any) -> None:
        params["ReturnConsumedCapacity"] = "TOTAL"

    client.meta.events.register("provide-client-params.dynamodb.UpdateItem", add_param)
    client.meta.events.register("after-call.dynamodb.UpdateItem", hook)
    try:
        call()
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.UpdateItem", add_param)
        client.meta.events.unregister("after-call.dynamodb.UpdateItem", hook)
    return consumed[-1] if consumed else float("nan")


def run(env: BenchEnv) -> dict[str, Any]:
    n = max(20, env.scale.samples)
    rate_hz = 20.0
    client = env.new_client(counted=True)
    backend = env.backend(namespace=unique("exact"), client=client)
    counters = backend.counters
    raw_pk = {"pk": {"S": f"RAWCOUNTER#{unique('raw')}"}, "sk": {"S": "COUNTER"}}

    def raw_add() -> None:
        client.update_item(
            TableName=env.table,
            Key=raw_pk,
            UpdateExpression="ADD n :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
            ReturnValues="ALL_NEW",
        )

    dyn_ms: list[float] = []
    raw_ms: list[float] = []
    with env.counter.measure() as ops:
        for i in range(n):
            started = time.perf_counter()
            if i % 2 == 0:
                counters.increment("hot")
                dyn_ms.append((time.perf_counter() - started) * 1000)
                raw_add()
                raw_ms.append((time.perf_counter() - started) * 1000 - dyn_ms[-1])
            else:
                raw_add()
                raw_ms.append((time.perf_counter() - started) * 1000)
                counters.increment("hot")
                dyn_ms.append((time.perf_counter() - started) * 1000 - raw_ms[-1])
            time.sleep(max(0.0, 1 / rate_hz - (time.perf_counter() - started)))
    requests = ops.get("UpdateItem", 0)
    stored = client.get_item(
        TableName=env.table,
        Key={"pk": {"S": f"COUNTER#{backend.namespace}#hot"}, "sk": {"S": "COUNTER"}},
        ConsistentRead=True,
    )["Item"]
    raw_item = client.get_item(TableName=env.table, Key=raw_pk, ConsistentRead=True)["Item"]
    wcu_dyn = _wcu(client, env.table, lambda: counters.increment("hot"))
    wcu_raw = _wcu(client, env.table, raw_add)
    # one writer slot per writer (dynacoord._writers); the previous design kept every token
    tokens = sum(1 for name in stored if name.startswith("w:"))
    return {
        "status": "ok",
        "increments": n,
        "rate_hz": rate_hz,
        "requests_per_increment": round((requests - n) / n, 3),  # minus the raw ADDs
        "tokens_on_item": tokens,
        "item_bytes": _item_bytes(stored),
        "raw_item_bytes": _item_bytes(raw_item),
        "wcu_per_increment": wcu_dyn,
        "raw_wcu_per_increment": wcu_raw,
        "median_ms": round(statistics.median(dyn_ms), 3),
        "raw_median_ms": round(statistics.median(raw_ms), 3),
        "ratio_median": round(statistics.median(dyn_ms) / statistics.median(raw_ms), 3),
    }
