"""The CLI's endpoints, digests, namespaces, messages and exit codes, and docs/cli.md's table of
messages and exit codes run command by command."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

import dynacoord
from dynacoord.cli import build_parser
from dynacoord.testing import DynamoDBLocal
from tests.cli.test_local import JAR_IN_PACKAGE, make_tarball, user_cache  # noqa: F401
from tests.cli_helpers import cli_tables, run_cli  # noqa: F401

ARN = "arn:aws:dynamodb:eu-west-1:123456789012:table/dynacoord"
CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


# --- DYNACOORD_ENDPOINT_URL is DynamoDB's only ----------------------------------------------------


def _context(argv: list[str]) -> Any:
    from dynacoord._cli.common import Context
    from dynacoord.cli import _resolve_globals

    args = build_parser().parse_args(argv)
    _resolve_globals(args)
    return Context(args)


def test_the_local_endpoint_variable_reaches_dynamodb_but_not_cloudformation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dynacoord._cli.provision import _aws_client

    monkeypatch.setenv("DYNACOORD_ENDPOINT_URL", "http://127.0.0.1:8000")
    ctx = _context(["--region", "us-east-1", "stack", "outputs"])
    assert ctx.client().meta.endpoint_url == "http://127.0.0.1:8000"
    assert ctx.client("dynamodbstreams").meta.endpoint_url == "http://127.0.0.1:8000"
    cfn = _aws_client(ctx, "cloudformation").meta.endpoint_url
    assert cfn == "https://cloudformation.us-east-1.amazonaws.com"
    # given on the command line, it is for every service (LocalStack, moto's server)
    ctx = _context(
        ["--region", "us-east-1", "--endpoint-url", "http://127.0.0.1:5000", "stack", "outputs"]
    )
    assert _aws_client(ctx, "cloudformation").meta.endpoint_url == "http://127.0.0.1:5000"
    assert _aws_client(ctx, "s3").meta.endpoint_url == "http://127.0.0.1:5000"


def test_local_start_prints_the_streams_endpoint_too() -> None:
    server = DynamoDBLocal(port=8123, jar_dir=Path("/nonexistent"))
    env = server.env()
    assert env["AWS_ENDPOINT_URL_DYNAMODB_STREAMS"] == "http://127.0.0.1:8123"
    assert env["AWS_ENDPOINT_URL_DYNAMODB"] == "http://127.0.0.1:8123"


# --- --sha512 in hex ------------------------------------------------------------------------------


def test_fetch_accepts_a_hex_sha512_and_refuses_a_malformed_one_before_downloading(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    user_cache: Path,
) -> None:
    tarball = make_tarball(tmp_path / "t.tgz", {JAR_IN_PACKAGE: b"good"})
    hexdigest = hashlib.sha512(tarball.read_bytes()).hexdigest()
    code, _, err = run_cli(capsys, "local", "fetch", "--url", str(tarball), "--sha512", hexdigest)
    assert code == 0, err
    assert (user_cache / JAR_IN_PACKAGE).read_bytes() == b"good"

    wrong = "0" * 128
    code, _, err = run_cli(
        capsys, "local", "fetch", "--url", str(tarball), "--sha512", wrong, "--force"
    )
    assert code == 1 and f"expected {wrong}" in err and hexdigest in err

    code, _, err = run_cli(
        capsys, "local", "fetch", "--url", str(tmp_path / "gone.tgz"), "--sha512", "abc"
    )
    assert code == 2 and "not a SHA-512 digest" in err and "128 hex digits" in err


# --- the global namespace scopes iam-policy -------------------------------------------------------


def _leading_keys(out: str) -> list[str]:
    statement = json.loads(out)["Statement"][0]
    return list(statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"])


def test_iam_policy_takes_the_global_namespace(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DYNACOORD_NAMESPACE", raising=False)
    code, out, err = run_cli(capsys, "--namespace", "billing", "iam-policy", "--table-arn", ARN)
    assert code == 0, err
    keys = _leading_keys(out)
    assert "LOCK#billing#*" in keys and all("#billing#" in k for k in keys)

    monkeypatch.setenv("DYNACOORD_NAMESPACE", "billing")
    code, out, _ = run_cli(capsys, "iam-policy", "--table-arn", ARN)
    assert all("#billing#" in k for k in _leading_keys(out))
    # the policy's own --namespace wins
    code, out, _ = run_cli(capsys, "iam-policy", "--table-arn", ARN, "--namespace", "jobs")
    assert all("#jobs#" in k for k in _leading_keys(out))

    monkeypatch.delenv("DYNACOORD_NAMESPACE")
    code, out, err = run_cli(capsys, "iam-policy", "--table-arn", ARN)
    assert "Condition" not in json.loads(out)["Statement"][0]
    assert "every namespace" in err


# --- exit codes and messages ----------------------------------------------------------------------


def test_json_version_prints_json_in_either_order(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--json", "--version"], ["--version", "--json"]):
        code, out, _ = run_cli(capsys, *argv)
        assert code == 0 and json.loads(out) == {"version": dynacoord.__version__}


def test_no_region_names_the_region_option(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_DYNAMODB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    code, _, err = run_cli(capsys, "table", "verify")
    assert code == 2
    assert err.startswith("dynacoord: error: no AWS region: pass --region") and err.count("\n") == 1


def test_ctrl_c_exits_130_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dynacoord._cli.provision as provision_cli

    def interrupted(ctx: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(provision_cli, "_stack_template", interrupted)
    code, _, err = run_cli(capsys, "stack", "template")
    assert (code, err) == (130, "dynacoord: error: interrupted\n")


def _documented_rows() -> list[tuple[str, int, str, str]]:
    """(command, exit code, start of stderr, start of stdout) of the table under "Messages and
    exit codes" in docs/cli.md."""
    text = CLI_DOC.read_text(encoding="utf-8")
    section = text.split("## Messages and exit codes", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`dynacoord"):
            continue
        command, code, err, out = (re.sub(r"^`|`$", "", c).replace("\\|", "|") for c in cells)
        rows.append((command, int(code), err, out))
    return rows


def test_the_documented_table_is_there() -> None:
    rows = _documented_rows()
    assert len(rows) >= 15
    assert {code for _, code, _, _ in rows} == {0, 1, 2}


@pytest.mark.parametrize(
    ("command", "code", "err", "out"), _documented_rows(), ids=lambda v: str(v)[:60]
)
def test_each_documented_message_and_exit_code(
    capsys: pytest.CaptureFixture[str],
    cli_tables: Any,
    command: str,
    code: int,
    err: str,
    out: str,
) -> None:
    argv = shlex.split(command)
    assert argv[0] == "dynacoord"
    got_code, got_out, got_err = run_cli(capsys, "--region", "us-east-1", *argv[1:])
    assert got_code == code, got_err
    if err:
        assert got_err.startswith(err), got_err
    if code != 0:
        assert got_err.count("\n") == 1, got_err  # one line
        assert got_err.startswith("dynacoord: error: ")  # one prefix
    if out:
        assert got_out.startswith(out), got_out
