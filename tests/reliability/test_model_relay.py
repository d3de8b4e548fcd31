"""The delivery fault model with the stream relay as an actor (DynamoDB only: it has a stream).

The machine of ``test_model_delivery.py`` (same actors, faults and checks), where the polling
workers are the stack's sweepers (``sweep_handler``'s worker: new events left to the relay for
one lease) and some actors are **relays**: a :class:`StreamHandler` run on the stream records of
what was published, in order, one Lambda batch at a time, every store call and handler phase a
checkpoint. Relays deliver without a claim by default (one write per event) or with one
(``claim=True``). On top of the worker faults:

* **Lambda retries** a relay's last batch (after a failure or for no reason: streams deliver at
  least once), and a relay killed mid-batch has its batch handed to its successor;
* **late streams**: a batch handed over long after its events were published (after the relay's
  lease, the event is the sweeper's);
* events published without a stream record (the stream's filter or a gap): the sweeper's.

Checked as in the worker model: a successful delivery is repeated only if its holder died,
froze past its lease or (a relay without a claim: no heartbeat) ran its handler past the lease;
ordered places in order; ``stats()`` agrees; and once the faults stop everything drains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule

from dynacoord._clock import now_ms
from dynacoord.outbox import EventRecord
from dynacoord.outbox.stream import StreamHandler
from tests.reliability.conftest import STRESS_SCALE
from tests.reliability.test_model_delivery import (
    LEASE_MS,
    MAX_EVENTS,
    Actor,
    GatedStore,
    ModelWorker,
    make_machine,
    moto_factory,  # noqa: F401  (a fixture)
    run_delivery_model,
)

#: (max_examples, steps) per backend kind
RELAY_BUDGET: dict[str, tuple[int, int]] = {"moto": (3, 60), "dynamodb": (10, 60)}


class RelayWorker(ModelWorker):
    """A relay's worker: an event it delivers without a claim is held from its handler's start
    until its outcome is stored, and its lease ends one lease after the event became due."""

    def _handle(self, record: EventRecord) -> Any:
        if record.id not in self.actor.held:  # not claimed: the relay's own lease
            self.actor.held[record.id] = record.due_at_ms
            self.actor.machine.log(record.id, f"relayed by {self.actor.name}")
        return super()._handle(record)


class RelayStore(GatedStore):
    def settle_unclaimed(self, settled: Any, now: int, retention_ms: int | None) -> list[bool]:
        written: list[bool] = self._call("settle_unclaimed", settled, now, retention_ms)
        self.stored([outcome for _, outcome in settled], written, " (relay)")
        return written


class RelayActor(Actor):
    """A Lambda function on the stream: runs the stream batches the machine hands it."""

    def __init__(self, machine: Any, name: str, backend: Any, *, claim: bool) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.batch: list[dict[str, Any]] | None = None  # the one being run
        self.claim = claim
        self._backend = backend
        super().__init__(machine, name, backend, relay=True, claim=claim)

    worker_class = RelayWorker
    store_class = RelayStore

    def _make_worker(self, backend: Any, options: dict[str, Any]) -> Any:
        # relay and claim are this actor's options, not its worker's
        return super()._make_worker(
            backend, {k: v for k, v in options.items() if k not in ("relay", "claim")}
        )

    def _main(self) -> None:
        from tests.reliability.test_model_delivery import DiedError

        relay = StreamHandler(self.worker, self.worker._store, claim=self.claim)
        try:
            while True:
                self.checkpoint("idle")
                self.handled = 0
                if not self.batches:
                    continue
                self.batch = self.batches.pop(0)
                before = self.worker.delivered + self.worker.retried + self.worker.failed
                relay({"Records": self.batch}, None)
                after = self.worker.delivered + self.worker.retried + self.worker.failed
                self.handled = after - before
                self.machine.last_batch = self.batch
                self.batch = None
        except DiedError:
            pass
        except BaseException as exc:  # reported by the scheduler's next step
            self.error = exc
        finally:
            self.done = True
            self._parked.set()


def make_relay_machine(make: Callable[..., Any], lose_next: Any, kind: str) -> type:
    base = make_machine(make, lose_next, kind)

    class RelayModel(base):  # type: ignore[valid-type, misc]
        def __init__(self) -> None:
            self.stream: list[dict[str, Any]] = []  # records not handed to a relay yet
            self.sequence = 0
            self.last_batch: list[dict[str, Any]] | None = None
            super().__init__()

        def designs(self) -> list[dict[str, Any]]:
            # sweepers of both batch designs, and relays with and without a claim
            return [
                {"batch_size": 25, "leave_new_for": LEASE_MS / 1000},
                {"batch_size": 1, "leave_new_for": LEASE_MS / 1000},
                {"relay": True, "claim": False},
                {"relay": True, "claim": True},
            ]

        def make_actor(self, name: str, backend: Any, design: dict[str, Any]) -> Actor:
            if design.get("relay"):
                return RelayActor(self, name, backend, claim=bool(design.get("claim")))
            return super().make_actor(name, backend, design)

        def on_kill(self, actor: Actor) -> None:
            if isinstance(actor, RelayActor):
                # Lambda hands the batch of a function that died to the next invocation.
                pending = ([actor.batch] if actor.batch else []) + actor.batches
                for batch in reversed(pending):
                    self.stream[:0] = batch

        def published(self, events: Any, shards: Any) -> None:
            """The stream's INSERT records of what was just published."""
            publisher = self.publishers[shards]
            store = publisher._store
            client = store._table.client
            for event in events:
                raw = client.get_item(
                    TableName=store._table.name, Key=store._key(event.id), ConsistentRead=True
                ).get("Item")
                if raw is None:
                    continue
                self.sequence += 1
                self.stream.append(
                    {
                        "eventName": "INSERT",
                        "eventSource": "aws:dynamodb",
                        "dynamodb": {
                            "NewImage": raw,
                            "SequenceNumber": f"{self.sequence:021d}",
                            "StreamViewType": "NEW_IMAGE",
                        },
                    }
                )

        def relays(self) -> list[RelayActor]:
            return [a for a in self.live() if isinstance(a, RelayActor) and not a.frozen]

        @rule(index=st.integers(0, 9), size=st.integers(1, 6), steps=st.integers(0, 12))
        def stream_batch(self, index: int, size: int, steps: int) -> None:
            """Lambda hands the next records of the stream to a relay, which runs a while."""
            relays = self.relays()
            if not relays or not self.stream:
                return
            batch, self.stream = self.stream[:size], self.stream[size:]
            relay = relays[index % len(relays)]
            relay.batches.append(batch)
            relay.fail_next = False
            for _ in range(steps):
                relay.step()
                if not relay.live:
                    break

        @rule(
            index=st.integers(0, 9),
            count=st.integers(1, 4),
            steps=st.integers(0, 12),
            rank=st.integers(0, 99),
        )
        def publish_and_stream(self, index: int, count: int, steps: int, rank: int) -> None:
            """New events reach a relay at once (the common case), which runs a while."""
            if len(self.events) >= MAX_EVENTS:
                return
            self.publish(
                shards=next(iter(self.publishers)),
                batch=[(False, None, (rank + i) % 100) for i in range(count)],
                lose=False,
            )
            self.stream_batch(index, len(self.stream), steps)

        @rule(index=st.integers(0, 9), polls=st.integers(1, 3))
        def sweep_now(self, index: int, polls: int) -> None:
            """A sweeper polls to the end, whatever the relays are doing (mid-handler, say)."""
            sweepers = [a for a in self.live() if not isinstance(a, RelayActor) and not a.frozen]
            if not sweepers:
                return
            sweeper = sweepers[index % len(sweepers)]
            sweeper.fail_next = False
            for _ in range(polls):
                sweeper.run_until_idle()
                if not sweeper.live:
                    break
                sweeper.step()  # past "idle": into the next poll

        @rule(index=st.integers(0, 9))
        def lambda_retry(self, index: int) -> None:
            """Lambda hands a batch it already delivered once more."""
            relays = self.relays()
            if relays and self.last_batch:
                relays[index % len(relays)].batches.append(list(self.last_batch))

        @rule(count=st.integers(1, 3))
        def stream_gap(self, count: int) -> None:
            """Records the stream never delivers (filtered out, or lost): the sweeper's."""
            del self.stream[:count]

        def pass_time(self, ms: int) -> None:
            super().pass_time(ms)
            now = now_ms(self.clock)
            for actor in self.live():
                if isinstance(actor, RelayActor) and not actor.claim:
                    # No heartbeat: a handler that runs past the relay's lease has overrun it.
                    for event_id, until in actor.held.items():
                        if until <= now and event_id not in self.excused:
                            self.excused.add(event_id)
                            self.log(event_id, f"{actor.name} ran past its lease")

    return RelayModel


def run_relay_model(make: Callable[..., Any], lose_next: Any, kind: str, scale: int = 1) -> None:
    examples, steps = RELAY_BUDGET[kind]
    run_delivery_model(
        make,
        lose_next,
        kind,
        scale=scale,
        machine=make_relay_machine(make, lose_next, kind),
        budget=(examples, steps),
    )


def test_relay_model_moto(moto_factory: Callable[..., Any]) -> None:
    run_relay_model(moto_factory, None, "moto")


@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_relay_model(lossy: Any) -> None:
    """On DynamoDB Local (the relay's writes are conditional PartiQL batches or single
    updates there), with lost responses."""
    run_relay_model(lossy.backend, lossy.lose_next, "dynamodb")


@pytest.mark.stress
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_stress_relay_model(lossy: Any) -> None:
    """``make stress``: the relay model with STRESS_SCALE times the examples."""
    run_relay_model(lossy.backend, lossy.lose_next, "dynamodb", scale=STRESS_SCALE)
