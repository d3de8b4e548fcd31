"""A table whose TTL is off or on another attribute: the advice is the layout's ``ttl`` name
(never "turn your TTL off"), and a backend on such a table says so once, in the log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from dynacoord import DynamoDBBackend, TableLayout
from dynacoord.backends.dynamodb._verify import wait_for_ttl_checks
from dynacoord.errors import TableNotReadyError
from dynacoord.provision import create_table, ensure_table, verify_table
from dynacoord.testing import DUMMY_CREDENTIALS

VERIFY_LOGGER = "dynacoord.backends.dynamodb._verify"


@pytest.fixture()
def ddb() -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("dynamodb", **DUMMY_CREDENTIALS)


def _other_client() -> Any:
    import boto3

    return boto3.client("dynamodb", **DUMMY_CREDENTIALS)


def _table_with_ttl_on(client: Any, name: str, attribute: str | None) -> None:
    create_table(client, name)
    client.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": False, "AttributeName": "ttl"}
    )
    if attribute is not None:
        client.update_time_to_live(
            TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": attribute}
        )


def test_ensure_table_advises_the_layouts_ttl_name_not_disabling_the_other_ttl(ddb: Any) -> None:
    _table_with_ttl_on(ddb, "apptable", "expires")
    with pytest.raises(TableNotReadyError) as raised:
        ensure_table(ddb, "apptable")
    message = str(raised.value)
    assert "disable" not in message
    assert "TableLayout(ttl='expires')" in message
    assert """--table-layout '{"ttl":"expires"}'""" in message
    # and the advice works: with that layout the table is complete
    ensure_table(ddb, "apptable", layout=TableLayout(ttl="expires"))
    assert verify_table(ddb, "apptable", layout=TableLayout(ttl="expires")) == []


def test_verify_names_the_layout_fix_for_ttl_on_another_attribute(ddb: Any) -> None:
    _table_with_ttl_on(ddb, "apptable", "expires")
    problems = verify_table(ddb, "apptable", layout=TableLayout(prefix="DC#"))
    [ttl] = [p for p in problems if p.startswith("TTL")]
    assert """--table-layout '{"prefix":"DC#","ttl":"expires"}'""" in ttl
    assert "disable" not in ttl


@pytest.mark.parametrize(
    ("attribute", "expected"),
    [
        (None, "TTL is DISABLED"),
        ("expires", "TableLayout(ttl='expires')"),
    ],
)
def test_a_backend_on_a_table_without_its_ttl_warns_once(
    ddb: Any, caplog: pytest.LogCaptureFixture, attribute: str | None, expected: str
) -> None:
    _table_with_ttl_on(
        _other_client(), "apptable", attribute
    )  # the backend's client has not seen it
    caplog.set_level(logging.WARNING, logger=VERIFY_LOGGER)
    backend = DynamoDBBackend(ddb, table_name="apptable")
    backend.cache().set("a", 1)
    backend.cache().set("b", 2)
    DynamoDBBackend(ddb, table_name="apptable", namespace="other").cache().set("c", 3)
    wait_for_ttl_checks()  # the TTL is read on a thread of its own
    warnings = [r for r in caplog.records if r.name == VERIFY_LOGGER]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    text = warnings[0].getMessage()
    assert "'apptable'" in text and expected in text
    assert "never" in text  # what it means: its items are never swept


def test_a_backend_on_a_complete_table_says_nothing(
    ddb: Any, caplog: pytest.LogCaptureFixture
) -> None:
    create_table(_other_client(), "complete")
    caplog.set_level(logging.WARNING, logger=VERIFY_LOGGER)
    DynamoDBBackend(ddb, table_name="complete").cache().set("a", 1)
    wait_for_ttl_checks()
    assert [r for r in caplog.records if r.name == VERIFY_LOGGER] == []


def test_a_role_without_describe_time_to_live_still_works(
    ddb: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from botocore.exceptions import ClientError

    create_table(_other_client(), "norole")

    def refuse(**kwargs: Any) -> None:
        raise ClientError(
            {"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "DescribeTimeToLive"
        )

    ddb.meta.events.register("before-call.dynamodb.DescribeTimeToLive", refuse)
    caplog.set_level(logging.WARNING, logger=VERIFY_LOGGER)
    backend = DynamoDBBackend(ddb, table_name="norole")
    backend.cache().set("a", 1)
    assert backend.cache().get("a") == 1
