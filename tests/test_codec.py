"""The codec: values round-trip with their type, the text is that of the plain JSON conversion,
errors name the path to the bad value, and the item size check."""

from __future__ import annotations

import decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynacoord import (
    InvalidValueError,
    ValueTooLargeError,
    codec,
)

# -- codec -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        2**100,
        1.5,
        0.1,
        -0.0,
        1e308,
        5e-324,
        decimal.Decimal("1.10"),
        decimal.Decimal("-3E+5"),
        "",
        "ünïcødé 🚀",
        True,
        False,
        None,
        b"",
        b"\x00\xff",
        [1, [2, [3]]],
        {"a": {"b": [None, 1.25, b"x"]}},
        {"$b": "not bytes"},
        {"$$": 1},
        {"$d": {"$b": "x"}},
    ],
)
def test_codec_round_trips_type_and_value(value):
    decoded = codec.decode(codec.encode(value))
    assert decoded == value
    assert type(decoded) is type(value)
    if isinstance(value, float):
        assert repr(decoded) == repr(value)


def _reference_tree(value):
    """The codec's JSON tree by its plain definition: every container copied, every value
    converted (what the encoder must produce whatever shortcuts it takes)."""
    if isinstance(value, dict):
        out = {k: _reference_tree(v) for k, v in value.items()}
        return {"$$": out} if len(out) == 1 and next(iter(out)) in ("$b", "$d", "$$") else out
    if isinstance(value, (list, tuple)):
        return [_reference_tree(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return {"$d": str(value)}
    if isinstance(value, bytes):
        import base64

        return {"$b": base64.b64encode(value).decode("ascii")}
    return value


_json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.binary(max_size=8),
    st.decimals(allow_nan=False, allow_infinity=False),
)
_json_keys = st.one_of(st.sampled_from(["$b", "$d", "$$", "a"]), st.text(max_size=4))
_json_values = st.recursive(
    _json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(_json_keys, inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_codec_text_is_that_of_the_plain_conversion_and_the_value_is_untouched(value):
    import copy
    import json

    before = copy.deepcopy(value)
    expected = json.dumps(_reference_tree(value), ensure_ascii=False, separators=(",", ":"))
    assert codec.encode(value) == expected
    assert codec.canonical(value) == json.dumps(
        _reference_tree(value), ensure_ascii=False, sort_keys=True
    )
    assert value == before  # the walk changed nothing it was given


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"a": [1, {"b": float("nan")}]}, "value['a'][1]['b']"),
        ([0, (1, {"k": object()})], "value[1][1]['k']"),
        ({"ok": 1, "bad": {3: "x"}}, "value['bad']"),
    ],
)
def test_codec_errors_name_the_path_to_the_bad_value(value, where):
    with pytest.raises(InvalidValueError) as info:
        codec.encode(value)
    assert f" at {where}" in str(info.value)


def test_codec_tuple_becomes_list():
    assert codec.decode(codec.encode((1, 2))) == [1, 2]


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        decimal.Decimal("NaN"),
        {1, 2},
        object(),
        {1: "int key"},
        frozenset(),
        complex(1, 2),
    ],
)
def test_codec_refuses_unstorable_values(value):
    with pytest.raises(InvalidValueError):
        codec.encode(value)


def test_codec_refuses_recursive_structures():
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(InvalidValueError, match="deeper"):
        codec.encode(loop)


def test_item_size_check():
    codec.check_item_size({"pk": "x", "v": "a" * 1000})
    with pytest.raises(ValueTooLargeError) as err:
        codec.check_item_size({"pk": "x", "v": "a" * 410_000})
    assert err.value.size > err.value.limit == codec.DYNAMODB_ITEM_LIMIT


@pytest.mark.parametrize(
    "text",
    [
        '{"\\u0024b":"AA=="}',  # a tag spelled with an escape is still a tag
        ' {"$d":"1.5"} ',  # whitespace around the value
        '{"a":"\\u00e9$"}',
        '[1,{"$$":{"$b":"x"}}]',
        '"plain"',
        "12",
    ],
)
def test_codec_decode_reads_any_json_text_as_the_full_walk_does(text):
    import json

    from dynacoord.codec import _from_jsonable

    assert codec.decode(text) == _from_jsonable(json.loads(text))
    assert codec.decode(text.encode()) == _from_jsonable(json.loads(text))


def test_codec_decode_refuses_what_json_refuses():
    import json

    for text in ("", "{", '{"a":1} x', "nan?"):
        with pytest.raises(json.JSONDecodeError):
            codec.decode(text)


@given(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**20), max_value=10**20),
        st.text(alphabet=st.characters(max_codepoint=0x2030, exclude_categories=["Cs"])),
        st.sampled_from(["", '"', "\\", "\x7f", "\x00", "a\tb", "\u2028"]),
    )
)
@settings(max_examples=400, deadline=None)
def test_a_lone_scalar_is_encoded_as_json_encodes_it(value):
    """codec.encode writes a lone str, int, bool or None without its walk: the same text."""
    import json

    from dynacoord import codec

    text = codec.encode(value)
    assert text == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert codec.decode(text) == value
