"""An event's whole life under the two lease shapes of delivery (issue 50), by AWS's rules.

``life_cost`` publishes events one per call, then delivers them with one real
:class:`~dynacoord.outbox.worker.OutboxWorker` on a :class:`ManualClock`: each handler call
moves the clock by ``handler_s`` in small slices, and the worker's own lease keeper beats every
lease / 3 of that clock (driven here instead of by its thread, as the fault model drives it).
Units are counted by ``bench/_units.py``'s meter from the requests sent and the items' sizes
read around each write; the keeper's beats are metered apart (the extensions).

Shapes: ``"event"`` (the default store: each event holds its own lease in the index) and
``"worker"`` (``WorkerLeaseOutboxStore``: one lease item per worker, the claim takes the
event out of the index).
"""

from __future__ import annotations

from typing import Any

from dynacoord import ManualClock
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._outbox_worker_leases import WorkerLeaseOutboxStore
from dynacoord.outbox import Event
from dynacoord.outbox.delivery import LeaseKeeper
from dynacoord.outbox.options import WorkerOptions
from dynacoord.outbox.worker import OutboxWorker
from dynacoord.testing import unique_name

from ._units import UnitMeter, Usage

__all__ = ["PAYLOAD_BYTES", "SHAPES", "WRITE_USD_PER_MILLION", "life_cost"]

SHAPES = ("event", "worker")
#: the payload of each event (as bench/costs.py's outbox rows)
PAYLOAD_BYTES = 384
#: us-east-1 on-demand, per million write request units (docs/benchmarks.md, 2026-11)
WRITE_USD_PER_MILLION = 0.625
READ_USD_PER_MILLION = 0.125
_SLICE_S = 0.25


class _DrivenKeeper(LeaseKeeper):
    """The worker's lease keeper, beaten by the driver instead of a thread."""

    def _wake(self) -> None:
        pass

    def _rest(self) -> None:
        return None


def _split(usage: Usage) -> dict[str, float]:
    return {"table_wcu": usage.wcu, "index_wcu": usage.index_wcu, "rcu": usage.rcu}


def life_cost(
    client: Any,
    peek: Any,
    table: str,
    *,
    shape: str,
    batch: int,
    handler_s: float,
    lease_s: float = 6.0,
    batches: int | None = None,
) -> dict[str, Any]:
    """Per event: publish, delivery (claims, outcomes, polls) and extensions, table and index
    WCU and RCU apart, and $ per million events; ``batches`` batches of ``batch`` events (by
    default at least 2 and 50 events: the namespace's shard record, written once, is then 1/50)."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    clock = ManualClock()
    namespace = unique_name("life")
    backend = DynamoDBBackend(client, table_name=table, namespace=namespace, clock=clock)
    n = batch * (batches or max(2, -(-50 // batch)))
    meter = UnitMeter(client, peek, table)
    try:
        outbox = backend.outbox
        events = [Event("bench.life", {"x": "p" * PAYLOAD_BYTES}) for _ in range(n)]
        start = meter.usage()
        for event in events:
            outbox.publish(event)
        publish = meter.usage() - start
        base: Any = outbox._store
        store = (
            base
            if shape == "event"
            else WorkerLeaseOutboxStore(base._table, namespace, shards=base._own_shards)
        )
        extensions = Usage()
        delivered: list[str] = []
        interval_s = lease_s / 3
        beat_at = [float(clock.time()) + interval_s]

        def handler(event: Event) -> None:
            nonlocal extensions
            left = handler_s
            while left > 0:
                step = min(_SLICE_S, left)
                clock.advance(step)
                left -= step
                if clock.time() >= beat_at[0]:
                    beat_at[0] = clock.time() + interval_s
                    before = meter.usage()
                    keeper.beat()
                    extensions = extensions + (meter.usage() - before)
            delivered.append(event.id)

        worker = OutboxWorker(
            store,
            handler,
            clock=clock,
            options=WorkerOptions(lease=lease_s, batch_size=batch, poll_interval=0.01),
        )
        keeper = _DrivenKeeper(worker.delivery, lease_s / 3)
        worker.delivery.keeper = keeper
        start = meter.usage()
        for _ in range(4 * n + 4):
            if len(delivered) >= n:
                break
            worker.run_once()
        delivery = meter.usage() - start - extensions
        if sorted(delivered) != sorted(e.id for e in events):
            raise RuntimeError(f"{shape}: {len(delivered)} of {n} events delivered once")
        publish_u, delivery_u, ext_u = _split(publish), _split(delivery), _split(extensions)
        total_w = sum(u["table_wcu"] + u["index_wcu"] for u in (publish_u, delivery_u, ext_u))
        total_r = sum(u["rcu"] for u in (publish_u, delivery_u, ext_u))
        beats = ext_u and extensions.requests
        row = {
            "shape": shape,
            "batch": batch,
            "handler_s": handler_s,
            "lease_s": lease_s,
            "events": n,
            "publish": {k: round(v / n, 3) for k, v in publish_u.items()},
            "delivery": {k: round(v / n, 3) for k, v in delivery_u.items()},
            "extensions": {k: round(v / n, 3) for k, v in ext_u.items()},
            "extension_writes": sum(beats.values()) if beats else 0,
            "wcu_per_event": round(total_w / n, 3),
            "rcu_per_event": round(total_r / n, 3),
            "usd_per_million": round(
                (total_w * WRITE_USD_PER_MILLION + total_r * READ_USD_PER_MILLION) / n, 3
            ),
        }
        if shape == "worker":
            item = peek.get_item(
                TableName=table, Key=store._worker_key(store._gen), ConsistentRead=True
            ).get("Item")
            from ._units import item_size

            row["worker_item_bytes"] = item_size(item) if item else 0
        return row
    finally:
        meter.close()
