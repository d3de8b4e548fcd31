"""The bundled CloudFormation stack: its template, its parameters (checked here against the
template's allowed values and ``Rules`` before anything is uploaded or sent), and deploy
(create or update), delete (and what it keeps), outputs, and the status of the stack's alarms.

Every CloudFormation request goes through :func:`._aws.call`; a refusal is a
:class:`~dynacoord.errors.StackDeploymentError`. Waits poll on the caller's clock.
"""

from __future__ import annotations

import ast
import importlib.resources
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from .._clock import Clock
from .._table_schema import TableLayout
from ..errors import DynacoordError, StackDeploymentError
from ._aws import Progress, Refusal, call, noop, request, wait_for
from .bundle import HANDLER_SPEC
from .iam import namespace_list

__all__ = [
    "ALARM_RUNBOOK",
    "LAYOUT_PARAMETERS",
    "STACK_PARAMETERS",
    "RetainedResource",
    "StackAlarm",
    "StackDeployment",
    "StackParameterValue",
    "StackStatus",
    "check_stack_parameters",
    "check_stack_rules",
    "delete_stack",
    "deploy_stack",
    "layout_parameters",
    "retained_resources",
    "stack_outputs",
    "stack_parameters",
    "stack_status",
    "template_body",
    "template_path",
]

logger = logging.getLogger("dynacoord.provision")

#: Parameters of the bundled template (tests check that this matches the YAML).
STACK_PARAMETERS = (
    "TableName",
    "PartitionKey",
    "SortKey",
    "IndexName",
    "IndexPartitionKey",
    "IndexSortKey",
    "TtlAttribute",
    "ExpiresAtAttribute",
    "KeyPrefix",
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
    "OutboxLagAlarmSeconds",
)
#: the stack parameter of each TableLayout field
LAYOUT_PARAMETERS = {
    "pk": "PartitionKey",
    "sk": "SortKey",
    "index": "IndexName",
    "index_pk": "IndexPartitionKey",
    "index_sk": "IndexSortKey",
    "ttl": "TtlAttribute",
    "expires_at": "ExpiresAtAttribute",
    "prefix": "KeyPrefix",
}
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
        namespace_list(text.split(","))
    elif key == "RelayNamespace":
        namespace_list([text])
    elif key in _HANDLER_PARAMETERS and text and not HANDLER_SPEC.match(text):
        raise ValueError(f"stack parameter {key} must be MODULE:ATTRIBUTE, got {text!r}")
    elif key in ("OutboxOptions", "HandlerSettings"):
        from ..outbox.stream import OUTBOX_OPTIONS

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
        from ..outbox.stream import OUTCOME_MARGIN_MS

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
        # (and an empty list as "['']": a name is what is left inside the quotes)
        names = (n.strip().strip("'\"").strip() for n in raw.split(","))
        namespaces = [n for n in names if n]
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


def _reported_value(key: str, value: str, spec: Mapping[str, Mapping[str, Any]]) -> str:
    """A parameter value as DescribeStacks reported it, in the form it is sent in. moto reports
    a ``CommaDelimitedList`` as a Python list's repr (``"['a', 'b']"``, ``"['']"``); that is
    read back as ``a,b`` (CloudFormation reports what was sent, which stays as it is)."""
    if spec.get(key, {}).get("Type") != "CommaDelimitedList":
        return value
    text = value.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return value
    try:
        items = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return value
    return ",".join(items)


def _previous_values(
    existing: Mapping[str, Any], spec: Mapping[str, Mapping[str, Any]]
) -> dict[str, str | None]:
    """The stack's parameter values as DescribeStacks reports them (None: a ``NoEcho``
    parameter, reported masked as ``****``)."""
    out: dict[str, str | None] = {}
    for p in existing.get("Parameters") or []:
        key, value = str(p["ParameterKey"]), p.get("ParameterValue")
        out[key] = (
            None if value is None or value == "****" else _reported_value(key, str(value), spec)
        )
    return out


def _kept_parameters(
    previous: Mapping[str, str | None],
    values: Mapping[str, str],
    template: str | None,
    spec: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The parameters an update does not change (a parameter the bundled template no longer
    has is dropped): ``UsePreviousValue``, except for a parameter whose value is the
    template's default, which is left out of the request (it takes that default again).

    Why: moto stores only the parameters a request named, so ``UsePreviousValue`` on one that
    took its default fails inside moto (a ``KeyError``, an HTTP 500 from its server), and a
    value sent explicitly counts as changed there (moto then updates resources that are off).
    On CloudFormation a parameter left out takes the template's default, and the value
    DescribeStacks reported is that default: the stack ends with the same parameters either
    way. (A ``NoEcho`` value is masked, so it always keeps ``UsePreviousValue``.)"""
    kept: list[dict[str, Any]] = []
    for key, value in previous.items():
        if key in values or (template is None and key not in STACK_PARAMETERS):
            continue
        default = spec.get(key, {}).get("Default")
        if value is not None and default is not None and value == default:
            continue  # not named: it takes the default, which is its value
        else:
            kept.append({"ParameterKey": key, "UsePreviousValue": True})
    return kept


def _unchanged(
    cfn_client: Any,
    stack_id: str,
    stack_name: str,
    body: str,
    values: Mapping[str, str],
    previous: Mapping[str, str | None],
) -> bool:
    """True when an update would change nothing: every given value is the stack's value (the
    others keep theirs) and the stack's template is ``body`` (GetTemplate, stage Original).

    A real CloudFormation answers such an update with "No updates are to be performed", which
    :func:`deploy_stack` reports as ``changed=False``; deciding it here gives the same answer
    without the UpdateStack request, which moto (its server, and in-process) cannot always take
    for a stack whose parameters kept their defaults. Where this cannot tell (a ``NoEcho``
    value, a template resolving SSM parameters, which CloudFormation reads again on every
    update, GetTemplate not allowed), the update is sent and CloudFormation decides."""
    if "AWS::SSM::Parameter::Value" in body:
        return False
    for key, value in values.items():
        if key not in previous or previous[key] is None or previous[key] != value:
            return False
    found = call(
        cfn_client,
        "get_template",
        f"read the template of stack {stack_name}",
        expect=lambda r: r.code in ("AccessDenied", "AccessDeniedException"),
        error=_stack_error(stack_name),
        StackName=stack_id,
        TemplateStage="Original",
    )
    if isinstance(found, Refusal):
        return False
    current = found.get("TemplateBody")
    if isinstance(current, Mapping):  # botocore decodes a JSON template into a dict
        try:
            return bool(dict(current) == json.loads(body))
        except ValueError:
            return False
    return current == body


def _stack_error(stack_name: str) -> Callable[[str, Refusal], DynacoordError]:
    """The error of a refused CloudFormation request about ``stack_name``."""

    def error(what: str, refusal: Refusal) -> DynacoordError:
        return StackDeploymentError(
            f"cannot {what}: {refusal.message}", stack_name=stack_name, events=[]
        )

    return error


def _cfn(cfn_client: Any, operation: str, stack_name: str, what: str, **kwargs: Any) -> Any:
    """One CloudFormation request about ``stack_name`` (refusals: StackDeploymentError)."""
    return request(cfn_client, operation, what, error=_stack_error(stack_name), **kwargs)


def _describe_stack(cfn_client: Any, stack_name: str) -> dict[str, Any] | None:
    found = call(
        cfn_client,
        "describe_stacks",
        f"describe stack {stack_name!r}",
        expect=lambda r: r.code == "ValidationError" and "does not exist" in r.message,
        error=_stack_error(stack_name),
        StackName=stack_name,
    )
    if isinstance(found, Refusal):
        return None
    stacks = found["Stacks"]
    return dict(stacks[0]) if stacks else None


def _outputs(stack: Mapping[str, Any]) -> dict[str, str]:
    return {str(o["OutputKey"]): str(o["OutputValue"]) for o in stack.get("Outputs") or []}


def _latest_event_id(cfn_client: Any, stack_id: str, stack_name: str) -> str | None:
    events = _cfn(
        cfn_client,
        "describe_stack_events",
        stack_name,
        f"read the events of stack {stack_name}",
        StackName=stack_id,
    ).get("StackEvents", [])
    return str(events[0]["EventId"]) if events else None


def _failed_events(
    cfn_client: Any, stack_id: str, stack_name: str, since_event_id: str | None
) -> list[dict[str, Any]]:
    """The ``*_FAILED`` events newer than ``since_event_id``, oldest first."""
    failed: list[dict[str, Any]] = []
    token: str | None = None
    for _ in range(_MAX_EVENT_PAGES):
        page_request: dict[str, Any] = {"StackName": stack_id}
        if token:
            page_request["NextToken"] = token
        page = _cfn(
            cfn_client,
            "describe_stack_events",
            stack_name,
            f"read the events of stack {stack_name}",
            **page_request,
        )
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
    clock: Clock | None,
) -> dict[str, Any]:
    """Poll (every ``poll_interval`` seconds of ``clock``) until the stack leaves every
    ``*_IN_PROGRESS`` state; return its description."""

    def probe() -> tuple[dict[str, Any] | None, str]:
        stack = dict(
            _cfn(
                cfn_client,
                "describe_stacks",
                stack_name,
                f"describe stack {stack_name!r}",
                StackName=stack_id,
            )["Stacks"][0]
        )
        status = str(stack["StackStatus"])
        return (None if status.endswith("_IN_PROGRESS") else stack), status

    return wait_for(
        probe,
        what=f"stack {stack_name}",
        clock=clock,
        timeout=timeout,
        progress=progress,
        timed_out=lambda status: StackDeploymentError(
            f"stack {stack_name} still {status} after {timeout}s",
            stack_name=stack_name,
            events=[],
        ),
        delay=poll_interval,
        max_delay=poll_interval,
    )


def deploy_stack(
    cfn_client: Any,
    stack_name: str,
    *,
    parameters: Mapping[str, StackParameterValue] | None = None,
    template: str | None = None,
    wait: bool = True,
    progress: Progress = noop,
    poll_interval: float = 5.0,
    timeout: float = 3600.0,
    clock: Clock | None = None,
    layout: TableLayout | None = None,
) -> StackDeployment:
    """Create the stack, or update it when it exists, from the bundled template.

    ``layout`` (a :class:`~dynacoord.TableLayout`) gives the table parameters ``PartitionKey``
    ... ``KeyPrefix`` its names (an explicit parameter of the same name must agree with it):
    the table, the managed policy, the relay's stream filter and the functions' backend then
    use them. A table's key schema cannot change: an update with other key names replaces the
    table (the old one is kept, DeletionPolicy Retain).

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
    the bundled template (its parameter names are then not checked here). The waits sleep on
    ``clock`` (default: the system's).
    """
    _check_stack_name(stack_name)
    if layout is not None:
        parameters = {**layout_parameters(layout, parameters or {}), **(parameters or {})}
    values = _stack_parameters(parameters, check_names=template is None)
    _check_layout(values)
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
    if existing is None:
        logger.info("creating stack %r", stack_name)
        created = _cfn(
            cfn_client,
            "create_stack",
            stack_name,
            f"create stack {stack_name}",
            StackName=stack_name,
            TemplateBody=body,
            Parameters=given,
            Capabilities=_CAPABILITIES,
        )
        stack_id = str(created["StackId"])
        action = "CREATE"
        progress(f"creating stack {stack_name} ...")
    else:
        stack_id = str(existing["StackId"])
        spec = _bundled_template_parameters() if template is None else _template_parameters(body)
        previous_values = _previous_values(existing, spec)
        if _unchanged(cfn_client, stack_id, stack_name, body, values, previous_values):
            progress(f"stack {stack_name} is up to date")
            return StackDeployment(
                stack_name, stack_id, status, changed=False, outputs=_outputs(existing)
            )
        keep = _kept_parameters(previous_values, values, template, spec)
        since = _latest_event_id(cfn_client, stack_id, stack_name)
        logger.info("updating stack %r", stack_name)
        updated = call(
            cfn_client,
            "update_stack",
            f"update stack {stack_name}",
            expect=lambda r: "No updates are to be performed" in r.message,
            error=_stack_error(stack_name),
            StackName=stack_id,
            TemplateBody=body,
            Parameters=given + keep,
            Capabilities=_CAPABILITIES,
        )
        if isinstance(updated, Refusal):
            progress(f"stack {stack_name} is up to date")
            return StackDeployment(
                stack_name,
                stack_id,
                str(existing["StackStatus"]),
                changed=False,
                outputs=_outputs(existing),
            )
        action = "UPDATE"
        progress(f"updating stack {stack_name} ...")

    if not wait:
        return StackDeployment(stack_name, stack_id, f"{action}_IN_PROGRESS", changed=True)
    stack = _wait_stack(cfn_client, stack_id, stack_name, progress, poll_interval, timeout, clock)
    status = str(stack["StackStatus"])
    if status != f"{action}_COMPLETE":
        events = _failed_events(cfn_client, stack_id, stack_name, since)
        raise _failure(stack_name, status, stack.get("StackStatusReason"), events)
    progress(f"stack {stack_name} is {status}")
    return StackDeployment(stack_name, stack_id, status, changed=True, outputs=_outputs(stack))


def layout_parameters(
    layout: TableLayout, given: Mapping[str, StackParameterValue] | None = None
) -> dict[str, str]:
    """The stack parameters of ``layout`` (all of them, defaults included, so an update moves
    a stack to exactly this layout); a parameter in ``given`` that says otherwise is a
    ``ValueError``."""
    if not isinstance(layout, TableLayout):
        raise ValueError(f"layout must be a dynacoord.TableLayout, got {type(layout).__name__}")
    out = {name: str(getattr(layout, field)) for field, name in LAYOUT_PARAMETERS.items()}
    for name, value in (given or {}).items():
        if name in out and str(value) != out[name]:
            raise ValueError(
                f"stack parameter {name}={value!r} contradicts the layout's {out[name]!r}"
            )
    return out


def _check_layout(values: Mapping[str, str]) -> None:
    """The layout parameters given make a valid :class:`~dynacoord.TableLayout` (the others at
    their defaults): names distinct, not dynacoord's own attributes, a prefix IAM can scope."""
    given = {field: values[name] for field, name in LAYOUT_PARAMETERS.items() if name in values}
    if given:
        TableLayout(**given)


def delete_stack(
    cfn_client: Any,
    stack_name: str,
    *,
    wait: bool = True,
    progress: Progress = noop,
    poll_interval: float = 5.0,
    timeout: float = 3600.0,
    clock: Clock | None = None,
) -> bool:
    """Delete the stack (and with it the table, unless deletion protection is on). False if the
    stack did not exist. With ``wait``, raises :class:`StackDeploymentError` listing the failed
    resource events unless the stack ends ``DELETE_COMPLETE``. The waits sleep on ``clock``."""
    _check_stack_name(stack_name)
    existing = _describe_stack(cfn_client, stack_name)
    if existing is None:
        return False
    stack_id = str(existing["StackId"])
    since = _latest_event_id(cfn_client, stack_id, stack_name)
    _cfn(cfn_client, "delete_stack", stack_name, f"delete stack {stack_name}", StackName=stack_id)
    logger.info("deleting stack %r", stack_name)
    progress(f"deleting stack {stack_name} ...")
    if not wait:
        return True
    stack = _wait_stack(cfn_client, stack_id, stack_name, progress, poll_interval, timeout, clock)
    status = str(stack["StackStatus"])
    if status != "DELETE_COMPLETE":
        events = _failed_events(cfn_client, stack_id, stack_name, since)
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


# --- what a deletion keeps, and the alarms --------------------------------------------------------


def _template_resources(body: str) -> dict[str, dict[str, str]]:
    """``{logical id: {"Type": ..., "DeletionPolicy": ...}}`` of the template's resources, read
    from its text (the template is ours: two-space resource names, four-space properties)."""
    resources: dict[str, dict[str, str]] = {}
    section = body.split("\nResources:\n", 1)[1].split("\nOutputs:\n", 1)[0]
    current: dict[str, str] | None = None
    for line in section.splitlines():
        name = re.match(r"^  ([A-Za-z0-9]+):\s*$", line)
        if name:
            current = resources.setdefault(name[1], {})
            continue
        attribute = re.match(r"^    (Type|DeletionPolicy):\s*(\S+)", line)
        if attribute and current is not None:
            current[attribute[1]] = attribute[2]
    return resources


#: how to remove what a stack deletion keeps, by resource type (``{id}``: its physical id)
_REMOVE_WITH = {
    "AWS::DynamoDB::Table": "dynacoord --table {id} table delete --yes "
    "--disable-deletion-protection",
    "AWS::KMS::Key": "aws kms schedule-key-deletion --key-id {id} --pending-window-in-days 30 "
    "(only once the table it encrypts is deleted: without the key its data is unreadable)",
    "AWS::SQS::Queue": "aws sqs delete-queue --queue-url {id}",
    "AWS::Logs::LogGroup": "aws logs delete-log-group --log-group-name {id}",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class RetainedResource:
    """A resource of the stack that its deletion keeps (``DeletionPolicy: Retain``)."""

    logical_id: str
    resource_type: str
    #: the table name, the key ARN, the queue URL, the log group name
    physical_id: str
    #: the command that removes it once it is no longer wanted
    remove_with: str


def retained_resources(cfn_client: Any, stack_name: str) -> list[RetainedResource]:
    """The resources of the stack that :func:`delete_stack` keeps: those the bundled template
    marks ``DeletionPolicy: Retain`` (the table, a key it made, the relay's dead-letter queue and
    both log groups), with their physical ids and the command that removes each. Empty when the
    stack does not exist. One ``ListStackResources`` page per 100 resources."""
    _check_stack_name(stack_name)
    kept = {
        logical: spec["Type"]
        for logical, spec in _template_resources(template_body()).items()
        if spec.get("DeletionPolicy") == "Retain"
    }
    if _describe_stack(cfn_client, stack_name) is None:
        return []
    found: list[RetainedResource] = []
    token: str | None = None
    while True:
        page = _cfn(
            cfn_client,
            "list_stack_resources",
            stack_name,
            f"list the resources of stack {stack_name}",
            StackName=stack_name,
            **({"NextToken": token} if token else {}),
        )
        for summary in page.get("StackResourceSummaries") or []:
            logical = str(summary.get("LogicalResourceId") or "")
            physical = str(summary.get("PhysicalResourceId") or "")
            if logical in kept and physical and summary.get("ResourceStatus") != "DELETE_COMPLETE":
                found.append(
                    RetainedResource(
                        logical_id=logical,
                        resource_type=kept[logical],
                        physical_id=physical,
                        remove_with=_REMOVE_WITH.get(kept[logical], "").format(id=physical),
                    )
                )
        token = page.get("NextToken")
        if not token:
            return found


#: What each alarm of the bundled template means and the first thing to run; docs/deployment.md's
#: runbook has the rest (a test holds the two and the template to the same alarms).
ALARM_RUNBOOK: dict[str, str] = {
    "TableThrottleAlarm": "writes to the table are throttled: `dynacoord table verify`, then raise "
    "WriteCapacity (PROVISIONED) or find the hot key (CloudWatch Contributor Insights)",
    "RelayErrorAlarm": "relay invocations fail: read the relay's log group; events stay pending "
    "and the sweeper delivers them (`dynacoord outbox stats`)",
    "SweeperErrorAlarm": "sweeper invocations fail: read the sweeper's log group; nothing retries "
    "failed events or expired leases meanwhile (`dynacoord outbox stats`)",
    "RelayThrottleAlarm": "the relay is throttled (account or reserved concurrency): raise the "
    "Lambda concurrency limit; the sweeper delivers meanwhile",
    "RelayLagAlarm": "the relay reads the stream over 5 minutes late: relay errors or throttles, "
    "or slow handlers (raise RelayBatchSize, RelayMemorySize)",
    "DeadLetterAlarm": "stream batches reached the dead-letter queue: informational, their events "
    "are still in the table and the sweeper delivers them; check `dynacoord outbox stats`, then "
    "purge the queue",
    "OutboxLagAlarm": "the oldest due event waits too long: `dynacoord outbox stats`, "
    "`dynacoord outbox pending --due`, handler errors in the logs",
    "OutboxExpiredLeaseAlarm": "a lease ran out without an outcome (workers dying or frozen): "
    "`dynacoord outbox stats`, the functions' timeouts and memory, `dynacoord outbox show ID`",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class StackAlarm:
    """One alarm of the stack and its CloudWatch state."""

    logical_id: str
    name: str
    #: ``OK``, ``ALARM``, ``INSUFFICIENT_DATA``, or ``MISSING`` (named by an output, not found)
    state: str
    reason: str
    updated: str
    #: what it means and what to run first (:data:`ALARM_RUNBOOK`)
    runbook: str


@dataclass(frozen=True, kw_only=True, slots=True)
class StackStatus:
    """The result of :func:`stack_status`."""

    stack_name: str
    status: str
    status_reason: str
    outputs: dict[str, str]
    alarms: list[StackAlarm]

    @property
    def alarming(self) -> list[StackAlarm]:
        """The alarms in state ``ALARM``."""
        return [a for a in self.alarms if a.state == "ALARM"]


def stack_status(cfn_client: Any, cloudwatch_client: Any, stack_name: str) -> StackStatus:
    """The stack's status, outputs and alarms with their CloudWatch state.

    The alarms are those named by the stack's ``*AlarmName`` outputs, and those CloudFormation
    named ``{stack}-{LogicalId}-...`` for the template's alarms (found by their prefix: an
    emulator without the outputs, a stack deployed from an older template). Requests: one
    ``DescribeStacks``, one ``DescribeAlarms`` per 100 alarms of the prefix, and one for those
    only the outputs named."""
    _check_stack_name(stack_name)
    stack = _describe_stack(cfn_client, stack_name)
    if stack is None:
        raise StackDeploymentError(
            f"stack {stack_name} does not exist", stack_name=stack_name, events=[]
        )
    outputs = _outputs(stack)
    alarm_ids = [
        logical
        for logical, spec in _template_resources(template_body()).items()
        if spec.get("Type") == "AWS::CloudWatch::Alarm"
    ]
    named = {
        outputs[f"{logical}Name"]: logical for logical in alarm_ids if f"{logical}Name" in outputs
    }
    pattern = re.compile(rf"^{re.escape(stack_name)}-({'|'.join(alarm_ids)})-[A-Za-z0-9]+$")
    found: dict[str, Mapping[str, Any]] = {}
    by_name: dict[str, str] = dict(named)
    paginator = cloudwatch_client.get_paginator("describe_alarms")
    for page in paginator.paginate(AlarmNamePrefix=f"{stack_name}-", AlarmTypes=["MetricAlarm"]):
        for alarm in page.get("MetricAlarms") or []:
            name = str(alarm["AlarmName"])
            match = pattern.match(name)
            if name in named or match:
                found[name] = alarm
                by_name.setdefault(name, match[1] if match else named[name])
    missing = [name for name in named if name not in found]
    if missing:
        answer = cloudwatch_client.describe_alarms(AlarmNames=missing[:100])
        for alarm in answer.get("MetricAlarms") or []:
            found[str(alarm["AlarmName"])] = alarm
    alarms = []
    for name, logical in sorted(by_name.items(), key=lambda item: alarm_ids.index(item[1])):
        alarm = found.get(name, {})
        updated = alarm.get("StateUpdatedTimestamp")
        alarms.append(
            StackAlarm(
                logical_id=logical,
                name=name,
                state=str(alarm.get("StateValue", "MISSING")),
                reason=str(alarm.get("StateReason", "")),
                updated=updated.isoformat() if isinstance(updated, datetime) else "",
                runbook=ALARM_RUNBOOK.get(logical, ""),
            )
        )
    return StackStatus(
        stack_name=stack_name,
        status=str(stack.get("StackStatus", "")),
        status_reason=str(stack.get("StackStatusReason", "")),
        outputs=outputs,
        alarms=alarms,
    )
