"""A warning the library logs while a command runs (a table whose TTL never sweeps dynacoord's
items) reaches a terminal as one ``dynacoord: warning: ...`` line on stderr, when the process has
no logging of its own (a real ``dynacoord`` process, DynamoDB Local)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dynacoord.provision import table_definition
from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal, unique_name

BIN = Path(sys.executable).parent


def test_a_ttl_warning_is_one_prefixed_line(dynamodb_local: DynamoDBLocal) -> None:
    client = dynamodb_local.client()
    table = unique_name("nottl")
    client.create_table(**table_definition(table))  # no TTL: create_table would turn it on
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
    }
    result = subprocess.run(
        ["dynacoord", "--endpoint-url", dynamodb_local.endpoint_url, "--region",
         DUMMY_CREDENTIALS["region_name"], "--table", table, "counters", "incr", "k"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"dynacoord: warning: DynamoDB table {table!r}")
    assert "TTL is DISABLED" in lines[0]
