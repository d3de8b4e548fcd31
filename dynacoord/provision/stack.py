"""The bundled CloudFormation stack: deploy (create or update), delete (and what it keeps),
outputs, and the status of the stack's alarms. The template and its parameters (checked against
the template's allowed values and ``Rules`` before anything is uploaded or sent) live in
:mod:`._template`; their public names are re-exported here.

Every CloudFormation request goes through :func:`._aws.call`; a refusal is a
:class:`~dynacoord.errors.StackDeploymentError`. Waits poll on the caller's clock.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .._clock import Clock
from .._table_schema import DEFAULT_LAYOUT, TableLayout
from ..errors import DynacoordError, StackDeploymentError
from ._aws import Progress, Refusal, call, noop, request, wait_for
from ._template import (
    LAYOUT_PARAMETERS,
    STACK_PARAMETERS,
    StackParameterValue,
    _bundled_template_parameters,
    _check_layout,
    _effective_parameters,
    _kept_parameters,
    _previous_values,
    _stack_parameters,
    _template_parameters,
    check_stack_parameters,
    check_stack_rules,
    layout_parameters,
    template_body,
    template_path,
)

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

#: The template creates an IAM managed policy and (with the relay) a role, without fixed names.
_CAPABILITIES = ["CAPABILITY_IAM"]
_STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}$")
_MAX_EVENT_PAGES = 20


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


def _check_stack_name(stack_name: str) -> None:
    if not isinstance(stack_name, str) or not _STACK_NAME.match(stack_name):
        raise ValueError(
            "stack name must start with a letter and contain only letters, digits and '-' "
            f"(at most 128 characters), got {stack_name!r}"
        )


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
    "failed events or expired leases meanwhile (`dynacoord outbox stats`; a one-off drain with "
    "the relay's handlers: `dynacoord outbox work --until-idle --handler MODULE:HANDLERS`)",
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


def _runbook_options(outputs: Mapping[str, str], parameters: Mapping[str, str]) -> str:
    """The global options that point a pasted ``dynacoord`` command at the stack's outbox:
    ``--table`` (the ``TableName`` output, else the parameter), ``--namespace`` (the
    ``RelayNamespace`` parameter, the namespace the outbox alarms measure) and, for a layout
    other than dynacoord's own, ``--table-layout``; shell-quoted. Without them a command pasted
    during an alarm reads table ``dynacoord``, namespace ``default``: an empty outbox, a false
    all-clear. A table name the stack does not say is left as ``TABLE`` (the command then
    fails on a missing table rather than reading another one)."""
    table = outputs.get("TableName") or parameters.get("TableName") or "TABLE"
    words = ["--table", table, "--namespace", parameters.get("RelayNamespace") or "default"]
    fields = {
        field: parameters[name] for field, name in LAYOUT_PARAMETERS.items() if parameters.get(name)
    }
    try:
        layout = TableLayout(**fields)
    except (TypeError, ValueError):  # a template of another version: dynacoord's own names
        layout = DEFAULT_LAYOUT
    if not layout.is_default:
        words += ["--table-layout", layout.to_json()]
    return " ".join(shlex.quote(word) for word in words)


def _runbook(text: str, options: str) -> str:
    """``text`` with ``options`` after the ``dynacoord`` of each command in backquotes."""
    return text.replace("`dynacoord ", f"`dynacoord {options} ")


@dataclass(frozen=True, kw_only=True, slots=True)
class StackAlarm:
    """One alarm of the stack and its CloudWatch state."""

    logical_id: str
    name: str
    #: ``OK``, ``ALARM``, ``INSUFFICIENT_DATA``, or ``MISSING`` (named by an output, not found)
    state: str
    reason: str
    updated: str
    #: what it means when it fires and what to run first (:data:`ALARM_RUNBOOK`), its
    #: ``dynacoord`` commands given the stack's table, namespace and layout (see
    #: :func:`_runbook_options`)
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
    parameters = {
        str(p["ParameterKey"]): str(p.get("ParameterValue") or "")
        for p in stack.get("Parameters") or []
    }
    options = _runbook_options(outputs, parameters)
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
                runbook=_runbook(ALARM_RUNBOOK.get(logical, ""), options),
            )
        )
    return StackStatus(
        stack_name=stack_name,
        status=str(stack.get("StackStatus", "")),
        status_reason=str(stack.get("StackStatusReason", "")),
        outputs=outputs,
        alarms=alarms,
    )
