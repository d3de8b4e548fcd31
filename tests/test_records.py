"""Record (dynacoord._compat), which is typing.NamedTuple: what code and users rely on from a
NamedTuple holds for the records the library returns."""

from __future__ import annotations

import copy
import pickle

import pytest

from dynacoord._compat import Record
from dynacoord.cache import CacheEntry
from dynacoord.keys import ItemKey, Kind, ParsedKey
from dynacoord.locks import AcquireResult, LockInfo


class Point(Record):
    """A test record."""

    x: int
    y: int
    label: str | None = None

    @property
    def total(self) -> int:
        return self.x + self.y


def test_fields_defaults_and_methods_are_a_named_tuples() -> None:
    p = Point(1, 2)
    assert (p.x, p.y, p.label, p.total) == (1, 2, None, 3)
    assert Point._fields == ("x", "y", "label")
    assert Point._field_defaults == {"label": None}
    assert Point.__match_args__ == ("x", "y", "label")
    assert p._asdict() == {"x": 1, "y": 2, "label": None}
    assert p._replace(label="a") == Point(1, 2, "a")
    assert Point._make([3, 4, "b"]) == Point(x=3, y=4, label="b")
    assert repr(p) == "Point(x=1, y=2, label=None)"
    assert Point.__doc__ == "A test record."


def test_it_is_a_tuple_equal_and_hashed_as_one() -> None:
    p = Point(1, 2, "a")
    assert isinstance(p, tuple)
    assert p == (1, 2, "a") and hash(p) == hash((1, 2, "a"))
    x, y, label = p
    assert (x, y, label) == (1, 2, "a")
    match p:
        case Point(a, b):
            assert (a, b) == (1, 2)
        case _:
            pytest.fail("a record did not match its class pattern")


def test_it_is_immutable_and_has_no_instance_dict() -> None:
    p = Point(1, 2)
    with pytest.raises(AttributeError):
        p.x = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        p.other = 5  # type: ignore[attr-defined]
    assert not hasattr(p, "__dict__")


@pytest.mark.parametrize(
    "make",
    [
        lambda: Point(1),
        lambda: Point(1, 2, "a", "b"),
        lambda: Point(1, 2, z=3),
        lambda: Point(1, 2, x=3),
        lambda: Point._make([1, 2]),
    ],
    ids=["missing", "too many", "unknown name", "repeated", "make short"],
)
def test_wrong_arguments_raise_type_error(make: object) -> None:
    with pytest.raises(TypeError):
        make()  # type: ignore[operator]


def test_a_subclass_that_adds_methods_keeps_its_bases_fields() -> None:
    class Labelled(Point):
        __slots__ = ()  # as a NamedTuple's subclass keeps no instance dict

        def describe(self) -> str:
            return f"{self.label}: {self.x},{self.y}"

    p = Labelled(1, 2, "a")
    assert p.describe() == "a: 1,2" and Labelled._fields == ("x", "y", "label")
    assert p._replace(x=5) == Labelled(5, 2, "a") and not hasattr(p, "__dict__")


def test_a_field_without_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="field b cannot follow default field a"):

        class Bad(Record):
            a: int = 0
            b: int


@pytest.mark.parametrize(
    "record",
    [
        Point(1, 2, "a"),
        LockInfo("k", "owner", 7, 1_000),
        AcquireResult(None, LockInfo("k", "owner", 7, 1_000)),
        ItemKey("pk", "sk"),
        ParsedKey(Kind.LOCK, "ns", "k"),
        CacheEntry("text", 5),
    ],
    ids=lambda r: type(r).__name__,
)
def test_records_pickle_and_copy(record: tuple[object, ...]) -> None:
    assert pickle.loads(pickle.dumps(record)) == record
    assert type(pickle.loads(pickle.dumps(record))) is type(record)
    assert copy.copy(record) == record and copy.deepcopy(record) == record


def test_the_librarys_records_keep_their_named_fields() -> None:
    info = LockInfo("k", "owner", 7, 1_500)
    assert info.expires_at == 1.5 and info._replace(fence=8).fence == 8
    assert AcquireResult(info).holder is None
    assert ItemKey("p", "s").as_dict() == {"pk": "p", "sk": "s"}
    assert ItemKey("p", "s", "g", "h").as_dict()["gsi1sk"] == "h"
