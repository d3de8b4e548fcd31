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
* events published without a stream record (the stream's filter or a gap): the sweeper's;
* (issue 36, behind switches) records late near and past the relay's implicit lease end, out of
  order, MODIFY records of retried events, old INSERT/MODIFY images handed again long after (as
  first streamed), relay handlers that run long, records the relay reports failed handed again;
  and a backlog: young events on every shard's first page of a small-batch sweeper while an
  event the relay never saw waits (it must be delivered within a bounded number of sweeps).

Checked as in the worker model: a successful delivery is repeated only if its holder died or
froze past its lease (with RELAY_LEASE_STRICT a relay without a claim is no exception: it must
never run a handler past its implicit lease unprotected; its lease keeper claims the event, and
the model's ``held`` follows that claim); ordered places in order; no event fails without a
handler run; ``stats()`` agrees; once the faults stop everything drains; and under a backlog an
event the relay never saw is delivered within a bounded number of sweeps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from dynacoord._clock import now_ms
from dynacoord.keys import shard_of
from dynacoord.outbox import Event, EventRecord, EventStatus
from dynacoord.outbox.stream import StreamHandler
from tests.reliability.conftest import DELIVERY_STRESS_SCALE
from tests.reliability.test_model_delivery import (
    LEASE_MS,
    MAX_ATTEMPTS,
    MAX_EVENTS,
    SKEW_MS,
    SLICE_MS,
    Actor,
    GatedStore,
    ModelKeeper,
    ModelWorker,
    Published,
    make_machine,
    moto_factory,  # noqa: F401  (a fixture)
    run_delivery_model,
    switch,
)

#: (max_examples, steps) per backend kind
RELAY_BUDGET: dict[str, tuple[int, int]] = {"moto": (3, 60), "dynamodb": (10, 60)}

# -- the generators of issue 36 (see test_model_delivery.py) ---------------------------------------

#: a relay without a claim never runs a handler past its implicit lease (due + lease) unprotected:
#: the model no longer excuses a second delivery by a sweeper meanwhile
RELAY_LEASE_STRICT = switch("RELAY_LEASE_STRICT", True)
#: stream records late (near and past the relay's lease end), out of order, MODIFY records of
#: retried events, a relay's handler that runs long
STREAM_TIMING = switch("STREAM_TIMING", True)
#: a sweeper of a small batch under a backlog of young events on every shard, while an event the
#: relay never sees waits: it is delivered within a bounded number of sweeps
BACKLOG = switch("BACKLOG", True)
#: old INSERT and MODIFY images handed again long after (after a delivery, a retry, a redrive of
#: the group), as first streamed; and the replayed history of case 4
REPLAYED_INSERT = switch("REPLAYED_INSERT", True)
#: the replayed history of case 3 (a relay's handler past its lease)
RELAY_OVERRUN_REPLAY = switch("RELAY_OVERRUN_REPLAY", True)
#: a relay's lease keeper beating (a claim or an extension on its way, sent or not yet) at the
#: moment the relay's handler returns and takes its event back
KEEPER_RACE = switch("KEEPER_RACE", True)
#: the replayed history it reached: a relay's outcome written slower than what is left of its
#: implicit lease
RELAY_SLOW_OUTCOME_REPLAY = switch("RELAY_SLOW_OUTCOME_REPLAY", True)
#: (issue 49, section 2) a relay's store write applied and then raised to its caller (botocore
#: after its last attempt), or raised unsent: its keeper's claim and extension, its outcome
#: without a claim and under one, its own claim
RAISED_WRITES = switch("RAISED_WRITES", True)
#: the same for the relay's outcome writes raised UNSENT: the record is reported, Lambda hands
#: it again and the relay runs the handler a second time (inside its own lease, or a sweeper
#: after it): at-least-once, the documented trade (docs/outbox.md, "An outcome that never
#: reached the store"). The exact oracle allows one re-run per delivery whose outcome write was
#: not applied, and no other (an outcome applied then raised is recognised: no re-run)
RAISED_OUTCOME_UNSENT = switch("RAISED_OUTCOME_UNSENT", True)
#: the relay's writes the generator makes raise, and how (applied, unsent)
RAISED_KINDS: tuple[tuple[str, bool], ...] = (
    ("claim_many", True),
    ("claim_many", False),
    ("extend_many", True),
    ("extend_many", False),
    ("settle_unclaimed", True),
    ("finish_many", True),
) + ((("settle_unclaimed", False), ("finish_many", False)) if RAISED_OUTCOME_UNSENT else ())
#: (shards, sweeper batch size) of a backlog: young events fill every shard's first page
BACKLOG_SHAPES = ((4, 1), (4, 2), (8, 1))
#: young events published during a backlog's sweeps, at most (they keep arriving)
BACKLOG_ARRIVALS = 3


class RelayKeeper(ModelKeeper):
    """The relay's keeper, which tells the model when the relay asks for an event back (the
    relay then waits for a beat in flight, outside any checkpoint)."""

    worker: RelayWorker

    def take_back(self, event_id: str) -> tuple[bool, EventRecord | None]:
        self.worker.actor.taking_back.set()  # type: ignore[attr-defined]
        return super().take_back(event_id)


class RelayWorker(ModelWorker):
    """A relay's worker: an event it delivers without a claim is held from its handler's start
    until its outcome is stored, and its lease ends one lease after the event became due."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.delivery.keeper is not None:
            keeper = RelayKeeper(self.delivery, self.lease_ms / 3000)
            keeper.worker = self
            self.delivery.keeper = keeper
        handle = self.delivery.handle

        def relayed(record: EventRecord) -> Any:
            if record.id not in self.actor.held:  # not claimed: the relay's own lease
                self.actor.held[record.id] = record.due_at_ms
                self.actor.machine.log(record.id, f"relayed by {self.actor.name}")
            return handle(record)

        self.delivery.handle = relayed  # type: ignore[method-assign]


class BeatGate:
    """Holds a lease keeper's beat inside its store call, on a thread of its own, while the
    relay goes on: ``applied`` holds it after the request was answered (its claim written, the
    keeper not told yet), else before it is sent."""

    def __init__(self, applied: bool) -> None:
        self.applied = applied
        self.parked = threading.Event()
        self.go = threading.Event()

    def hold(self, call: Callable[[], Any]) -> Any:
        if not self.applied:
            self.parked.set()
            self.go.wait(60)
            return call()
        answer = call()
        self.parked.set()
        self.go.wait(60)
        return answer


class InjectedWriteError(ConnectionError):
    """What the client raised after its last attempt (a read timeout, then connection errors):
    the write may have applied."""


class RaisingStore:
    """The relay's store under its gate: the next write named in the actor's ``raising`` (by
    its thread or its keeper's) applies and then raises, or raises unsent (one-shot)."""

    def __init__(self, store: Any, actor: Any) -> None:
        self._store = store
        self._actor = actor

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            applied = self._actor.take_raise(name)
            if applied is None:
                return attr(*args, **kwargs)
            if not applied:
                self._actor.machine.log_write(name, f"{name} raised unsent")
                self._outcomes_not_applied(name, args)
                raise InjectedWriteError(f"injected: {name} not sent")
            answer = attr(*args, **kwargs)
            self._actor.machine.log_write(name, f"{name} applied ({answer!r:.120}), then raised")
            raise InjectedWriteError(f"injected: {name} applied, its answer lost")

        return call

    def _outcomes_not_applied(self, name: str, args: tuple[Any, ...]) -> None:
        """An outcome write raised unsent: the deliveries it was to store may run again (the
        store still shows their events undelivered; the exact oracle allows one re-run each)."""
        if name == "settle_unclaimed":
            outcomes = [outcome for _, outcome in args[0]]
        elif name == "finish_many":
            outcomes = list(args[0])
        else:
            return
        machine = self._actor.machine
        for outcome in outcomes:
            if outcome.kind == "completed" and outcome.error is None:
                machine.outcome_not_applied.add(outcome.record.id)
                machine.log(outcome.record.id, f"its delivery's outcome ({name}) not applied")


class RelayStore(GatedStore):
    def __init__(self, store: Any, actor: Any) -> None:
        super().__init__(RaisingStore(store, actor), actor)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        gate = getattr(self._actor, "beat_gate", None)
        if gate is None or threading.current_thread() is self._actor.thread:
            return super()._call(name, *args, **kwargs)
        return gate.hold(lambda: super(RelayStore, self)._call(name, *args, **kwargs))

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
        self.beat_gate: BeatGate | None = None  # a beat held inside its store call
        self.taking_back = threading.Event()  # the relay asked its keeper for an event back
        self._backend = backend
        self.raising: list[tuple[str, bool]] = []  # (write, applied) to raise, one-shot each
        self._raising_lock = threading.Lock()
        super().__init__(machine, name, backend, relay=True, claim=claim)

    worker_class = RelayWorker
    store_class = RelayStore

    def take_raise(self, name: str) -> bool | None:
        """Whether this call of ``name`` is to raise after it applied (True) or unsent (False);
        None: it goes as usual."""
        with self._raising_lock:
            for i, (write, applied) in enumerate(self.raising):
                if write == name:
                    del self.raising[i]
                    return applied
        return None

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
                answer = relay({"Records": self.batch}, None)
                reported = {f["itemIdentifier"] for f in answer.get("batchItemFailures", [])}
                if reported:
                    # Lambda hands the batch again from the first record reported
                    first = next(
                        i
                        for i, r in enumerate(self.batch)
                        if r["dynamodb"]["SequenceNumber"] in reported
                    )
                    self.machine.stream[:0] = self.batch[first:]
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
            self.streamed: list[dict[str, Any]] = []  # every record, as first streamed
            self.backlogs = 0
            self.sequence = 0
            self.last_batch: list[dict[str, Any]] | None = None
            self.write_log: list[str] = []  # the writes made to raise
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
            self.images([e.id for e in events], "INSERT")

        def retried(self, event_ids: list[str]) -> None:
            """The stream's MODIFY records of failed events put back to pending."""
            if STREAM_TIMING:
                for record in self.streamed:
                    if record["dynamodb"]["NewImage"]["event_id"]["S"] in event_ids:
                        record["stale"] = True  # an image from before the retry
                self.images(event_ids, "MODIFY")

        def images(self, event_ids: list[str], name: str) -> None:
            store = self.publishers[next(iter(self.publishers))]._store
            client = store._table.client
            for event_id in event_ids:
                raw = client.get_item(
                    TableName=store._table.name, Key=store._key(event_id), ConsistentRead=True
                ).get("Item")
                if raw is None:
                    continue
                self.sequence += 1
                record = {
                    "eventName": name,
                    "eventSource": "aws:dynamodb",
                    "dynamodb": {
                        "NewImage": raw,
                        "SequenceNumber": f"{self.sequence:021d}",
                        "StreamViewType": "NEW_IMAGE",
                    },
                }
                self.stream.append(record)
                self.streamed.append({**record, "stale": False})

        def log_write(self, name: str, what: str) -> None:
            self.write_log.append(f"{now_ms(self.clock)}: {what}")

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

        # -- stream timing and backlogs (issue 36) ---------------------------------------------------

        def hand(self, index: int, batch: list[dict[str, Any]], steps: int) -> None:
            relays = self.relays()
            if not relays or not batch:
                return
            relay = relays[index % len(relays)]
            relay.batches.append(batch)
            relay.fail_next = False
            for _ in range(steps):
                relay.step()
                if not relay.live:
                    break

        @precondition(lambda self: STREAM_TIMING)
        @rule(
            index=st.integers(0, 9),
            size=st.integers(1, 6),
            before_end=st.sampled_from((3000, 2500, 2000, 1500, 1000, 500, 0, -1500)),
            steps=st.integers(0, 12),
        )
        def late_stream(self, index: int, size: int, before_end: int, steps: int) -> None:
            """The next records reach a relay late: ``before_end`` ms before the implicit lease
            of their first event ends (due + lease), or after it."""
            if not self.stream or not self.relays():
                return
            due = int(self.stream[0]["dynamodb"]["NewImage"].get("due_ms", {}).get("N", 0))
            wait = due + LEASE_MS - before_end - now_ms(self.clock)
            if wait > 0:
                self.pass_time(wait)
            batch, self.stream = self.stream[:size], self.stream[size:]
            self.hand(index, batch, steps)

        @precondition(lambda self: STREAM_TIMING)
        @rule(first=st.integers(0, 20), second=st.integers(0, 20))
        def out_of_order(self, first: int, second: int) -> None:
            """Two records of the stream swap places (different shards of the stream, a batch
            bisected and retried)."""
            if len(self.stream) > 1:
                i, j = first % len(self.stream), second % len(self.stream)
                self.stream[i], self.stream[j] = self.stream[j], self.stream[i]

        @precondition(lambda self: REPLAYED_INSERT and bool(self.streamed))
        @rule(
            index=st.integers(0, 9),
            pick=st.integers(0, 99),
            stale=st.booleans(),
            steps=st.integers(0, 12),
        )
        def replay_image(self, index: int, pick: int, stale: bool, steps: int) -> None:
            """An old INSERT or MODIFY image is handed again long after, as first streamed (the
            mapping starts at TRIM_HORIZON; Lambda retries and bisects): after a delivery, a
            retry, a redrive of its group (``stale``: an image older than its event's last
            retry, when there is one)."""
            images = self.streamed
            if stale:
                images = [r for r in self.streamed if r["stale"]] or images
            record = images[pick % len(images)]
            self.hand(index, [{k: v for k, v in record.items() if k != "stale"}], steps)

        @precondition(lambda self: STREAM_TIMING)
        @rule(
            index=st.integers(0, 9),
            ms=st.sampled_from((SLICE_MS, 2 * SLICE_MS, 4 * SLICE_MS, LEASE_MS)),
            polls=st.integers(1, 2),
        )
        def overrun(self, index: int, ms: int, polls: int) -> None:
            """A relay's handler runs long (a slow downstream): time passes while a relay is
            inside a handler, then a sweeper polls."""
            inside = [a for a in self.relays() if a.at.startswith("handler")]
            if not inside:
                return
            self.pass_time(ms)
            self.sweep_now(index, polls)

        @precondition(lambda self: BACKLOG and self.backlogs < 1)
        @rule(
            shape=st.sampled_from(BACKLOG_SHAPES),
            rank=st.integers(0, 99),
            arrivals=st.integers(0, BACKLOG_ARRIVALS),
        )
        def backlog(self, shape: tuple[int, int], rank: int, arrivals: int) -> None:
            """The relay lags behind a fast publisher: young events fill the first page of every
            shard of a sweeper of a small batch, while an event whose stream record never came
            waits. The sweeper delivers that event within a bounded number of sweeps, while
            young events keep arriving (not only once the load stops)."""
            shards, batch_size = shape
            self.backlogs += 1
            publisher = self.publishers[shards]
            target = self.publish_on(publisher, shards, None, rank)
            self.stream = [
                r for r in self.stream if r["dynamodb"]["NewImage"]["event_id"]["S"] != target
            ]
            self.log(target, "its stream record never comes")
            # old for every sweeper, whatever its clock
            self.pass_time(LEASE_MS + SKEW_MS + SLICE_MS)
            sweeper = self.spawn(
                {"batch_size": batch_size, "leave_new_for": LEASE_MS / 1000}, shards=shards
            )
            truth = self.truth()
            waiting = sum(
                r is not None and r.status in (EventStatus.PENDING, EventStatus.IN_FLIGHT)
                for r in truth.values()
            )
            polled = max(shards, sweeper.worker._store.refresh_shards())
            for shard in range(polled):
                for _ in range(batch_size):
                    self.publish_on(self.publishers[polled], polled, shard, rank)
            bound = polled + waiting + 2
            for sweep in range(bound):
                sweeper.run_until_idle()
                record = self.readers[0].get(target)
                if target in self.started or (
                    record is not None and record.status is not EventStatus.PENDING
                ):
                    return
                if sweep % 2 and arrivals:
                    arrivals -= 1
                    self.publish_on(self.publishers[polled], polled, sweep % polled, rank)
                sweeper.step()  # past "idle": into the next poll
            self.violations.append(
                f"{target}, which the relay never saw, was not delivered in {bound} sweeps of "
                f"{sweeper} while young events kept arriving on {polled} shards: "
                f"{self.history.get(target)}; {self.readers[0].get(target)}"
            )

        @precondition(lambda self: RAISED_WRITES)
        @rule(
            index=st.integers(0, 9),
            kind=st.sampled_from(RAISED_KINDS),
            steps=st.integers(0, 12),
        )
        def write_raises(self, index: int, kind: tuple[str, bool], steps: int) -> None:
            """The next ``kind[0]`` write of a relay (its own or its keeper's) applies and then
            raises to its caller (``kind[1]``), or raises unsent; the relay runs a while."""
            relays = self.relays()
            if not relays:
                return
            relay = relays[index % len(relays)]
            relay.raising.append(kind)
            for _ in range(steps):
                if not relay.live or (relay.at == "idle" and not relay.batches):
                    break
                relay.step()

        @precondition(lambda self: KEEPER_RACE)
        @rule(index=st.integers(0, 9), applied=st.booleans(), steps=st.integers(1, 6))
        def beat_meets_take_back(self, index: int, applied: bool, steps: int) -> None:
            """A relay's lease keeper beats on its own thread (as it does in production) while
            the relay runs a handler; its claim or extension is held on its way, answered or not
            yet sent (``applied``), while the relay goes on: its handler returns and it takes
            its event back (waiting for the beat), then stores the outcome."""
            inside = [
                a
                for a in self.relays()
                if a.at.startswith("handler") and a.keeper is not None and a.keeper._held
            ]
            if not inside:
                return
            relay = inside[index % len(inside)]
            keeper = relay.keeper
            assert keeper is not None
            # Half a beat passes with this keeper still (a thread a little late); the others
            # beat as usual. Then its beat has work: a claim, or an extension.
            relay.keeper = None
            self.pass_time(SLICE_MS)
            relay.keeper = keeper
            gate = relay.beat_gate = BeatGate(applied)
            relay.taking_back.clear()
            beat = threading.Thread(target=keeper.beat, name=f"model-beat-{relay.name}")
            beat.start()
            while not gate.parked.wait(0.01) and beat.is_alive():
                pass
            try:
                for _ in range(steps):
                    if not relay.live:
                        break
                    relay._parked.clear()
                    relay._go.release()
                    # The relay parks at its next checkpoint, or waits for the beat (in
                    # take_back, outside any checkpoint): then the beat's answer comes.
                    deadline = time.monotonic() + 120
                    while not relay._parked.wait(0.01):
                        if relay.taking_back.is_set():
                            gate.go.set()
                        assert time.monotonic() < deadline, f"{relay!r} reached no checkpoint"
                    if relay.error is not None:
                        raise relay.error
            finally:
                gate.go.set()
                beat.join(60)
                relay.beat_gate = None
            assert not beat.is_alive(), "the keeper's beat did not end"

        def publish_on(self, publisher: Any, shards: int, shard: int | None, rank: int) -> str:
            """Publish one unordered event (on ``shard`` of ``shards`` when given) and stream it;
            its id."""
            number = len(self.events)
            for r in range(100):
                event_id = f"{(rank + r) % 100:02d}-e{number}"
                if shard is None or shard_of(event_id, shards) == shard:
                    break
            event = Event("t", {"n": number}, id=event_id, occurred_at=self.clock.time())
            assert publisher.publish([event]) == [event_id]
            self.events[event_id] = Published(None, None)
            self.published([event], None)
            return event_id

        def pass_time(self, ms: int) -> None:
            super().pass_time(ms)
            if RELAY_LEASE_STRICT:
                return
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
@pytest.mark.timeout(4 * 3600)
@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_stress_relay_model(lossy: Any) -> None:
    """``make stress``: the relay model with DELIVERY_STRESS_SCALE (20) times the examples."""
    run_relay_model(lossy.backend, lossy.lose_next, "dynamodb", scale=DELIVERY_STRESS_SCALE)


def replay_old_insert_after_redrive(make: Callable[..., Any], lose_next: Any, kind: str) -> None:
    """A history the random search reaches rarely (issue 36, case 4), replayed through the same
    machine: ``e0`` (place 1 of g0) fails for good, ``e1`` and ``e2`` follow it, and
    ``retry(group="g0")`` moves ``e0`` behind them; then the stream hands the relay ``e0``'s
    original INSERT image again (the mapping starts at TRIM_HORIZON). It must not run before
    ``e1`` and ``e2``."""
    machine = make_relay_machine(make, lose_next, kind)()
    try:
        machine.publish(shards=1, batch=[(True, "g0", 10)], lose=False)
        machine.stream.clear()  # the relay never sees it: the sweeper fails it for good
        [sweeper] = [a for a in machine.actors if a.options.get("batch_size") == 1]
        sweeper.fail_next = True
        for _ in range(12 * MAX_ATTEMPTS):
            sweeper.run_until_idle()
            record = machine.readers[0].get("10-e0")
            if record is not None and record.status is EventStatus.FAILED:
                break
            machine.pass_time(LEASE_MS)
        else:
            raise AssertionError(f"10-e0 did not fail: {machine.truth()}")
        sweeper.fail_next = False
        machine.publish(shards=1, batch=[(True, "g0", 20), (True, "g0", 30)], lose=False)
        machine.stream.clear()
        machine.retry_group("g0", lose=False)
        assert machine.groups["g0"] == ["20-e1", "30-e2", "10-e0"]
        [insert] = [
            r
            for r in machine.streamed
            if r["eventName"] == "INSERT" and r["dynamodb"]["NewImage"]["event_id"]["S"] == "10-e0"
        ]
        machine.hand(0, [{k: v for k, v in insert.items() if k != "stale"}], 30)
        machine.safe()
    finally:
        machine.teardown()
    assert list(machine.delivered) == ["20-e1", "30-e2", "10-e0"]


@pytest.mark.skipif(not REPLAYED_INSERT, reason="REPLAYED_INSERT is off")
def test_replay_old_insert_after_redrive_moto(moto_factory: Callable[..., Any]) -> None:
    replay_old_insert_after_redrive(moto_factory, None, "moto")


@pytest.mark.skipif(not REPLAYED_INSERT, reason="REPLAYED_INSERT is off")
@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_replay_old_insert_after_redrive(lossy: Any) -> None:
    replay_old_insert_after_redrive(lossy.backend, lossy.lose_next, "dynamodb")


def sweep_then_let_the_relay_finish(machine: Any, relay: Any) -> None:
    """A replayed history's end: the sweeper of the large batch polls twice while the relay
    waits where it is, then the relay goes on to idle; safety checked after each."""
    sweeper = next(a for a in machine.actors if a.options.get("batch_size") == 25)
    sweeper.run_until_idle()
    sweeper.step()
    sweeper.run_until_idle()
    machine.safe()
    relay.run_until_idle()
    machine.safe()


def replay_relay_handler_past_its_lease(
    make: Callable[..., Any], lose_next: Any, kind: str
) -> None:
    """A history the random search reaches rarely (issue 36, case 3), replayed through the same
    machine: the stream hands a new event to a relay without a claim 1.5 s before its implicit
    lease (due + lease) ends; the relay starts the handler, which runs 2 s; a sweeper polls. The
    event must not be delivered twice (no crash, no freeze)."""
    machine = make_relay_machine(make, lose_next, kind)()
    try:
        machine.publish(shards=1, batch=[(False, None, 10)], lose=False)
        [relay] = [a for a in machine.relays() if not a.claim]
        machine.pass_time(LEASE_MS - 1500)
        relay.batches.append(machine.stream[:1])
        del machine.stream[:1]
        for _ in range(30):
            relay.step()
            if relay.at.startswith("handler") or (relay.at == "idle" and not relay.batches):
                break
        machine.pass_time(2000)
        sweep_then_let_the_relay_finish(machine, relay)
    finally:
        machine.teardown()
    assert machine.delivered == {"10-e0": 1}


@pytest.mark.skipif(not RELAY_OVERRUN_REPLAY, reason="RELAY_OVERRUN_REPLAY is off")
def test_replay_relay_handler_past_its_lease_moto(moto_factory: Callable[..., Any]) -> None:
    replay_relay_handler_past_its_lease(moto_factory, None, "moto")


@pytest.mark.skipif(not RELAY_OVERRUN_REPLAY, reason="RELAY_OVERRUN_REPLAY is off")
@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_replay_relay_handler_past_its_lease(lossy: Any) -> None:
    replay_relay_handler_past_its_lease(lossy.backend, lossy.lose_next, "dynamodb")


def replay_relay_outcome_slower_than_its_lease(
    make: Callable[..., Any], lose_next: Any, kind: str
) -> None:
    """A history the keeper race generator reached: a relay without a claim runs a new event's
    handler at once, which succeeds; its outcome's write (one conditional request) then takes
    longer than what is left of its implicit lease (botocore's retries, a slow network: the
    process is not frozen, its keeper beats); a sweeper polls. The event must not be delivered
    twice: its keeper still holds it while the outcome is written, and claims it before the
    lease ends, so the outcome goes under the claim."""
    machine = make_relay_machine(make, lose_next, kind)()
    try:
        # every worker's clock 2 s behind the publisher's: the relay has its whole lease to
        # run the handler without a claim
        machine.skew_clocks(low=-SKEW_MS, spread=[0])
        machine.publish(shards=1, batch=[(False, None, 10)], lose=False)
        [relay] = [a for a in machine.relays() if not a.claim]
        relay.batches.append(machine.stream[:1])
        del machine.stream[:1]
        for _ in range(30):
            relay.step()
            if relay.at == "settle_unclaimed" or (relay.at == "idle" and not relay.batches):
                break
        assert relay.at == "settle_unclaimed", relay
        machine.pass_time(2 * LEASE_MS)  # the outcome's write is slow
        sweep_then_let_the_relay_finish(machine, relay)
        truth = machine.truth()
    finally:
        machine.teardown()
    assert machine.delivered == {"10-e0": 1}
    assert truth["10-e0"] is not None and truth["10-e0"].status is EventStatus.COMPLETED


@pytest.mark.skipif(not RELAY_SLOW_OUTCOME_REPLAY, reason="RELAY_SLOW_OUTCOME_REPLAY is off")
def test_replay_relay_outcome_slower_than_its_lease_moto(moto_factory: Callable[..., Any]) -> None:
    replay_relay_outcome_slower_than_its_lease(moto_factory, None, "moto")


@pytest.mark.skipif(not RELAY_SLOW_OUTCOME_REPLAY, reason="RELAY_SLOW_OUTCOME_REPLAY is off")
@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_replay_relay_outcome_slower_than_its_lease(lossy: Any) -> None:
    replay_relay_outcome_slower_than_its_lease(lossy.backend, lossy.lose_next, "dynamodb")


def replay_keeper_claim_applied_then_raised(
    make: Callable[..., Any], lose_next: Any, kind: str
) -> None:
    """The history of issue 49, section 2, through the machine: a relay without a claim runs a
    new event's handler past its keeper's first beat; the keeper's claim applies and raises
    (botocore after its last attempt); the handler returns before the next beat and the relay
    stores its outcome; after the lease a sweeper polls. The event must be stored completed and
    its handler run once: the outcome refused by the relay's own claim is stored under it."""
    machine = make_relay_machine(make, lose_next, kind)()
    try:
        # every worker's clock 2 s behind the publisher's: the relay has its whole lease
        machine.skew_clocks(low=-SKEW_MS, spread=[0])
        machine.publish(shards=1, batch=[(False, None, 10)], lose=False)
        [relay] = [a for a in machine.relays() if not a.claim]
        relay.batches.append(machine.stream[:1])
        del machine.stream[:1]
        for _ in range(30):
            relay.step()
            if relay.at.startswith("handler") or (relay.at == "idle" and not relay.batches):
                break
        assert relay.at.startswith("handler"), relay
        relay.raising.append(("claim_many", True))
        # until the keeper's beat claims it: the claim applies, then raises
        for _ in range(LEASE_MS // SLICE_MS):
            machine.pass_time(SLICE_MS)
            if not relay.raising:
                break
        assert not relay.raising and machine.write_log, machine.write_log
        relay.run_until_idle()
        machine.safe()
        machine.pass_time(2 * LEASE_MS)
        sweep_then_let_the_relay_finish(machine, relay)
        truth = machine.truth()
    finally:
        machine.teardown()
    assert machine.delivered == {"10-e0": 1}
    assert truth["10-e0"] is not None and truth["10-e0"].status is EventStatus.COMPLETED


@pytest.mark.skipif(not RAISED_WRITES, reason="RAISED_WRITES is off")
def test_replay_keeper_claim_applied_then_raised_moto(moto_factory: Callable[..., Any]) -> None:
    replay_keeper_claim_applied_then_raised(moto_factory, None, "moto")


@pytest.mark.skipif(not RAISED_WRITES, reason="RAISED_WRITES is off")
@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_replay_keeper_claim_applied_then_raised(lossy: Any) -> None:
    replay_keeper_claim_applied_then_raised(lossy.backend, lossy.lose_next, "dynamodb")
