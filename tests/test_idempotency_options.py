"""``@idempotent``'s options as one object (``IdempotencyOptions``): one definition reached
from ``backend.idempotent`` and ``backend.idempotency.idempotent``, the same behaviour by name
or as an object, unknown names and wrong values refused, and signatures that stay short."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from dynacoord import (
    IdempotencyKeyMismatchError,
    IdempotencyOptions,
    InvalidKeyError,
    ManualClock,
)
from dynacoord._backend import Backend
from dynacoord.errors import ConfigurationError, InvalidValueError
from dynacoord.idempotency import Idempotency

#: the options' names and defaults, as the dataclass declares them
DEFAULTS = {f.name: f.default for f in dataclasses.fields(IdempotencyOptions) if f.init}


def _history(decorate: Callable[..., Any], clock: ManualClock) -> list[Any]:
    """What an idempotent function does over a first call, a replay, a different payload under
    the same key, a missing key and an expired result."""
    runs: list[int] = []

    @decorate
    def charge(event: dict[str, Any]) -> dict[str, Any]:
        runs.append(event["amount"])
        return {"charged": event["amount"]}

    seen: list[Any] = [charge({"id": "o-1", "amount": 5}), charge({"id": "o-1", "amount": 5})]
    try:
        charge({"id": "o-1", "amount": 6})
    except IdempotencyKeyMismatchError:
        seen.append("mismatch")
    seen.append(charge({"amount": 7}))  # no key: raise_on_no_key=False runs it unprotected
    clock.advance(61)
    seen.append(charge({"id": "o-1", "amount": 8}))  # ttl=60: expired, runs again
    seen.append(list(runs))
    return seen


def test_an_options_object_and_keywords_behave_the_same(mongo_backend_factory: Any) -> None:
    values: dict[str, Any] = {"payload": "amount", "ttl": 60, "raise_on_no_key": False}
    options = IdempotencyOptions(**values)
    histories = []
    for decorate in (
        lambda b: b.idempotent(key="id", **values),
        lambda b: b.idempotent(options, key="id"),
        lambda b: b.idempotent(options=options, key="id"),
        lambda b: b.idempotency.idempotent(key="id", **values),
        lambda b: b.idempotency.idempotent(options, key="id"),
    ):
        clock = ManualClock()
        histories.append(_history(decorate(mongo_backend_factory(clock=clock)), clock))
    expected = [
        {"charged": 5},
        {"charged": 5},
        "mismatch",
        {"charged": 7},
        {"charged": 8},
        [5, 7, 8],
    ]
    assert histories == [expected] * 5


def test_a_name_beside_an_object_wins_over_its_value(mongo_backend_factory: Any) -> None:
    base = IdempotencyOptions(raise_on_no_key=False)

    @mongo_backend_factory().idempotent(base, key="id", raise_on_no_key=True)
    def handler(event: dict[str, Any]) -> int:
        return 1

    with pytest.raises(InvalidKeyError, match="refusing to run it without idempotency"):
        handler({})
    assert base.raise_on_no_key is False  # the object given is not changed


def test_one_options_object_serves_many_functions_each_with_its_own_cache(
    mongo_backend_factory: Any,
) -> None:
    backend = mongo_backend_factory()
    options = IdempotencyOptions(use_local_cache=True, local_cache_max_items=4)

    @backend.idempotent(options, key="id")
    def first(event: dict[str, Any]) -> str:
        return "first"

    @backend.idempotent(options, key="id")
    def second(event: dict[str, Any]) -> str:
        return "second"

    assert first({"id": "a"}) == "first"
    caches = (first.local_cache, second.local_cache)  # type: ignore[attr-defined]
    assert caches[0] is not caches[1]
    assert (len(caches[0]), len(caches[1]), caches[0].max_items) == (1, 0, 4)


@pytest.mark.parametrize(
    "make",
    [
        lambda b: b.idempotent(key="id", tll=60),
        lambda b: b.idempotency.idempotent(key="id", tll=60),
        lambda b: b.idempotent(IdempotencyOptions(), key="id", tll=60),
    ],
    ids=["backend", "idempotency", "beside-an-object"],
)
def test_an_unknown_name_is_refused_with_the_known_ones(
    mongo_backend_factory: Any, make: Callable[[Backend], Any]
) -> None:
    with pytest.raises(
        ConfigurationError, match=r"unknown idempotency option\(s\) \['tll'\]"
    ) as info:
        make(mongo_backend_factory())
    assert str(info.value).endswith("the options are " + ", ".join(DEFAULTS))


@pytest.mark.parametrize("given", ["order_id", lambda event: event["id"], {"ttl": 60}])
def test_options_must_be_an_options_object_and_the_key_is_named(
    mongo_backend_factory: Any, given: Any
) -> None:
    backend = mongo_backend_factory()
    hint = r" \(the key is given by name" if not isinstance(given, dict) else ""
    with pytest.raises(TypeError, match=f"options must be an IdempotencyOptions, got .*{hint}"):
        backend.idempotent(given, key="id")
    with pytest.raises(TypeError, match="key"):
        backend.idempotent(given)  # type: ignore[call-arg]  # @backend.idempotent without key


@pytest.mark.parametrize(
    ("values", "error", "match"),
    [
        ({"ttl": 0}, InvalidValueError, "ttl"),
        ({"ttl": "1h"}, TypeError, "ttl"),
        ({"in_progress_ttl": -1}, InvalidValueError, "in_progress_ttl"),
        ({"payload": 3}, ConfigurationError, "payload"),
        ({"payload": "a[?"}, ConfigurationError, "payload"),
        ({"wait": "yes"}, TypeError, "wait"),
        ({"wait_timeout": -1}, InvalidValueError, "wait_timeout"),
        ({"raise_on_no_key": None}, TypeError, "raise_on_no_key"),
        ({"output_type": 3}, ConfigurationError, "output_type"),
        ({"use_local_cache": 1}, TypeError, "use_local_cache"),
        ({"use_local_cache": True, "local_cache_max_items": 0}, InvalidValueError, "local_cache"),
        ({"response_hook": "mark"}, ConfigurationError, "response_hook"),
    ],
)
def test_a_wrong_value_is_refused_when_the_options_are_made(
    values: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        IdempotencyOptions(**values)
    with pytest.raises(error, match=match):
        IdempotencyOptions.of(IdempotencyOptions(), **values)  # beside an object: checked too


def test_options_are_frozen_and_compare_by_their_values() -> None:
    options = IdempotencyOptions(payload="amount", output_type=int)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.ttl = 5  # type: ignore[misc]
    assert options == IdempotencyOptions(payload="amount", output_type=int)
    assert dataclasses.replace(options, ttl=5).ttl_ms == 5000
    assert "_payload" not in repr(options)


def _parameters(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(function).parameters.items() if n != "self"}


def test_idempotent_is_defined_once() -> None:
    """``Backend.idempotent`` takes what ``Idempotency.idempotent`` takes, parameter for
    parameter, and repeats none of the options."""
    backend_side = _parameters(Backend.idempotent)
    one_definition = _parameters(Idempotency.idempotent)
    assert [(n, p.kind, p.default) for n, p in backend_side.items()] == [
        (n, p.kind, p.default) for n, p in one_definition.items()
    ]
    for parameters in (backend_side, one_definition):
        assert len(parameters) <= 8, list(parameters)
        assert not set(DEFAULTS) & set(parameters)  # each option is named in one place
        assert parameters["option_values"].kind is inspect.Parameter.VAR_KEYWORD


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_both_entry_points_accept_every_option_name(mongo_backend_factory: Any, name: str) -> None:
    backend = mongo_backend_factory()
    value = DEFAULTS[name]
    for idempotent in (backend.idempotent, backend.idempotency.idempotent):
        decorated = idempotent(key="id", **{name: value})(lambda event: event["id"])
        assert decorated({"id": name}) == name
