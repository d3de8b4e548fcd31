"""Issue 31, the points left after the first pass: 4 (an unstorable idempotent result's advice
matches its cause, and the docs agree with the code)."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import pytest

from dynacoord import IdempotencyValueError, codec

ROOT = Path(__file__).resolve().parents[1]

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


def test_a_record_marked_unstorable_by_an_older_version_still_reads() -> None:
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


# -- point 2: the docs of what the first pass changed ----------------------------------------------


def _doc(name: str) -> str:
    return re.sub(r"[ \t]*\n[ \t]*", " ", (ROOT / name).read_text())


def test_testing_md_shows_every_variable_local_start_prints(dynamodb_local: Any) -> None:
    names = set(dynamodb_local.env())  # what `dynacoord local start` prints as exports
    text = (ROOT / "docs" / "testing.md").read_text()
    block = text[text.index("Point boto3 and the dynacoord CLI at it with:") :]
    block = block[: block.index("Press Ctrl-C")]
    assert set(re.findall(r"export (\w+)=", block)) == names


def test_deployment_md_says_how_to_delete_the_table_a_stack_kept() -> None:
    text = _doc("docs/deployment.md")
    assert "table delete --yes --disable-deletion-protection" in text
    assert "once `DeletionProtection` is off" not in text


def test_the_docs_say_dynacoord_endpoint_url_is_dynamodbs_only() -> None:
    deployment = _doc("docs/deployment.md")
    assert "`--endpoint-url` (or `DYNACOORD_ENDPOINT_URL`) for all the services" not in deployment
    for page in ("docs/deployment.md", "docs/lambda.md", "README.md"):
        assert "DynamoDB only" in _doc(page), page


def test_the_docs_describe_the_first_use_table_check() -> None:
    for page in ("docs/deployment.md", "docs/lambda.md", "docs/backends.md"):
        text = _doc(page)
        assert "verify=False" in text and "ConfigurationError" in text, page
        assert "DescribeTable" in text, page
    for page in ["README.md", *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]:
        text = _doc(page)
        for found in re.finditer(r"TableNotReadyError", text):
            around = text[max(0, found.start() - 300) : found.end() + 100]
            if "no longer the `TableNotReadyError`" in around:
                continue  # the note for upgraders
            assert "missing" not in around and "does not exist" not in around, (page, around)


# -- point 14: README's links, read from a wheel ---------------------------------------------------


def test_readme_says_where_its_linked_docs_are_and_every_link_resolves() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?!https?://|#)[^)#\s]+)(?:#[^)]*)?\)", text)
    assert links, "README links its docs"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, missing
    flat = re.sub(r"\s+", " ", text)
    # the wheel carries the package only (and this README as its description): say so, and
    # where the linked pages are
    assert "not in the wheel" in flat and "relative to the repository" in flat


# -- point 10 (follow-up): a stack's previous empty Namespaces as moto reports it ------------------


@pytest.mark.parametrize("previous", ["", "['']", "[]", "[' ']"])
def test_an_empty_previous_namespaces_list_allows_every_relay_namespace(previous: str) -> None:
    from dynacoord.provision import check_stack_rules

    relay = {"Relay": "true", "RelayHandlers": "m:h", "CodeS3Bucket": "b", "CodeS3Key": "k"}
    check_stack_rules({**relay, "Namespaces": previous, "RelayNamespace": "orders"})
    with pytest.raises(ValueError, match="not one of Namespaces 'billing'"):
        check_stack_rules({**relay, "Namespaces": "['billing']", "RelayNamespace": "orders"})
