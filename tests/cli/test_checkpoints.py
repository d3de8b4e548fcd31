"""``dynacoord checkpoints list|show|cleanup|delete`` against Amazon DynamoDB Local."""

from __future__ import annotations

import json

import pytest


@pytest.fixture()
def cli(ddb_cli):
    backend, run = ddb_cli

    def run_checkpoints(*argv, json_output=True):
        return run("checkpoints", *argv, json_output=json_output, quiet=True)

    return backend, run_checkpoints


def test_list_show_cleanup_delete(cli):
    backend, run = cli
    for i in range(1, 6):
        backend.checkpoints.save("job@2024", {"offset": i * 10}, progress=i * 20)

    code, out, _ = run("list", "job@2024")
    assert code == 0
    rows = json.loads(out)
    assert [r["sequence"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0]["id"] == "job@2024@1" and rows[4]["progress"] == 100.0
    assert "data" not in rows[0]

    code, out, _ = run("list", "job@2024", "--limit", "2", "--data")
    assert [r["data"] for r in json.loads(out)] == [{"offset": 10}, {"offset": 20}]

    code, out, _ = run("show", "job@2024@3")
    assert code == 0
    shown = json.loads(out)
    assert shown["sequence"] == 3 and shown["data"] == {"offset": 30}

    code, out, _ = run("show", "job@2024", "--latest")
    assert json.loads(out)["sequence"] == 5

    code, out, _ = run("cleanup", "job@2024", "--keep", "2")
    assert code == 0 and json.loads(out)["deleted"] == 3
    assert [c.sequence for c in backend.checkpoints.list("job@2024")] == [4, 5]

    code, out, _ = run("delete", "job@2024", "--yes")
    assert code == 0 and json.loads(out)["deleted"] == 2
    assert backend.checkpoints.list("job@2024") == []


def test_plain_output(cli):
    backend, run = cli
    backend.checkpoints.save("plain", {"a": 1}, progress=12.5)
    code, out, _ = run("list", "plain", json_output=False)
    assert code == 0
    assert out.startswith("plain@1\tprogress=12.5\tcreated_at=")
    code, out, _ = run("show", "plain@1", json_output=False)
    assert "sequence: 1" in out and 'data: {"a": 1}' in out


def test_errors_and_exit_codes(cli):
    _, run = cli
    code, _, err = run("show", "missing@1")
    assert code == 1 and "not found" in err
    code, _, err = run("show", "no-sequence")
    assert code == 2 and "not a checkpoint id" in err
    code, _, err = run("show", "nothing", "--latest")
    assert code == 1 and "no checkpoints" in err
    code, _, err = run("cleanup", "t", "--keep", "-1")
    assert code == 2
    code, _, _ = run("cleanup", "t")  # --keep is required
    assert code == 2
    code, out, _ = run("list", "empty")
    assert code == 0 and json.loads(out) == []


def test_checkpoints_delete_needs_yes_like_every_destructive_command(ddb_cli):
    backend, run = ddb_cli
    backend.checkpoints.save("task-y", {"a": 1})
    code, _, err = run("checkpoints", "delete", "task-y")
    assert code != 0 and "--yes" in err
    assert backend.checkpoints.load_latest("task-y") is not None  # nothing deleted
    code, _, _ = run("checkpoints", "delete", "task-y", "--yes")
    assert code == 0
    assert backend.checkpoints.load_latest("task-y") is None


def test_version_flag_prints_the_version(capsys):
    import dynacoord
    from dynacoord.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"dynacoord {dynacoord.__version__}"
