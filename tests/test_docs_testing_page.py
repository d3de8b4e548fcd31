"""docs/testing.md against the code it describes: the ``dynamodb_local_env`` row names every
variable the fixture sets, and ``local fetch``'s synopsis takes the digests the option takes
(issue 52 item 12)."""

from __future__ import annotations

from pathlib import Path

from dynacoord.testing import DynamoDBLocal

TESTING = Path(__file__).resolve().parent.parent / "docs" / "testing.md"


def test_the_env_fixture_row_names_every_variable_it_sets() -> None:
    (row,) = [
        line for line in TESTING.read_text().splitlines() if "| `dynamodb_local_env` |" in line
    ]
    for name in DynamoDBLocal(port=8000).env():
        if name.startswith(("AWS_ENDPOINT", "DYNACOORD_")):
            assert f"`{name}`" in row, name


def test_the_fetch_synopsis_says_hex_or_base64() -> None:
    from dynacoord.cli import build_parser

    text = TESTING.read_text()
    assert "--sha512 BASE64]" not in text
    local = build_parser()._subparsers._group_actions[0].choices["local"]  # type: ignore[union-attr]
    fetch = local._subparsers._group_actions[0].choices["fetch"]  # type: ignore[union-attr]
    (option,) = [a for a in fetch._actions if "--sha512" in a.option_strings]
    assert "hex" in (option.help or "") and "base64" in (option.help or "")
    assert "[--sha512 HEX_OR_BASE64]" in text
