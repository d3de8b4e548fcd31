"""How the library's log records reach a terminal through the CLI: a record at ERROR is a
``dynacoord: error:`` line (not ``warning:``), and ``outbox retry`` with unknown ids says so in
one error line, not also in the library's warning (issue 52 item 12)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dynacoord import DynamoDBBackend, Event
from dynacoord.provision import create_table
from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal, unique_name

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def explode(event: Event) -> None:
    raise RuntimeError(f"cannot handle {event.id}")


def test_an_error_record_is_an_error_line(dynamodb_local: DynamoDBLocal) -> None:
    client = dynamodb_local.client()
    table = unique_name("loglines")
    create_table(client, table)
    DynamoDBBackend(client, table_name=table).outbox.publish(Event("x", 1, id="boom1"))
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
    }
    result = subprocess.run(
        ["dynacoord", "--endpoint-url", dynamodb_local.endpoint_url, "--region",
         DUMMY_CREDENTIALS["region_name"], "--table", table, "outbox", "work", "--once",
         "--max-attempts", "1", "--handler", "tests.cli.test_library_log_lines:explode"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    # the worker logs the event it marked failed at ERROR: an error line, whatever its words
    assert any(line.startswith("dynacoord: error: ") and "boom1" in line for line in lines), (
        result.stderr
    )
    assert lines[-1].startswith("dynacoord: error: outbox work marked 1 event(s) failed")


def test_retry_of_unknown_ids_is_one_error_line(ddb_cli: Any, caplog: Any) -> None:
    backend, run = ddb_cli
    caplog.set_level(logging.WARNING, logger="dynacoord")
    code, _, err = run("outbox", "retry", "ID", "nope")
    assert code == 1
    assert err.splitlines() == ["dynacoord: error: retried 0; not found: ID, nope"]
    # the library's own warning about them is not sent as well (the CLI's line says it)
    assert not [r for r in caplog.records if "no such events" in r.getMessage()]
    # and the library still says it to a Python caller
    backend.outbox.retry_report(["ghost"])
    assert [r for r in caplog.records if "no such events" in r.getMessage()]
