"""A reader that stops early (``dynacoord stack template | head -1``) ends the command quietly:
no traceback, exit 0 (the reader took what it wanted)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynacoord.cli import main

BIN = Path(sys.executable).parent


class ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_is_a_quiet_exit_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["stack", "template"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "command",
    [
        "dynacoord stack template",
        "dynacoord iam-policy --table-arn arn:aws:dynamodb:eu-west-1:123456789012:table/t",
    ],
)
def test_a_reader_that_stops_early_gets_no_traceback(command: str) -> None:
    # the reader (true) is gone before the command writes: its write meets a closed pipe
    script = f"(sleep 0.5; exec {command}) | true; echo \"status=${{PIPESTATUS[0]}}\" >&2"
    result = subprocess.run(
        ["bash", "-c", script],
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == "status=0", result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr
    assert not any(line.startswith("dynacoord: error") for line in lines)
