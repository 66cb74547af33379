"""rsc_health.record gives the node side's record classes what dataclasses gives the same class
body (without importing dataclasses on every job start): each record class of the node side is
rebuilt as a real dataclass from its own fields and both are driven alike; and the behaviours
one by one (positional and keyword init, defaults and factories, errors, repr, equality, hash,
frozen, asdict, replace) on small classes written twice."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
from typing import Any, ClassVar

import pytest

from rsc_health import record
from tests.fixtures.nodepyz import REPO, build_node


def _node_record_classes() -> list[type]:
    found = []
    for rel in build_node().node_side_files(REPO):
        if not rel.endswith(".py"):
            continue
        name = rel[:-3].replace("/", ".").removesuffix(".__init__")
        try:
            module = importlib.import_module(name)
        except ImportError:  # the flush's modules without SQLAlchemy
            continue
        for obj in vars(module).values():
            if (isinstance(obj, type) and obj.__module__ == name
                    and "__record_fields__" in obj.__dict__):
                found.append(obj)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


RECORDS = _node_record_classes()


def _twin(cls: type) -> type:
    """The same fields as a real dataclass (frozen as cls is)."""
    ns: dict[str, Any] = {"__annotations__": {}, "__qualname__": cls.__qualname__}
    for name, f in cls.__record_fields__.items():
        ns["__annotations__"][name] = "Any"
        kwargs: dict[str, Any] = {"repr": f.repr, "compare": f.compare}
        if f.default_factory is not record._MISSING:
            kwargs["default_factory"] = f.default_factory
        elif f.default is not record._MISSING:
            kwargs["default"] = f.default
        ns[name] = dataclasses.field(**kwargs)
    frozen = cls.__setattr__ is not object.__setattr__
    return dataclasses.dataclass(frozen=frozen)(type(cls.__name__, (), ns))


def _required(cls: type) -> dict[str, Any]:
    return {n: f"<{n}>" for n, f in cls.__record_fields__.items()
            if f.default is record._MISSING and f.default_factory is record._MISSING}


def _hashable(obj) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def test_the_node_side_uses_records_not_dataclasses():
    names = {f"{c.__module__}.{c.__qualname__}" for c in RECORDS}
    assert {"rsc_health.model.Finding", "rsc_health.model.Verdict",
            "rsc_health.checks.Family", "rsc_health.collect.kmsg.XidEvent"} <= names
    assert len(RECORDS) >= 20


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_each_node_record_behaves_as_the_dataclass_of_its_fields(cls):
    twin = _twin(cls)
    assert record.record_fields(cls) == tuple(f.name for f in dataclasses.fields(twin))
    args = _required(cls)
    ours, theirs = cls(**args), twin(**args)
    assert repr(ours) == repr(theirs) or cls.__dict__.get("__repr__") is not None
    assert record.asdict(ours) == dataclasses.asdict(theirs)
    assert ours == cls(**args)
    frozen = cls.__setattr__ is not object.__setattr__
    if frozen:
        with pytest.raises(AttributeError):
            setattr(ours, next(iter(cls.__record_fields__)), 1)
    assert _hashable(ours) == _hashable(theirs)  # a frozen one with a dict field is not
    if _hashable(ours):
        assert hash(ours) == hash(cls(**args))
    first = next(iter(cls.__record_fields__))
    changed = record.replace(ours, **{first: "other"})
    assert getattr(changed, first) == "other" and changed != ours


@record.dataclass(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: list = record.field(default_factory=list)
    note: str = record.field(default="", repr=False, compare=False)
    KIND: ClassVar[str] = "point"


@dataclasses.dataclass(frozen=True)
class RealPoint:
    x: int
    y: int = 0
    tags: list = dataclasses.field(default_factory=list)
    note: str = dataclasses.field(default="", repr=False, compare=False)
    KIND: ClassVar[str] = "point"


@record.dataclass
class Box:
    inner: Point
    items: dict = record.field(default_factory=dict)


def test_init_takes_fields_by_position_and_name_with_fresh_factory_defaults():
    a, b = Point(1), Point(x=1, y=2)
    assert (a.x, a.y, a.tags, b.y) == (1, 0, [], 2)
    assert a.tags is not Point(1).tags  # a new list each time
    assert Point.KIND == "point" and "KIND" not in record.record_fields(Point)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
        Point()
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Point(1, z=3)
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, x=2)
    with pytest.raises(TypeError, match="positional arguments"):
        Point(1, 2, [], "", "extra")


def test_repr_eq_hash_and_frozen_match_dataclasses():
    assert repr(Point(1, 2, ["a"], "hidden")).replace("Point", "RealPoint") == \
        repr(RealPoint(1, 2, ["a"], "hidden"))
    assert Point(1, note="a") == Point(1, note="b")  # note is not compared
    assert Point(1) != Point(2)
    assert Point(1) != RealPoint(1)  # another class is never equal
    assert hash(Point(1, 2, ())) == hash(Point(1, 2, ()))
    with pytest.raises(AttributeError):
        Point(1).x = 2
    with pytest.raises(AttributeError):
        del Point(1).x
    box = Box(Point(1))
    box.items["k"] = 1  # a mutable record takes assignment and is unhashable
    box.inner = Point(2)
    with pytest.raises(TypeError):
        hash(box)


def test_asdict_recurses_and_copies_replace_makes_a_new_record():
    box = Box(Point(1, tags=[[1]]), {"p": [Point(2)]})
    d = record.asdict(box)
    assert d == {"inner": {"x": 1, "y": 0, "tags": [[1]], "note": ""},
                 "items": {"p": [{"x": 2, "y": 0, "tags": [], "note": ""}]}}
    d["inner"]["tags"][0].append(2)
    assert box.inner.tags == [[1]]  # copied, as dataclasses.asdict copies
    moved = record.replace(box.inner, y=5)
    assert (moved.x, moved.y, box.inner.y) == (1, 5, 0)
    with pytest.raises(TypeError):
        record.asdict({"not": "a record"})
    with pytest.raises(TypeError):
        record.replace(object())


def test_a_required_field_after_a_default_is_refused_as_dataclasses_refuse_it():
    with pytest.raises(TypeError, match="non-default argument 'b'"):
        @record.dataclass
        class Bad:
            a: int = 0
            b: int


def test_a_lazy_pattern_compiles_at_first_use_and_then_is_the_pattern():
    from rsc_health import lazyre

    pat = lazyre.compile(r"^(?P<n>\d+)x$", 0)
    assert pat._compiled is None  # nothing compiled at import
    assert pat.match("12x").group("n") == "12"
    assert pat.fullmatch("1y") is None and pat.sub("-", "3x") == "-"
    assert pat.pattern == r"^(?P<n>\d+)x$" and pat._compiled is not None
    with pytest.raises(__import__("re").error):
        lazyre.compile("(").match("x")  # a bad pattern fails where it is used


def test_every_lazy_pattern_of_the_node_side_compiles():
    from rsc_health import lazyre

    found = 0
    for rel in build_node().node_side_files(REPO):
        name = rel[:-3].replace("/", ".").removesuffix(".__init__")
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attr, value in vars(module).items():
            if isinstance(value, lazyre._Lazy):
                assert value.search("") is not None or True, f"{name}.{attr}"
                found += 1
    assert found >= 15


def test_a_findings_dict_is_made_without_importing_copy():
    code = ("import sys; from rsc_health.model import Finding, Level, Status\n"
            "f = Finding('xid', 'gpu3', Status.FAIL, Level.DRAIN_NOW, 'Xid 79', 'xid79', True,"
            " {'xid': 79, 'pid': None, 'ratio': 0.5, 'raw': b'x', 'lines': ['a', ('b', 2)],"
            " 'level': Level.WARN})\n"
            "d = f.to_dict(); print(d['data']['level'] is Level.WARN, 'copy' in sys.modules)")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO)})
    assert out.stdout.split() == ["True", "False"], out.stderr
