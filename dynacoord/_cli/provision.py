"""``dynacoord table create|verify|delete``, ``dynacoord stack
deploy|package|delete|outputs|status|template`` and ``dynacoord iam-policy``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import BackendError, ConfigurationError, TableNotReadyError
from .common import CommandFailed, Context, UsageError, add_command, emit


def register(subparsers: Any) -> None:
    _register_table(subparsers)
    _register_stack(subparsers)
    policy = add_command(
        subparsers,
        "iam-policy",
        _iam_policy,
        "print a least-privilege IAM policy (JSON) for code that uses the table",
    )
    policy.add_argument("--table-arn", required=True, help="ARN of the dynacoord table")
    policy.add_argument(
        "--namespace",
        dest="policy_namespaces",
        action="append",
        metavar="NS",
        help="restrict items to this namespace (repeat for several; default: the global "
        "--namespace or DYNACOORD_NAMESPACE if given, else every namespace)",
    )
    policy.add_argument(
        "--no-index",
        action="store_true",
        help="do not grant Query on gsi1 (docs/deployment.md, 'The IAM policy': LeadingKeys and "
        "indexes)",
    )


def _register_table(subparsers: Any) -> None:
    group = subparsers.add_parser(
        "table", help="create, verify or delete the table directly (no CloudFormation)"
    )
    sub = group.add_subparsers(dest="table_command", required=True, metavar="COMMAND")

    create = add_command(
        sub,
        "create",
        _table_create,
        "create the table if missing, wait until ACTIVE, enable TTL, then verify it (idempotent)",
    )
    create.add_argument(
        "--billing-mode", choices=("PAY_PER_REQUEST", "PROVISIONED"), default="PAY_PER_REQUEST"
    )
    create.add_argument(
        "--read-capacity", type=_positive_int, default=None, help="PROVISIONED only (default 5)"
    )
    create.add_argument(
        "--write-capacity", type=_positive_int, default=None, help="PROVISIONED only (default 5)"
    )
    create.add_argument("--deletion-protection", action="store_true")
    create.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for ACTIVE")

    add_command(sub, "verify", _table_verify, "check the table's schema, index, TTL and status")

    delete = add_command(sub, "delete", _table_delete, "delete the table and all its items")
    delete.add_argument("--yes", action="store_true", help="required: confirm the deletion")
    delete.add_argument(
        "--missing-ok", action="store_true", help="succeed when the table does not exist"
    )
    delete.add_argument("--no-wait", action="store_true", help="do not wait until it is gone")
    delete.add_argument(
        "--disable-deletion-protection",
        action="store_true",
        help="turn deletion protection off first (a table kept by `stack delete` has it on)",
    )


def _register_stack(subparsers: Any) -> None:
    group = subparsers.add_parser("stack", help="deploy the bundled CloudFormation stack")
    sub = group.add_subparsers(dest="stack_command", required=True, metavar="COMMAND")

    deploy = add_command(
        sub, "deploy", _stack_deploy, "create or update the stack and wait until it settles"
    )
    _stack_name_option(deploy)
    deploy.add_argument(
        "--parameter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="template parameter (repeat), e.g. TableName=orders-coord, Namespaces=a,b, "
        "EncryptionKey=create, AlarmTopic=create (`dynacoord stack template` lists them all)",
    )
    deploy.add_argument(
        "--relay",
        metavar="MODULE:HANDLERS",
        help="deliver the outbox serverlessly with these handlers: package them with dynacoord, "
        "upload the bundle to --code-bucket and turn on the stream relay and the sweeper for "
        "the --namespace",
    )
    _bundle_options(deploy)
    deploy.add_argument("--no-wait", action="store_true", help="return once the change started")
    deploy.add_argument(
        "--poll-interval", type=float, default=5.0, help="seconds between status checks"
    )

    package = add_command(
        sub,
        "package",
        _stack_package,
        "build the code bundle of the relay and the sweeper (dynacoord + your handlers module); "
        "write it (--output) and/or upload it (--code-bucket)",
    )
    package.add_argument("handlers", metavar="MODULE:HANDLERS", help="your handlers")
    package.add_argument("--output", metavar="FILE", help="write the zip here")
    _bundle_options(package)

    delete = add_command(
        sub,
        "delete",
        _stack_delete,
        "delete the stack; it keeps the table, a key it made, the relay's dead-letter queue and "
        "log groups, and prints each with the command that removes it",
    )
    _stack_name_option(delete)
    delete.add_argument("--yes", action="store_true", help="required: confirm the deletion")
    delete.add_argument("--no-wait", action="store_true", help="return once the deletion started")
    delete.add_argument(
        "--poll-interval", type=float, default=5.0, help="seconds between status checks"
    )

    outputs = add_command(sub, "outputs", _stack_outputs, "print the stack's outputs")
    _stack_name_option(outputs)

    status = add_command(
        sub,
        "status",
        _stack_status,
        "print the stack's status, outputs and alarms with their state and what to run; exit 1 "
        "when an alarm is in ALARM",
    )
    _stack_name_option(status)

    add_command(sub, "template", _stack_template, "print the bundled CloudFormation template")


def _stack_name_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack-name", default="dynacoord", help="default: dynacoord")


def _bundle_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--code-bucket", metavar="BUCKET", help="S3 bucket for the code bundle")
    parser.add_argument(
        "--code-prefix", default="dynacoord/", metavar="PREFIX", help="S3 key prefix (dynacoord/)"
    )
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATH",
        help="also bundle this file or folder (repeat), e.g. modules your handlers import",
    )
    parser.add_argument(
        "--reconcile",
        metavar="MODULE:FUNCTION",
        help="a callback for stalled workflow runs; the sweeper then also reconciles runs",
    )
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="do not import the handlers here before bundling them",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


# --- table -------------------------------------------------------------------------------------


def _layout(ctx: Context) -> Any:
    """The layout of ``--table-layout`` or ``DYNACOORD_TABLE_LAYOUT``; a bad one is a usage
    error naming where it came from."""
    try:
        return ctx.layout()
    except ConfigurationError as exc:
        where = "--table-layout" if ctx.args.table_layout else "DYNACOORD_TABLE_LAYOUT"
        raise UsageError(f"{where}: {exc}") from exc


#: the TTL finding's advice, which is no advice on a table whose keys do not fit
_TTL_ADVICE = "; ensure_table or `dynacoord table create` enables it"


def _fail_with_problems(ctx: Context, table: str, problems: list[str]) -> None:
    """Print the report on stdout and fail with one summary line (exit 1) that ends with the fix
    when there is one to run."""
    wrong_keys = any(p.startswith("table key schema is") for p in problems)
    if wrong_keys:  # `table create` leaves such a table alone: it enables no TTL there
        problems = [p.replace(_TTL_ADVICE, "") for p in problems]
    emit(ctx, {"table": table, "ok": False, "problems": problems} if ctx.json else problems)
    fix = ""
    if problems == [f"table {table!r} does not exist"]:
        region = ctx.client().meta.region_name
        fix = (
            f": create it with `dynacoord --table {table} table create` (or deploy the stack), "
            f"or fix the table name or region (region {region})"
        )
    elif wrong_keys:
        fix = _key_schema_hint(ctx, table)
    raise TableNotReadyError(
        f"table {table!r} is not usable: {len(problems)} problem(s): " + "; ".join(problems) + fix,
        table_name=table,
    )


def _key_schema_hint(ctx: Context, table: str) -> str:
    """What can help a table whose keys are not the layout's: its own key names as a layout
    when it has two string keys (one more DescribeTable), else a table of dynacoord's own (a
    table's keys cannot change, and dynacoord needs a string partition and sort key)."""
    from .._table_schema import TableLayout

    described = ctx.client().describe_table(TableName=table)["Table"]
    keys = {k["KeyType"]: str(k["AttributeName"]) for k in described.get("KeySchema", [])}
    types = {
        str(d["AttributeName"]): d["AttributeType"]
        for d in described.get("AttributeDefinitions", [])
    }
    pk, sk = keys.get("HASH"), keys.get("RANGE")
    if pk and sk and types.get(pk) == types.get(sk) == "S":
        changes = {"pk": pk, "sk": sk}
        for index in described.get("GlobalSecondaryIndexes", []):
            # an index of two string keys: the application's GSI1, which dynacoord can share
            on = {k["KeyType"]: str(k["AttributeName"]) for k in index.get("KeySchema", [])}
            ipk, isk = on.get("HASH"), on.get("RANGE")
            if ipk and isk and types.get(ipk) == types.get(isk) == "S":
                changes.update(index=str(index["IndexName"]), index_pk=ipk, index_sk=isk)
                break
        try:
            fitted: TableLayout = _layout(ctx).replace(**changes)
        except (UsageError, ValueError) as exc:
            return (
                f". Its keys cannot be dynacoord's: {exc}. Give dynacoord a table of its own, "
                "beside this one: `dynacoord --table NEW table create` (or the stack)"
            )
        return (
            f". If it is your application's table, give dynacoord its key names: "
            f"--table-layout '{fitted.to_json()}' (or DYNACOORD_TABLE_LAYOUT; `table create` "
            "then adds the index and TTL that are missing)"
        )
    shape = f"{pk} ({types.get(pk or '', '?')})" + (
        f" + {sk} ({types.get(sk, '?')})" if sk else " alone"
    )
    return (
        f". Its keys ({shape}) cannot change and no --table-layout fits them: dynacoord needs a "
        "string partition key and a string sort key. Give dynacoord a table of its own, beside "
        "this one: `dynacoord --table NEW table create` (or the stack)"
    )


def _table_create(ctx: Context) -> Any:
    from ..provision import ensure_table, is_warning, verify_table

    capacities = (ctx.args.read_capacity, ctx.args.write_capacity)
    if ctx.args.billing_mode != "PROVISIONED" and capacities != (None, None):
        # Silently ignored otherwise: an on-demand table has no capacity to set.
        raise UsageError(
            "--read-capacity/--write-capacity apply to --billing-mode PROVISIONED only "
            f"(this table would be {ctx.args.billing_mode})"
        )
    layout = _layout(ctx)
    client = ctx.client()
    refused: TableNotReadyError | None = None
    try:
        created = ensure_table(
            client,
            ctx.table_name,
            progress=ctx.progress,
            timeout=ctx.args.timeout,
            billing_mode=ctx.args.billing_mode,
            read_capacity=ctx.args.read_capacity or 5,
            write_capacity=ctx.args.write_capacity or 5,
            deletion_protection=ctx.args.deletion_protection,
            layout=layout,
        )
    except ConfigurationError:
        # an existing table with another key schema, left as it is: a table with problems
        # (exit 1, as `table verify`), not a usage error
        created = False
    except TableNotReadyError as exc:
        # TTL on the application's own attribute (ensure_table never takes it over): usable,
        # with a note, as `table verify` says; anything else is raised below
        created, refused = False, exc
    found = verify_table(client, ctx.table_name, layout=layout)
    problems = [p for p in found if not is_warning(p)]
    warnings = [p for p in found if is_warning(p)]
    if problems:  # an existing table with another schema: ensure_table does not alter it
        _fail_with_problems(ctx, ctx.table_name, problems + warnings)
    if refused is not None and not warnings:
        raise refused
    for warning in warnings:
        print(f"dynacoord: warning: {warning}", file=sys.stderr)
    ctx.progress(f"table {ctx.table_name} is ready" + ("" if created else " (it already existed)"))
    result: dict[str, Any] = {"table": ctx.table_name, "created": created, "ok": True}
    if warnings:
        result["warnings"] = warnings
    return result


def _table_verify(ctx: Context) -> Any:
    from ..provision import is_warning, verify_table

    client = ctx.client()
    found = verify_table(client, ctx.table_name, layout=_layout(ctx))
    problems = [p for p in found if not is_warning(p)]
    warnings = [p for p in found if is_warning(p)]
    if problems:
        _fail_with_problems(ctx, ctx.table_name, problems + warnings)
    for warning in warnings:  # usable (exit 0), but say what it lacks
        print(f"dynacoord: warning: {warning}", file=sys.stderr)
    result: dict[str, Any] = {
        "table": ctx.table_name,
        "ok": True,
        "problems": [],
        "warnings": warnings,
    }
    replicated = _global_table(client, ctx.table_name)
    if replicated is not None:
        result["global_table"] = replicated
    return result


def _global_table(client: Any, table_name: str) -> dict[str, Any] | None:
    """A global table's mode, with a note on stderr of what dynacoord does there (None: the
    table has no replica in another Region). One more DescribeTable: ``verify_table`` keeps its
    answer to itself."""
    from ..backends.dynamodb._global_tables import global_table_of, what_works

    table = client.describe_table(TableName=table_name)["Table"]
    replicated = global_table_of(table, client.meta.region_name)
    if replicated is None:
        return None
    print(f"dynacoord: note: table {table_name!r} is {what_works(replicated)}", file=sys.stderr)
    return {
        "consistency": replicated.consistency,
        "regions": list(replicated.regions),
        "witnesses": list(replicated.witnesses),
    }


def _table_delete(ctx: Context) -> Any:
    from ..provision import delete_table

    if not ctx.args.yes:
        raise UsageError(f"table delete removes {ctx.table_name!r} and every item: add --yes")
    deleted = delete_table(
        ctx.client(),
        ctx.table_name,
        wait=not ctx.args.no_wait,
        progress=ctx.progress,
        disable_deletion_protection=ctx.args.disable_deletion_protection,
    )
    if not deleted and not ctx.args.missing_ok:
        raise BackendError(
            f"table {ctx.table_name!r} does not exist (use --missing-ok to accept that)",
            code="ResourceNotFoundException",
        )
    return {"table": ctx.table_name, "deleted": deleted}


# --- stack -------------------------------------------------------------------------------------


def _parse_parameters(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--parameter must be KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _aws_client(ctx: Context, service: str) -> Any:
    """A client for the stack commands: ``--endpoint-url`` given on the command line is used
    for every service they call (an emulator such as LocalStack or moto's server serves them
    all on one endpoint); ``DYNACOORD_ENDPOINT_URL`` is not (it is DynamoDB's: ``dynacoord
    local start`` prints it for DynamoDB Local, which serves no CloudFormation). Without it
    boto3 reads ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_<SERVICE>``."""
    import boto3
    from botocore.config import Config

    factory: Any = boto3.client  # the service name is a variable: no typed overload applies
    return factory(
        service,
        region_name=ctx.args.region or None,
        endpoint_url=getattr(ctx.args, "aws_endpoint_url", None) or None,
        config=Config(retries={"max_attempts": 8, "mode": "adaptive"}),
    )


def _bundle(ctx: Context, handlers: str, settings: str | None = None) -> Any:
    from ..provision import package_relay

    # Like `python -m` (and `outbox work --handler`): modules in the current directory import.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    # The check imports the handlers as the functions will: with the HandlerSettings they get.
    previous = os.environ.get("DYNACOORD_HANDLER_SETTINGS")
    if settings is not None:
        os.environ["DYNACOORD_HANDLER_SETTINGS"] = settings
    try:
        bundle = package_relay(
            handlers,
            include=ctx.args.include,
            reconcile=ctx.args.reconcile,
            check=not ctx.args.no_check,
        )
    finally:
        if settings is not None:
            if previous is None:
                os.environ.pop("DYNACOORD_HANDLER_SETTINGS", None)
            else:
                os.environ["DYNACOORD_HANDLER_SETTINGS"] = previous
    ctx.progress(f"bundled {len(bundle.files)} files ({len(bundle.data)} bytes) for {handlers}")
    return bundle


def _upload(ctx: Context, bundle: Any) -> tuple[str, str]:
    from ..provision import upload_bundle

    bucket = ctx.args.code_bucket
    key = upload_bundle(_aws_client(ctx, "s3"), bundle, bucket, prefix=ctx.args.code_prefix)
    ctx.progress(f"code bundle at s3://{bucket}/{key}")
    return bucket, key


def _stack_package(ctx: Context) -> Any:
    if not ctx.args.output and not ctx.args.code_bucket:
        raise UsageError("stack package needs --output FILE and/or --code-bucket BUCKET")
    bundle = _bundle(ctx, ctx.args.handlers)
    result: dict[str, Any] = {
        "sha256": bundle.sha256,
        "size": len(bundle.data),
        "files": len(bundle.files),
    }
    if ctx.args.output:
        Path(ctx.args.output).write_bytes(bundle.data)
        result["output"] = ctx.args.output
    if ctx.args.code_bucket:
        bucket, key = _upload(ctx, bundle)
        result["parameters"] = {"CodeS3Bucket": bucket, "CodeS3Key": key}
    return result


def _stack_deploy(ctx: Context) -> Any:
    from ..provision import deploy_stack

    parameters: dict[str, Any] = _parse_parameters(ctx.args.parameter)
    relay = ctx.args.relay
    if relay is None and (ctx.args.code_bucket or ctx.args.include or ctx.args.reconcile):
        raise UsageError("--code-bucket, --include and --reconcile go with --relay")
    if relay is not None:
        clash = sorted(
            {"Relay", "RelayHandlers", "CodeS3Bucket", "CodeS3Key", "ReconcileHandler"}
            & set(parameters)
        )
        if clash:
            raise UsageError(f"--relay sets {', '.join(clash)}: do not also pass them")
        if not ctx.args.code_bucket:
            raise UsageError(
                "--relay needs --code-bucket BUCKET (an S3 bucket in the stack's region for "
                "the code bundle)"
            )
        from ..provision import check_stack_parameters

        current = _stack_now(ctx)
        # every value checked before the bundle is built and uploaded
        check_stack_parameters(
            {
                **parameters,
                "Relay": "true",
                "RelayHandlers": relay,
                "CodeS3Bucket": ctx.args.code_bucket,
                "CodeS3Key": "dynacoord/bundle.zip",
                "ReconcileHandler": ctx.args.reconcile or "",
                "RelayNamespace": parameters.get("RelayNamespace", ctx.args.namespace),
            },
            previous=current,
        )
        settings = parameters.get("HandlerSettings")
        if settings is None:  # an update keeps the stack's settings: check with those
            settings = (current or {}).get("HandlerSettings")
        bucket, key = _upload(ctx, _bundle(ctx, relay, settings))
        parameters.update(Relay="true", RelayHandlers=relay, CodeS3Bucket=bucket, CodeS3Key=key)
        parameters["ReconcileHandler"] = ctx.args.reconcile or ""
        parameters.setdefault("RelayNamespace", ctx.args.namespace)
    _refuse_an_existing_table(ctx, str(parameters.get("TableName") or ""), _stack_now(ctx))
    # a layout given (option or environment) sets the table parameters; none keeps the stack's
    given_layout = ctx.args.table_layout or os.environ.get("DYNACOORD_TABLE_LAYOUT")
    result = deploy_stack(
        _aws_client(ctx, "cloudformation"),
        ctx.args.stack_name,
        parameters=parameters,
        wait=not ctx.args.no_wait,
        progress=ctx.progress,
        poll_interval=ctx.args.poll_interval,
        layout=_layout(ctx) if given_layout else None,
    )
    return {
        "stack": result.stack_name,
        "stack_id": result.stack_id,
        "status": result.status,
        "changed": result.changed,
        "outputs": result.outputs,
    }


def _stack_now(ctx: Context) -> dict[str, str] | None:
    """The stack's parameters (None: it does not exist), read once per command."""
    from ..provision import stack_parameters

    if not hasattr(ctx.args, "_stack_now"):
        cfn = _aws_client(ctx, "cloudformation")
        ctx.args._stack_now = stack_parameters(cfn, ctx.args.stack_name)
    found: dict[str, str] | None = ctx.args._stack_now
    return found


def _refuse_an_existing_table(ctx: Context, table: str, current: dict[str, str] | None) -> None:
    """A deploy that would make the stack create table ``table`` while a table of that name
    exists (the one an earlier ``stack delete`` kept, DeletionPolicy Retain) fails in
    CloudFormation after minutes of rollback (and through an emulator as an unreadable answer):
    say what to do instead, before anything is sent. One DescribeTable; a check that cannot be
    made (no permission) leaves it to CloudFormation."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ..errors import StackDeploymentError

    if not table or (current is not None and current.get("TableName") == table):
        return  # a generated name, or the stack's own table
    try:
        _aws_client(ctx, "dynamodb").describe_table(TableName=table)
    except (ClientError, BotoCoreError):
        return  # not found (the usual case), or not ours to know
    raise StackDeploymentError(
        f"table {table!r} already exists (kept by an earlier `stack delete`?) and a stack cannot "
        "create a table that exists: deploy with another name (--parameter TableName=NEW), "
        "import the table into the stack (docs/deployment.md#after-stack-delete), or delete it "
        f"and every item: `dynacoord --table {table} table delete --yes "
        "--disable-deletion-protection`; nothing was sent to CloudFormation",
        stack_name=ctx.args.stack_name,
        events=[],
    )


def _stack_delete(ctx: Context) -> Any:
    from ..errors import StackDeploymentError
    from ..provision import delete_stack, retained_resources

    if not ctx.args.yes:
        raise UsageError(
            f"stack delete removes stack {ctx.args.stack_name!r} (its table, key, dead-letter "
            "queue and log groups are kept): add --yes"
        )
    cfn = _aws_client(ctx, "cloudformation")
    kept = retained_resources(cfn, ctx.args.stack_name)
    deleted = delete_stack(
        cfn,
        ctx.args.stack_name,
        wait=not ctx.args.no_wait,
        progress=ctx.progress,
        poll_interval=ctx.args.poll_interval,
    )
    if not deleted:
        raise StackDeploymentError(
            f"stack {ctx.args.stack_name} does not exist",
            stack_name=ctx.args.stack_name,
            events=[],
        )
    for resource in kept:
        ctx.progress(
            f"kept {resource.logical_id} ({resource.resource_type}) {resource.physical_id}: "
            f"remove it with `{resource.remove_with}`"
        )
    return {
        "stack": ctx.args.stack_name,
        "deleted": True,
        "kept": [
            {
                "logical_id": r.logical_id,
                "type": r.resource_type,
                "physical_id": r.physical_id,
                "remove_with": r.remove_with,
            }
            for r in kept
        ],
    }


def _stack_outputs(ctx: Context) -> Any:
    from ..provision import stack_outputs

    return stack_outputs(_aws_client(ctx, "cloudformation"), ctx.args.stack_name)


def _stack_status(ctx: Context) -> Any:
    from ..provision import stack_status

    found = stack_status(
        _aws_client(ctx, "cloudformation"), _aws_client(ctx, "cloudwatch"), ctx.args.stack_name
    )
    alarms = [
        {
            "alarm": a.logical_id,
            "name": a.name,
            "state": a.state,
            "reason": a.reason,
            "updated": a.updated,
            "runbook": a.runbook,
        }
        for a in found.alarms
    ]
    result: dict[str, Any] = {
        "stack": found.stack_name,
        "status": found.status,
        "outputs": found.outputs,
        "alarms": alarms,
    }
    if found.status_reason:
        result["status_reason"] = found.status_reason
    lines = [f"stack: {found.stack_name} {found.status}"]
    lines += [f"output {key}: {value}" for key, value in found.outputs.items()]
    for a in found.alarms:
        lines.append(f"alarm {a.logical_id}: {a.state} ({a.name})")
        if a.state == "ALARM":
            lines += [f"  reason: {a.reason}"] if a.reason else []
            lines.append(f"  runbook: {a.runbook}")
        elif a.state == "INSUFFICIENT_DATA":
            # a new stack's alarms start here, and a metric nothing wrote yet stays here: its
            # alarm's runbook line would describe a condition that has not happened
            lines.append(
                "  no data yet: the alarm has no metric data to judge (a new stack, or nothing "
                "measured yet); its runbook applies only once it is in ALARM"
            )
        elif a.state == "MISSING":
            lines.append("  not found in CloudWatch (deleted by hand, or the emulator made none)")
    if not found.alarms:
        lines.append("alarms: none (Alarms=false, or an emulator that makes no alarms)")
    output: Any = result if ctx.json else "\n".join(lines)
    if found.alarming:
        names = ", ".join(a.logical_id for a in found.alarming)
        raise CommandFailed(
            f"stack {found.stack_name}: {len(found.alarming)} alarm(s) in ALARM: {names} (the "
            "runbook lines above say what to run; docs/deployment.md#runbook)",
            result=output,
        )
    return output


def _stack_template(ctx: Context) -> Any:
    from ..provision import template_body

    body = template_body()
    return {"template": body} if ctx.json else body.rstrip("\n")


# --- iam-policy --------------------------------------------------------------------------------


def _iam_policy(ctx: Context) -> Any:
    from ..provision import iam_policy

    namespaces = ctx.args.policy_namespaces
    if namespaces is None and getattr(ctx.args, "namespace_given", False):
        # `dynacoord --namespace billing iam-policy` (or DYNACOORD_NAMESPACE=billing) means
        # billing's policy: printing one for every namespace would widen access silently.
        namespaces = [ctx.args.namespace]
    policy = iam_policy(
        ctx.args.table_arn,
        namespaces,
        include_index=not ctx.args.no_index,
        layout=_layout(ctx),
    )
    if namespaces is None:
        ctx.progress("iam-policy: every namespace (give --namespace NS to narrow it)")
    # A policy is a JSON document either way; --json just keeps the common output format.
    return policy if ctx.json else json.dumps(policy, indent=2)
