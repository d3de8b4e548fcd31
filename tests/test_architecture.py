"""The package's shape: imports run one way (no cycles, type-only imports included), each backend
is a package, and every exported error is raised somewhere."""

from __future__ import annotations

import ast
import pathlib

import dynacoord
from dynacoord import errors

PACKAGE_ROOT = pathlib.Path(dynacoord.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE_ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in PACKAGE_ROOT.rglob("*.py")}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    # a package's own name is its anchor for level 1; a module's anchor is its parent
    anchor = base if is_package else base[:-1]
    if node.level > 1:
        anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """Every ``import``/``from .. import`` in dynacoord, at any depth (functions and
    ``if TYPE_CHECKING:`` blocks included), as edges between dynacoord modules."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    # ``from . import codec`` imports the module codec, not the package
                    targets.append(sub if sub in modules else base)
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = import_graph()
    assert graph.get("dynacoord.outbox.worker")
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]


def test_primitives_never_import_a_backend() -> None:
    graph = import_graph()
    primitives = [
        m
        for m in graph
        if not m.startswith(("dynacoord.backends", "dynacoord._cli"))
        # entry points at the top of the graph: the package, the CLI, the test helpers and the
        # bundled stack's Lambda functions
        and m
        not in {
            "dynacoord",
            "dynacoord.cli",
            "dynacoord.__main__",
            "dynacoord.testing",
            "dynacoord.serverless",
        }
    ]
    offenders = {
        m: sorted(t for t in graph[m] if t.startswith("dynacoord.backends")) for m in primitives
    }
    assert {m: t for m, t in offenders.items() if t} == {}


def test_each_backend_is_a_package_with_one_module_per_primitive() -> None:
    for backend in ("dynamodb", "redis", "mongo"):
        folder = PACKAGE_ROOT / "backends" / backend
        assert (folder / "__init__.py").is_file(), backend
        for primitive in (
            "locks",
            "breaker",
            "cache",
            "checkpoints",
            "counters",
            "idempotency",
            "outbox",
            "runs",
        ):
            assert (folder / f"{primitive}.py").is_file(), (backend, primitive)
    assert sorted(p.name for p in (PACKAGE_ROOT / "backends").glob("*.py")) == ["__init__.py"]


def test_every_exported_error_is_raised_somewhere() -> None:
    sources = "\n".join(p.read_text() for p in PACKAGE_ROOT.rglob("*.py") if p.name != "errors.py")
    dead = []
    for name in errors.__all__:
        cls = getattr(errors, name)
        subclasses = [c.__name__ for c in cls.__subclasses__()]
        used = f"{name}(" in sources or f"raise {name}" in sources
        if not used and not subclasses:
            dead.append(name)
    assert dead == []
