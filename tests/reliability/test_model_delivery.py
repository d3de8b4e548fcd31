"""The randomized fault model of delivery (issue 28): histories of publishers, workers that die,
freeze past their lease or run slow handlers, lost responses and shard changes, on every backend.

How a history runs. Every worker is an *actor*: a real :class:`OutboxWorker` on its own thread,
on a backend of its own (its own shard setting), whose store calls and handler calls each stop
at a checkpoint until the scheduler lets the actor take one more step. Only one thread runs at a
time, so a history is a sequence of single store requests (or handler phases) chosen by
hypothesis, interleaved with:

* **time**: a :class:`ManualClock` moves in slices of half a lease-keeper beat; after each slice
  the lease keeper of every live worker that is not frozen beats (the keeper is the worker's
  own ``LeaseKeeper``, driven by the scheduler instead of a thread);
* **slow handlers**: a worker parked inside a handler while time passes;
* **death** at any checkpoint (after a claim, mid-handler, before or after a flush): the actor's
  thread ends there, nothing of it is sent any more, and a new worker takes its place;
* **freeze**: neither the worker nor its keeper runs while time passes (SIGSTOP), then it goes on;
* **lost responses**: the next write is applied, its answer dropped and re-sent by the client's
  own retry (``tests/lossy.py``), on publishes, claims, outcomes and lease extensions;
* ``outbox.retry`` of failed events, ``outbox.retry(group=...)`` of an ordered group's failed
  events (they take new places at the group's tail: the model moves them there too), publishers
  with 1, 4 or 8 shards (DynamoDB), and long-lived readers whose shard count was read at the
  start;
* (issue 36, each behind a switch below) events **near the item limit** (accepted and delivered,
  or refused up-front with ValueTooLargeError writing nothing); **contention answers** on an
  actor's DynamoDB requests (per-request throttles botocore retries, per-statement errors inside
  a BatchExecuteStatement for statements not applied, transactions cancelled by
  TransactionConflict round after round: ``tests/reliability/_injected.py``); the **PartiQL
  permission** withdrawn and granted again; actor **clocks** off by fixed offsets up to the
  documented 2 s skew.

* (issue 49) **poison events**: an event whose handler kills its worker's process wherever it
  runs (in a batch with others, re-claimed alone), until the faults stop; an **index that
  lags** (``LAG``: AWS's GSIs are eventually consistent, DynamoDB Local's are not): an actor's
  next queries are answered from the index as it last answered them, entries since gone still
  listed in their old status, due time and lease token, entries since added missing.

Checked after every step (safety), by an exact oracle: a reference of what the store holds (per
event: the lease token, its end and its holder as the claims, renewals and outcomes the model
saw apply wrote them; the claims applied; its handler's starts since its last retry) judges each
applied write when it applies. No "a worker died or froze" excuse:

* a claim of an event in flight applies only if its stored lease had ended at the claimer's
  ``now`` (the clock the store judged by): a renewal applied since the claimer's read moved it;
* an event whose handler once succeeded runs again, and two handlers of one event overlap, only
  if a claim of it applied after the earlier run began (a takeover, itself judged above);
* in an ordered group, no handler of place k+1 starts before place k was delivered once or
  stored as failed (a failed event lets its group go on, as documented);
* ``stats()`` of a long-lived reader (one of them, in turn) equals the counts of the stored items;
* no event is stored as failed unless its own handler started ``MAX_ATTEMPTS`` times since it
  was last retried (a death inside it counts: the start is counted when the handler is called).
  (The relay model adds its own narrow excuses, ``excused``, for a relay run past its lease.)

Checked at the end, once the faults stop (liveness): frozen workers go on, handlers succeed,
and within a bounded number of polls every event is completed (its handler succeeded) or failed
after ``max_attempts``: nothing wedges, whatever the batch sizes; every reader's ``stats()`` agrees.

While developing: ``DYNACOORD_MODEL_SCALE=N`` runs N times the examples,
``DYNACOORD_MODEL_NO_SHRINK=1`` reports a failure without shrinking it (minutes on the real
servers), ``DYNACOORD_MODEL_DEBUG=1`` prints what each history did.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import Phase
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from dynacoord import ManualClock
from dynacoord._clock import now_ms
from dynacoord.codec import DYNAMODB_ITEM_LIMIT
from dynacoord.errors import ValueTooLargeError
from dynacoord.outbox import Event, EventRecord, EventStatus, Outcome
from dynacoord.outbox.delivery import LeaseKeeper
from dynacoord.outbox.options import WorkerOptions
from dynacoord.outbox.worker import OutboxWorker
from dynacoord.testing import unique_name
from tests.reliability._injected import (
    STATEMENT_CODES,
    THROTTLE_CODES,
    Injector,
    Plan,
    SkewedClock,
    forget_partiql,
)
from tests.reliability.conftest import DELIVERY_STRESS_SCALE, hsettings

LEASE_MS = 3000
SLICE_MS = LEASE_MS // 6  # half a keeper beat (the keeper beats every lease / 3)
MAX_ATTEMPTS = 3
MAX_EVENTS = 14
GROUPS = ("g0", "g1", "g2")
#: rounds (polls while they find work, then a lease of time) within which the outbox must drain
#: once the faults stop
DRAIN_ROUNDS = 25
#: (max_examples, steps) per backend kind; ``make stress`` runs DELIVERY_STRESS_SCALE times the examples
BUDGET: dict[str, tuple[int, int]] = {
    "moto": (3, 60),  # about 20 s an example (moto is the slowest store here)
    "dynamodb": (10, 60),
    "redis": (12, 60),
    "redis_cluster": (5, 60),
    "mongo": (12, 60),
}

# -- the generators of issue 36 ---------------------------------------------------------------------
# Each is a kind of history production brings that the model did not generate. One that fails on
# the library as it is stays off in a commit (a missing generator first, then a fix) and is turned
# on with the fix. ``DYNACOORD_MODEL_OFF=SIZES,CONTENTION`` turns some off for a run (while
# developing: to look past a known failure); ``DYNACOORD_MODEL_ON=...`` turns some on.

_OFF = set(os.environ.get("DYNACOORD_MODEL_OFF", "").split(","))
_ON = set(os.environ.get("DYNACOORD_MODEL_ON", "").split(","))


def switch(name: str, default: bool) -> bool:
    """Whether the generator ``name`` runs: ``default``, unless the environment says."""
    return name in _ON or (default and name not in _OFF)


#: events whose item is near the item limit (every backend refuses items over DynamoDB's 400 KB):
#: publish accepts them (then they are delivered, their outcome stored even with a 2 KB
#: ``last_error``) or refuses them with ValueTooLargeError, writing nothing
SIZES = switch("SIZES", True)
#: per-request throttles, per-statement errors inside a BatchExecuteStatement, transactions
#: cancelled by TransactionConflict round after round (DynamoDB: botocore hooks on the client)
CONTENTION = switch("CONTENTION", True)
#: the replayed history of case 5: an ordered group's outcomes and gate cancelled six rounds running
OUTCOME_CONFLICTS = switch("OUTCOME_CONFLICTS", True)
#: the PartiQL permission withdrawn (every BatchExecuteStatement AccessDenied) and granted again
PERMISSION = switch("PERMISSION", True)
#: every actor's clock is the model's plus a fixed offset; two actors differ by up to SKEW_MS
SKEW = switch("SKEW", True)
#: an event whose handler kills its worker's process (issue 49: a poison event fails alone)
POISON = switch("POISON", True)
#: an index that lags (AWS's GSIs are eventually consistent, DynamoDB Local's are not): an actor's
#: next queries are answered from the index as it was, entries missing or in an old status
LAG = switch("LAG", True)
#: the documented clock skew (docs/guarantees.md, "Clock skew")
SKEW_MS = 2000
#: how much room a large event leaves under the item limit (bytes; negative: over it)
ROOM = (-300, 0, 1500, 2600, 4000, 4100, 4200, 4600, 6000)
#: moto refuses an item over 405,000 bytes (its LimitedSizeDict), DynamoDB over 400 KB (409,600),
#: so an event publish accepts by DynamoDB's rules may not take delivery's attributes on moto: there
#: large events are 4 KB (the room publish keeps) further under moto's own limit
MOTO_ITEM_LIMIT = 405_000 - 4 * 1024
#: bytes of an event's item besides its payload's padding (id, keys, type, status, due...)
ITEM_OVERHEAD = 240
#: at most this many large events a history (each is read at every step's checks)
MAX_LARGE = 2


class DiedError(BaseException):
    """The worker's process was killed: nothing after this point of it runs."""


class HandlerFailedError(Exception):
    """The downstream said no."""


class ModelKeeper(LeaseKeeper):
    """The worker's own lease keeper (one for its life), beaten by the scheduler instead of a
    thread."""

    def _wake(self) -> None:
        pass

    def _rest(self) -> None:
        return None


class ModelWorker(OutboxWorker):
    actor: Actor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.delivery.keeper is not None:
            self.delivery.keeper = ModelKeeper(self.delivery, self.lease_ms / 3000)


class GatedStore:
    """The actor's view of its backend's outbox store: every call waits for the scheduler's
    go (from the actor's thread) and tells the model what the worker holds."""

    def __init__(self, store: Any, actor: Actor) -> None:
        self._store = store
        self._actor = actor

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        actor = self._actor
        if threading.current_thread() is actor.thread:
            actor.checkpoint(name)
        elif actor.killed or actor.frozen:  # its keeper: dead or frozen with its process
            raise DiedError()
        injector = actor.machine.injector
        if injector is None:
            return getattr(self._store, name)(*args, **kwargs)
        with injector.acting(actor.plan):  # the faults armed for this actor's requests
            return getattr(self._store, name)(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        return functools.partial(self._call, name) if callable(attr) else attr

    def query_page(self, status: EventStatus, shard: int, **kwargs: Any) -> Any:
        """An index query; while the actor's index lags (the LAG generator), answered from the
        index as it was: the last answer to the same query (entries since gone still listed in
        their old status, due time and lease token; entries since added missing), or nothing."""
        answer = self._call("query_page", status, shard, **kwargs)
        key = (status, shard, kwargs.get("cursor"))
        actor = self._actor
        if actor.lagging > 0:
            actor.lagging -= 1
            stale = actor.index_seen.get(key, ([], None))
            actor.machine.log_lag(actor, status, shard, stale[0])
            return stale
        actor.index_seen[key] = answer
        return answer

    def claim(self, seen: EventRecord, token: str, until: int, now: int) -> EventRecord | None:
        got = self._call("claim", seen, token, until, now)
        if got is not None:
            self._actor.held[got.id] = got.due_at_ms
            self._actor.machine.log(got.id, f"claimed by {self._actor.name} until {until}")
            self._actor.machine.claim_applied(self._actor, seen, got, now)
        return got  # type: ignore[no-any-return]

    def claim_many(
        self, seen: Sequence[EventRecord], tokens: Sequence[str], until: int, now: int
    ) -> list[EventRecord]:
        got: list[EventRecord] = self._call("claim_many", seen, tokens, until, now)
        as_seen = {r.id: r for r in seen}
        for record in got:
            self._actor.held[record.id] = record.due_at_ms
            self._actor.machine.log(record.id, f"claimed by {self._actor.name} until {until}")
            self._actor.machine.claim_applied(self._actor, as_seen[record.id], record, now)
        return got

    def extend_many(self, held: Sequence[EventRecord], until: int, now: int) -> list[bool]:
        kept: list[bool] = self._call("extend_many", held, until, now)
        for record, ok in zip(held, kept, strict=True):
            if ok and record.id in self._actor.held:
                self._actor.held[record.id] = until
            self._actor.machine.log(record.id, f"extended by {self._actor.name}: {ok}")
            if ok:
                self._actor.machine.lease_moved(record, until)
        return kept

    def finish_many(
        self, outcomes: Sequence[Outcome], now: int, retention_ms: int | None
    ) -> list[bool]:
        written: list[bool] = self._call("finish_many", outcomes, now, retention_ms)
        self.stored(outcomes, written)
        return written

    def stored(self, outcomes: Sequence[Outcome], written: Sequence[bool], how: str = "") -> None:
        """Tell the model which outcomes were written: the events are no longer held."""
        for outcome, ok in zip(outcomes, written, strict=True):
            self._actor.held.pop(outcome.record.id, None)
            self._actor.machine.log(
                outcome.record.id,
                f"{outcome.kind} by {self._actor.name}{how}: {'ok' if ok else 'refused'}",
            )
            if ok and outcome.kind == "failed":
                self._actor.machine.ever_failed.add(outcome.record.id)
            if ok:
                self._actor.machine.lease_ended(outcome.record.id, outcome.token)
                self._actor.machine.outcome_not_applied.discard(outcome.record.id)


class Actor:
    """One worker process: a thread that runs ``worker.run_once()`` over and over, one
    checkpoint (store call or handler phase) per scheduler step."""

    def __init__(self, machine: Any, name: str, backend: Any, **options: Any) -> None:
        self.machine = machine
        self.name = name
        self.killed = False
        self.frozen = False
        self.done = False
        self.error: BaseException | None = None
        self.at = "start"
        self.fail_next = False
        self.handled = 0  # what the last poll handled
        self.held: dict[str, int] = {}  # claimed, outcome not stored: event id -> lease end
        self.keeper: ModelKeeper | None = None
        self.plan = Plan()  # faults injected into its requests (DynamoDB)
        self.lagging = 0  # index queries still to answer from the index as it was (LAG)
        #: (status, shard, cursor) -> the last answer the index gave this actor
        self.index_seen: dict[tuple[Any, int, Any], Any] = {}
        self.clock: SkewedClock = backend.clock  # the model's clock, maybe off by a fixed offset
        self._go = threading.Semaphore(0)
        self._parked = threading.Event()
        self.options = options
        self.worker = self._make_worker(backend, options)
        self.worker.actor = self
        self.keeper = self.worker.delivery.keeper
        self.thread = threading.Thread(target=self._main, name=f"model-{name}", daemon=True)
        self.thread.start()
        if not self._parked.wait(30):
            raise AssertionError(f"{name} did not start")

    worker_class: type[OutboxWorker] = ModelWorker
    store_class: type[GatedStore] = GatedStore

    def _make_worker(self, backend: Any, options: dict[str, Any]) -> Any:
        return self.worker_class(
            self.store_class(backend.outbox._store, self),  # type: ignore[arg-type]
            self.handle,
            clock=self.clock,
            options=WorkerOptions(
                lease=LEASE_MS / 1000,
                max_attempts=MAX_ATTEMPTS,
                backoff=0.2,
                max_backoff=1.0,
                retention=3600,
                **options,
            ),
            name=self.name,
        )

    def __repr__(self) -> str:
        flags = "".join(f" {f}" for f in ("killed", "frozen", "done") if getattr(self, f))
        skew = f" clock {self.clock.offset_ms:+d} ms" if self.clock.offset_ms else ""
        return f"<{self.name} {self.options}{skew} at {self.at}{flags} holding {sorted(self.held)}>"

    @property
    def live(self) -> bool:
        return not self.killed and not self.done

    def _main(self) -> None:
        try:
            while True:
                self.checkpoint("idle")
                self.handled = self.worker.run_once()
        except DiedError:
            pass
        except BaseException as exc:  # reported by the scheduler's next step
            self.error = exc
        finally:
            self.done = True
            self._parked.set()

    def checkpoint(self, what: str) -> None:
        if self.killed:
            raise DiedError()
        self.at = what
        self._parked.set()
        self._go.acquire()
        if self.killed:
            raise DiedError()

    def step(self) -> None:
        """Let the actor do what it is parked before, up to its next checkpoint."""
        assert self.live and not self.frozen
        self._parked.clear()
        self._go.release()
        if not self._parked.wait(120):
            raise AssertionError(f"{self!r} did not reach its next checkpoint")
        if self.error is not None:
            raise self.error

    def run_until_idle(self, limit: int = 400) -> None:
        for _ in range(limit):
            self.step()
            if self.at == "idle" or not self.live:
                return
        raise AssertionError(f"{self!r}: one poll took more than {limit} steps")

    def kill(self) -> None:
        self.killed = True
        self.keeper = None
        if not self.done:
            self._parked.clear()
            self._go.release()
            self._parked.wait(30)

    def handle(self, event: Event) -> None:
        self.machine.handler_called(self, event)
        if event.id in self.machine.poison:  # its handler kills the process (OOM, SIGKILL)
            self.machine.log(event.id, f"its handler killed {self.name}")
            self.killed = True
            raise DiedError()
        self.checkpoint(f"handler {event.id}")
        self.machine.handler_starts(self, event)
        self.checkpoint(f"handler-end {event.id}")
        self.machine.in_handler.get(event.id, set()).discard(self.name)
        if self.fail_next:
            message = f"{event.id} refused on attempt {event.attempt}"
            if "pad" in event.payload:  # a large event's outcome carries a full last_error
                message += " " + "e" * 2100
            raise HandlerFailedError(message)
        self.machine.delivered[event.id] = self.machine.delivered.get(event.id, 0) + 1
        self.machine.delivered_claims[event.id] = self.machine.claims.get(event.id, 0)
        self.machine.log(event.id, f"delivered by {self.name}")


@dataclass
class Published:
    group: str | None
    place: int | None  # 0-based place in an ordered group


def drain_rounds(kind: str) -> int:
    """The rounds within which the outbox must drain once the faults stop: DRAIN_ROUNDS after a
    hole in an ordered group may be passed. Only MongoDB has holes (its publish takes a group's
    place, then inserts the event: a publisher dying in between leaves a place without an
    event, which the gate passes HOLE_WAIT_MS after the next event's publish); a history whose
    lost publishes left holes at the drain's start used up most of the plain budget waiting
    (found at 20x its examples)."""
    if kind != "mongo":
        return DRAIN_ROUNDS
    from dynacoord.backends.mongo.outbox import HOLE_WAIT_MS

    return DRAIN_ROUNDS + -(-HOLE_WAIT_MS // LEASE_MS)


def make_machine(
    make: Callable[..., Any], lose_next: Callable[[], None] | None, kind: str
) -> type[RuleBasedStateMachine]:
    dynamodb = kind in ("moto", "dynamodb")
    shard_choices = (1, 4, 8) if dynamodb else (None,)

    def backend(clock: ManualClock | SkewedClock, namespace: str, shards: int | None) -> Any:
        return make(
            clock=clock, namespace=namespace, **({} if shards is None else {"shards": shards})
        )

    class DeliveryModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            self.ns = unique_name("dm")
            self.events: dict[str, Published] = {}
            self.groups: dict[str, list[str]] = {g: [] for g in GROUPS}
            self.delivered: dict[str, int] = {}  # successful handler runs
            self.ever_failed: set[str] = set()
            self.excused: set[str] = set()  # a holder died or froze past its lease
            self.in_handler: dict[str, set[str]] = {}  # event id -> actors inside its handler
            self.violations: list[str] = []
            self.history: dict[str, list[str]] = {}  # event id -> what happened to it
            self.actors: list[Actor] = []
            self.spawned = 0
            self.started: set[str] = set()  # events whose handler started since their last retry
            #: events whose last successful delivery's outcome write was never applied (it
            #: raised unsent): one more run of its handler is at-least-once, not a violation
            #: (the relay model's RAISED_OUTCOME_UNSENT; nothing else adds to it)
            self.outcome_not_applied: set[str] = set()
            # The exact oracle's reference of what the store holds, from the writes the model saw
            # apply (claims, renewals, outcomes): event id -> (lease token, lease end, holder).
            self.leases: dict[str, tuple[str, int, str]] = {}
            self.claims: dict[str, int] = {}  # claims applied per event
            #: handler starts per event since its last retry (a death inside counts: the start is
            #: counted when the handler is called)
            self.runs: dict[str, int] = {}
            #: (event id, actor) -> the event's claims applied when that actor's handler started
            self.run_claims: dict[tuple[str, str], int] = {}
            #: event id -> its claims applied when its handler last succeeded
            self.delivered_claims: dict[str, int] = {}
            #: events whose handler kills its process (the POISON generator)
            self.poison: set[str] = set()
            self.replaced: set[Actor] = set()  # actors killed by a poison event, replaced
            self.lagged = 0  # queries answered from a stale index (LAG)
            self.offsets = [0]  # the actors' clock offsets, in turn (ms)
            self.skew_max = 0  # the fastest actor clock's offset
            self.large = 0  # events near the item limit published
            self.refused_large = 0  # publishes refused as too large
            self.publishers = {s: backend(self.clock, self.ns, s).outbox for s in shard_choices}
            self.injector: Injector | None = None
            if dynamodb:
                client = self.publishers[shard_choices[0]]._store._table.client
                self.injector = Injector.of(client)
                self.injector.partiql_denied = False
                if CONTENTION or PERMISSION:
                    forget_partiql(client)  # a fresh process: its first batch probes
            # Readers made (and their shard counts read) before any publisher with more shards.
            self.readers = [backend(self.clock, self.ns, s).outbox for s in shard_choices]
            for reader in self.readers:
                reader.stats()
            self.next_reader = 0
            for design in self.designs():
                self.spawn(design)

        # -- actors (the hooks are for a machine that extends this one) -------------------------

        def designs(self) -> list[dict[str, Any]]:
            """The workers a history starts with."""
            return [
                {"batch_size": 25},
                {"batch_size": 1},
                {"batch_size": 25, "batch_claim": False},
            ]

        def make_actor(self, name: str, backend: Any, design: dict[str, Any]) -> Actor:
            return Actor(self, name, backend, **design)

        def on_kill(self, actor: Actor) -> None:
            """``actor`` was just killed (before its successor is spawned)."""

        def published(self, events: list[Event], shards: int | None) -> None:
            """``events`` were just published (by the publisher with ``shards``)."""

        def retried(self, event_ids: list[str]) -> None:
            """Failed ``event_ids`` were just put back to pending (``retry``, ``retry(group=)``)."""

        def spawn(self, design: dict[str, Any], shards: int | None = None) -> Actor:
            if shards is None:
                shards = shard_choices[self.spawned % len(shard_choices)]
            clock = SkewedClock(self.clock, self.offsets[self.spawned % len(self.offsets)])
            self.spawned += 1
            actor = self.make_actor(
                f"w{self.spawned}", backend(clock, self.ns, shards), dict(design)
            )
            self.actors.append(actor)
            return actor

        def live(self) -> list[Actor]:
            return [a for a in self.actors if a.live]

        def pick(self, index: int, *, frozen: bool | None = False) -> Actor | None:
            chosen = [a for a in self.live() if frozen is None or a.frozen == frozen]
            return chosen[index % len(chosen)] if chosen else None

        def log(self, event_id: str, what: str) -> None:
            self.history.setdefault(event_id, []).append(f"{now_ms(self.clock)}: {what}")

        # -- the exact oracle: every applied write judged against the store when it applied ----

        def claim_applied(
            self, actor: Actor, seen: EventRecord, got: EventRecord, now: int
        ) -> None:
            """A claim applied (``now``: the claimer's clock, which the store judged by). Taking
            over an event in flight is allowed only if its stored lease had ended then: a
            renewal applied after the claimer's read moved the lease past ``now``."""
            held = self.leases.get(got.id)
            if (
                seen.status is EventStatus.IN_FLIGHT
                and held is not None
                and held[0] == seen.lease_token
                and held[1] > now
            ):
                self.violations.append(
                    f"{got.id} claimed by {actor.name} at {now} (its clock) while the lease "
                    f"{held[2]} held ran until {held[1]} (read as {seen.due_at_ms}): "
                    f"{self.history[got.id]}; workers: {self.actors}"
                )
            assert got.lease_token is not None
            self.leases[got.id] = (got.lease_token, got.due_at_ms, actor.name)
            self.claims[got.id] = self.claims.get(got.id, 0) + 1

        def lease_moved(self, record: EventRecord, until: int) -> None:
            held = self.leases.get(record.id)
            if held is not None and held[0] == record.lease_token:
                self.leases[record.id] = (held[0], until, held[2])

        def lease_ended(self, event_id: str, token: str) -> None:
            held = self.leases.get(event_id)
            if held is not None and held[0] == token:
                del self.leases[event_id]

        def taken_over_since(self, event_id: str, claims: int) -> bool:
            """Whether a claim of ``event_id`` applied after it had ``claims`` claims: a takeover,
            each judged when it applied (claim_applied); a relay model's own excuses too."""
            return self.claims.get(event_id, 0) > claims or event_id in self.excused

        def handler_called(self, actor: Actor, event: Event) -> None:
            self.runs[event.id] = self.runs.get(event.id, 0) + 1
            self.run_claims[(event.id, actor.name)] = self.claims.get(event.id, 0)

        def handler_starts(self, actor: Actor, event: Event) -> None:
            published = self.events[event.id]
            self.log(event.id, f"handled by {actor.name}, attempt {event.attempt}")
            self.started.add(event.id)
            inside = self.in_handler.setdefault(event.id, set())
            for other in sorted(inside - {actor.name}):
                if not self.taken_over_since(event.id, self.run_claims.get((event.id, other), 0)):
                    self.violations.append(
                        f"{event.id} handled by {actor.name} while {other} still handled it, "
                        f"though no claim took it over since {other}'s run began: "
                        f"{self.history[event.id]}; workers: {self.actors}"
                    )
            inside.add(actor.name)
            rerun = event.id in self.outcome_not_applied
            self.outcome_not_applied.discard(event.id)  # one re-run per outcome not applied
            if (
                self.delivered.get(event.id)
                and not rerun
                and not self.taken_over_since(event.id, self.delivered_claims.get(event.id, 0))
            ):
                self.violations.append(
                    f"{event.id} handled again by {actor.name} after a successful delivery, "
                    "though no claim took it over since: "
                    f"{self.history[event.id]}; workers: {self.actors}"
                )
            if published.group is not None and published.place is not None:
                for earlier in self.groups[published.group][: published.place]:
                    if earlier not in self.delivered and earlier not in self.ever_failed:
                        self.violations.append(
                            f"{event.id} (place {published.place + 1} of {published.group}) "
                            f"handled by {actor.name} before {earlier} was delivered"
                        )

        # -- rules ------------------------------------------------------------------------------

        @precondition(lambda self: len(self.events) < MAX_EVENTS)
        @rule(
            shards=st.sampled_from(shard_choices),
            # (ordered, group, where its id sorts): ids decide the order of equal due times in
            # the queues, so hypothesis chooses it (and a history runs the same every time)
            batch=st.lists(
                st.tuples(st.booleans(), st.sampled_from((None, *GROUPS)), st.integers(0, 99)),
                min_size=1,
                max_size=4,
            ),
            lose=st.booleans(),
            large=st.integers(-len(ROOM), 12),
        )
        def publish(
            self,
            shards: int | None,
            batch: list[tuple[bool, str | None, int]],
            lose: bool,
            large: int = 0,
        ) -> None:
            # The first event of the batch may be near the item limit, leaving ``room`` bytes.
            pad = None
            room = ROOM[-large - 1] if large < 0 else None
            if SIZES and room is not None and self.large < MAX_LARGE:
                limit = MOTO_ITEM_LIMIT if kind == "moto" else DYNAMODB_ITEM_LIMIT
                pad = limit - ITEM_OVERHEAD - room
            events = [
                Event(
                    "t",
                    {"n": len(self.events) + i}
                    if i or pad is None
                    else {"n": len(self.events), "pad": "x" * pad},
                    id=f"{rank:02d}-e{len(self.events) + i}",
                    occurred_at=self.clock.time(),  # due then: the manual clock, not the real one
                    group=group,
                    ordered=ordered and bool(group),
                )
                for i, (ordered, group, rank) in enumerate(batch)
            ]
            if lose and lose_next is not None:
                lose_next()
            try:
                assert self.publishers[shards].publish(events) == [e.id for e in events]
            except ValueTooLargeError:
                # Refused up-front: allowed for an event near the limit, and nothing is written.
                assert pad is not None, "a batch of small events refused as too large"
                written = {e.id for e in events if self.readers[0].get(e.id) is not None}
                assert not written, f"a refused publish wrote {sorted(written)}"
                self.refused_large += 1
                return
            if pad is not None:
                self.large += 1
                self.log(events[0].id, f"published with {room} bytes left under the item limit")
            for event in events:
                place = None
                if event.ordered and event.group is not None:
                    place = len(self.groups[event.group])
                    self.groups[event.group].append(event.id)
                self.events[event.id] = Published(event.group, place)
            self.published(events, shards)

        @rule(index=st.integers(0, 9), fail=st.integers(0, 3), lose=st.integers(0, 5))
        def step(self, index: int, fail: int, lose: int) -> None:
            actor = self.pick(index)
            if actor is None:
                return
            actor.fail_next = fail == 0
            if lose == 0 and lose_next is not None:
                lose_next()
            actor.step()
            self.replace_if_poisoned(actor)

        @rule(index=st.integers(0, 9), steps=st.integers(1, 30))
        def run(self, index: int, steps: int) -> None:
            """A worker goes on for a while with healthy handlers."""
            actor = self.pick(index)
            if actor is None:
                return
            actor.fail_next = False
            for _ in range(steps):
                actor.step()
                if not actor.live:
                    self.replace_if_poisoned(actor)
                    break

        @rule(ms=st.sampled_from([SLICE_MS, LEASE_MS // 2, LEASE_MS, 2 * LEASE_MS]))
        def advance(self, ms: int) -> None:
            self.pass_time(ms)

        # This machine's own rules only: they replace an actor its poison event killed (a
        # machine that extends it steps actors in rules of its own, which do not).
        @precondition(
            lambda self: POISON and type(self) is DeliveryModel and not self.poison and self.events
        )
        @rule(index=st.integers(0, MAX_EVENTS - 1))
        def poison_one(self, index: int) -> None:
            """An event whose handler kills the worker's process (an OOM kill, SIGKILL, a Lambda
            timeout), wherever it is (in a batch with others, re-claimed...), until the faults
            stop: it must fail after MAX_ATTEMPTS deaths of its own, its batchmates unharmed."""
            event_id = sorted(self.events)[index % len(self.events)]
            self.poison.add(event_id)
            self.log(event_id, "poison from now on")

        @precondition(lambda self: LAG)
        @rule(index=st.integers(0, 9), queries=st.integers(1, 6))
        def lag(self, index: int, queries: int) -> None:
            """The actor's next ``queries`` index queries are answered from a stale index."""
            actor = self.pick(index, frozen=None)
            if actor is not None:
                actor.lagging += queries

        def log_lag(self, actor: Actor, status: EventStatus, shard: int, stale: Any) -> None:
            self.lagged += 1
            for record in stale:
                self.log(record.id, f"listed to {actor.name} as {record.status.value} (stale)")

        def replace_if_poisoned(self, actor: Actor) -> None:
            """An actor its poison event killed is replaced, as ``kill`` replaces one."""
            if actor.killed and actor not in self.replaced:
                self.replaced.add(actor)
                actor.keeper = None
                self.on_kill(actor)
                self.spawn(dict(actor.options))

        @rule(index=st.integers(0, 9))
        def kill(self, index: int) -> None:
            actor = self.pick(index, frozen=None)
            if actor is None:
                return
            for event_id in actor.held:
                self.log(event_id, f"{actor.name} killed holding it")
            actor.kill()
            self.replaced.add(actor)
            self.on_kill(actor)
            self.spawn(dict(actor.options))

        @precondition(lambda self: sum(not a.frozen for a in self.live()) > 1)
        @rule(index=st.integers(0, 9))
        def freeze(self, index: int) -> None:
            actor = self.pick(index)
            if actor is not None:
                actor.frozen = True
                for event_id in actor.held:
                    self.log(event_id, f"{actor.name} frozen")

        @rule(index=st.integers(0, 9))
        def thaw(self, index: int) -> None:
            actor = self.pick(index, frozen=True)
            if actor is not None:
                actor.frozen = False
                for event_id in actor.held:
                    self.log(event_id, f"{actor.name} thawed")

        @rule(lose=st.booleans())
        def retry_failed(self, lose: bool) -> None:
            failed = [r.id for r in self.readers[0].failed(limit=1000)]
            if not failed:
                return
            if lose and lose_next is not None:
                lose_next()
            assert self.readers[0].retry(failed) == len(failed)
            self.started.difference_update(failed)
            for event_id in failed:
                self.runs.pop(event_id, None)
            self.retried(failed)

        @rule(group=st.sampled_from(GROUPS), lose=st.booleans())
        def retry_group(self, group: str, lose: bool) -> None:
            reader = self.readers[0]
            failed = sorted(
                (
                    r
                    for r in reader.failed(limit=1000)
                    if r.seq is not None and r.event.group == group
                ),
                key=lambda r: r.seq or 0,
            )
            before = {i: reader.get(i) for i in self.groups[group]}
            if lose and lose_next is not None:
                lose_next()
            moved = reader.retry_report(group=group).retried
            assert moved == [r.id for r in failed], (moved, failed)
            if not moved:
                return
            # Each took a new place after every place the group had handed out, in the old
            # order: the model moves them to the group's tail, and from now on place k+1 waits
            # for place k in that order. Being pending again, they no longer let later places go.
            # (On MongoDB a lost place-taking of a publish leaves empty places: the new ones may
            # start further on, never before.)
            seqs = [reader.get(i).seq for i in moved]  # type: ignore[union-attr]
            last = max((r.seq or 0) for r in before.values() if r is not None)
            first = seqs[0] or 0
            assert first > last and seqs == list(range(first, first + len(moved))), (seqs, last)
            for event_id in moved:
                self.groups[group].remove(event_id)
                self.groups[group].append(event_id)
                self.ever_failed.discard(event_id)
                self.started.discard(event_id)
                self.runs.pop(event_id, None)
                self.log(event_id, f"redriven to place {len(self.groups[group])} of {group}")
            for place, event_id in enumerate(self.groups[group]):
                self.events[event_id].place = place
            self.retried(moved)

        # -- the generators of issue 36 ----------------------------------------------------------

        @initialize(
            low=st.sampled_from((-SKEW_MS, -SKEW_MS // 2, 0)),
            spread=st.lists(st.sampled_from((0, 500, 1000, 1500, SKEW_MS)), min_size=1, max_size=6),
        )
        def skew_clocks(self, low: int, spread: list[int]) -> None:
            """Each actor's clock is off by a fixed offset in [-2 s, +2 s]; any two differ by
            at most the documented skew (successors take the offsets in turn)."""
            if not SKEW:
                return
            self.offsets = [low + s for s in spread]
            self.skew_max = max(self.offsets)
            for number, actor in enumerate(self.actors):
                actor.clock.offset_ms = self.offsets[number % len(self.offsets)]

        @precondition(lambda self: CONTENTION and self.injector is not None)
        @rule(
            index=st.integers(0, 9),
            operation=st.sampled_from(
                (
                    None,
                    "Query",
                    "UpdateItem",
                    "TransactWriteItems",
                    "BatchExecuteStatement",
                    "BatchGetItem",
                )
            ),
            count=st.integers(1, 3),
            code=st.sampled_from(THROTTLE_CODES),
        )
        def throttle(self, index: int, operation: str | None, count: int, code: str) -> None:
            """The actor's next request (of ``operation``) is throttled ``count`` times; botocore
            sends it again."""
            actor = self.pick(index, frozen=None)
            if actor is not None:
                actor.plan.throttles.append([operation, count, code])

        @precondition(lambda self: CONTENTION and self.injector is not None)
        @rule(
            index=st.integers(0, 9),
            positions=st.lists(st.integers(0, 24), min_size=1, max_size=4),
            code=st.sampled_from(STATEMENT_CODES),
            times=st.integers(1, 4),
        )
        def refuse_statements(
            self, index: int, positions: list[int], code: str, times: int
        ) -> None:
            """The actor's next ``times`` BatchExecuteStatements answer ``code`` for statements
            DynamoDB did not apply."""
            actor = self.pick(index, frozen=None)
            if actor is not None:
                actor.plan.statements.extend([(positions, code)] * times)

        @precondition(lambda self: CONTENTION and self.injector is not None)
        @rule(
            index=st.integers(0, 9),
            # six rounds running exhaust finish_many (case 5): only with OUTCOME_CONFLICTS
            rounds=st.integers(1, 8 if OUTCOME_CONFLICTS else 5),
            at=st.integers(0, 99),
            outcomes=st.booleans(),
        )
        def conflict(self, index: int, rounds: int, at: int, outcomes: bool) -> None:
            """The actor's next ``rounds`` transactions (``outcomes``: those storing outcomes)
            are cancelled by a TransactionConflict (a hot gate: an ordered group's outcomes
            and gate, a claim with its gate check)."""
            actor = self.pick(index, frozen=None)
            if actor is not None:
                # rounds running, whatever was armed before
                cap = 8 if OUTCOME_CONFLICTS else 5
                actor.plan.conflicts = min(cap, actor.plan.conflicts + rounds)
                actor.plan.conflict_at = at
                actor.plan.conflict_outcomes = outcomes

        @precondition(lambda self: PERMISSION and self.injector is not None)
        @rule(granted=st.booleans())
        def partiql(self, granted: bool) -> None:
            """The PartiQL permission is withdrawn (a policy rollback, an SCP) or granted again."""
            assert self.injector is not None
            self.injector.partiql_denied = not granted

        def faults_stop(self) -> None:
            """No more injected answers (the clocks stay as they are)."""
            for actor in self.actors:
                actor.plan.clear()
            if self.injector is not None:
                self.injector.partiql_denied = False

        # -- checks -----------------------------------------------------------------------------

        def pass_time(self, ms: int) -> None:
            while ms > 0:
                self.clock.advance(min(ms, SLICE_MS) / 1000)
                ms -= SLICE_MS
                now = now_ms(self.clock)
                for actor in self.live():
                    if actor.frozen:
                        # its keeper is frozen too: leases that run out now may be taken over
                        # (by whoever's clock runs fastest)
                        for event_id, until in actor.held.items():
                            if until <= now + self.skew_max:
                                self.log(event_id, f"{actor.name} frozen past its lease")
                    elif actor.keeper is not None:
                        actor.keeper.beat()

        def truth(self) -> dict[str, EventRecord | None]:
            reader = self.readers[0]
            return {event_id: reader.get(event_id) for event_id in self.events}

        def check_stats(self, reader: Any, truth: dict[str, EventRecord | None]) -> None:
            counts = dict.fromkeys(EventStatus, 0)
            due = 0
            now = now_ms(self.clock)
            for record in truth.values():
                if record is not None:
                    counts[record.status] += 1
                    due += record.status is EventStatus.PENDING and record.due_at_ms <= now
            stats = reader.stats()
            expected = (counts[EventStatus.PENDING], due, counts[EventStatus.IN_FLIGHT])
            assert (stats.pending, stats.due, stats.in_flight, stats.failed) == (
                *expected,
                counts[EventStatus.FAILED],
            ), f"stats() of a reader with {reader._store.shards} shards: {stats}"

            def age(status: EventStatus) -> float | None:
                ends = [
                    r.due_at_ms
                    for r in truth.values()
                    if r is not None and r.status is status and r.due_at_ms <= now
                ]
                return (now - min(ends)) / 1000 if ends else None

            lag = (age(EventStatus.PENDING), age(EventStatus.IN_FLIGHT))
            assert (stats.oldest_due_age, stats.expired_lease_age) == lag, (stats, lag)

        @invariant()
        def safe(self) -> None:
            assert not self.violations, self.violations

        def check_failures(self, truth: dict[str, EventRecord | None]) -> None:
            """No event fails unless its own handler started ``MAX_ATTEMPTS`` times since it was
            last retried (a death inside its handler is a start): a batchmate of an event that
            killed its process is not charged for it."""
            for event_id, record in truth.items():
                runs = self.runs.get(event_id, 0)
                if (
                    record is not None
                    and record.status is EventStatus.FAILED
                    and runs < MAX_ATTEMPTS
                ):
                    self.violations.append(
                        f"{event_id} failed ({record.last_error!r:.300}) after {runs} start(s) "
                        f"of its handler, fewer than {MAX_ATTEMPTS}: "
                        f"{self.history.get(event_id)}; workers: {self.actors}"
                    )
            assert not self.violations, self.violations

        @invariant()
        def stats_agree(self) -> None:
            reader = self.readers[self.next_reader % len(self.readers)]
            self.next_reader += 1
            truth = self.truth()
            self.check_failures(truth)
            self.check_stats(reader, truth)

        def teardown(self) -> None:
            try:
                if not self.violations:
                    self.drain()
            finally:
                for actor in self.actors:
                    actor.kill()

        def drain(self) -> None:
            # The faults stop: frozen workers go on and finish what they hold, then rest.
            self.faults_stop()
            self.poison.clear()
            for actor in self.actors:
                actor.lagging = 0
            for actor in self.live():
                actor.frozen = False
                actor.fail_next = False
                if actor.at != "idle":  # mid-poll: finish it
                    actor.run_until_idle()
            # One fresh worker drains alone, of a design that changes from history to history
            # (batch_size=1 is the one a queue head full of blocked events starves first).
            designs = (
                {"batch_size": 1},
                {"batch_size": 25},
                {"batch_size": 1},
                {"batch_size": 3, "batch_claim": False},
            )
            resting = set(self.live())
            self.spawn(designs[len(self.events) % len(designs)], shards=shard_choices[0])
            truth = self.truth()
            rounds = drain_rounds(kind)
            for _ in range(rounds):
                for actor in self.live():
                    if actor in resting:
                        continue
                    for _poll in range(4 * MAX_EVENTS):  # poll while polls find work
                        actor.run_until_idle()
                        if not actor.handled:
                            break
                assert not self.violations, self.violations
                truth = self.truth()
                open_ = [
                    i
                    for i, r in truth.items()
                    if r is not None and r.status in (EventStatus.PENDING, EventStatus.IN_FLIGHT)
                ]
                if not open_:
                    break
                self.pass_time(LEASE_MS)
            else:
                raise AssertionError(
                    f"the outbox did not drain in {rounds} rounds: "
                    f"{ {i: r.status.value for i, r in truth.items() if r is not None} } "
                    f"actors {self.actors}"
                )
            for event_id, record in truth.items():
                assert record is not None, f"{event_id} vanished"
                if record.status is EventStatus.COMPLETED:
                    assert self.delivered.get(event_id), f"{event_id} completed, never handled"
                else:
                    assert record.status is EventStatus.FAILED, record
                    assert record.attempts >= MAX_ATTEMPTS, record
            self.check_failures(truth)
            for reader in self.readers:
                self.check_stats(reader, truth)
            if os.environ.get("DYNACOORD_MODEL_DEBUG"):
                print(
                    f"events {len(self.events)} handled {sum(self.delivered.values())} "
                    f"failed {len(self.ever_failed)} workers {len(self.actors)} "
                    f"lagged {self.lagged} poison {sorted(self.poison)} "
                    f"excused {len(self.excused)} large {self.large}/{self.refused_large} clocks {self.offsets} "
                    f"injected {[a.plan.done for a in self.actors if a.plan.done]} "
                    f"denied {self.injector.denials if self.injector else 0}"
                )

    return DeliveryModel


def run_delivery_model(
    make: Callable[..., Any],
    lose_next: Callable[[], None] | None,
    kind: str,
    *,
    scale: int = 1,
    machine: type[RuleBasedStateMachine] | None = None,
    budget: tuple[int, int] | None = None,
) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    examples, steps = budget or BUDGET[kind]
    scale *= int(os.environ.get("DYNACOORD_MODEL_SCALE", "1"))
    options: dict[str, Any] = {}
    if os.environ.get("DYNACOORD_MODEL_NO_SHRINK"):  # a quick first report while developing
        options["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    run_state_machine_as_test(
        machine or make_machine(make, lose_next, kind),
        settings=hsettings(max_examples=examples * scale, stateful_step_count=steps, **options),
    )


@pytest.fixture()
def moto_factory(moto_table: tuple[Any, str]) -> Iterator[Callable[..., Any]]:
    from dynacoord.backends.dynamodb import DynamoDBBackend

    client, table = moto_table

    def make(**kwargs: Any) -> Any:
        return DynamoDBBackend(client, table_name=table, **kwargs)

    yield make


def test_delivery_model_moto(moto_factory: Callable[..., Any]) -> None:
    """The fault model on moto (no lost responses: moto has no network to lose them on)."""
    run_delivery_model(moto_factory, None, "moto")


LOSSY_KINDS = ["dynamodb", "redis", "redis_cluster", "mongo"]


@pytest.mark.parametrize("lossy", LOSSY_KINDS, indirect=True)
def test_delivery_model(lossy: Any, request: pytest.FixtureRequest) -> None:
    """The fault model on DynamoDB Local, Redis, a Redis Cluster and MongoDB (mongomock), with
    lost responses."""
    kind = request.node.callspec.params["lossy"]
    run_delivery_model(lossy.backend, lossy.lose_next, kind)


@pytest.mark.stress
@pytest.mark.timeout(4 * 3600)
@pytest.mark.parametrize("lossy", LOSSY_KINDS, indirect=True)
def test_stress_delivery_model(lossy: Any, request: pytest.FixtureRequest) -> None:
    """``make stress``: the fault model with DELIVERY_STRESS_SCALE (20) times the examples."""
    kind = request.node.callspec.params["lossy"]
    run_delivery_model(lossy.backend, lossy.lose_next, kind, scale=DELIVERY_STRESS_SCALE)


@pytest.mark.stress
@pytest.mark.timeout(4 * 3600)
def test_stress_delivery_model_moto(moto_factory: Callable[..., Any]) -> None:
    run_delivery_model(moto_factory, None, "moto", scale=DELIVERY_STRESS_SCALE)


def replay_dead_worker_with_head_and_follower(
    make: Callable[..., Any], lose_next: Callable[[], None] | None, kind: str
) -> None:
    """A history the random search reaches rarely, replayed step by step through the same
    machine: a worker dies holding an ordered group's head and follower whose id sorts first;
    one batch_size=1 worker must then drain the outbox (it wedged on DynamoDB: the expired-lease
    scan kept returning the blocked follower, which postpone left in flight)."""
    machine = make_machine(make, lose_next, kind)()
    try:
        shards = 1 if kind in ("moto", "dynamodb") else None
        # two events: the drain worker is designs[2], batch_size=1
        machine.publish(shards=shards, batch=[(True, "g0", 50), (True, "g0", 10)], lose=False)
        worker = machine.actors[0]
        assert worker.options == {"batch_size": 25}
        while not worker.held:
            worker.step()
        assert sorted(worker.held) == ["10-e1", "50-e0"]
        machine.kill(0)
        machine.pass_time(LEASE_MS + SLICE_MS)
        machine.safe()
    finally:
        machine.teardown()
    assert machine.delivered == {"10-e1": 1, "50-e0": 1}


def test_replay_dead_worker_with_head_and_follower_moto(moto_factory: Callable[..., Any]) -> None:
    replay_dead_worker_with_head_and_follower(moto_factory, None, "moto")


@pytest.mark.parametrize("lossy", LOSSY_KINDS, indirect=True)
def test_replay_dead_worker_with_head_and_follower(
    lossy: Any, request: pytest.FixtureRequest
) -> None:
    kind = request.node.callspec.params["lossy"]
    replay_dead_worker_with_head_and_follower(lossy.backend, lossy.lose_next, kind)


def replay_redrive_of_a_failed_group(
    make: Callable[..., Any],
    lose_next: Callable[[], None] | None,
    kind: str,
    *,
    batch_size: int = 1,
) -> None:
    """A history the random search rarely reaches (an event fails only after MAX_ATTEMPTS
    refusals), replayed through the same machine and its checks: every event of an ordered
    group fails, one more is published, and ``retry(group=...)`` (its answer lost where the
    backend can lose one) puts the failed ones after it, in their order; the drain must deliver
    the group in its new order, each once. The events fail under a worker of ``batch_size``."""
    machine = make_machine(make, lose_next, kind)()
    try:
        shards = 1 if kind in ("moto", "dynamodb") else None
        batch = [(True, "g0", 10), (True, "g0", 20), (True, "g0", 30)]
        machine.publish(shards=shards, batch=batch, lose=False)
        [worker] = [a for a in machine.actors if a.options == {"batch_size": batch_size}]
        worker.fail_next = True
        for _ in range(12 * MAX_ATTEMPTS):
            worker.run_until_idle()
            machine.safe()
            truth = machine.truth()
            if all(r is not None and r.status is EventStatus.FAILED for r in truth.values()):
                break
            machine.pass_time(LEASE_MS)
        else:
            raise AssertionError(f"the group did not fail: {machine.truth()}")
        worker.fail_next = False
        machine.publish(shards=shards, batch=[(True, "g0", 40)], lose=False)
        machine.retry_group("g0", lose=True)
        assert machine.groups["g0"] == ["40-e3", "10-e0", "20-e1", "30-e2"]
        machine.safe()
    finally:
        machine.teardown()
    assert list(machine.delivered) == ["40-e3", "10-e0", "20-e1", "30-e2"]
    assert set(machine.delivered.values()) == {1}


def test_replay_redrive_of_a_failed_group_moto(moto_factory: Callable[..., Any]) -> None:
    replay_redrive_of_a_failed_group(moto_factory, None, "moto")


@pytest.mark.parametrize("lossy", LOSSY_KINDS, indirect=True)
def test_replay_redrive_of_a_failed_group(lossy: Any, request: pytest.FixtureRequest) -> None:
    kind = request.node.callspec.params["lossy"]
    replay_redrive_of_a_failed_group(lossy.backend, lossy.lose_next, kind)


def test_replay_a_batch_runs_the_follower_before_its_heads_failure_is_stored(
    moto_factory: Callable[..., Any],
) -> None:
    """A batch whose ordered head fails for good stores that failure before the group's next
    place runs (a worker dying in between would leave the head to an attempt after it)."""
    replay_redrive_of_a_failed_group(moto_factory, None, "moto", batch_size=25)


def replay_conflicts_on_an_ordered_outcome(
    make: Callable[..., Any], lose_next: Callable[[], None] | None, kind: str
) -> None:
    """A history the random search reaches rarely (issue 36, case 5), replayed through the same
    machine: the transaction that stores an ordered group's outcomes with its gate is cancelled
    by TransactionConflict six rounds in a row. The outcomes must be stored (or the worker must
    go on holding the events): never a held lease reported lost, the events delivered again."""
    machine = make_machine(make, lose_next, kind)()
    try:
        machine.publish(shards=1, batch=[(True, "g0", 10), (True, "g0", 20)], lose=False)
        worker = machine.actors[0]
        assert worker.options == {"batch_size": 25}
        worker.plan.conflicts = 6
        worker.plan.conflict_outcomes = True
        worker.run_until_idle()
        assert worker.plan.done.get("TransactionConflict"), worker.plan.done
        machine.pass_time(LEASE_MS + SLICE_MS)
        machine.safe()
    finally:
        machine.teardown()
    assert machine.delivered == {"10-e0": 1, "20-e1": 1}


@pytest.mark.skipif(not OUTCOME_CONFLICTS, reason="OUTCOME_CONFLICTS is off")
def test_replay_conflicts_on_an_ordered_outcome_moto(moto_factory: Callable[..., Any]) -> None:
    replay_conflicts_on_an_ordered_outcome(moto_factory, None, "moto")


@pytest.mark.skipif(not OUTCOME_CONFLICTS, reason="OUTCOME_CONFLICTS is off")
@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_replay_conflicts_on_an_ordered_outcome(lossy: Any) -> None:
    replay_conflicts_on_an_ordered_outcome(lossy.backend, lossy.lose_next, "dynamodb")


def replay_poison_batch(
    make: Callable[..., Any], lose_next: Callable[[], None] | None, kind: str
) -> None:
    """Issue 49's history, replayed through the machine and its exact oracle: e0's handler kills
    its worker's process, e1 and e2 were claimed in the same batch. Round after round a worker
    of batch_size 25 polls (its predecessor's leases run out between rounds). e0 must fail after
    MAX_ATTEMPTS deaths of its own; e1 and e2 are delivered once each. Before the fix the
    expired-lease scan claimed the three again as one batch, e0 first, and after MAX_ATTEMPTS
    rounds all three were stored failed: the oracle reported "20-e1 failed ... after 0
    start(s) of its handler"."""
    machine = make_machine(make, lose_next, kind)()
    try:
        shards = 1 if kind in ("moto", "dynamodb") else None
        batch = [(False, None, 10), (False, None, 20), (False, None, 30)]
        machine.publish(shards=shards, batch=batch, lose=False)
        machine.poison.add("10-e0")
        for _ in range(4 * MAX_ATTEMPTS):
            worker = next(a for a in machine.live() if a.options == {"batch_size": 25})
            worker.run_until_idle()
            machine.replace_if_poisoned(worker)
            truth = machine.truth()
            machine.check_failures(truth)
            machine.safe()
            if all(
                r is not None and r.status in (EventStatus.COMPLETED, EventStatus.FAILED)
                for r in truth.values()
            ):
                break
            machine.pass_time(LEASE_MS + SLICE_MS)
        else:
            raise AssertionError(f"not finished: {machine.truth()}")
        assert truth["10-e0"] is not None and truth["10-e0"].status is EventStatus.FAILED
        assert machine.runs["10-e0"] >= MAX_ATTEMPTS
    finally:
        machine.teardown()
    assert machine.delivered == {"20-e1": 1, "30-e2": 1}


def test_replay_poison_batch_moto(moto_factory: Callable[..., Any]) -> None:
    replay_poison_batch(moto_factory, None, "moto")


@pytest.mark.parametrize("lossy", LOSSY_KINDS, indirect=True)
def test_replay_poison_batch(lossy: Any, request: pytest.FixtureRequest) -> None:
    kind = request.node.callspec.params["lossy"]
    replay_poison_batch(lossy.backend, lossy.lose_next, kind)
