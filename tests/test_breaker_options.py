"""A breaker's options as one object (``BreakerOptions``): the same breaker by name or as an
object, unknown names and wrong values refused, and signatures that stay short."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from dynacoord import BreakerOptions, CircuitBreaker, CircuitOpenError, FailureRate, ManualClock
from dynacoord._backend import Backend
from dynacoord.breaker import DEFAULT_FAILURE_THRESHOLD, State
from dynacoord.errors import ConfigurationError, InvalidValueError

OPTION_NAMES = tuple(f.name for f in dataclasses.fields(BreakerOptions))


def _boom(exc: type[BaseException]) -> Callable[[], None]:
    def call() -> None:
        raise exc("down")

    return call


def _history(breaker: CircuitBreaker, clock: ManualClock) -> list[str]:
    """What a breaker does through one outage: the state after each step."""
    seen: list[str] = []
    with pytest.raises(KeyError):
        breaker.call(_boom(KeyError))  # ignored: not a failure
    seen.append(breaker.state.value)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            breaker.call(_boom(RuntimeError))
        seen.append(breaker.state.value)
    try:
        breaker.call(lambda: None)
        seen.append("let through")
    except CircuitOpenError:
        seen.append("refused")
    clock.advance(7)
    breaker.call(lambda: None)  # the trial
    seen.append(breaker.state.value)
    breaker.call(lambda: None)
    seen.append(breaker.state.value)
    return seen


def test_an_options_object_and_keywords_make_the_same_breaker(mongo_backend_factory: Any) -> None:
    values: dict[str, Any] = {
        "failure_threshold": 2,
        "reset_timeout": 7,
        "success_threshold": 2,
        "ignore": KeyError,
    }
    histories = []
    for make in (
        lambda b: b.breaker("by-name", **values),
        lambda b: b.breaker("as-object", BreakerOptions(**values)),
        lambda b: b.breaker("options-keyword", options=BreakerOptions(**values)),
    ):
        clock = ManualClock()
        breaker = make(mongo_backend_factory(clock=clock))
        assert breaker.options == BreakerOptions(**values)
        histories.append(_history(breaker, clock))
    # two trial successes to close (success_threshold=2), the KeyError never counted
    expected = ["closed", "closed", "open", "refused", "half_open", "closed"]
    assert histories == [expected] * 3


def test_the_defaults_are_the_options_defaults(mongo_backend_factory: Any) -> None:
    breaker = mongo_backend_factory().breaker("defaults")
    assert breaker.options == BreakerOptions()
    assert breaker.failure_threshold == DEFAULT_FAILURE_THRESHOLD == 5
    assert (breaker.reset_timeout, breaker.success_threshold, breaker.half_open_max_calls) == (
        30.0,
        1,
        1,
    )
    assert (breaker.ignore, breaker.consistent_reads, breaker.state_cache) == ((), False, 0.0)
    assert breaker.policy is None


def test_a_name_beside_an_object_wins_over_its_value(mongo_backend_factory: Any) -> None:
    clock = ManualClock()
    base = BreakerOptions(failure_threshold=5, reset_timeout=60)
    breaker = mongo_backend_factory(clock=clock).breaker("mixed", base, failure_threshold=1)
    assert breaker.options == BreakerOptions(failure_threshold=1, reset_timeout=60)
    with pytest.raises(RuntimeError):
        breaker.call(_boom(RuntimeError))
    assert breaker.state is State.OPEN  # tripped at 1, not 5
    assert base.failure_threshold == 5  # the object given is not changed


def test_the_constructor_takes_options_the_same_ways(mongo_backend_factory: Any) -> None:
    backend = mongo_backend_factory()
    store = backend._breaker_store(backend.namespace)
    by_name = CircuitBreaker(store, "direct", failure_threshold=3, state_cache=2)
    as_object = CircuitBreaker(store, "direct", BreakerOptions(failure_threshold=3, state_cache=2))
    assert by_name.options == as_object.options
    assert (by_name.failure_threshold, by_name.state_cache) == (3, 2.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda b: b.breaker("x", failure_treshold=3),
        lambda b: CircuitBreaker(b._breaker_store(b.namespace), "x", failure_treshold=3),
        lambda b: b.breaker("x", BreakerOptions(), failure_treshold=3),
    ],
    ids=["backend", "constructor", "beside-an-object"],
)
def test_an_unknown_name_is_refused_with_the_known_ones(
    mongo_backend_factory: Any, make: Callable[[Backend], Any]
) -> None:
    with pytest.raises(
        ConfigurationError, match=r"unknown breaker option\(s\) \['failure_treshold'\]"
    ) as info:
        make(mongo_backend_factory())
    assert str(info.value).endswith("the options are " + ", ".join(OPTION_NAMES))


def test_wiring_is_not_an_option(mongo_backend_factory: Any) -> None:
    """The backend wires its own clock, namespace and metrics: they are refused by name."""
    backend = mongo_backend_factory()
    for name in ("clock", "namespace", "metrics", "store"):
        with pytest.raises(ConfigurationError, match=rf"unknown breaker option\(s\) \['{name}'\]"):
            backend.breaker("x", **{name: None})


def test_options_must_be_an_options_object(mongo_backend_factory: Any) -> None:
    with pytest.raises(TypeError, match="options must be a BreakerOptions, got dict"):
        mongo_backend_factory().breaker("x", {"failure_threshold": 3})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "error", "match"),
    [
        ({"failure_threshold": 0}, InvalidValueError, "failure_threshold"),
        ({"failure_threshold": "3"}, TypeError, "failure_threshold"),
        ({"failure_threshold": True}, TypeError, "failure_threshold"),
        ({"reset_timeout": 0}, InvalidValueError, "reset_timeout"),
        ({"reset_timeout": "30"}, TypeError, "reset_timeout"),
        ({"success_threshold": 0}, InvalidValueError, "success_threshold"),
        ({"half_open_max_calls": 0}, InvalidValueError, "half_open_max_calls"),
        ({"ignore": (KeyError, "ValueError")}, TypeError, "ignore"),
        ({"ignore": 3}, TypeError, "ignore"),
        ({"state_cache": 61}, ValueError, "state_cache"),
        ({"state_cache": -1}, ValueError, "state_cache"),
        ({"state_cache": "1"}, ValueError, "state_cache"),
        ({"policy": "rate"}, TypeError, "policy"),
        ({"consistent_reads": "no"}, TypeError, "consistent_reads"),
        ({"consistent_reads": 1}, TypeError, "consistent_reads"),
        ({"policy": FailureRate(), "failure_threshold": 3}, InvalidValueError, "failure_threshold"),
    ],
)
def test_a_wrong_value_is_refused_when_the_options_are_made(
    values: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        BreakerOptions(**values)
    base = BreakerOptions()
    with pytest.raises(error, match=match):
        BreakerOptions.of(base, **values)  # a name given beside an object is checked too


def test_a_wrong_value_by_name_raises_before_anything_is_stored(
    mongo_backend_factory: Any,
) -> None:
    with pytest.raises(InvalidValueError, match="half_open_max_calls"):
        mongo_backend_factory().breaker("x", half_open_max_calls=0)


def test_options_are_frozen_and_kept_in_one_form() -> None:
    options = BreakerOptions(ignore=KeyError, state_cache=2, consistent_reads=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.reset_timeout = 5  # type: ignore[misc]
    assert options == BreakerOptions(ignore=(KeyError,), state_cache=2.0, consistent_reads=True)
    assert options.ignore == options.ignored == (KeyError,)
    assert isinstance(options.state_cache, float)
    assert BreakerOptions(policy=FailureRate()).failures_to_trip == DEFAULT_FAILURE_THRESHOLD


def _parameters(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(function).parameters.items() if n != "self"}


@pytest.mark.parametrize(
    "function", [CircuitBreaker.__init__, Backend.breaker], ids=["CircuitBreaker", "breaker"]
)
def test_options_grow_in_the_object_not_in_the_signatures(function: Callable[..., Any]) -> None:
    parameters = _parameters(function)
    assert len(parameters) <= 8, list(parameters)
    assert not set(OPTION_NAMES) & set(parameters)  # each option is named in one place
    assert parameters["option_values"].kind is inspect.Parameter.VAR_KEYWORD
