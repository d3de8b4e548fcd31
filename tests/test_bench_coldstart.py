"""``make bench`` section 5 (cold start): each side runs in a fresh process on a table of the
section's own, which stays empty, with dynacoord measured with and without its first-use check."""

from __future__ import annotations

import pytest

from bench import TINY, coldstart
from bench._harness import BenchEnv, RequestCounter
from dynacoord.provision import create_table
from dynacoord.testing import DynamoDBLocal, unique_name

pytestmark = pytest.mark.integration


def test_a_pair_runs_every_side_and_leaves_the_table_empty(dynamodb_local: DynamoDBLocal) -> None:
    counter = RequestCounter()
    client = counter.attach(dynamodb_local.client())
    shared = unique_name("shared")
    create_table(client, shared)
    env = BenchEnv(scale=TINY, ddb=dynamodb_local, client=client, table=shared, counter=counter)
    own = unique_name("cold")
    create_table(client, own)
    children = coldstart._Children(env, own)
    sides = children.pair(0, dynacoord_first=True)
    assert set(sides) == {
        coldstart.WITH_CHECK,
        coldstart.WITHOUT_CHECK,
        coldstart.RAW,
        coldstart.CHECK_SENT_EARLY,
    }
    for sample in sides.values():
        assert sample["first_op_ms"] > 0 and sample["to_first_result_ms"] > sample["first_op_ms"]
    # each process's lock items are deleted after it: DescribeTable stays as fast as on an
    # empty table, and the shared table is not touched
    assert children.items() == 0
    assert client.scan(TableName=shared, Select="COUNT")["Count"] == 0
