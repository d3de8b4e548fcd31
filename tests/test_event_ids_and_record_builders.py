"""Default event ids, and the record builders the stores call: what the constructor makes."""

from __future__ import annotations

import pytest


def test_a_default_event_id_is_a_random_version_4_uuid_in_hex():
    """Events made without an id (and workers' lease tokens) get what uuid.uuid4().hex gives:
    32 hex digits of a version-4, RFC 4122 UUID, different every time."""
    import uuid

    from dynacoord.outbox import Event
    from dynacoord.outbox.event import new_event_id

    ids = [Event("t").id for _ in range(200)] + [new_event_id() for _ in range(200)]
    assert len(set(ids)) == len(ids)
    for event_id in ids:
        parsed = uuid.UUID(hex=event_id)
        assert parsed.hex == event_id and len(event_id) == 32
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_record_builders_make_what_the_constructor_makes():
    """The builders the stores call by position (runs, checkpoints, counter results, events and
    event records) set every field, and give an object equal, hashed, printed, pickled and frozen
    as the constructor's."""
    import copy
    import dataclasses
    import pickle

    from dynacoord import counters, runs
    from dynacoord.checkpoints import Checkpoint, _checkpoint
    from dynacoord.counters import CounterItem, JoinResult, WriteOutcome
    from dynacoord.outbox import Event, EventRecord, EventStatus
    from dynacoord.outbox.event import _new_event, new_record

    event = Event("t", None, id="e")
    item = counters._counter_item("join", 3, 9, 5, frozenset({"a"}), "a")
    pairs = [
        (
            runs._new_run("r", runs.RunStatus.RUNNING, {"k": 1}, 1, 2, "ok", "e", 3, 4, 5),
            runs.Run("r", runs.RunStatus.RUNNING, {"k": 1}, 1, 2, "ok", "e", 3, 4, 5),
        ),
        (
            _checkpoint("t", 7, '{"a":1}', 0.5, 1500, 2500),
            Checkpoint("t", 7, {"a": 1}, 0.5, 1.5, 2.5),
        ),
        (item, CounterItem("join", 3, 9, 5, frozenset({"a"}), "a")),
        (counters._write_outcome(True, item, None, 2), WriteOutcome(True, item, None, 2)),
        (counters._join_result(3, True, False, 5), JoinResult(3, True, False, 5)),
        (
            _new_event("t", {"p": 1}, "i", 1.5, {"m": 2}, "g", 3, True),
            Event(
                "t",
                {"p": 1},
                id="i",
                occurred_at=1.5,
                metadata={"m": 2},
                group="g",
                attempt=3,
                ordered=True,
            ),
        ),
        (
            new_record(event, EventStatus.FAILED, 2, 9, "tok", "err", 8, 4),
            EventRecord(event, EventStatus.FAILED, 2, 9, "tok", "err", 8, 4),
        ),
    ]
    for built, made in pairs:
        cls = type(made)
        assert type(built) is cls
        for field in dataclasses.fields(cls):  # every field set, to the constructor's value
            assert getattr(built, field.name) == getattr(made, field.name), field.name
        assert built == made and repr(built) == repr(made)
        try:
            expected_hash: object = hash(made)
        except TypeError:  # holds a dict (a run's context, a checkpoint's data)
            expected_hash = TypeError
        try:
            assert hash(built) == expected_hash
        except TypeError:
            assert expected_hash is TypeError
        assert pickle.loads(pickle.dumps(built)) == made and copy.deepcopy(built) == made
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(built, dataclasses.fields(cls)[0].name, None)
