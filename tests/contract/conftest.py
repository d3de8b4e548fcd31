"""The contract suite once more on DynamoDB in an application's own single table.

``make_backend`` here is the one of tests/conftest.py plus two kinds: ``moto_layout`` (every
contract test, on moto) and ``dynamodb_layout`` (the modules in :data:`LAYOUT_LOCAL_MODULES`,
on DynamoDB Local: its concurrency cases, which moto skips, at a bounded cost). Both are backends
with a :class:`~dynacoord.TableLayout` (``PK``/``SK``/``GSI1``/``GSI1PK``/``GSI1SK``, prefix
``DC#``) on a table that also holds an application's items, which must be unchanged after each
test (tests/backends_fixtures.py). Their ``kind`` is their table's (``moto``, ``dynamodb``), so
the suite's per-kind expectations apply to them unchanged.
"""

from __future__ import annotations

import pytest

from tests.backends_fixtures import (  # noqa: F401  (fixtures are registered by import)
    dynamodb_layout_backend_factory,
    dynamodb_layout_table,
    moto_layout_backend_factory,
)
from tests.conftest import CONTRACT_BACKENDS, BackendFactory, backend_factory

#: kind of the parametrization -> the kind of its table
LAYOUT_KINDS = {"moto_layout": "moto", "dynamodb_layout": "dynamodb"}
#: the modules that also run on DynamoDB Local with a layout, where DynamoDB's own checks of
#: expressions apply: the outbox (transactions, index queries and their pages, batched claims,
#: SET of the index keys) and checkpoints (key conditions, projections, batch writes). Every
#: module runs on moto with a layout; all of them here too would add about a minute to
#: ``make test``.
LAYOUT_LOCAL_MODULES = frozenset({"test_outbox", "test_checkpoints"})


@pytest.fixture(params=[*CONTRACT_BACKENDS, *LAYOUT_KINDS])
def make_backend(request: pytest.FixtureRequest) -> BackendFactory:
    """tests/conftest.py's ``make_backend``, with the layout kinds."""
    kind = request.param
    if kind in LAYOUT_KINDS:
        factory = request.getfixturevalue(f"{kind}_backend_factory")
    else:
        factory = backend_factory(request, kind)
    factory.kind = LAYOUT_KINDS.get(kind, kind)  # type: ignore[attr-defined]
    factory.layout = kind in LAYOUT_KINDS  # type: ignore[attr-defined]
    return factory


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the DynamoDB Local layout runs to :data:`LAYOUT_LOCAL_MODULES`."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("make_backend") if callspec is not None else None
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        if kind == "dynamodb_layout" and name not in LAYOUT_LOCAL_MODULES:
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
