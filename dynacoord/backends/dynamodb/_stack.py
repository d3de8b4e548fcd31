"""The outbox lag of the bundled stack's sweeper, as CloudWatch metrics (EMF).

The stack alarms when the oldest due event has waited too long (``OutboxOldestDueAge``) or a
lease ran out without the event being settled (``OutboxExpiredLeaseAge``): delivery stalled
(handlers failing everywhere, workers dying) while the functions themselves report no error.
The sweeper's environment carries ``DYNACOORD_OUTBOX_LAG_METRICS`` (a CloudWatch namespace) when
the alarms are on; :meth:`DynamoDBBackend.from_env` then gives the backend a :class:`LagOutbox`,
whose sweep handler, after each sweep, reads the two ages and writes them as one EMF line
(milliseconds, dimensions ``TableName``, ``Primitive=outbox``, ``DynacoordNamespace``): the
names, unit and dimensions the template's alarms watch.

The cost: one read of the outbox's shard count and two one-item Queries per shard of the outbox
index (the oldest due pending event, the oldest expired lease: the index is ordered by due time),
so 9 requests per sweep with the default 4 shards, about 13,000 a day at one sweep a minute
(about 7,000 read units: an eventually consistent index read of one small item is half a unit);
no COUNT query (what :meth:`Outbox.stats` adds would read whole partitions of a backlog every
minute), no request at all for the metrics (EMF is a log line; the sweep's own delivered,
retried and failed counts go out in the same line). Each age is written on every sweep, 0 when
nothing waits, so missing data means the sweeper did not run (its own Errors alarm covers that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..._clock import now_ms
from ...errors import ConfigurationError
from ...metrics import EMFMetrics, MetricsScope
from ...outbox import Outbox
from ...outbox.event import EventStatus
from ...outbox.stream import SweepHandler
from ...outbox.worker import Handler

__all__ = [
    "EXPIRED_LEASE_AGE",
    "LAG_METRICS_ENV",
    "OLDEST_DUE_AGE",
    "LagOutbox",
    "LagSweepHandler",
    "lag_outbox",
]

#: the environment variable that turns the lag metrics on: their CloudWatch namespace
LAG_METRICS_ENV = "DYNACOORD_OUTBOX_LAG_METRICS"
#: the metrics (milliseconds), named as :meth:`Outbox.stats` names them
OLDEST_DUE_AGE = "OutboxOldestDueAge"
EXPIRED_LEASE_AGE = "OutboxExpiredLeaseAge"


class LagOutbox(Outbox):
    """An outbox whose sweep handler reports the lag after each sweep."""

    def __init__(self, *args: Any, emf: EMFMetrics, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.emf = emf

    def lag(self) -> dict[str, int]:
        """The age (ms) of the oldest due pending event and of the earliest expired lease (0
        when none), reported to the metrics and written out."""
        now = now_ms(self.clock)
        shards = self._shards()  # one read of the shard count for both statuses
        ages: dict[str, int] = {}
        for name, status in (
            (OLDEST_DUE_AGE, EventStatus.PENDING),
            (EXPIRED_LEASE_AGE, EventStatus.IN_FLIGHT),
        ):
            earliest: int | None = None
            for shard in range(shards):
                page, _ = self._store.query_page(status, shard, due_before_ms=now, limit=1)
                for record in page:
                    if earliest is None or record.due_at_ms < earliest:
                        earliest = record.due_at_ms
            ages[name] = 0 if earliest is None else max(0, now - earliest)
            self._metrics.milliseconds(name, ages[name])
        self.emf.flush()
        return ages

    def sweep_handler(
        self,
        handlers: Handler | Mapping[str, Handler],
        *,
        runs: Any = None,
        stalled_after: float = 300.0,
        on_stalled: Callable[[Any], Any] | None = None,
        **worker_options: Any,
    ) -> SweepHandler:
        return LagSweepHandler(
            self.worker(handlers, **worker_options),
            outbox=self,
            runs=runs,
            stalled_after=stalled_after,
            on_stalled=on_stalled,
        )


class LagSweepHandler(SweepHandler):
    """A :class:`SweepHandler` that reports the outbox lag after each sweep (``"lag"`` in its
    result, in milliseconds)."""

    def __init__(self, worker: Any, *, outbox: LagOutbox, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.outbox = outbox

    def __call__(self, event: Any = None, context: Any = None) -> dict[str, Any]:
        result = super().__call__(event, context)
        result["lag"] = self.outbox.lag()
        return result


def lag_outbox(backend: Any, namespace: str) -> LagOutbox:
    """The outbox of a DynamoDB ``backend`` that reports its lag as EMF metrics in the
    CloudWatch ``namespace`` (dimension ``TableName`` added to the outbox's own)."""
    try:
        emf = EMFMetrics(namespace, default_dimensions={"TableName": backend.table_name})
    except ConfigurationError as exc:
        raise ConfigurationError(f"{LAG_METRICS_ENV}: {exc}") from exc
    scope = MetricsScope(emf, {"Primitive": "outbox", "DynacoordNamespace": backend.namespace})
    return LagOutbox(
        backend._outbox_store(backend.namespace), clock=backend.clock, metrics=scope, emf=emf
    )
