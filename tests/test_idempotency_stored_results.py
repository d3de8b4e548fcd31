"""What an idempotent result is stored as: the size check's cheap bound agrees with the full
estimate, and a result that cannot be stored gives advice that matches its cause, on the first
call and on duplicates, as the docs say."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynacoord import IdempotencyValueError, ValueTooLargeError, codec, keys

ROOT = Path(__file__).resolve().parents[1]

# -- the idempotency record's size check -----------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    chars=st.sampled_from(["x", "é", "€", "😀"]),
    length=st.integers(min_value=0, max_value=450 * 1024),
    key=st.text(min_size=1, max_size=40).filter(str.strip),
)
def test_the_idempotency_size_check_agrees_with_the_full_estimate(chars, length, key):
    # The check's cheap bound skips the estimate only where the estimate would pass too: a record
    # is refused exactly when the full estimate of the largest record it can become refuses it.
    from dynacoord.idempotency import Claim, Idempotency

    text = chars * (length // len(chars.encode()))
    claim = Claim(key, "t" * 32, 0, "h" * 64)
    try:
        codec.check_item_size(
            {
                "pk": f"IDEMP#{'x' * keys.MAX_NAMESPACE_CHARS}#{key}",
                "sk": "IDEMP",
                "status": "COMPLETED",
                "result": text,
                "payload_hash": "h" * 64,
                "expires_at_ms": 10**15,
                "ttl": 10**12,
                "created_ms": 10**15,
                "completed_ms": 10**15,
            },
            key=key,
        )
        fits = True
    except ValueTooLargeError:
        fits = False
    if fits:
        Idempotency._check_size(claim, text)
    else:
        with pytest.raises(ValueTooLargeError):
            Idempotency._check_size(claim, text)


# -- a result that cannot be stored ----------------------------------------------------------------


AT = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)

# (result, what both the first call's and a duplicate's message must say, what they must not)
UNSTORABLE = {
    "big-dict": (
        {"blob": "x" * (500 * 1024)},
        ["too large", f"{codec.DYNAMODB_ITEM_LIMIT}-byte"],
        ["output_type"],
    ),
    "huge-int": (
        10**5000,
        ["out of range", f"{codec.MAX_INT_DIGITS} digits"],
        ["output_type=int", "the function's output_type"],
    ),
    "nan-in-a-list": (
        [1.0, float("nan")],
        ["out of range", "NaN"],
        ["output_type=list", "the function's output_type"],
    ),
    "datetime": (AT, ["output_type=datetime"], ["too large", "out of range"]),
    "set": ({1, 2}, ["output_type=set"], ["too large", "out of range"]),
    "datetime-in-a-dict": (
        {"at": AT},
        ["output_type=(to_store, from_store)"],
        ["output_type=dict", "too large", "out of range"],
    ),
}


@pytest.mark.parametrize("case", sorted(UNSTORABLE))
def test_an_unstorable_results_advice_matches_its_cause_on_first_call_and_duplicates(
    make_backend: Any, case: str
) -> None:
    result, says, never = UNSTORABLE[case]
    backend = make_backend()
    calls: list[int] = []

    @backend.idempotent(key=lambda: case)
    def job() -> Any:
        calls.append(1)
        return result

    messages = []
    for _ in range(2):
        with pytest.raises(IdempotencyValueError) as err:
            job()
        messages.append(str(err.value))
    assert calls == [1], "the side effects ran once"
    for message in messages:
        for text in says:
            assert text in message, (text, message)
        for text in never:
            assert text not in message, (text, message)
        assert " a int" not in message
    record = backend.idempotency.get(case)
    assert record is not None and record.completed
    assert record.unstorable == codec_type_name(result)
    assert backend.idempotency.delete(case) is True


def codec_type_name(value: Any) -> str:
    cls = type(value)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def test_an_unstorable_marker_without_advice_still_reads() -> None:
    from dynacoord.idempotency import IdempotencyRecord, IdempotencyStatus

    record = IdempotencyRecord("k", IdempotencyStatus.COMPLETED, 1, None, "!unstorable:int")
    assert record.unstorable == "int"
    with pytest.raises(IdempotencyValueError, match="could not be stored"):
        _ = record.result


def _section(text: str, start: str) -> str:
    return text[text.index(start) :].split("\n* **", 1)[0]


def test_the_docs_say_what_the_code_does_with_an_unstorable_result() -> None:
    guarantees = (ROOT / "docs" / "guarantees.md").read_text()
    row = _section(guarantees, "* **`@idempotent` with a result the codec refuses**")
    row = re.sub(r"\s+", " ", row)
    assert "still gets the result" not in row and "claim is released" not in row, row
    assert "IdempotencyValueError" in row and "unstorable" in row, row
    idempotency = re.sub(r"\s+", " ", (ROOT / "docs" / "idempotency.md").read_text())
    for cause in ("too large", "out of range", "output_type"):
        assert cause in idempotency.split("## Unstorable results", 1)[1].split("\n## ", 1)[0]
