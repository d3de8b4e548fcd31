"""The delivery fault model (tests/reliability/test_model_delivery.py, its exact oracle and every
generator) run on the prototype store with one lease item per worker
(``dynacoord.backends.dynamodb._outbox_worker_leases``, issue 50): each actor's backend delivers
through a ``WorkerLeaseOutboxStore`` of its own (one per worker), publishers and readers too.

The random histories take a dead worker's events over rarely (about 3 takeovers in 10 examples,
as on the default store), so the model's replays of dead-worker histories run here too: a
worker that dies holding an ordered group's head and follower, a poison event that kills its
worker batch after batch, a failed group redriven, conflicts on an ordered outcome."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dynacoord.backends.dynamodb._outbox_worker_leases import WorkerLeaseOutboxStore
from tests.reliability.test_model_delivery import (
    moto_factory,
    replay_conflicts_on_an_ordered_outcome,
    replay_dead_worker_with_head_and_follower,
    replay_poison_batch,
    replay_redrive_of_a_failed_group,
    run_delivery_model,
)

__all__ = ["moto_factory"]


def worker_leases(make: Callable[..., Any]) -> Callable[..., Any]:
    """``make`` with the backend's outbox delivering through a worker-lease store."""

    def made(**kwargs: Any) -> Any:
        backend = make(**kwargs)
        outbox = backend.outbox
        base = outbox._store
        outbox._store = WorkerLeaseOutboxStore(base._table, base._ns, shards=base._own_shards)
        return backend

    return made


# The random model takes minutes (moto 3 examples, DynamoDB Local 10, as the default store's):
# `make stress` runs it; `make test` runs the two takeover replays on moto.


@pytest.mark.stress
@pytest.mark.timeout(4 * 3600)
def test_worker_lease_model_moto(moto_factory: Callable[..., Any]) -> None:
    run_delivery_model(worker_leases(moto_factory), None, "moto")


@pytest.mark.stress
@pytest.mark.timeout(4 * 3600)
@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_worker_lease_model(lossy: Any) -> None:
    run_delivery_model(worker_leases(lossy.backend), lossy.lose_next, "dynamodb")


REPLAYS = [
    replay_dead_worker_with_head_and_follower,
    replay_poison_batch,
    replay_redrive_of_a_failed_group,
    replay_conflicts_on_an_ordered_outcome,
]


#: the two that take a dead worker's events over run in ``make test`` (~6 s on moto)
TAKEOVERS = [replay_dead_worker_with_head_and_follower, replay_poison_batch]


@pytest.mark.parametrize("replay", TAKEOVERS, ids=lambda r: r.__name__)
def test_worker_lease_takeover_replays_moto(moto_factory: Callable[..., Any], replay: Any) -> None:
    replay(worker_leases(moto_factory), None, "moto")


@pytest.mark.stress
@pytest.mark.parametrize(
    "replay", [r for r in REPLAYS if r not in TAKEOVERS], ids=lambda r: r.__name__
)
def test_worker_lease_replays_moto(moto_factory: Callable[..., Any], replay: Any) -> None:
    replay(worker_leases(moto_factory), None, "moto")


@pytest.mark.stress
@pytest.mark.parametrize("replay", REPLAYS, ids=lambda r: r.__name__)
@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_worker_lease_replays(lossy: Any, replay: Any) -> None:
    replay(worker_leases(lossy.backend), lossy.lose_next, "dynamodb")
