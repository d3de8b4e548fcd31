"""Create, check and deploy the dynacoord table (directly or with the bundled CloudFormation stack).

Two ways to get the table of DESIGN.md section 2:

* :func:`ensure_table` / :func:`create_table` call DynamoDB directly (scripts, tests, DynamoDB
  Local). :func:`verify_table` checks any existing table and lists what is wrong with it.
* :func:`deploy_stack` creates or updates the bundled CloudFormation stack
  (:func:`template_body`), which also carries point-in-time recovery, encryption, deletion
  protection and a least-privilege managed IAM policy. :func:`iam_policy` builds the same policy
  as JSON for roles managed elsewhere, optionally narrowed to some namespaces.

Functions that wait take a ``progress`` callback that gets one human-readable line per wait step
(the CLI prints them on stderr); they also log at DEBUG level.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._table_schema import (
    GSI_NAME,
    TTL_ATTRIBUTE,
    forget_verified,
    key_schema_problems,
    mark_verified,
    schema_problems,
)
from .errors import BackendError, ConfigurationError, StackDeploymentError, TableNotReadyError
from .keys import Kind, validate_namespace

__all__ = [
    "GSI_NAME",
    "INDEX_ACTIONS",
    "ITEM_ACTIONS",
    "METADATA_ACTIONS",
    "STACK_PARAMETERS",
    "TTL_ATTRIBUTE",
    "RelayBundle",
    "StackDeployment",
    "StackParameterValue",
    "check_stack_parameters",
    "check_stack_rules",
    "create_table",
    "delete_stack",
    "delete_table",
    "deploy_stack",
    "ensure_table",
    "iam_policy",
    "is_warning",
    "package_relay",
    "stack_outputs",
    "stack_parameters",
    "table_definition",
    "template_body",
    "template_path",
    "upload_bundle",
    "verify_table",
]

logger = logging.getLogger(__name__)


Progress = Callable[[str], None]


def _noop(_: str) -> None:
    return None


def table_definition(
    table_name: str,
    *,
    billing_mode: str = "PAY_PER_REQUEST",
    read_capacity: int = 5,
    write_capacity: int = 5,
    deletion_protection: bool = False,
) -> dict[str, Any]:
    """The ``CreateTable`` request for the dynacoord table (same schema as the bundled template)."""
    if billing_mode not in ("PAY_PER_REQUEST", "PROVISIONED"):
        raise ValueError(
            f"billing_mode must be PAY_PER_REQUEST or PROVISIONED, got {billing_mode!r}"
        )
    gsi: dict[str, Any] = {
        "IndexName": GSI_NAME,
        "KeySchema": [
            {"AttributeName": "gsi1pk", "KeyType": "HASH"},
            {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "ALL"},
    }
    request: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": "S"}
            for name in ("pk", "sk", "gsi1pk", "gsi1sk")
        ],
        "KeySchema": [
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [gsi],
        "BillingMode": billing_mode,
        "DeletionProtectionEnabled": deletion_protection,
    }
    if billing_mode == "PROVISIONED":
        throughput = {"ReadCapacityUnits": read_capacity, "WriteCapacityUnits": write_capacity}
        request["ProvisionedThroughput"] = throughput
        gsi["ProvisionedThroughput"] = dict(throughput)
    return request


def create_table(
    client: Any,
    table_name: str,
    *,
    wait: bool = True,
    progress: Progress = _noop,
    **options: Any,
) -> None:
    """Create the table and enable TTL on ``ttl``. Fails if the table exists (see ensure_table)."""
    from botocore.exceptions import ClientError

    try:
        client.create_table(**table_definition(table_name, **options))
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        raise BackendError(f"cannot create table {table_name!r}: {exc}", code=code) from exc
    progress(f"creating table {table_name} ...")
    mark_verified(client, table_name)  # made here as dynacoord needs it: no check on first use
    if wait:
        _wait_active(client, table_name, progress)
    _enable_ttl(client, table_name, progress)


def ensure_table(
    client: Any,
    table_name: str,
    *,
    progress: Progress = _noop,
    timeout: float = 300.0,
    **options: Any,
) -> bool:
    """Make sure the table exists, has the index ``gsi1``, is ACTIVE and has TTL on ``ttl``.

    Idempotent; creates only what is missing and never alters what exists with another shape
    (:func:`verify_table` reports that). True if the table was created.
    """
    from botocore.exceptions import ClientError

    created = False
    try:
        client.describe_table(TableName=table_name)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
            raise BackendError(f"cannot describe table {table_name!r}: {exc}") from exc
        try:
            client.create_table(**table_definition(table_name, **options))
            created = True
            mark_verified(client, table_name)
            progress(f"creating table {table_name} ...")
        except ClientError as create_exc:
            # Another process may have created it between our describe and create.
            if create_exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
                raise BackendError(
                    f"cannot create table {table_name!r}: {create_exc}"
                ) from create_exc
    table = _wait_active(client, table_name, progress, timeout=timeout)
    if not created:
        # Pointed at the wrong table (a typo, a wrong variable): change nothing there. Adding an
        # index and TTL on an attribute that means something else would delete someone's data.
        types = {
            str(d.get("AttributeName")): str(d.get("AttributeType"))
            for d in table.get("AttributeDefinitions", [])
        }
        problems = key_schema_problems("table", table.get("KeySchema", []), "pk", "sk", types)
        if problems:
            raise ConfigurationError(
                f"table {table_name!r} is not a dynacoord table ({'; '.join(problems)}); "
                "nothing was changed: check the table name"
            )
    if not created and _add_missing_index(client, table, progress, options):
        _wait_active(client, table_name, progress, timeout=timeout)
    _enable_ttl(client, table_name, progress)
    return created


def _add_missing_index(
    client: Any, table: Mapping[str, Any], progress: Progress, options: Mapping[str, Any]
) -> bool:
    """Add ``gsi1`` to an existing ACTIVE ``table`` (its description) that lacks it (one
    UpdateTable). True if it was added.

    An index that exists with other keys is not touched: replacing it would drop what its users
    rely on, so :func:`verify_table` reports it instead.
    """
    from botocore.exceptions import ClientError

    table_name = str(table["TableName"])
    if any(g.get("IndexName") == GSI_NAME for g in table.get("GlobalSecondaryIndexes", [])):
        return False
    definition = table_definition(table_name, **options)
    gsi = dict(definition["GlobalSecondaryIndexes"][0])
    # The index follows the table's billing mode, whatever ensure_table was asked to create.
    billing = table.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED")
    if billing == "PROVISIONED":
        throughput = table.get("ProvisionedThroughput", {})
        gsi["ProvisionedThroughput"] = {
            "ReadCapacityUnits": throughput.get("ReadCapacityUnits") or 5,
            "WriteCapacityUnits": throughput.get("WriteCapacityUnits") or 5,
        }
    else:
        gsi.pop("ProvisionedThroughput", None)
    index_attributes = {"gsi1pk", "gsi1sk"}
    try:
        client.update_table(
            TableName=table_name,
            AttributeDefinitions=[
                a
                for a in definition["AttributeDefinitions"]
                if a["AttributeName"] in index_attributes
            ],
            GlobalSecondaryIndexUpdates=[{"Create": gsi}],
        )
    except ClientError as exc:
        raise BackendError(
            f"cannot add index {GSI_NAME} to table {table_name!r}: {_error_message(exc)}",
            code=_error_code(exc),
        ) from exc
    progress(f"adding index {GSI_NAME} to {table_name} ...")
    return True


def _wait_active(
    client: Any, table_name: str, progress: Progress, *, timeout: float = 300.0
) -> dict[str, Any]:
    """Wait until the table and its indexes are ACTIVE; return the last description."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        table = client.describe_table(TableName=table_name)["Table"]
        gsis = table.get("GlobalSecondaryIndexes", [])
        if table.get("TableStatus") == "ACTIVE" and all(
            g.get("IndexStatus", "ACTIVE") == "ACTIVE" for g in gsis
        ):
            return dict(table)
        if time.monotonic() > deadline:
            raise TableNotReadyError(
                f"table {table_name!r} not ACTIVE after {timeout}s (status "
                f"{table.get('TableStatus')})",
                table_name=table_name,
            )
        progress(f"waiting for table {table_name} ({table.get('TableStatus')}) ...")
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def _enable_ttl(client: Any, table_name: str, progress: Progress) -> None:
    from botocore.exceptions import ClientError

    try:
        status = client.describe_time_to_live(TableName=table_name)["TimeToLiveDescription"]
    except ClientError as exc:
        raise BackendError(f"cannot read TTL settings of {table_name!r}: {exc}") from exc
    if (
        status.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
        and status.get("AttributeName") == TTL_ATTRIBUTE
    ):
        return
    if status.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
        # DynamoDB allows one TTL attribute per table; switching it is the owner's decision.
        raise TableNotReadyError(
            f"table {table_name!r} has TTL on attribute {status.get('AttributeName')!r}; "
            f"dynacoord needs it on {TTL_ATTRIBUTE!r} (disable the other TTL first)",
            table_name=table_name,
        )
    progress(f"enabling TTL on {table_name}.{TTL_ATTRIBUTE} ...")
    try:
        client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
        )
    except ClientError as exc:
        raise BackendError(
            f"cannot enable TTL on {table_name}.{TTL_ATTRIBUTE}: {_error_message(exc)}",
            code=_error_code(exc),
        ) from exc


def _error_code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _error_message(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Message", "")) or str(exc)


def _refused_for_protection(exc: Any) -> bool:
    message = _error_message(exc)
    return "DeletionProtection" in message or "deletion protection" in message.lower()


# --- verify / delete the table ---------------------------------------------------------------


def is_warning(problem: str) -> bool:
    """Whether a :func:`verify_table` finding leaves the table usable: only TTL being off (every
    read treats expired items as absent; they are just never garbage-collected)."""
    return problem.startswith(("TTL is DISABLED", "TTL is DISABLING"))


def verify_table(client: Any, table_name: str) -> list[str]:
    """Check that ``table_name`` is a usable dynacoord table; return the problems found.

    An empty list means the table is ACTIVE, keyed ``pk``/``sk`` (strings), has the index
    ``gsi1`` on ``gsi1pk``/``gsi1sk`` (strings, projection ALL, ACTIVE) and TTL enabled on the
    attribute ``ttl``. Each problem is one sentence naming what is wrong. Only a failing request
    (other than "table not found") raises :class:`~dynacoord.errors.BackendError`.
    """
    from botocore.exceptions import ClientError

    try:
        table = client.describe_table(TableName=table_name)["Table"]
    except ClientError as exc:
        if _error_code(exc) == "ResourceNotFoundException":
            return [f"table {table_name!r} does not exist"]
        raise BackendError(
            f"cannot describe table {table_name!r}: {_error_message(exc)}", code=_error_code(exc)
        ) from exc
    problems = schema_problems(table)
    if not problems:
        mark_verified(client, table_name)
    try:
        ttl = client.describe_time_to_live(TableName=table_name)["TimeToLiveDescription"]
    except ClientError as exc:
        raise BackendError(
            f"cannot read TTL settings of {table_name!r}: {_error_message(exc)}",
            code=_error_code(exc),
        ) from exc
    ttl_status = ttl.get("TimeToLiveStatus", "DISABLED")
    if ttl_status in ("ENABLED", "ENABLING"):
        if ttl.get("AttributeName") != TTL_ATTRIBUTE:
            problems.append(
                f"TTL is enabled on attribute {ttl.get('AttributeName')!r}, "
                f"expected {TTL_ATTRIBUTE!r}"
            )
    else:
        problems.append(
            f"TTL is {ttl_status}, expected enabled on attribute {TTL_ATTRIBUTE!r} "
            "(expired items are never garbage-collected; ensure_table enables it)"
        )
    return problems


def delete_table(
    client: Any,
    table_name: str,
    *,
    wait: bool = True,
    progress: Progress = _noop,
    timeout: float = 300.0,
    disable_deletion_protection: bool = False,
) -> bool:
    """Delete the table and (with ``wait``) wait until it is gone. False if it did not exist.

    A table with deletion protection is refused with a :class:`BackendError` that says so,
    unless ``disable_deletion_protection``: then protection is turned off first (one
    UpdateTable, only when the DeleteTable was refused for it) and the table deleted. That is
    how a table kept by ``stack delete`` is removed. Do not use this on a table that a
    CloudFormation stack still owns: delete the stack first.
    """
    from botocore.exceptions import ClientError

    try:
        try:
            client.delete_table(TableName=table_name)
        except ClientError as exc:
            if not (disable_deletion_protection and _refused_for_protection(exc)):
                raise
            progress(f"turning off deletion protection of {table_name} ...")
            client.update_table(TableName=table_name, DeletionProtectionEnabled=False)
            logger.info("turned off deletion protection of %r", table_name)
            _wait_active(client, table_name, progress, timeout=timeout)
            client.delete_table(TableName=table_name)
    except ClientError as exc:
        code = _error_code(exc)
        if code == "ResourceNotFoundException":
            return False
        message = _error_message(exc)
        if _refused_for_protection(exc):
            message = (
                "deletion protection is enabled; turn it off first: `dynacoord table delete "
                "--yes --disable-deletion-protection` (or the stack parameter "
                "DeletionProtection=false while a stack owns the table)"
            )
        raise BackendError(f"cannot delete table {table_name!r}: {message}", code=code) from exc
    forget_verified(client, table_name)
    logger.info("deleting table %r", table_name)
    progress(f"deleting table {table_name} ...")
    if not wait:
        return True
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        try:
            status = client.describe_table(TableName=table_name)["Table"].get("TableStatus")
        except ClientError as exc:
            if _error_code(exc) == "ResourceNotFoundException":
                return True
            raise BackendError(
                f"cannot describe table {table_name!r}: {_error_message(exc)}",
                code=_error_code(exc),
            ) from exc
        if time.monotonic() > deadline:
            raise TableNotReadyError(
                f"table {table_name!r} still exists {timeout}s after DeleteTable (status {status})",
                table_name=table_name,
            )
        progress(f"waiting for table {table_name} to be deleted ({status}) ...")
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


# --- the bundled CloudFormation stack ----------------------------------------------------------

#: Parameters of the bundled template (tests check that this matches the YAML).
STACK_PARAMETERS = (
    "TableName",
    "BillingMode",
    "ReadCapacity",
    "WriteCapacity",
    "DeletionProtection",
    "Namespaces",
    "EncryptionKey",
    "Stream",
    "Relay",
    "RelayNamespace",
    "RelayHandlers",
    "CodeS3Bucket",
    "CodeS3Key",
    "PythonRuntime",
    "RelayBatchSize",
    "RelayMaximumRetryAttempts",
    "RelayTimeout",
    "RelayMemorySize",
    "RelayPolicyArns",
    "OutboxOptions",
    "HandlerSettings",
    "SweepSchedule",
    "ReconcileHandler",
    "ReconcileAfter",
    "LogRetentionDays",
    "Alarms",
    "AlarmTopic",
)
#: The template creates an IAM managed policy and (with the relay) a role, without fixed names.
_CAPABILITIES = ["CAPABILITY_IAM"]
_STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}$")
_MAX_EVENT_PAGES = 20


def template_path() -> Path:
    """The file system path of the bundled template ``dynacoord/cloudformation/dynacoord.yaml``."""
    return Path(
        str(importlib.resources.files("dynacoord").joinpath("cloudformation/dynacoord.yaml"))
    )


def template_body() -> str:
    """The bundled CloudFormation template (YAML text)."""
    return (
        importlib.resources.files("dynacoord")
        .joinpath("cloudformation/dynacoord.yaml")
        .read_text(encoding="utf-8")
    )


@dataclass(frozen=True, slots=True)
class StackDeployment:
    """The result of :func:`deploy_stack`."""

    stack_name: str
    stack_id: str
    #: the final stack status (``CREATE_COMPLETE``, ``UPDATE_COMPLETE``, or the unchanged status
    #: when there was nothing to update; ``*_IN_PROGRESS`` with ``wait=False``)
    status: str
    #: False when CloudFormation reported that no updates were needed
    changed: bool
    outputs: dict[str, str] = field(default_factory=dict)


#: A stack parameter value: bools become "true"/"false"; the list parameters (Namespaces,
#: RelayPolicyArns) also take a list of str; OutboxOptions and HandlerSettings also take a dict
#: (sent as JSON).
StackParameterValue = str | int | bool | Sequence[str] | Mapping[str, Any]
_LIST_PARAMETERS = ("Namespaces", "RelayPolicyArns")
_HANDLER_PARAMETERS = ("RelayHandlers", "ReconcileHandler")
_HANDLER_SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$")


def _parameter_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    if (
        key in _LIST_PARAMETERS
        and isinstance(value, (list, tuple))
        and all(isinstance(v, str) for v in value)
    ):
        return ",".join(value)
    if key in ("OutboxOptions", "HandlerSettings") and isinstance(value, Mapping):
        return json.dumps(dict(value), sort_keys=True)
    kinds = "a str, int or bool"
    if key in _LIST_PARAMETERS:
        kinds += " or a list of str"
    elif key in ("OutboxOptions", "HandlerSettings"):
        kinds += " or a dict"
    raise TypeError(f"stack parameter {key} must be {kinds}, got {type(value).__name__}")


def _check_parameter(key: str, text: str) -> None:
    """Refuse values of the bundled template's parameters that would fail (or widen the policy)
    in CloudFormation, before any request."""
    if key == "Namespaces" and text:
        _namespace_list(text.split(","))
    elif key == "RelayNamespace":
        _namespace_list([text])
    elif key in _HANDLER_PARAMETERS and text and not _HANDLER_SPEC.match(text):
        raise ValueError(f"stack parameter {key} must be MODULE:ATTRIBUTE, got {text!r}")
    elif key in ("OutboxOptions", "HandlerSettings"):
        from .outbox.stream import OUTBOX_OPTIONS

        try:
            options = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"stack parameter {key} is not JSON: {exc}") from None
        if not isinstance(options, dict):
            raise ValueError(f"stack parameter {key} must be a JSON object, got {text!r}")
        unknown = sorted(set(options) - set(OUTBOX_OPTIONS)) if key == "OutboxOptions" else []
        if unknown:
            raise ValueError(
                f"unknown outbox option(s) {unknown} in OutboxOptions; the options are "
                f"{', '.join(OUTBOX_OPTIONS)}"
            )


def _stack_parameters(
    parameters: Mapping[str, StackParameterValue] | None, *, check_names: bool
) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (parameters or {}).items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"stack parameter names must be non-empty strings, got {key!r}")
        if check_names and key not in STACK_PARAMETERS:
            raise ValueError(
                f"unknown stack parameter {key!r}; the template takes {', '.join(STACK_PARAMETERS)}"
            )
        out[key] = _parameter_text(key, value)
        if check_names:
            _check_parameter(key, out[key])
    if check_names and "RelayTimeout" in out and "OutboxOptions" in out:
        # Neither function claims an event once a whole lease no longer fits its remaining time:
        # a timeout at or under the lease would deliver nothing, ever.
        from .outbox.stream import OUTCOME_MARGIN_MS

        lease = json.loads(out["OutboxOptions"]).get("lease", 30)
        if isinstance(lease, (int, float)) and int(out["RelayTimeout"]) * 1000 <= (
            lease * 1000 + OUTCOME_MARGIN_MS
        ):
            raise ValueError(
                f"RelayTimeout {out['RelayTimeout']} s leaves no room for the lease of {lease} s "
                "(and a second to store the outcome): nothing would ever be delivered"
            )
    if check_names:
        _check_allowed(out)
    namespaces = out.get("Namespaces")
    relay_namespace = out.get("RelayNamespace")
    if namespaces and relay_namespace and relay_namespace not in namespaces.split(","):
        raise ValueError(
            f"RelayNamespace {relay_namespace!r} is not one of Namespaces {namespaces!r}: the "
            "relay could not read its own events"
        )
    return out


def _template_parameters(body: str) -> dict[str, dict[str, Any]]:
    """The ``Parameters`` section of a template in the bundled template's layout (two-space
    names, four-space attributes): Type, Default, AllowedValues, AllowedPattern, MinValue,
    MaxValue of each. Read without a YAML library (the package has none, and CloudFormation's
    short tags need a custom loader)."""
    out: dict[str, dict[str, Any]] = {}
    in_parameters = False
    current: dict[str, Any] | None = None
    for line in body.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            in_parameters = line.rstrip() == "Parameters:"
            continue
        if not in_parameters:
            continue
        if line.startswith("  ") and not line.startswith("   "):
            current = out.setdefault(line.strip().rstrip(":"), {})
        elif current is not None and line.startswith("    ") and not line.startswith("     "):
            key, _, raw = line.strip().partition(":")
            raw = raw.strip()
            if key == "AllowedValues" and raw.startswith("["):
                current[key] = [_scalar(v) for v in raw.strip("[]").split(",")]
            elif key in ("Type", "Default", "AllowedPattern", "MinValue", "MaxValue"):
                current[key] = _scalar(raw)
    return out


def _scalar(raw: str) -> str:
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return raw[1:-1].replace("\\\\", "\\")
    if len(raw) >= 2 and raw[0] == raw[-1] == "'":
        return raw[1:-1]
    return raw


_bundled_parameters: dict[str, dict[str, Any]] | None = None


def _bundled_template_parameters() -> dict[str, dict[str, Any]]:
    global _bundled_parameters
    if _bundled_parameters is None:
        _bundled_parameters = _template_parameters(template_body())
    return _bundled_parameters


def _check_allowed(values: Mapping[str, str]) -> None:
    """Refuse a value the bundled template's AllowedValues, AllowedPattern, MinValue or MaxValue
    would refuse, before anything is uploaded or sent (an emulator may not check them)."""
    spec = _bundled_template_parameters()
    for key, text in values.items():
        rules = spec.get(key, {})
        allowed = rules.get("AllowedValues")
        if allowed is not None and text not in allowed:
            raise ValueError(
                f"stack parameter {key} must be one of {', '.join(allowed)}, got {text!r}"
            )
        pattern = rules.get("AllowedPattern")
        if pattern is not None and not re.fullmatch(pattern, text):
            raise ValueError(f"stack parameter {key} must match {pattern}, got {text!r}")
        if rules.get("Type") == "Number":
            try:
                number = float(text)
            except ValueError:
                raise ValueError(f"stack parameter {key} must be a number, got {text!r}") from None
            low, high = rules.get("MinValue"), rules.get("MaxValue")
            if (low is not None and number < float(low)) or (
                high is not None and number > float(high)
            ):
                raise ValueError(
                    f"stack parameter {key} must be in {low or '-inf'}..{high or 'inf'}, got {text}"
                )


def _effective_parameters(
    values: Mapping[str, str], previous: Mapping[str, str] | None
) -> dict[str, str]:
    """The values a stack will have: given, else previous (an update), else the default."""
    effective = {k: str(v.get("Default", "")) for k, v in _bundled_template_parameters().items()}
    effective.update({k: v for k, v in (previous or {}).items() if v != "****"})
    effective.update(values)
    return effective


def check_stack_parameters(
    parameters: Mapping[str, StackParameterValue], *, previous: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Check ``parameters`` of the bundled template as :func:`deploy_stack` will, with the
    ``previous`` values of an existing stack (:func:`stack_parameters`), without sending
    anything; return them as text. ``ValueError``/``TypeError`` for a value that would fail."""
    values = _stack_parameters(parameters, check_names=True)
    check_stack_rules(_effective_parameters(values, previous))
    return values


def check_stack_rules(values: Mapping[str, str]) -> None:
    """The bundled template's ``Rules``, checked here on the values the stack will have (given,
    else previous, else default): CloudFormation checks them too, but only after the code
    bundle was uploaded, and an emulator (moto) not at all (a stack with Relay=true and no code
    then stays in CREATE_IN_PROGRESS)."""
    if values.get("Relay") == "true":
        missing = [k for k in ("RelayHandlers", "CodeS3Bucket", "CodeS3Key") if not values.get(k)]
        if missing:
            raise ValueError(
                f"Relay=true needs {', '.join(missing)}: deploy with `dynacoord stack deploy "
                "--relay MODULE:HANDLERS --code-bucket BUCKET`, which packages and uploads the "
                "code and sets them"
            )
        # (moto reports a previous CommaDelimitedList as a Python list's repr: read that too)
        raw = (values.get("Namespaces") or "").strip().strip("[]")
        namespaces = [n.strip().strip("'\"") for n in raw.split(",") if n.strip()]
        relay_namespace = values.get("RelayNamespace", "")
        if namespaces and relay_namespace not in namespaces:
            raise ValueError(
                f"RelayNamespace {relay_namespace!r} is not one of Namespaces "
                f"{','.join(namespaces)!r}: the relay could not read its own events"
            )


def _check_stack_name(stack_name: str) -> None:
    if not isinstance(stack_name, str) or not _STACK_NAME.match(stack_name):
        raise ValueError(
            "stack name must start with a letter and contain only letters, digits and '-' "
            f"(at most 128 characters), got {stack_name!r}"
        )


def _kept_parameters(
    existing: Mapping[str, Any], values: Mapping[str, str], template: str | None
) -> list[dict[str, Any]]:
    """The parameters an update does not change: ``UsePreviousValue`` (a parameter the
    bundled template no longer has is dropped)."""
    return [
        {"ParameterKey": str(p["ParameterKey"]), "UsePreviousValue": True}
        for p in existing.get("Parameters") or []
        if str(p["ParameterKey"]) not in values
        and (template is not None or str(p["ParameterKey"]) in STACK_PARAMETERS)
    ]


def _describe_stack(cfn_client: Any, stack_name: str) -> dict[str, Any] | None:
    from botocore.exceptions import ClientError

    try:
        stacks = cfn_client.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:
        if _error_code(exc) == "ValidationError" and "does not exist" in _error_message(exc):
            return None
        raise StackDeploymentError(
            f"cannot describe stack {stack_name!r}: {_error_message(exc)}",
            stack_name=stack_name,
            events=[],
        ) from exc
    return dict(stacks[0]) if stacks else None


def _outputs(stack: Mapping[str, Any]) -> dict[str, str]:
    return {str(o["OutputKey"]): str(o["OutputValue"]) for o in stack.get("Outputs") or []}


def _latest_event_id(cfn_client: Any, stack_id: str) -> str | None:
    events = cfn_client.describe_stack_events(StackName=stack_id).get("StackEvents", [])
    return str(events[0]["EventId"]) if events else None


def _failed_events(
    cfn_client: Any, stack_id: str, since_event_id: str | None
) -> list[dict[str, Any]]:
    """The ``*_FAILED`` events newer than ``since_event_id``, oldest first."""
    failed: list[dict[str, Any]] = []
    token: str | None = None
    for _ in range(_MAX_EVENT_PAGES):
        request: dict[str, Any] = {"StackName": stack_id}
        if token:
            request["NextToken"] = token
        page = cfn_client.describe_stack_events(**request)
        for event in page.get("StackEvents", []):
            if since_event_id is not None and event.get("EventId") == since_event_id:
                return failed[::-1]
            if str(event.get("ResourceStatus", "")).endswith("_FAILED"):
                timestamp = event.get("Timestamp")
                failed.append(
                    {
                        "logical_id": event.get("LogicalResourceId"),
                        "resource_type": event.get("ResourceType"),
                        "status": event.get("ResourceStatus"),
                        "reason": event.get("ResourceStatusReason", ""),
                        "timestamp": timestamp.isoformat()
                        if hasattr(timestamp, "isoformat")
                        else timestamp,
                    }
                )
        token = page.get("NextToken")
        if not token:
            break
    return failed[::-1]


def _failure(
    stack_name: str, status: str, reason: str | None, events: list[dict[str, Any]]
) -> StackDeploymentError:
    if events:
        detail = "; ".join(
            f"{e['logical_id']} ({e['resource_type']}) {e['status']}: {e['reason']}" for e in events
        )
    else:
        detail = f"no failed resource events ({reason or 'no reason given'})"
    return StackDeploymentError(
        f"stack {stack_name} ended in {status}: {detail}", stack_name=stack_name, events=events
    )


def _wait_stack(
    cfn_client: Any,
    stack_id: str,
    stack_name: str,
    progress: Progress,
    poll_interval: float,
    timeout: float,
) -> dict[str, Any]:
    """Poll until the stack leaves every ``*_IN_PROGRESS`` state; return its description."""
    deadline = time.monotonic() + timeout
    while True:
        stack = cfn_client.describe_stacks(StackName=stack_id)["Stacks"][0]
        status = str(stack["StackStatus"])
        if not status.endswith("_IN_PROGRESS"):
            return dict(stack)
        if time.monotonic() > deadline:
            raise StackDeploymentError(
                f"stack {stack_name} still {status} after {timeout}s",
                stack_name=stack_name,
                events=[],
            )
        logger.debug("stack %r is %r", stack_name, status)
        progress(f"waiting for stack {stack_name} ({status}) ...")
        time.sleep(poll_interval)


def deploy_stack(
    cfn_client: Any,
    stack_name: str,
    *,
    parameters: Mapping[str, StackParameterValue] | None = None,
    template: str | None = None,
    wait: bool = True,
    progress: Progress = _noop,
    poll_interval: float = 5.0,
    timeout: float = 3600.0,
) -> StackDeployment:
    """Create the stack, or update it when it exists, from the bundled template.

    ``parameters`` maps template parameters to values (bools become ``"true"``/``"false"``,
    ``Namespaces`` and ``RelayPolicyArns`` also take a list, ``OutboxOptions`` and
    ``HandlerSettings`` a dict); values
    that would fail in CloudFormation or widen the policy (a namespace with ``#`` or ``*``, a
    handler that is not ``MODULE:ATTRIBUTE``, an unknown outbox option, a ``RelayNamespace``
    outside ``Namespaces``) raise ``ValueError`` before any request. On an update, parameters
    not given keep their previous values (like ``aws cloudformation deploy``). The template's allowed values and its ``Rules`` (Relay=true
    needs the code and handlers; RelayNamespace one of Namespaces) are checked here too. An update with nothing to change ("No updates are to be performed") is a success
    with ``changed=False``. With ``wait`` (default), polls until the stack settles and raises
    :class:`~dynacoord.errors.StackDeploymentError` unless it ends ``CREATE_COMPLETE`` /
    ``UPDATE_COMPLETE``; the error's message and ``events`` list the resource events that failed,
    with CloudFormation's reasons. A stack left in ``ROLLBACK_COMPLETE`` by a failed creation
    cannot be updated: delete it (:func:`delete_stack`) and deploy again. ``template`` replaces
    the bundled template (its parameter names are then not checked here).
    """
    from botocore.exceptions import ClientError

    _check_stack_name(stack_name)
    values = _stack_parameters(parameters, check_names=template is None)
    body = template if template is not None else template_body()
    given = [{"ParameterKey": k, "ParameterValue": v} for k, v in values.items()]

    existing = _describe_stack(cfn_client, stack_name)
    if existing is not None:
        status = str(existing["StackStatus"])
        if status == "ROLLBACK_COMPLETE":
            raise StackDeploymentError(
                f"stack {stack_name} is in ROLLBACK_COMPLETE (its creation failed) and cannot "
                "be updated: delete it and deploy again",
                stack_name=stack_name,
                events=[],
            )
        if status.endswith("_IN_PROGRESS"):
            raise StackDeploymentError(
                f"stack {stack_name} is busy ({status}); try again when it has settled",
                stack_name=stack_name,
                events=[],
            )

    if template is None:  # the Rules on the values the stack will have, before anything is sent
        previous = {
            str(p["ParameterKey"]): str(p["ParameterValue"])
            for p in (existing or {}).get("Parameters") or []
            if p.get("ParameterValue") is not None
        }
        check_stack_rules(_effective_parameters(values, previous))

    since: str | None = None
    try:
        if existing is None:
            logger.info("creating stack %r", stack_name)
            response = cfn_client.create_stack(
                StackName=stack_name,
                TemplateBody=body,
                Parameters=given,
                Capabilities=_CAPABILITIES,
            )
            stack_id = str(response["StackId"])
            action = "CREATE"
            progress(f"creating stack {stack_name} ...")
        else:
            stack_id = str(existing["StackId"])
            keep = _kept_parameters(existing, values, template)
            since = _latest_event_id(cfn_client, stack_id)
            logger.info("updating stack %r", stack_name)
            cfn_client.update_stack(
                StackName=stack_id,
                TemplateBody=body,
                Parameters=given + keep,
                Capabilities=_CAPABILITIES,
            )
            action = "UPDATE"
            progress(f"updating stack {stack_name} ...")
    except ClientError as exc:
        message = _error_message(exc)
        if existing is not None and "No updates are to be performed" in message:
            progress(f"stack {stack_name} is up to date")
            return StackDeployment(
                stack_name,
                str(existing["StackId"]),
                str(existing["StackStatus"]),
                changed=False,
                outputs=_outputs(existing),
            )
        verb = "create" if existing is None else "update"
        raise StackDeploymentError(
            f"cannot {verb} stack {stack_name}: {message}", stack_name=stack_name, events=[]
        ) from exc

    if not wait:
        return StackDeployment(stack_name, stack_id, f"{action}_IN_PROGRESS", changed=True)
    stack = _wait_stack(cfn_client, stack_id, stack_name, progress, poll_interval, timeout)
    status = str(stack["StackStatus"])
    if status != f"{action}_COMPLETE":
        events = _failed_events(cfn_client, stack_id, since)
        raise _failure(stack_name, status, stack.get("StackStatusReason"), events)
    progress(f"stack {stack_name} is {status}")
    return StackDeployment(stack_name, stack_id, status, changed=True, outputs=_outputs(stack))


def delete_stack(
    cfn_client: Any,
    stack_name: str,
    *,
    wait: bool = True,
    progress: Progress = _noop,
    poll_interval: float = 5.0,
    timeout: float = 3600.0,
) -> bool:
    """Delete the stack (and with it the table, unless deletion protection is on). False if the
    stack did not exist. With ``wait``, raises :class:`StackDeploymentError` listing the failed
    resource events unless the stack ends ``DELETE_COMPLETE``."""
    from botocore.exceptions import ClientError

    _check_stack_name(stack_name)
    existing = _describe_stack(cfn_client, stack_name)
    if existing is None:
        return False
    stack_id = str(existing["StackId"])
    since = _latest_event_id(cfn_client, stack_id)
    try:
        cfn_client.delete_stack(StackName=stack_id)
    except ClientError as exc:
        raise StackDeploymentError(
            f"cannot delete stack {stack_name}: {_error_message(exc)}",
            stack_name=stack_name,
            events=[],
        ) from exc
    logger.info("deleting stack %r", stack_name)
    progress(f"deleting stack {stack_name} ...")
    if not wait:
        return True
    stack = _wait_stack(cfn_client, stack_id, stack_name, progress, poll_interval, timeout)
    status = str(stack["StackStatus"])
    if status != "DELETE_COMPLETE":
        events = _failed_events(cfn_client, stack_id, since)
        raise _failure(stack_name, status, stack.get("StackStatusReason"), events)
    progress(f"stack {stack_name} is deleted")
    return True


def stack_outputs(cfn_client: Any, stack_name: str) -> dict[str, str]:
    """The outputs of the stack (``TableName``, ``TableArn``, ``AccessPolicyArn``, and those of
    the parts it has: ``StreamArn``, ``RelayFunctionName``, ...)."""
    stack = _describe_stack(cfn_client, stack_name)
    if stack is None:
        raise StackDeploymentError(
            f"stack {stack_name} does not exist", stack_name=stack_name, events=[]
        )
    return _outputs(stack)


def stack_parameters(cfn_client: Any, stack_name: str) -> dict[str, str] | None:
    """The parameter values the stack was last deployed with, or None if it does not exist."""
    _check_stack_name(stack_name)
    stack = _describe_stack(cfn_client, stack_name)
    if stack is None:
        return None
    return {
        str(p["ParameterKey"]): str(p.get("ParameterValue", ""))
        for p in stack.get("Parameters") or []
    }


# --- the code bundle of the relay and the sweeper ------------------------------------------------

#: Every entry of a bundle gets this time stamp, so the same files make the same bytes (and the
#: same S3 key): a redeploy of unchanged code changes nothing.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class RelayBundle:
    """The code bundle of the stack's relay and sweeper (:func:`package_relay`)."""

    #: the zip file's bytes
    data: bytes
    #: hex SHA-256 of ``data``
    sha256: str
    #: the paths inside the zip, sorted
    files: tuple[str, ...]

    @property
    def name(self) -> str:
        """A file name that changes with the content: a new S3 key for new code is what makes
        CloudFormation update the functions."""
        return f"dynacoord-relay-{self.sha256[:20]}.zip"


def _tree(root: Path, arcroot: str) -> Iterable[tuple[Path, str]]:
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if (
            path.is_file()
            and "__pycache__" not in rel.parts
            and path.suffix not in (".pyc", ".pyo")
        ):
            yield path, f"{arcroot}/{rel.as_posix()}"


def _module_files(module: str) -> list[tuple[Path, str]]:
    """The files of the top-level module or package ``module`` (found as ``import`` would)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        raise ValueError(f"cannot find module {module!r} to package (is it importable here?)")
    origin = Path(str(spec.origin))
    if spec.submodule_search_locations:
        return list(_tree(origin.parent, module))
    return [(origin, f"{module}{origin.suffix}")]


def package_relay(
    handlers: str,
    *,
    include: Iterable[str | Path] = (),
    reconcile: str | None = None,
    check: bool = True,
) -> RelayBundle:
    """Build the code bundle of the stack's relay and sweeper: a zip of dynacoord,
    typing-extensions (dynacoord's one dependency that Lambda's Python runtime lacks), the
    top-level module or package of ``handlers`` (``MODULE:ATTRIBUTE``), the module of
    ``reconcile`` if given, and every file or folder of ``include`` (at its own name). boto3 and
    botocore come from the Lambda runtime and are not bundled.

    With ``check`` (default), ``handlers`` (and ``reconcile``) are imported here first, as the
    functions will import them, and must be a callable or a mapping of event types to callables:
    a typo fails now, not in the deployed function. The bytes are deterministic (fixed entry
    times, sorted entries)."""
    import io
    import zipfile

    import typing_extensions

    from .serverless import load_object

    specs = [("handlers", handlers)] + ([("reconcile handler", reconcile)] if reconcile else [])
    for what, spec in specs:
        if not isinstance(spec, str) or not _HANDLER_SPEC.match(spec):
            raise ValueError(f"{what} must be MODULE:ATTRIBUTE, got {spec!r}")
    if check:
        for what, spec in specs:
            try:
                target = load_object(spec, what)
            except Exception as exc:
                # Most often the module reads its HandlerSettings at import (as the example
                # does) and finds none here: say where the check's settings come from.
                raise ConfigurationError(
                    f"the check imports {what} {spec!r} as the relay will, and that failed: "
                    f"{type(exc).__name__}: {exc}. If the module reads its HandlerSettings at "
                    "import, set DYNACOORD_HANDLER_SETTINGS to them here (the JSON you give the "
                    "stack as HandlerSettings; `stack deploy` uses the stack's); or skip the "
                    "check: --no-check (check=False)"
                ) from exc
            if what == "handlers" and isinstance(target, Mapping):
                bad = [k for k, v in target.items() if not isinstance(k, str) or not callable(v)]
                if bad:
                    raise ValueError(
                        f"handlers {spec!r}: entries {bad!r} do not map an event type to a callable"
                    )
            elif not callable(target):
                raise ValueError(f"{what} {spec!r} is not callable (nor a mapping of handlers)")
    package_root = Path(__file__).resolve().parent
    entries: dict[str, Path] = {}
    sources = list(_tree(package_root, "dynacoord"))
    sources.append((Path(str(typing_extensions.__file__)), "typing_extensions.py"))
    for _, spec in specs:
        top = spec.partition(":")[0].split(".")[0]
        if top != "dynacoord":
            sources.extend(_module_files(top))
    for item in include:
        path = Path(item)
        if path.is_dir():
            sources.extend(_tree(path, path.resolve().name))
        elif path.is_file():
            sources.append((path, path.name))
        else:
            raise ValueError(f"cannot include {str(item)!r}: no such file or folder")
    for path, arcname in sources:
        previous = entries.setdefault(arcname, path)
        if previous.resolve() != path.resolve():
            raise ValueError(f"two files would be {arcname!r} in the bundle: {previous}, {path}")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for arcname in sorted(entries):
            info = zipfile.ZipInfo(arcname, _ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            bundle.writestr(info, entries[arcname].read_bytes())
    data = buffer.getvalue()
    import hashlib

    return RelayBundle(data, hashlib.sha256(data).hexdigest(), tuple(sorted(entries)))


def upload_bundle(s3_client: Any, bundle: RelayBundle, bucket: str, *, prefix: str = "") -> str:
    """Upload ``bundle`` to ``s3://bucket/{prefix}{bundle.name}`` (unless that key already holds
    it) and return the key, for the stack parameters ``CodeS3Bucket`` / ``CodeS3Key``."""
    from botocore.exceptions import ClientError

    key = f"{prefix}{bundle.name}"
    try:
        s3_client.head_object(Bucket=bucket, Key=key)
        return key  # the key names the content: it is there already
    except ClientError as exc:
        if _error_code(exc) not in ("404", "NoSuchKey", "NotFound"):
            raise BackendError(
                f"cannot check s3://{bucket}/{key}: {_error_message(exc)}", code=_error_code(exc)
            ) from exc
    try:
        s3_client.put_object(Bucket=bucket, Key=key, Body=bundle.data)
    except ClientError as exc:
        raise BackendError(
            f"cannot upload the relay bundle to s3://{bucket}/{key}: {_error_message(exc)}",
            code=_error_code(exc),
        ) from exc
    return key


# --- IAM ---------------------------------------------------------------------------------------

#: Item-level actions dynacoord uses on the table. TransactWriteItems / TransactGetItems have no
#: IAM action of their own: each Put/Update/Delete/ConditionCheck/Get inside a transaction is
#: authorized as PutItem/UpdateItem/DeleteItem/ConditionCheckItem/GetItem.
ITEM_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:Query",
    "dynamodb:BatchGetItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:ConditionCheckItem",
)
#: Actions on the index gsi1 (listing: cache keys, outbox events, stalled runs).
INDEX_ACTIONS = ("dynamodb:Query",)
#: Table metadata (readiness and TTL checks).
METADATA_ACTIONS = ("dynamodb:DescribeTable", "dynamodb:DescribeTimeToLive")
#: The kinds whose items carry gsi1pk (``KIND#{ns}#...``), see DESIGN.md section 2.
_INDEXED_KINDS = (Kind.CACHE, Kind.OUTBOX, Kind.RUN)
_TABLE_ARN = re.compile(r"^arn:[a-z-]+:dynamodb:[a-z0-9*-]*:[0-9*]*:table/[A-Za-z0-9_.*-]+$")


def _namespace_list(namespaces: Iterable[str]) -> list[str]:
    if isinstance(namespaces, str):
        raise TypeError("namespaces must be a list of namespaces, not one str")
    out: list[str] = []
    for namespace in namespaces:
        validate_namespace(namespace)
        if any(c in namespace for c in "*?$"):
            raise ValueError(
                f"namespace {namespace!r} contains an IAM wildcard or variable character "
                "(* ? $): it would widen the policy"
            )
        if namespace not in out:
            out.append(namespace)
    if not out:
        raise ValueError("namespaces must not be empty (pass None to allow every namespace)")
    return out


def iam_policy(
    table_arn: str,
    namespaces: Iterable[str] | None = None,
    *,
    include_index: bool = True,
) -> dict[str, Any]:
    """A least-privilege IAM policy document (a JSON-ready dict) for code that uses the table.

    Three statements: the item actions (:data:`ITEM_ACTIONS`) on the table, ``Query`` on the
    index ``gsi1`` (omitted with ``include_index=False``), and ``DescribeTable`` /
    ``DescribeTimeToLive`` on the table. It is the same policy as the stack's ``AccessPolicy``.

    With ``namespaces``, the item statement gets a ``ForAllValues:StringLike`` condition on
    ``dynamodb:LeadingKeys`` that allows only partition keys ``KIND#{ns}#*`` of those
    namespaces, for every item kind of :class:`dynacoord.keys.Kind` (``LOCK#ns#*``,
    ``CACHE#ns#*``, ...). ``ForAllValues`` over a request without partition keys is true, which
    is why no Scan is granted. The describe statement has no condition (no keys involved).

    The index is different: IAM documents ``dynamodb:LeadingKeys`` as the *table's* partition key,
    and does not document that a Query on a GSI matches it against the index partition key
    (``gsi1pk``). So the index gets its own statement, on the index ARN only, with the same kind
    of condition written for the ``gsi1pk`` prefixes (``CACHE#ns#*``, ``OUTBOX#ns#*``,
    ``RUN#ns#*``; they start with the namespace too). Where IAM does not evaluate that condition
    for index queries, the statement allows querying gsi1 partitions of other namespaces, and
    gsi1 projects ALL attributes of cache entries, outbox events and runs. When that matters,
    use ``include_index=False`` (cache ``keys()``, outbox workers and the run reconciler then
    fail with AccessDenied) or one table per tenant.
    """
    if not isinstance(table_arn, str) or not _TABLE_ARN.match(table_arn):
        raise ValueError(
            "table_arn must look like arn:aws:dynamodb:REGION:ACCOUNT:table/NAME, "
            f"got {table_arn!r}"
        )
    names = None if namespaces is None else _namespace_list(namespaces)
    items: dict[str, Any] = {
        "Sid": "DynacoordItems",
        "Effect": "Allow",
        "Action": list(ITEM_ACTIONS),
        "Resource": table_arn,
    }
    index: dict[str, Any] = {
        "Sid": "DynacoordIndexQuery",
        "Effect": "Allow",
        "Action": list(INDEX_ACTIONS),
        "Resource": f"{table_arn}/index/{GSI_NAME}",
    }
    if names is not None:
        items["Condition"] = {
            "ForAllValues:StringLike": {
                "dynamodb:LeadingKeys": [f"{kind.value}#{ns}#*" for ns in names for kind in Kind]
            }
        }
        index["Condition"] = {
            "ForAllValues:StringLike": {
                "dynamodb:LeadingKeys": [
                    f"{kind.value}#{ns}#*" for ns in names for kind in _INDEXED_KINDS
                ]
            }
        }
    describe: dict[str, Any] = {
        "Sid": "DynacoordDescribe",
        "Effect": "Allow",
        "Action": list(METADATA_ACTIONS),
        "Resource": table_arn,
    }
    statements = [items, index, describe] if include_index else [items, describe]
    return {"Version": "2012-10-17", "Statement": statements}
