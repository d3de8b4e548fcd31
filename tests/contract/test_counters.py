"""Counter, flag and join contract: every backend must pass these unchanged."""

from __future__ import annotations

import decimal
import threading

import pytest

from dynacoord import (
    CounterTypeError,
    InvalidKeyError,
    InvalidValueError,
    JoinMismatchError,
    ManualClock,
)
from tests.conftest import needs_atomic_store


def counters_of(make_backend, **kwargs):
    return make_backend(**kwargs).counters


def run_threads(n, target):
    errors: list[BaseException] = []

    def wrapped(i):
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


# -- counters -------------------------------------------------------------------------------------


def test_increment_counts_from_zero_and_returns_new_value(make_backend):
    counters = counters_of(make_backend)
    assert counters.get("c") is None
    assert counters.increment("c") == 1
    assert counters.increment("c", 5) == 6
    assert counters.increment("c", -2) == 4
    assert counters.get("c") == 4
    assert isinstance(counters.get("c"), int)


def test_increment_refuses_bad_arguments_before_writing(make_backend):
    counters = counters_of(make_backend)
    with pytest.raises(TypeError):
        counters.increment("c", 1.5)
    with pytest.raises(TypeError):
        counters.increment("c", True)
    with pytest.raises(ValueError):
        counters.increment("c", ttl=0)
    with pytest.raises(InvalidKeyError):
        counters.increment("")
    assert counters.get("c") is None


def test_expired_counter_restarts_from_zero(make_backend):
    clock = ManualClock()
    counters = counters_of(make_backend, clock=clock)
    assert counters.increment("w", 10, ttl=1) == 10
    clock.advance(0.999)
    assert counters.get("w") == 10
    clock.advance(0.001)
    assert counters.get("w") is None
    assert counters.increment("w", 3, ttl=1) == 3  # not 13
    clock.advance(0.5)
    assert counters.get("w") == 3


def test_ttl_is_a_fixed_window_not_sliding(make_backend):
    clock = ManualClock()
    counters = counters_of(make_backend, clock=clock)
    counters.increment("win", ttl=1)
    clock.advance(0.6)
    assert counters.increment("win", ttl=1) == 2  # does not push the expiry
    clock.advance(0.5)
    assert counters.get("win") is None
    assert counters.increment("win") == 1


def test_expired_counter_restarted_without_ttl_never_expires(make_backend):
    clock = ManualClock()
    counters = counters_of(make_backend, clock=clock)
    counters.increment("k", ttl=1)
    clock.advance(2)
    assert counters.increment("k") == 1
    clock.advance(3600)
    assert counters.get("k") == 1
    assert counters.item("k").expires_at_ms is None


def test_8_threads_x_100_increments_sum_exactly(make_backend):
    needs_atomic_store(make_backend)
    counters = counters_of(make_backend)
    seen: list[int] = []
    guard = threading.Lock()
    start = threading.Barrier(8)

    def worker(_):
        start.wait()
        mine = [counters.increment("hot") for _ in range(100)]
        with guard:
            seen.extend(mine)

    run_threads(8, worker)
    assert counters.get("hot") == 800
    # Every increment returned a distinct value: none was lost or counted twice.
    assert sorted(seen) == list(range(1, 801))


def test_racing_restarts_of_an_expired_counter_lose_no_increment(make_backend):
    needs_atomic_store(make_backend)
    clock = ManualClock()
    counters = counters_of(make_backend, clock=clock)
    for round_ in range(3):
        key = f"exp{round_}"
        counters.increment(key, 100, ttl=1)
        clock.advance(2)  # every racer finds the counter expired
        start = threading.Barrier(8)
        results: list[int] = []

        def worker(_, key=key, start=start, results=results):
            start.wait()
            results.append(counters.increment(key, ttl=1))

        run_threads(8, worker)
        assert counters.get(key) == 8
        assert sorted(results) == list(range(1, 9))


# -- flags ----------------------------------------------------------------------------------------


def test_set_if_absent_only_first_writer_wins(make_backend):
    counters = counters_of(make_backend)
    assert counters.set_if_absent("flag", "first") is True
    assert counters.set_if_absent("flag", "second") is False
    assert counters.get("flag") == "first"


def test_set_if_absent_on_an_expired_item_succeeds(make_backend):
    clock = ManualClock()
    counters = counters_of(make_backend, clock=clock)
    assert counters.set_if_absent("lease", "a", ttl=1) is True
    clock.advance(0.5)
    assert counters.set_if_absent("lease", "b", ttl=1) is False
    clock.advance(0.5)
    assert counters.get("lease") is None
    assert counters.set_if_absent("lease", "b", ttl=1) is True
    assert counters.get("lease") == "b"
    # An expired counter is absent too.
    counters.increment("n", ttl=1)
    clock.advance(1)
    assert counters.set_if_absent("n", "now a flag") is True
    assert counters.get("n") == "now a flag"


@pytest.mark.parametrize(
    "value",
    [1.5, "x", True, None, [1, "a"], {"a": {"b": 2.25}}, b"\x00\xff", decimal.Decimal("1.10")],
)
def test_flag_values_round_trip(make_backend, value):
    counters = counters_of(make_backend)
    assert counters.set_if_absent("v", value) is True
    got = counters.get("v")
    assert got == value and type(got) is type(value)


def test_int_value_creates_a_counter(make_backend):
    counters = counters_of(make_backend)
    assert counters.set_if_absent("start", 41) is True
    assert counters.increment("start") == 42


def test_unsupported_flag_value_is_refused_before_writing(make_backend):
    counters = counters_of(make_backend)
    with pytest.raises(InvalidValueError):
        counters.set_if_absent("bad", {1, 2})
    with pytest.raises(InvalidValueError):
        counters.set_if_absent("bad", float("nan"))
    assert counters.get("bad") is None


def test_increment_on_a_flag_is_a_type_error(make_backend):
    counters = counters_of(make_backend)
    counters.set_if_absent("f", "text")
    with pytest.raises(CounterTypeError) as info:
        counters.increment("f")
    assert info.value.kind == "flag"
    assert counters.get("f") == "text"


# -- delete and extend_ttl ------------------------------------------------------------------------


def test_delete_reports_whether_a_live_item_was_deleted(make_backend):
    clock = ManualClock()
    counters = counters_of(make_backend, clock=clock)
    assert counters.delete("none") is False
    counters.increment("c")
    assert counters.delete("c") is True
    assert counters.get("c") is None
    assert counters.delete("c") is False
    counters.set_if_absent("e", "x", ttl=1)
    clock.advance(1)
    assert counters.delete("e") is False


def test_extend_ttl(make_backend):
    clock = ManualClock()
    counters = counters_of(make_backend, clock=clock)
    assert counters.extend_ttl("missing", 5) is False
    counters.increment("c", ttl=1)
    clock.advance(0.9)
    assert counters.extend_ttl("c", 1) is True
    clock.advance(0.9)
    assert counters.get("c") == 1  # would have expired without the extension
    clock.advance(0.1)
    assert counters.get("c") is None
    assert counters.extend_ttl("c", 5) is False  # expired stays expired
    assert counters.get("c") is None
    counters.increment("forever")
    assert counters.extend_ttl("forever", 1) is True
    clock.advance(1)
    assert counters.get("forever") is None


# -- joins ----------------------------------------------------------------------------------------


def test_join_completes_only_after_all_members_and_fires_once(make_backend):
    counters = counters_of(make_backend)
    results = [counters.join("j", m, expected=3) for m in ("a", "a", "b", "a")]
    assert [(r.count, r.complete, r.fired) for r in results] == [
        (1, False, False),
        (1, False, False),
        (2, False, False),
        (2, False, False),
    ]
    last = counters.join("j", "c", expected=3)
    assert (last.count, last.complete, last.fired) == (3, True, True)
    # At least once: a redelivery of the completing member fires again, any other member never.
    again = counters.join("j", "c", expected=3)
    assert (again.count, again.complete, again.fired) == (3, True, True)
    assert not counters.join("j", "a", expected=3).fired
    assert counters.get("j") == 3
    assert counters.item("j").members == frozenset({"a", "b", "c"})


def test_join_fires_exactly_once_across_8_racing_threads(make_backend):
    needs_atomic_store(make_backend)
    counters = counters_of(make_backend)
    # Three members; "a" arrives three times (redeliveries), "b" twice, "c" three times.
    arrivals = ["a", "a", "a", "b", "b", "c", "c", "c"]
    for round_ in range(5):
        key = f"fan{round_}"
        start = threading.Barrier(len(arrivals))
        results = []

        def worker(i, key=key, start=start, results=results):
            start.wait()
            results.append((arrivals[i], counters.join(key, arrivals[i], expected=3)))

        run_threads(len(arrivals), worker)
        # One member fires: the one whose arrival completed the join (its redeliveries that came
        # after completion fire too, at least once); no other member ever does.
        fired = [(m, r) for m, r in results if r.fired]
        assert len({m for m, _ in fired}) == 1
        assert all(r.count == 3 and r.complete for _, r in fired)
        # A result only says complete once its count reached 3.
        assert all(r.complete == (r.count == 3) for _, r in results)
        # Each distinct member was counted once: no arrival ever saw a count above 3.
        assert {r.count for _, r in results} <= {1, 2, 3}
        assert counters.get(key) == 3


def test_join_with_one_expected_fires_on_first_arrival(make_backend):
    counters = counters_of(make_backend)
    first = counters.join("solo", "x", expected=1)
    assert first.fired and first.complete
    assert counters.join("solo", "x", expected=1).fired  # its redelivery fires again
    assert not counters.join("solo", "y", expected=1).fired  # an extra never does


def test_join_extra_members_never_fire_again(make_backend):
    counters = counters_of(make_backend)
    assert not counters.join("j", "a", expected=2).fired
    assert counters.join("j", "b", expected=2).fired
    extra = counters.join("j", "c", expected=2)
    assert (extra.count, extra.complete, extra.fired) == (3, True, False)


def test_join_expected_mismatch_is_refused(make_backend):
    counters = counters_of(make_backend)
    counters.join("j", "a", expected=3)
    with pytest.raises(JoinMismatchError) as info:
        counters.join("j", "b", expected=4)
    assert info.value.stored_expected == 3 and info.value.expected == 4
    assert counters.get("j") == 1


def test_expired_join_restarts(make_backend):
    clock = ManualClock()
    counters = counters_of(make_backend, clock=clock)
    counters.join("j", "a", expected=2, ttl=1)
    clock.advance(1)
    assert counters.get("j") is None
    result = counters.join("j", "a", expected=2, ttl=1)  # counted again: the old join is gone
    assert (result.count, result.fired) == (1, False)
    assert counters.join("j", "b", expected=2, ttl=1).fired
    # An expired join may be restarted with another expected count.
    clock.advance(1)
    assert counters.join("j", "z", expected=1).fired


def test_join_refuses_bad_input_and_other_kinds(make_backend):
    counters = counters_of(make_backend)
    with pytest.raises(ValueError):
        counters.join("j", "a", expected=0)
    with pytest.raises(TypeError):
        counters.join("j", "a", expected=True)
    with pytest.raises(InvalidKeyError):
        counters.join("j", "", expected=2)
    with pytest.raises(InvalidKeyError):
        counters.join("j", "m" * 129, expected=2)
    assert counters.get("j") is None
    counters.increment("n")
    with pytest.raises(CounterTypeError):
        counters.join("n", "a", expected=2)
    counters.join("jj", "a", expected=2)
    with pytest.raises(CounterTypeError):
        counters.increment("jj")
    assert counters.get("jj") == 1
