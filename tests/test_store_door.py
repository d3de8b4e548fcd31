"""The Redis and MongoDB stores reach the server only through their backend's door:
``RedisConn`` (``backends/redis/_conn.py``) and ``MongoCollection``
(``backends/mongo/_collection.py``) hold the raw client, and every request goes through their
``send`` (error translation and metrics, in one place, as ``DynamoTable.call`` on DynamoDB).

Two rules, checked on the syntax tree of every other module of the two backend packages:

1. no attribute read names a raw client's holder (``conn.client``, ``coll.collection``, the
   stores' old ``self._c`` alias, a metrics proxy's ``_client``/``_collection``, a cluster
   node's ``redis_connection``): a store never gets hold of the raw object;
2. no call names a method that only a raw client, pipeline or cursor has (``hgetall``,
   ``find_one``, ``pipeline``, ``bulk_write``, ``limit``...): names computed from redis-py's and
   pymongo's own classes, less the methods of Python's built-in types (``get``, ``find``,
   ``update``... which stores call on dicts and strings) and the door's own methods. A raw
   object reached any other way is still caught where it is used.

The self-tests below run the checker on small sources, so a rule that stopped seeing anything
would fail here too.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import dynacoord

pytest.importorskip("redis")
pytest.importorskip("pymongo")

BACKENDS = pathlib.Path(dynacoord.__file__).parent / "backends"
#: the one module per backend that may hold and call the raw client
DOORS = {"redis": "_conn.py", "mongo": "_collection.py"}
#: attribute names that hold a raw client (rule 1)
RAW_HOLDERS = frozenset(
    {"client", "collection", "_client", "_collection", "_c", "_redis", "redis_connection"}
)


def _methods(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name))}


def raw_methods() -> frozenset[str]:
    """Rule 2's names: methods of redis-py's and pymongo's client, pipeline and cursor
    classes that Python's built-in types and the doors do not have."""
    import pymongo.collection
    import pymongo.command_cursor
    import pymongo.cursor
    import redis
    import redis.client
    import redis.cluster

    from dynacoord.backends.mongo._collection import MongoCollection
    from dynacoord.backends.redis._conn import RedisConn

    raw: set[str] = set()
    for cls in (
        redis.Redis,
        redis.cluster.RedisCluster,
        redis.client.Pipeline,
        redis.cluster.ClusterPipeline,
        pymongo.collection.Collection,
        pymongo.cursor.Cursor,
        pymongo.command_cursor.CommandCursor,
    ):
        raw |= _methods(cls)
    for cls in (str, bytes, dict, list, set, tuple, int, float, RedisConn, MongoCollection):
        raw -= _methods(cls)
    # making a client (RedisBackend.from_env) is not using one
    return frozenset(raw - {"from_url", "from_pool"})


def touches(source: str, filename: str, raw: frozenset[str]) -> list[str]:
    """Where ``source`` reads a raw client's holder or calls a raw-only method."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and node.attr in RAW_HOLDERS
        ):
            found.append(f"{filename}:{node.lineno}: reads .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in raw
        ):
            found.append(f"{filename}:{node.lineno}: calls .{node.func.attr}()")
    return found


def _store_modules() -> list[pathlib.Path]:
    paths = []
    for backend, door in DOORS.items():
        paths += [p for p in sorted((BACKENDS / backend).glob("*.py")) if p.name != door]
    return paths


def test_stores_reach_redis_and_mongodb_only_through_the_door() -> None:
    raw = raw_methods()
    modules = _store_modules()
    assert {p.name for p in modules} >= {"locks.py", "outbox.py", "__init__.py"}
    found = []
    for path in modules:
        found += touches(path.read_text(), str(path.relative_to(BACKENDS)), raw)
    found.sort(key=lambda where: (where.split(":")[0], int(where.split(":")[1])))
    assert not found, (
        "call RedisConn / MongoCollection (add a small method there if none fits), "
        "never the raw client:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        "self._conn.client.hgetall(key)",
        "raw = conn.client",
        "self._c.find_one(key)",
        "coll.collection.create_index(keys)",
        "pipe.hmget(key, fields)",  # a raw pipeline, however it was reached
        "self._store.bulk_write(ops)",
        "cursor.sort('gsi1sk').limit(5)",
        "node.redis_connection.pipeline()",
    ],
)
def test_the_checker_sees_a_raw_call(source: str) -> None:
    assert touches(source, "store.py", raw_methods())


@pytest.mark.parametrize(
    "source",
    [
        "self._conn.call('cache get', 'hmget', key, fields)",
        "self._coll.call('lock get', 'find_one', key)",
        "self._conn.run(_SCRIPT, keys, args, 'lock acquire')",
        "doc.get('w'); text.find('#'); fields.update(more); items.sort()",
        "self.client = client",  # the backend keeps the user's client as given
    ],
)
def test_the_checker_passes_door_calls_and_builtin_methods(source: str) -> None:
    assert touches(source, "store.py", raw_methods()) == []
