"""The small mismatches between the CLI's help, its messages and the docs: each message says the
fix in the CLI's own terms, and help texts agree with the pages."""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord.cli import build_parser
from tests.cli_helpers import cli_tables, run_cli  # noqa: F401


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "--region", "us-east-1", *argv)


def _help(*path: str) -> str:
    parser: Any = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if hasattr(a, "choices") and a.choices)
        parser = sub.choices[name]
    return " ".join(str(parser.format_help()).split())


def test_help_texts_agree_with_the_pages() -> None:
    per_event = _help("outbox", "work")
    assert "fewer write units" not in per_event and "the same write units" in per_event
    no_index = _help("iam-policy")
    assert "README" not in no_index and "deployment.md" in no_index
    sha512 = _help("local", "fetch")
    assert "hex" in sha512 and "base64" in sha512


def test_a_lost_release_is_one_line(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, cli_tables: Any
) -> None:
    assert run(capsys, "lock", "acquire", "k", "--ttl", "30", "--owner", "a")[0] == 0
    caplog.clear()
    code, _, err = run(capsys, "lock", "release", "k", "--owner", "b", "--fence", "1")
    assert code == 1
    assert err == "dynacoord: error: lock 'k' is held by 'a', not by that owner\n"
    # no log line beside it (a terminal shows warnings through logging's last resort)
    assert [r.getMessage() for r in caplog.records if r.levelno >= 30] == []


def test_verify_of_a_missing_table_says_how_to_create_it(
    capsys: pytest.CaptureFixture[str], cli_tables: Any
) -> None:
    code, _, err = run(capsys, "--table", "absent", "table", "verify")
    assert code == 1 and err.count("\n") == 1
    assert "`dynacoord --table absent table create`" in err and "region us-east-1" in err


def test_verify_of_a_pk_sk_table_points_at_table_layout(
    capsys: pytest.CaptureFixture[str], cli_tables: Any
) -> None:
    code, _, err = run(capsys, "--table", "shop", "table", "verify")
    assert code == 1 and err.count("\n") == 1
    assert "--table-layout" in err


def test_checkpoints_show_of_a_task_suggests_latest(
    capsys: pytest.CaptureFixture[str], cli_tables: Any
) -> None:
    code, _, err = run(capsys, "checkpoints", "show", "t-1")
    assert code == 2 and err.count("\n") == 1
    assert "`dynacoord checkpoints show t-1 --latest`" in err


def test_a_refused_describe_table_names_the_permission_not_a_python_option(
    capsys: pytest.CaptureFixture[str], cli_tables: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.exceptions import ClientError

    from dynacoord._cli.common import Context

    built = Context.client

    def refusing_client(self: Context, service: str = "dynamodb") -> Any:
        client = built(self, service)

        def refuse(**kwargs: Any) -> None:
            raise ClientError(
                {"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}},
                "DescribeTable",
            )

        client.meta.events.register("before-call.dynamodb.DescribeTable", refuse)
        return client

    monkeypatch.setattr(Context, "client", refusing_client)
    # the table is checked before the first write (a read goes without it)
    code, _, err = run(capsys, "cache", "set", "k", "1")
    assert code == 1 and err.count("\n") == 1
    assert "verify=False" not in err
    assert "dynamodb:DescribeTable" in err and "iam-policy" in err
