"""The IAM policy of code that uses the table: the same least-privilege policy as the stack's
``AccessPolicy``, optionally narrowed to some namespaces (``dynamodb:LeadingKeys``)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .._table_schema import DEFAULT_LAYOUT, TableLayout
from ..keys import Kind, validate_namespace

__all__ = ["INDEX_ACTIONS", "ITEM_ACTIONS", "METADATA_ACTIONS", "iam_policy", "namespace_list"]

#: Item-level actions dynacoord uses on the table. TransactWriteItems / TransactGetItems have no
#: IAM action of their own: each Put/Update/Delete/ConditionCheck/Get inside a transaction is
#: authorized as PutItem/UpdateItem/DeleteItem/ConditionCheckItem/GetItem. BatchExecuteStatement
#: (the outbox's conditional batches) is authorized per statement as PartiQLUpdate/PartiQLDelete.
ITEM_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:Query",
    "dynamodb:BatchGetItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:PartiQLUpdate",
    "dynamodb:PartiQLDelete",
)
#: Actions on the index gsi1 (listing: cache keys, outbox events, stalled runs).
INDEX_ACTIONS = ("dynamodb:Query",)
#: Table metadata (readiness and TTL checks).
METADATA_ACTIONS = ("dynamodb:DescribeTable", "dynamodb:DescribeTimeToLive")
#: The kinds whose items carry gsi1pk (``KIND#{ns}#...``), see DESIGN.md section 2.
_INDEXED_KINDS = (Kind.CACHE, Kind.OUTBOX, Kind.RUN)
_TABLE_ARN = re.compile(r"^arn:[a-z-]+:dynamodb:[a-z0-9*-]*:[0-9*]*:table/[A-Za-z0-9_.*-]+$")


def namespace_list(namespaces: Iterable[str]) -> list[str]:
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
    layout: TableLayout | None = None,
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

    With a ``layout`` (:class:`~dynacoord.TableLayout`), the index statement names its index
    and every ``LeadingKeys`` pattern starts with its key prefix (``DC#LOCK#ns#*``): the
    policy still allows only dynacoord's items of those namespaces, none of yours.
    """
    if layout is None:
        layout = DEFAULT_LAYOUT
    elif not isinstance(layout, TableLayout):
        raise ValueError(f"layout must be a dynacoord.TableLayout, got {type(layout).__name__}")
    prefix = layout.prefix
    if not isinstance(table_arn, str) or not _TABLE_ARN.match(table_arn):
        raise ValueError(
            "table_arn must look like arn:aws:dynamodb:REGION:ACCOUNT:table/NAME, "
            f"got {table_arn!r}"
        )
    names = None if namespaces is None else namespace_list(namespaces)
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
        "Resource": f"{table_arn}/index/{layout.index}",
    }
    if names is not None:
        items["Condition"] = {
            "ForAllValues:StringLike": {
                "dynamodb:LeadingKeys": [
                    f"{prefix}{kind.value}#{ns}#*" for ns in names for kind in Kind
                ]
            }
        }
        index["Condition"] = {
            "ForAllValues:StringLike": {
                "dynamodb:LeadingKeys": [
                    f"{prefix}{kind.value}#{ns}#*" for ns in names for kind in _INDEXED_KINDS
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
