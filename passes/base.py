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
