"""The README's tour runs twice in a row against the same table, as a reader running their
script again would (test_docs.py gives every block a fresh database, which hides that)."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal
from tests.test_docs import extract

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def reader_env(dynamodb_local: DynamoDBLocal, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", f"tour{os.getpid()}")  # a database of its own
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", DUMMY_CREDENTIALS["region_name"])
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamodb_local.endpoint_url)
    for name in ("DYNACOORD_ENDPOINT_URL", "DYNACOORD_NAMESPACE", "DYNACOORD_TABLE", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    yield


def _tour() -> str:
    blocks = extract(ROOT / "README.md")
    [tour] = [b for b in blocks if b.lang == "python" and "backend.transaction()" in b.code]
    return tour.code


def test_the_tour_runs_twice_in_a_row(reader_env: None) -> None:
    code = compile(_tour(), "README.md tour", "exec")
    outputs = []
    for _ in range(2):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, {"__name__": "tour"})
        outputs.append(out.getvalue())
    assert "invoicing with fence" in outputs[0] and "order.placed" in outputs[0]
    assert "invoicing with fence" in outputs[1]
