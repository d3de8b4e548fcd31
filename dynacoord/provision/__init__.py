"""Create, check and deploy the dynacoord table (directly or with the bundled CloudFormation stack).

The operator's path, in the order the stack is built, one module each:

* :mod:`.table`: :func:`ensure_table` / :func:`create_table` call DynamoDB directly (scripts,
  tests, DynamoDB Local); :func:`verify_table` checks any existing table and lists what is wrong
  with it; :func:`delete_table` removes one (also one a deleted stack kept).
* :mod:`.bundle`: :func:`package_relay` builds the code of the stack's relay and sweeper,
  :func:`upload_bundle` puts it in S3.
* :mod:`.stack`: :func:`deploy_stack` creates or updates the bundled CloudFormation stack
  (:func:`template_body`), which also carries point-in-time recovery, encryption, deletion
  protection, the serverless outbox relay and a least-privilege managed IAM policy.
* :mod:`.iam`: :func:`iam_policy` builds the same policy as JSON for roles managed elsewhere,
  optionally narrowed to some namespaces.

Every AWS request goes through one translation point (``_aws.call``): a refusal is a
:class:`~dynacoord.errors.BackendError` (a :class:`~dynacoord.errors.StackDeploymentError` for
CloudFormation) naming what was being done, chained from botocore's ``ClientError``. Functions
that wait take a ``progress`` callback that gets one human-readable line per wait step (the CLI
prints them on stderr; they also log at DEBUG level) and a ``clock`` (default the system's; pass
the backend's, or a :class:`~dynacoord.ManualClock` in tests).
"""

from __future__ import annotations

from .bundle import RelayBundle, package_relay, upload_bundle
from .iam import INDEX_ACTIONS, ITEM_ACTIONS, METADATA_ACTIONS, iam_policy
from .stack import (
    ALARM_RUNBOOK,
    STACK_PARAMETERS,
    RetainedResource,
    StackAlarm,
    StackDeployment,
    StackParameterValue,
    StackStatus,
    check_stack_parameters,
    check_stack_rules,
    delete_stack,
    deploy_stack,
    retained_resources,
    stack_outputs,
    stack_parameters,
    stack_status,
    template_body,
    template_path,
)
from .table import (
    GSI_NAME,
    TTL_ATTRIBUTE,
    create_table,
    delete_table,
    ensure_table,
    is_warning,
    table_definition,
    verify_table,
)

__all__ = [
    "ALARM_RUNBOOK",
    "GSI_NAME",
    "INDEX_ACTIONS",
    "ITEM_ACTIONS",
    "METADATA_ACTIONS",
    "STACK_PARAMETERS",
    "TTL_ATTRIBUTE",
    "RelayBundle",
    "RetainedResource",
    "StackAlarm",
    "StackDeployment",
    "StackParameterValue",
    "StackStatus",
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
    "retained_resources",
    "stack_outputs",
    "stack_parameters",
    "stack_status",
    "table_definition",
    "template_body",
    "template_path",
    "upload_bundle",
    "verify_table",
]
