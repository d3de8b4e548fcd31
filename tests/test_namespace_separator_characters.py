"""A namespace with a comma or a control character (tab, newline) is refused where namespaces
are validated: the stack's ``Namespaces`` parameter is comma-separated, so ``"a,b"`` would
become two namespaces in the policy, and a tab or newline is invisible in every listing
(issue 52 item 12)."""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import DynamoDBBackend, InvalidKeyError
from dynacoord.provision import check_stack_parameters, iam_policy

BAD = ["orders,billing", "a\tb", "line\nbreak", "bell\x07", "del\x7f"]


@pytest.mark.parametrize("namespace", BAD)
def test_the_backend_refuses_it(moto_table: Any, namespace: str) -> None:
    client, table = moto_table
    with pytest.raises(InvalidKeyError) as raised:
        DynamoDBBackend(client, table_name=table, namespace=namespace)
    assert repr(namespace) in str(raised.value)


@pytest.mark.parametrize("namespace", BAD)
def test_the_policy_and_the_stack_refuse_it(namespace: str) -> None:
    arn = "arn:aws:dynamodb:us-east-1:123456789012:table/t1"
    with pytest.raises(InvalidKeyError):
        iam_policy(arn, [namespace])
    with pytest.raises((InvalidKeyError, ValueError)):
        check_stack_parameters({"Namespaces": [namespace]})
    with pytest.raises((InvalidKeyError, ValueError)):
        check_stack_parameters({"RelayNamespace": namespace})


def test_the_comma_error_says_why(moto_table: Any) -> None:
    client, table = moto_table
    with pytest.raises(InvalidKeyError, match="comma"):
        DynamoDBBackend(client, table_name=table, namespace="a,b")


def test_ordinary_namespaces_still_pass(moto_table: Any) -> None:
    client, table = moto_table
    for namespace in ("orders", "team a", "é-ü", "v1.2_x"):
        assert DynamoDBBackend(client, table_name=table, namespace=namespace).namespace == namespace
