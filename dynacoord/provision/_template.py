"""The bundled CloudFormation template and the parameters it takes.

A stack's parameters are checked here, before anything is uploaded or sent: their names, their
text (bools, lists and dicts as CloudFormation takes them), the template's ``AllowedValues``,
``AllowedPattern``, ``MinValue``/``MaxValue`` and ``Rules``, a layout's parameters, and on an
update which parameters keep their previous values. Nothing here sends a request:
:mod:`.stack` does, and re-exports the public names.
"""

from __future__ import annotations

import ast
import importlib.resources
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._table_schema import TableLayout
from .bundle import HANDLER_SPEC
from .iam import namespace_list

__all__ = [
    "LAYOUT_PARAMETERS",
    "STACK_PARAMETERS",
    "StackParameterValue",
    "check_stack_parameters",
    "check_stack_rules",
    "layout_parameters",
    "template_body",
    "template_path",
]


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
        if key == "Namespaces":  # each one checked before the join (a comma would split it)
            namespace_list(list(value))
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
        try:
            options = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"stack parameter {key} is not JSON: {exc}") from None
        if not isinstance(options, dict):
            raise ValueError(f"stack parameter {key} must be a JSON object, got {text!r}")
        if key == "OutboxOptions":
            from ..outbox.options import stack_options

            # the names and the values the stack's functions would refuse at their first event
            try:
                stack_options(options)
            except ValueError as exc:
                raise ValueError(f"stack parameter OutboxOptions: {exc}") from None


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
