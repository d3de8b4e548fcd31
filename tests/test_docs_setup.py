"""The setup pages say what the code does: testing.md's exports are what ``local start`` prints,
deployment.md says how to delete a kept table, ``DYNACOORD_ENDPOINT_URL`` is DynamoDB's only, the
first-use table check is described, and every README link resolves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


# -- the setup pages ------------------------------------------------------------------------------


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


# -- README's links, read from a wheel ------------------------------------------------------------


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
