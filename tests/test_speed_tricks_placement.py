"""Where speed tricks may live (docs/architecture.md, "Where speed tricks may live"): an object's
class is swapped (``x.__class__ = C``, ``setattr(x, "__class__", C)``,
``object.__setattr__(x, "__class__", C)``) only in the marshaller and the record readers, never
in a primitive, a store or the outbox."""

from __future__ import annotations

import ast
import pathlib

import dynacoord

PACKAGE_ROOT = pathlib.Path(dynacoord.__file__).parent

#: the only modules allowed hand-built values and fast record readers
ALLOWED = {
    pathlib.Path("backends/dynamodb/_marshal.py"),
    pathlib.Path("_items.py"),
}


def _class_swaps(tree: ast.AST) -> list[int]:
    """Line numbers of every statement of ``tree`` that sets an object's ``__class__``."""
    lines: list[int] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("setattr", "__setattr__") and any(
                isinstance(arg, ast.Constant) and arg.value == "__class__" for arg in node.args
            ):
                lines.append(node.lineno)
        for target in targets:
            for part in ast.walk(target):  # a, b.__class__ = ... and (x.__class__) = ... alike
                if isinstance(part, ast.Attribute) and part.attr == "__class__":
                    lines.append(part.lineno)
    return lines


def test_the_finder_sees_every_way_of_swapping_a_class():
    source = (
        "x.__class__ = C\n"
        "a, y.__class__ = 1, C\n"
        "setattr(x, '__class__', C)\n"
        "object.__setattr__(x, '__class__', C)\n"
        "name = x.__class__.__name__\n"  # a read is not a swap
        "if x.__class__ is int: pass\n"
    )
    assert _class_swaps(ast.parse(source)) == [1, 2, 3, 4]


def test_only_the_marshaller_and_the_record_readers_swap_an_objects_class():
    found = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        module = path.relative_to(PACKAGE_ROOT)
        if module in ALLOWED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found += [f"{module}:{line}" for line in _class_swaps(tree)]
    assert not found, (
        "an object's __class__ is set outside the marshaller and the record readers "
        "(build a plain dataclass or NamedTuple; see docs/architecture.md, 'Where speed tricks "
        f"may live'): {found}"
    )


def test_records_are_the_standard_librarys_named_tuples():
    """No hand-written stand-in for NamedTuple: a cold start did not show what it saved."""
    import typing

    from dynacoord._compat import Record

    assert Record is typing.NamedTuple
