"""``breaker status`` computes ``retry_after`` from a reset timeout the table does not store:
it shows the one it used and, when it was not given, says that it assumed 30 s (issue 52
item 12)."""

from __future__ import annotations

import json
from typing import Any


def test_status_names_the_reset_timeout_it_assumed(ddb_cli: Any) -> None:
    backend, run = ddb_cli
    backend.breaker("payments").trip()
    code, out, err = run("breaker", "status", "payments", json_output=True)
    assert code == 0, err
    status = json.loads(out)
    assert status["state"] == "open" and status["reset_timeout"] == 30.0
    (note,) = err.splitlines()
    assert note.startswith("dynacoord: note: retry_after assumes a reset timeout of 30 s")
    assert "--reset-timeout" in note

    code, out, err = run("breaker", "status", "payments", "--reset-timeout", "60")
    assert code == 0 and "reset_timeout: 60.0" in out and err == ""
