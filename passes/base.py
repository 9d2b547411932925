"""The pass contract and the registry of passes by name.

A pass is a small frozen dataclass whose fields are its options, with XLA's contract
``run(module) -> bool`` (did it change anything). Register it with ``@register_pass`` so a
pipeline spec such as ``"inline,fixpoint(simplify,cse,dce)"`` can name it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol, runtime_checkable

from hlo.errors import HlotkError
from hlo.ir import Module


class PassError(HlotkError):
    """A bad pipeline spec, an unknown pass or option, or a pass that broke the module."""


@runtime_checkable
class Pass(Protocol):
    name: ClassVar[str]

    def run(self, module: Module) -> bool: ...


PASSES: dict[str, type] = {}


def register_pass(cls: type) -> type:
    """Class decorator: make the pass available by its ``name`` in pipeline specs."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a (frozen) dataclass")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} needs a class attribute name = '...'")
    PASSES[name] = cls
    return cls


class ModuleSnapshot:
    """What a module is made of, held by reference, to tell afterwards whether a pass
    changed it without printing it twice: the config entries, the computations in order
    with their roots, and each instruction's opcode, shape, operands and attribute values
    (values compared by identity, then equality; an array replaced by an equal new one
    counts as a change: verification, which the answer decides, then runs once more than
    it had to)."""

    def __init__(self, module: Module) -> None:
        self._state = self._take(module)

    @staticmethod
    def _take(module: Module) -> list:
        state: list = [("config", tuple(module.config.items()))]
        for comp in module.computations:
            state.append(("computation", comp, comp.root))
            state.extend(("instruction", inst, inst.opcode, inst.shape, tuple(inst.operands),
                          tuple(inst.attrs.items())) for inst in comp.instructions)
        return state

    def changed(self, module: Module) -> bool:
        now = self._take(module)
        return len(now) != len(self._state) or \
            any(not _same_entry(a, b) for a, b in zip(self._state, now))


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):       # arrays compare elementwise: count it a change
        return False


def _same_items(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(ka == kb and _same_value(va, vb)
                                    for (ka, va), (kb, vb) in zip(a, b))


def _same_entry(a: tuple, b: tuple) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "config":
        return _same_items(a[1], b[1])
    if a[0] == "computation":
        return a[1] is b[1] and a[2] is b[2]
    _, inst, opcode, shape, operands, attrs = a
    return (inst is b[1] and opcode == b[2] and shape == b[3] and len(operands) == len(b[4])
            and all(x is y for x, y in zip(operands, b[4])) and _same_items(attrs, b[5]))


def make_pass(name: str, options: dict[str, str] | None = None) -> Any:
    """Instantiate a registered pass from its name and string options (from a spec)."""
    try:
        cls = PASSES[name]
    except KeyError:
        raise PassError(f"unknown pass {name!r}; known passes: {', '.join(sorted(PASSES))}") from None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, text in (options or {}).items():
        if key not in fields:
            known = ", ".join(sorted(fields)) or "(none)"
            raise PassError(f"pass {name!r} has no option {key!r}; its options: {known}")
        kwargs[key] = _convert_option(name, key, text, fields[key])
    return cls(**kwargs)


def _convert_option(pass_name: str, key: str, text: str, field: dataclasses.Field) -> Any:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    try:
        if kind == "bool":
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ValueError(text)
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        raise PassError(f"pass {pass_name!r}: option {key}={text!r} is not a valid {kind}") from None
    return text


def pass_name(p: Any) -> str:
    """``name{opt=value,...}`` for non-default options, as a spec would write it."""
    base = getattr(p, "name", type(p).__name__)
    if not dataclasses.is_dataclass(p):
        return base
    opts = []
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        if f.default is not dataclasses.MISSING and v == f.default:
            continue
        opts.append(f"{f.name}={str(v).lower() if isinstance(v, bool) else v}")
    return base + ("{" + ",".join(opts) + "}" if opts else "")
