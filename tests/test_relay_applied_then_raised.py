"""The stream relay without a claim when its lease keeper's claim applies and then raises
(issue 49, section 2), on DynamoDB Local through the lossy client (``lossy.raise_next``).

The relay runs a new event's handler without a claim; the handler runs past the keeper's first
beat, whose claim (under the delivery's own lease token) applies, but botocore raises after its
last attempt. The handler returns before the next beat. The relay's outcome, conditional on the
event being still unclaimed, is refused by the relay's *own* claim: that refusal means the claim
applied, and the outcome must be stored under it. Otherwise it is dropped, the event stays in
flight, and the sweeper runs its handler a second time after the lease.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from dynacoord import Event, ManualClock
from dynacoord.outbox import EventStatus

LEASE_S = 30


def _stream_batch(backend: Any, event_ids: list[str]) -> dict[str, Any]:
    """The INSERT records the table's stream would carry for ``event_ids``, as Lambda hands
    them over (the new image read back from the table)."""
    store = backend.outbox._store
    client = store._table.client
    records = []
    for n, event_id in enumerate(event_ids, 1):
        raw = client.get_item(
            TableName=store._table.name, Key=store._key(event_id), ConsistentRead=True
        )["Item"]
        records.append(
            {
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "dynamodb": {
                    "NewImage": raw,
                    "SequenceNumber": f"{n:021d}",
                    "StreamViewType": "NEW_IMAGE",
                },
            }
        )
    return {"Records": records}


@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_a_relay_outcome_refused_by_its_own_claim_is_stored_under_it(
    lossy: Any, applied: bool
) -> None:
    clock = ManualClock(time.time())  # an event is due when it occurred (system time)
    backend = lossy.backend(clock=clock)
    (event_id,) = backend.outbox.publish([Event("t", 1)])
    batch = _stream_batch(backend, [event_id])
    runs: Counter[str] = Counter()
    keepers: list[Any] = []

    def handler(event: Event) -> None:
        runs[event.id] += 1
        if runs[event.id] > 1:
            return
        # past the keeper's first beat: it claims the event, and the claim raises
        (keeper,) = keepers
        clock.advance(keeper.interval_ms / 1000)
        lossy.raise_next(applied=applied)
        keeper.beat()
        assert lossy.raised == 1

    relay = backend.outbox.stream_handler(handler, lease=LEASE_S)
    keepers.append(relay.worker.delivery.keeper)
    assert keepers[0] is not None
    assert relay(batch) == {"batchItemFailures": []}
    assert runs == Counter({event_id: 1})
    record = backend.outbox.get(event_id)
    assert record is not None and record.status is EventStatus.COMPLETED, record
    assert relay.worker.delivered == 1 and relay.worker.lost == 0
    # after the lease, a sweeper finds nothing to deliver again
    clock.advance(2 * LEASE_S)
    sweeper = backend.outbox.sweep_handler(handler, lease=LEASE_S)
    assert sweeper({})["handled"] == 0
    assert runs == Counter({event_id: 1})


@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_a_relay_outcome_applied_and_raised_is_not_delivered_again_by_the_lambda_retry(
    lossy: Any,
) -> None:
    """The outcome's write applied and raised: the record is reported, and Lambda's retry reads
    the event completed and runs nothing. (Raised unsent, the retry runs the handler again: the
    documented trade of delivery without a claim, tests/integration/test_outbox_stream.py::
    test_an_outcome_that_cannot_be_stored_is_reported_and_the_retry_delivers_it_again.)"""
    clock = ManualClock(time.time())
    backend = lossy.backend(clock=clock)
    (event_id,) = backend.outbox.publish([Event("t", 1)])
    batch = _stream_batch(backend, [event_id])
    runs: Counter[str] = Counter()

    def handler(event: Event) -> None:
        runs[event.id] += 1
        if runs[event.id] == 1:
            lossy.raise_next()  # the outcome's write, the next one: applied, then raised

    relay = backend.outbox.stream_handler(handler, lease=LEASE_S)
    failures = relay(batch)["batchItemFailures"]
    assert lossy.raised == 1
    assert [f["itemIdentifier"] for f in failures] == [
        batch["Records"][0]["dynamodb"]["SequenceNumber"]
    ]
    assert relay(batch) == {"batchItemFailures": []}  # Lambda hands the record again
    assert runs == Counter({event_id: 1})
