"""DynamoDB Local does not outlive the process that started it: a SIGTERM (how CI cancels a job)
to the starter stops Java too, a SIGKILL does as well on Linux (the child dies with its parent),
and a SIGTERM handler the program set before the server started stays in charge."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dynacoord.testing import find_dynamodb_local, find_java

ROOT = Path(__file__).resolve().parents[1]


needs_dynamodb_local = pytest.mark.skipif(
    (find_dynamodb_local() is None or find_java() is None)
    and os.environ.get("CI", "").lower() != "true",
    reason="DynamoDB Local (jar and Java) not available",
)

STARTER = """
import signal, sys, time
from dynacoord import testing
from dynacoord.testing import DynamoDBLocal

if sys.argv[1] == "handler":  # the SIGTERM handler, as where the kernel cannot help
    testing._DIE_WITH_PARENT = False
if sys.argv[1] == "own-handler":
    def on_term(signum, frame):
        print("own handler", flush=True)
        server.stop()
        sys.exit(7)
    signal.signal(signal.SIGTERM, on_term)
server = DynamoDBLocal(startup_timeout=30)
server.start()
print(server.pid, flush=True)
while True:
    time.sleep(0.05)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie counts as gone: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


def _run_starter(mode: str, sig: int) -> tuple[int, int, str]:
    """Start a script that starts DynamoDB Local, send it ``sig`` once the server answers; its
    exit code, the Java pid it printed and what else it printed. Java is killed here if it
    outlives the check (only that pid: other runs' servers are left alone)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT)
    script = subprocess.Popen(
        [sys.executable, "-c", STARTER, mode],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    java_pid = 0
    try:
        assert script.stdout is not None
        line = script.stdout.readline()
        assert line.strip().isdigit(), (line, script.stderr.read() if script.stderr else "")
        java_pid = int(line)
        assert _alive(java_pid)
        script.send_signal(sig)
        out, _err = script.communicate(timeout=15)
        gone = _gone_within(java_pid, 5)
        return script.returncode, java_pid if not gone else 0, out
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
        if java_pid and _alive(java_pid):
            os.kill(java_pid, signal.SIGKILL)


@needs_dynamodb_local
def test_sigterm_to_the_starting_process_stops_dynamodb_local() -> None:
    code, orphan, _out = _run_starter("default", signal.SIGTERM)
    assert orphan == 0, f"DynamoDB Local (pid {orphan}) outlived the SIGTERM of its starter"
    # The starter still ends as a SIGTERM ends it: the default action, re-raised.
    assert code == -signal.SIGTERM


@needs_dynamodb_local
def test_sigterm_handler_stops_dynamodb_local_then_ends_the_process() -> None:
    code, orphan, _out = _run_starter("handler", signal.SIGTERM)
    assert orphan == 0, f"DynamoDB Local (pid {orphan}) outlived the SIGTERM of its starter"
    assert code == -signal.SIGTERM


@needs_dynamodb_local
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_sigkill_to_the_starting_process_stops_dynamodb_local() -> None:
    code, orphan, _out = _run_starter("default", signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert orphan == 0, f"DynamoDB Local (pid {orphan}) outlived the SIGKILL of its starter"


@needs_dynamodb_local
def test_a_sigterm_handler_set_before_stays_in_charge() -> None:
    code, orphan, out = _run_starter("own-handler", signal.SIGTERM)
    assert "own handler" in out
    assert code == 7
    assert orphan == 0


def test_the_testing_page_says_a_sigterm_stops_it() -> None:
    assert "SIGTERM" in (ROOT / "docs" / "testing.md").read_text()
