"""The list of ``make mutate`` (tests/mutations/guards.toml) still points at real guards and tests.

A refactor that moves or rewrites a guard must update its entry: the entry's ``find`` text must
occur exactly once in its file, and every test it names must exist. Fast: reads files, starts no
server and runs no mutant (``make mutate`` does that).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from tests.mutations.run import ROOT, Guard, load

GUARDS = load()


@cache
def _test_names(path: Path) -> frozenset[str]:
    """``name`` and ``Class::name`` of the test functions of a test module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}::{item.name}")
    return frozenset(names)


def test_the_list_covers_every_backend() -> None:
    assert len(GUARDS) >= 30
    backends = {guard.backend for guard in GUARDS}
    assert {"dynamodb", "redis", "mongo"} <= backends
    assert backends <= {"dynamodb", "redis", "mongo", "all"}


@pytest.mark.parametrize("guard", GUARDS, ids=lambda g: g.id)
def test_each_guard_is_found_once_and_its_tests_exist(guard: Guard) -> None:
    path = ROOT / guard.file
    assert path.is_file(), f"{guard.id}: no file {guard.file}"
    text = path.read_text(encoding="utf-8")
    count = text.count(guard.find)
    assert count == 1, (
        f"{guard.id}: its find text occurs {count} times in {guard.file}: the guard moved or "
        "changed; update tests/mutations/guards.toml and run "
        f"`python -m tests.mutations.run --only {guard.id}`"
    )
    assert guard.replace != guard.find
    assert guard.tests and guard.guarantee
    for test in guard.tests:
        file, _, node = test.partition("::")
        test_path = ROOT / file
        assert test_path.is_file(), f"{guard.id}: no test file {file}"
        if node:
            name = node.split("[", 1)[0]
            assert name in _test_names(test_path), f"{guard.id}: no test {test}"
