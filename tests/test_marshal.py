"""The DynamoDB fast marshalling path gives what boto3's TypeSerializer/TypeDeserializer give,
value for value and type for type, and boto3's errors where boto3 raises."""

from __future__ import annotations

import decimal
import subprocess
import sys
from decimal import Decimal
from typing import Any

import pytest
from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer
from hypothesis import given, settings
from hypothesis import strategies as st

from dynacoord.backends.dynamodb._marshal import marshal, to_av, unmarshal, values

_ser = TypeSerializer()
_de = TypeDeserializer()

scalars = st.one_of(
    st.text(),
    st.integers(min_value=-(10**38) + 1, max_value=10**38 - 1),
    st.booleans(),
    st.none(),
    st.binary(max_size=16),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=4, max_value=10**20, min_value=-(10**20)
    ),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _typed(value: Any) -> Any:
    """A value with its types spelled out, so 1 == True == Decimal(1) cannot hide a difference."""
    if isinstance(value, dict):
        return ("dict", {k: _typed(v) for k, v in value.items()})
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    if isinstance(value, (set, frozenset)):
        return ("set", sorted(repr(_typed(v)) for v in value))
    return (type(value).__name__, value)


@settings(max_examples=300, deadline=None)
@given(documents)
def test_serialize_matches_boto3(value: Any) -> None:
    assert to_av(value) == _ser.serialize(value)
    assert values(x=value) == {":x": _ser.serialize(value)}


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), documents, max_size=5))
def test_item_round_trip_matches_boto3(item: dict[str, Any]) -> None:
    wire = marshal(item)
    assert wire == {k: _ser.serialize(v) for k, v in item.items() if v is not None}
    assert _typed(unmarshal(wire)) == _typed({k: _de.deserialize(v) for k, v in wire.items()})


@pytest.mark.parametrize(
    "av",
    [
        {"N": "12345678901234567890123456789012345678"},
        {"N": "-1.5E+10"},
        {"N": "0.000001"},
        {"B": b"\x00\xff"},
        {"SS": ["a", "b"]},
        {"NS": ["1", "2.5"]},
        {"BS": [b"x"]},
        {"L": [{"S": "a"}, {"M": {"k": {"NULL": True}}}, {"BOOL": False}]},
    ],
)
def test_deserialize_matches_boto3(av: dict[str, Any]) -> None:
    assert _typed(unmarshal({"a": av})["a"]) == _typed(_de.deserialize(av))


def test_binary_and_sets_keep_boto3_types() -> None:
    assert isinstance(unmarshal({"b": {"B": b"x"}})["b"], Binary)
    assert to_av({"a", "b"})["SS"] in (["a", "b"], ["b", "a"])


@pytest.mark.parametrize(
    "value",
    [10**38, -(10**38), 10**400, 1.5, float("nan")],
    ids=["1e38", "-1e38", "1e400", "float", "nan"],
)
def test_values_boto3_refuses_are_refused_the_same_way(value: Any) -> None:
    with pytest.raises((TypeError, decimal.Inexact, decimal.Rounded)) as ours:
        to_av(value)
    with pytest.raises(type(ours.value)):
        _ser.serialize(value)


def test_bool_is_not_a_number() -> None:
    assert to_av(True) == {"BOOL": True}
    assert to_av(1) == {"N": "1"}
    assert type(unmarshal({"n": {"N": "1"}})["n"]) is Decimal


def test_importing_the_dynamodb_backend_does_not_import_boto3() -> None:
    code = (
        "import sys, dynacoord.backends.dynamodb, dynacoord.backends.dynamodb._table;"
        "import dynacoord.backends.dynamodb.locks, dynacoord.backends.dynamodb.outbox;"
        "bad = [m for m in ('boto3', 'botocore') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@settings(max_examples=200, deadline=None)
@given(st.sets(st.text(), min_size=1, max_size=6))
def test_string_sets_match_boto3(value: set[str]) -> None:
    wire = to_av(value)
    assert wire == _ser.serialize(value)
    assert _typed(unmarshal({"a": wire})["a"]) == _typed(_de.deserialize(wire))


def test_empty_and_mixed_sets_are_boto3s_business() -> None:
    assert to_av(set()) == _ser.serialize(set())
    with pytest.raises(TypeError):
        to_av({"a", 1})
    with pytest.raises(TypeError):
        _ser.serialize({"a", 1})
