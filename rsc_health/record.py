"""`dataclass`, `field`, `asdict` and `replace` for the node side, without their start-up cost.

Every prolog is a fresh interpreter, and the standard library's dataclasses cost a healthy one
a fifth of its time: `import dataclasses` brings inspect, ast, dis and tokenize, and decorating
a class compiles each generated method with exec (the node path decorates about 25 at import).
The node side's record classes use only what this module gives: an __init__ taking the fields
positionally or by name (defaults and default_factory), __repr__, __eq__ over the compared
fields, frozen=True (assignment refused, hashable by the fields), asdict (recursive, leaves
copied) and replace. Type checkers see the standard library's own (TYPE_CHECKING), so a record
class is typed as a dataclass is; tests/node/test_record.py holds every node-side record class
to the behaviour dataclasses give the same class body. Not here: order=, slots=, kw_only=,
InitVar, __post_init__ with init-only fields, `dataclasses.fields()` (these classes have no
__dataclass_fields__: use `record_fields`). benchmarks/bench_prolog.py measures the difference.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from dataclasses import asdict, dataclass, field, replace
    from typing import Any
else:
    _MISSING = object()
    _FIELDS = "__record_fields__"

    class FrozenInstanceError(AttributeError):
        """Assignment to a field of a frozen record (as dataclasses.FrozenInstanceError)."""

    class Field:
        __slots__ = ("compare", "default", "default_factory", "name", "repr")

        def __init__(self, default=_MISSING, default_factory=_MISSING, repr=True,
                     compare=True):
            if default is not _MISSING and default_factory is not _MISSING:
                raise ValueError("cannot specify both default and default_factory")
            self.name = ""
            self.default = default
            self.default_factory = default_factory
            self.repr = repr
            self.compare = compare

    def field(*, default=_MISSING, default_factory=_MISSING, repr=True, compare=True):
        return Field(default, default_factory, repr, compare)

    def dataclass(cls=None, *, frozen=False):
        def wrap(klass):
            return _process(klass, frozen)

        return wrap if cls is None else wrap(cls)

    def _is_classvar(annotation) -> bool:
        text = annotation if isinstance(annotation, str) else getattr(annotation, "_name", "")
        return str(text).split("[")[0].rsplit(".", 1)[-1] == "ClassVar"

    def _process(cls, frozen: bool):
        fields = _fields(cls)
        _check_order(fields)
        setattr(cls, _FIELDS, fields)
        own = cls.__dict__
        compared = tuple(n for n, f in fields.items() if f.compare)
        made = {"__init__": lambda: _make_init(cls, tuple(fields.values())),
                "__repr__": lambda: _make_repr(tuple(n for n, f in fields.items() if f.repr)),
                "__eq__": lambda: _make_eq(compared)}
        for name, make in made.items():
            if name not in own:
                setattr(cls, name, make())
        if own.get("__hash__", None) is None:  # no explicit __hash__
            cls.__hash__ = _make_hash(compared) if frozen else None
        if frozen:
            cls.__setattr__ = _frozen_setattr(cls)
            cls.__delattr__ = _frozen_delattr(cls)
        return cls

    def _fields(cls) -> dict[str, Field]:
        """The bases' fields, then this class's own annotations (not ClassVars), in order; a
        field() default moves onto the class as a plain attribute (or leaves it)."""
        fields: dict[str, Field] = {}
        for base in reversed(cls.__mro__[1:]):
            fields.update(getattr(base, _FIELDS, {}))
        for name, annotation in cls.__dict__.get("__annotations__", {}).items():
            if _is_classvar(annotation):
                continue
            value = cls.__dict__.get(name, _MISSING)
            f = value if isinstance(value, Field) else Field(default=value)
            f.name = name
            if isinstance(value, Field) and f.default is _MISSING:
                delattr(cls, name)
            elif isinstance(value, Field):
                setattr(cls, name, f.default)
            fields[name] = f
        return fields

    def _check_order(fields: dict[str, Field]) -> None:
        required_after_default = False
        for f in fields.values():
            has_default = f.default is not _MISSING or f.default_factory is not _MISSING
            if required_after_default and not has_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")
            required_after_default = required_after_default or has_default

    def _make_init(cls, fields: tuple[Field, ...]):
        names = tuple(f.name for f in fields)
        count = len(names)
        specs = tuple((f.name, f.default, f.default_factory) for f in fields)
        setter = object.__setattr__
        title = cls.__qualname__
        post_init = hasattr(cls, "__post_init__")

        def __init__(self, *args, **kwargs):
            if len(args) > count:
                raise TypeError(f"{title}.__init__() takes {count + 1} positional arguments "
                                f"but {len(args) + 1} were given")
            for name, value in zip(names, args):
                if name in kwargs:
                    raise TypeError(f"{title}.__init__() got multiple values for argument "
                                    f"{name!r}")
                setter(self, name, value)
            for name, default, factory in specs[len(args):]:
                if name in kwargs:
                    value = kwargs.pop(name)
                elif factory is not _MISSING:
                    value = factory()
                elif default is not _MISSING:
                    value = default
                else:
                    raise TypeError(f"{title}.__init__() missing 1 required positional "
                                    f"argument: {name!r}")
                setter(self, name, value)
            if kwargs:
                raise TypeError(f"{title}.__init__() got an unexpected keyword argument "
                                f"{next(iter(kwargs))!r}")
            if post_init:
                self.__post_init__()

        __init__.__qualname__ = f"{title}.__init__"
        return __init__

    def _make_repr(names: tuple[str, ...]):
        def __repr__(self):
            inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
            return f"{type(self).__qualname__}({inner})"

        return __repr__

    def _make_eq(names: tuple[str, ...]):
        def __eq__(self, other):
            if other.__class__ is not self.__class__:
                return NotImplemented
            return all(getattr(self, n) == getattr(other, n) for n in names)

        return __eq__

    def _make_hash(names: tuple[str, ...]):
        def __hash__(self):
            return hash(tuple(getattr(self, n) for n in names))

        return __hash__

    def _frozen_setattr(cls):
        def __setattr__(self, name, value):
            if type(self) is cls or name in getattr(cls, _FIELDS):
                raise FrozenInstanceError(f"cannot assign to field {name!r}")
            super(cls, self).__setattr__(name, value)

        return __setattr__

    def _frozen_delattr(cls):
        def __delattr__(self, name):
            if type(self) is cls or name in getattr(cls, _FIELDS):
                raise FrozenInstanceError(f"cannot delete field {name!r}")
            super(cls, self).__delattr__(name)

        return __delattr__

    def asdict(obj) -> dict[str, Any]:
        if not hasattr(type(obj), _FIELDS):
            raise TypeError("asdict() should be called on record instances")
        return _asdict(obj)

    def _asdict(value):
        if hasattr(type(value), _FIELDS):
            return {n: _asdict(getattr(value, n)) for n in getattr(type(value), _FIELDS)}
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*(_asdict(v) for v in value))
        if isinstance(value, (list, tuple)):
            return type(value)(_asdict(v) for v in value)
        if isinstance(value, dict):
            return type(value)((_asdict(k), _asdict(v)) for k, v in value.items())
        # What copy.deepcopy does, without importing copy (with weakref and types) for the
        # leaves every finding has: its atomic types are themselves, and a leaf with its own
        # __deepcopy__ (model's enum members: themselves) is asked with a fresh memo.
        if type(value) in _ATOMIC:
            return value
        if not isinstance(value, type):
            own = getattr(value, "__deepcopy__", None)
            if own is not None:
                return own({})
        import copy

        return copy.deepcopy(value)

    _ATOMIC = frozenset({type(None), int, float, bool, complex, bytes, str, range,
                         type(Ellipsis), type(NotImplemented)})

    def replace(obj, **changes):
        fields = getattr(type(obj), _FIELDS, None)
        if fields is None:
            raise TypeError("replace() should be called on record instances")
        values = {n: getattr(obj, n) for n in fields}
        values.update(changes)
        return type(obj)(**values)


def record_fields(cls_or_obj) -> tuple[str, ...]:
    """The field names of a record class or instance, in order."""
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    fields = getattr(cls, "__record_fields__", None)
    if fields is None:  # a standard dataclass (what a type checker is told they are)
        fields = getattr(cls, "__dataclass_fields__", {})
    return tuple(fields)


__all__ = ["asdict", "dataclass", "field", "record_fields", "replace"]
