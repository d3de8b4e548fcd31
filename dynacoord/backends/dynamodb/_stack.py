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

from typing import Any

from ..._clock import now_ms
from ...errors import ConfigurationError
from ...metrics import EMFMetrics, MetricsScope
from ...outbox import Outbox
from ...outbox.stream import SweepHandler
from ...outbox.worker import OutboxWorker

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
        due_age, lease_age = self._lag_ms(self._shards(), now_ms(self.clock))
        ages = {OLDEST_DUE_AGE: due_age or 0, EXPIRED_LEASE_AGE: lease_age or 0}
        for name, age in ages.items():
            self._metrics.milliseconds(name, age)
        self.emf.flush()
        return ages

    def _make_sweep_handler(self, worker: OutboxWorker, **options: Any) -> SweepHandler:
        return LagSweepHandler(worker, outbox=self, **options)


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
