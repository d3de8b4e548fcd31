"""Checkpoint contract: every backend must pass these unchanged (public API only)."""

from __future__ import annotations

import decimal
import threading

import pytest

from dynacoord import (
    MANUAL_CLOCK_START,
    CheckpointExistsError,
    CheckpointNotFoundError,
    InvalidKeyError,
    InvalidValueError,
    ManualClock,
    ValueTooLargeError,
)
from dynacoord.checkpoints import parse_checkpoint_id
from tests.conftest import needs_atomic_store


def _checkpoints(make_backend, **kwargs):
    return make_backend(**kwargs).checkpoints


def test_save_load_and_latest(make_backend):
    clock = ManualClock(MANUAL_CLOCK_START + 0.123)
    cps = _checkpoints(make_backend, clock=clock)
    assert cps.load_latest("job") is None
    assert cps.list("job") == []
    first = cps.save("job", {"offset": 10}, progress=10)
    assert first.sequence == 1 and first.task_id == "job" and first.id == "job@1"
    assert first.progress == 10.0 and first.created_at == pytest.approx(MANUAL_CLOCK_START + 0.123)
    assert first.expires_at is None
    clock.advance(1)
    second = cps.save("job", {"offset": 20}, progress=20.5)
    assert second.sequence == 2
    assert cps.load("job@1") == first
    assert cps.load(second.id) == second
    assert cps.load_latest("job") == second
    assert cps.load_latest("job").data == {"offset": 20}


def test_latest_of_twelve_uses_numeric_order(make_backend):
    cps = _checkpoints(make_backend)
    for i in range(1, 13):
        cps.save("twelve", {"i": i})
    latest = cps.load_latest("twelve")
    assert latest.sequence == 12 and latest.data == {"i": 12}
    sequences = [c.sequence for c in cps.list("twelve")]
    assert sequences == list(range(1, 13))  # 9 < 10 < 11 < 12, not string order


def test_list_follows_every_page(make_backend):
    cps = _checkpoints(make_backend)
    for i in range(1, 11):
        cps.save("paged", i, sequence=i)
    listed = cps.list("paged", page_size=3)  # 4 pages
    assert [c.sequence for c in listed] == list(range(1, 11))
    assert [c.data for c in listed] == list(range(1, 11))
    assert [c.sequence for c in cps.iter("paged", page_size=2)] == list(range(1, 11))
    assert [c.sequence for c in cps.list("paged", page_size=3, limit=5)] == [1, 2, 3, 4, 5]
    assert cps.list("paged", limit=0) == []


def test_cleanup_keeps_the_newest(make_backend):
    cps = _checkpoints(make_backend)
    for i in range(1, 6):
        cps.save("clean", {"n": i})
    assert cps.cleanup("clean", keep=2) == 3
    assert [c.sequence for c in cps.list("clean")] == [4, 5]
    assert cps.cleanup("clean", keep=2) == 0
    assert cps.cleanup("clean", keep=0) == 2
    assert cps.list("clean") == []
    assert cps.load_latest("clean") is None


def test_cleanup_and_delete_all_in_batches(make_backend):
    cps = _checkpoints(make_backend)
    for i in range(1, 61):
        cps.save("many", i, sequence=i)
    assert cps.cleanup("many", keep=7) == 53  # three delete batches
    assert [c.sequence for c in cps.list("many")] == list(range(54, 61))
    assert cps.delete_all("many") == 7
    assert cps.list("many") == []
    assert cps.delete_all("many") == 0
    # Numbering starts again once a task has no checkpoints left.
    assert cps.save("many", "again").sequence == 1


def test_tasks_are_isolated(make_backend):
    cps = _checkpoints(make_backend)
    cps.save("a", "a1")
    cps.save("a", "a2")
    cps.save("ab", "ab1")
    cps.save("a@x", "ax1")
    assert [c.data for c in cps.list("a")] == ["a1", "a2"]
    assert [c.data for c in cps.list("ab")] == ["ab1"]
    assert cps.load_latest("ab").sequence == 1
    assert cps.delete_all("ab") == 1
    assert len(cps.list("a")) == 2


def test_namespaces_are_isolated(make_backend):
    one = _checkpoints(make_backend, namespace="cp-one-x")
    two = _checkpoints(make_backend, namespace="cp-two-x")
    one.save("t", "one")
    assert two.load_latest("t") is None
    assert two.save("t", "two").sequence == 1
    assert one.load_latest("t").data == "one"
    one.delete_all("t")
    two.delete_all("t")


def test_task_ids_with_at_signs_round_trip_through_ids(make_backend):
    cps = _checkpoints(make_backend)
    saved = cps.save("user@example.com@run", {"ok": True})
    assert saved.id == "user@example.com@run@1"
    assert parse_checkpoint_id(saved.id) == ("user@example.com@run", 1)
    assert cps.load(saved.id) == saved


def test_nested_data_round_trips(make_backend):
    cps = _checkpoints(make_backend)
    data = {
        "floats": [0.1, 1e-300, -2.5, 1.7976931348623157e308],
        "none": None,
        "unicode": "zażółć gęślą jaźń — 東京 🚀",
        "nested": {"list": [1, [2, [3, {"deep": None}]]], "empty": {}, "bool": False},
        "big": 2**70,
        "decimal": decimal.Decimal("12.340"),
        "bytes": b"\x00\xff",
        "tag-like": {"$b": "not bytes"},
    }
    saved = cps.save("nested", data, progress=33.3)
    loaded = cps.load(saved.id)
    assert loaded.data == data
    assert isinstance(loaded.data["decimal"], decimal.Decimal)
    assert isinstance(loaded.data["big"], int) and isinstance(loaded.data["floats"][0], float)
    assert loaded.progress == 33.3
    assert cps.load_latest("nested").data == data
    for scalar in (None, 0, "text", [1, 2]):
        assert cps.load(cps.save("scalars", scalar).id).data == scalar


def test_concurrent_savers_get_distinct_sequences(make_backend):
    needs_atomic_store(make_backend)
    cps = _checkpoints(make_backend)
    barrier = threading.Barrier(8)
    results, errors = [], []

    def saver(n):
        barrier.wait()
        try:
            results.append(cps.save("race", {"saver": n}).sequence)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=saver, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(results) == list(range(1, 9))
    stored = cps.list("race")
    assert [c.sequence for c in stored] == list(range(1, 9))
    assert sorted(c.data["saver"] for c in stored) == list(range(8))


def test_explicit_sequence_is_never_overwritten(make_backend):
    cps = _checkpoints(make_backend)
    cps.save("explicit", "first", sequence=5)
    with pytest.raises(CheckpointExistsError) as err:
        cps.save("explicit", "second", sequence=5)
    assert err.value.task_id == "explicit" and err.value.sequence == 5
    assert cps.load("explicit@5").data == "first"
    # Automatic numbering continues above an explicit sequence.
    assert cps.save("explicit", "next").sequence == 6
    assert cps.save("explicit", "zero", sequence=0).sequence == 0
    assert [c.sequence for c in cps.list("explicit")] == [0, 5, 6]


def test_ttl_expiry(make_backend):
    clock = ManualClock()
    cps = _checkpoints(make_backend, clock=clock)
    keep = cps.save("ttl", "durable")
    short = cps.save("ttl", "short-lived", ttl=1.5)
    assert short.expires_at == pytest.approx(clock.time() + 1.5)
    assert cps.load_latest("ttl") == short
    clock.advance(1.499)
    assert cps.load(short.id).data == "short-lived"
    clock.advance(0.002)
    with pytest.raises(CheckpointNotFoundError):
        cps.load(short.id)
    # The newest is expired (but maybe not swept yet): latest skips it, list leaves it out.
    assert cps.load_latest("ttl") == keep
    assert cps.list("ttl") == [keep]
    # The expired sequence is not reused while its item may still exist ...
    assert cps.save("ttl", "after").sequence == 3
    # ... and an explicit save over an expired checkpoint is allowed (expired counts as absent).
    assert cps.save("ttl", "reused", sequence=2).data == "reused"
    assert cps.load("ttl@2").data == "reused"


def test_latest_skips_many_expired_checkpoints(make_backend):
    clock = ManualClock()
    cps = _checkpoints(make_backend, clock=clock)
    cps.save("skip", "old")
    for i in range(5):
        cps.save("skip", i, ttl=1)
    clock.advance(2)
    assert cps.load_latest("skip").data == "old"
    assert cps.cleanup("skip", keep=1) == 0  # expired ones are removed but not counted
    assert [c.data for c in cps.list("skip")] == ["old"]


def test_load_errors(make_backend):
    cps = _checkpoints(make_backend)
    with pytest.raises(CheckpointNotFoundError) as err:
        cps.load("missing@1")
    assert err.value.checkpoint_id == "missing@1"
    assert isinstance(err.value, KeyError)
    for bad in ("no-sequence", "task@", "@3", "task@-1", "task@x"):
        with pytest.raises(ValueError):
            cps.load(bad)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"task_id": ""}, InvalidKeyError),
        ({"task_id": 7}, InvalidKeyError),
        ({"task_id": "t" * 3000}, InvalidKeyError),
        ({"data": {1, 2}}, InvalidValueError),
        ({"data": float("nan")}, InvalidValueError),
        ({"progress": 101}, ValueError),
        ({"progress": -0.1}, ValueError),
        ({"progress": float("nan")}, ValueError),
        ({"progress": "50"}, TypeError),
        ({"progress": True}, TypeError),
        ({"sequence": -1}, ValueError),
        ({"sequence": "1"}, TypeError),
        ({"ttl": 0}, ValueError),
        ({"data": "x" * (401 * 1024)}, ValueTooLargeError),
    ],
)
def test_bad_input_raises_and_writes_nothing(make_backend, kwargs, error):
    cps = _checkpoints(make_backend)
    args = {"task_id": "bad", "data": {"ok": 1}, **kwargs}
    task_id = args.pop("task_id")
    data = args.pop("data")
    with pytest.raises(error):
        cps.save(task_id, data, **args)
    assert cps.list("bad") == []


def test_task_context_resumes(make_backend):
    cps = _checkpoints(make_backend)
    with cps.task("resume") as task:
        assert task.latest is None and not task.resumed
        task.save({"offset": 100}, progress=50)
        assert task.latest.sequence == 1
    with pytest.raises(RuntimeError):
        with cps.task("resume") as task:
            assert task.resumed and task.latest.data == {"offset": 100}
            task.save({"offset": 150}, progress=75)
            raise RuntimeError("crash")
    with cps.task("resume", cleanup_on_success=True) as task:
        assert task.latest.data == {"offset": 150}  # a failed run leaves its checkpoints
        task.save({"offset": 200}, progress=100)
    assert cps.list("resume") == []  # finished: cleaned up


def test_task_context_applies_ttl(make_backend):
    clock = ManualClock()
    cps = _checkpoints(make_backend, clock=clock)
    with cps.task("ttl-task", ttl=10) as task:
        saved = task.save("x")
    assert saved.expires_at == pytest.approx(clock.time() + 10)
    clock.advance(11)
    with cps.task("ttl-task") as task:
        assert task.latest is None
