"""The package surface: what an import loads, the public names, one error root, the licence
that ships, and ``DynamoDBBackend.from_env()``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dynacoord
from dynacoord import (
    InvalidKeyError,
)

# -- package surface -------------------------------------------------------------------------------


def _loaded_after(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after running ``code``."""
    probe = f"import sys\n{code}\nprint(','.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_import_is_cheap_and_optional_backends_not_imported():
    unwanted = ("boto3", "botocore", "redis", "pymongo", "dynacoord.outbox")
    assert (
        _loaded_after("import dynacoord", (*unwanted, "dynacoord.idempotency", "dynacoord.cache"))
        == []
    )


def test_a_lambda_cold_path_imports_nothing_it_does_not_use():
    """``import dynacoord``, the DynamoDB backend and a first lock: typing_extensions (hundreds
    of module-level objects, which tip a full garbage collection inside ``boto3.client()``) and
    the modules of other primitives stay unloaded."""
    code = (
        "import boto3, dynacoord; "
        "c = boto3.client('dynamodb', region_name='us-east-1', aws_access_key_id='x', "
        "aws_secret_access_key='x'); "
        "dynacoord.DynamoDBBackend(c, table_name='tbl').locks"
    )
    unwanted = ("typing_extensions", "dynacoord.outbox", "dynacoord.idempotency")
    assert _loaded_after(code, (*unwanted, "dynacoord.cache", "dynacoord.codec")) == []


def test_public_names_resolve_and_py_typed_ships():
    for name in dynacoord.__all__:
        assert getattr(dynacoord, name) is not None, name
    assert (Path(dynacoord.__file__).parent / "py.typed").exists()
    with pytest.raises(AttributeError):
        dynacoord.NoSuchThing  # noqa: B018


def test_errors_share_one_root():
    from dynacoord import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), dynacoord.DynacoordError), name


def test_every_public_error_is_exported_from_the_package():
    """``except dynacoord.CredentialsError`` works for every error of dynacoord.errors."""
    from dynacoord import errors

    missing = sorted(set(errors.__all__) - set(dynacoord.__all__))
    assert not missing, f"errors not re-exported from dynacoord: {missing}"


def test_from_env_reads_table_namespace_and_endpoint(monkeypatch, ddb_table, dynamodb_local):
    """``DynamoDBBackend.from_env()`` against DynamoDB Local, configured only by variables."""
    from dynacoord import DynamoDBBackend
    from dynacoord.testing import DUMMY_CREDENTIALS

    _, table = ddb_table
    monkeypatch.setenv("DYNACOORD_TABLE", table)
    monkeypatch.setenv("DYNACOORD_NAMESPACE", "from-env")
    monkeypatch.setenv("DYNACOORD_ENDPOINT_URL", dynamodb_local.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", DUMMY_CREDENTIALS["region_name"])
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    backend = DynamoDBBackend.from_env()
    assert (backend.table_name, backend.namespace) == (table, "from-env")
    lease = backend.locks.acquire("env-lock", ttl=5)
    assert lease is not None and lease.release()
    # An explicit argument wins over the environment.
    assert DynamoDBBackend.from_env(namespace="explicit").namespace == "explicit"
    monkeypatch.setenv("DYNACOORD_NAMESPACE", "bad#ns")
    with pytest.raises(InvalidKeyError):
        DynamoDBBackend.from_env()


def test_the_declared_license_ships_as_a_file() -> None:
    root = Path(__file__).resolve().parent.parent
    assert 'license = "Apache-2.0"' in (root / "pyproject.toml").read_text(encoding="utf-8")
    text = (root / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
