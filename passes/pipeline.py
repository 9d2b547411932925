"""Pipelines: sequences and fixed points of passes, a text spec, and instrumentation.

Spec grammar (what ``hlotk compile --passes`` and ``runtime.jit(pipeline=...)`` accept)::

    spec     := item ("," item)*
    item     := NAME options? | "fixpoint" "(" spec ")" options?
    options  := "{" KEY "=" VALUE ("," KEY "=" VALUE)* "}"

e.g. ``"inline,fixpoint(simplify,cse,dce){max_iterations=8},fusion{policy=priority}"``.
Every pass run is recorded (name, wall time, instruction counts, changed); hooks see the
module before and after each pass (verification and dumping are such hooks).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from hlo.ir import Module

from .base import PassError, make_pass, pass_name


@dataclass
class PassRecord:
    name: str
    seconds: float
    instructions_before: int
    instructions_after: int
    changed: bool
    index: int = 0           # position in the flattened run order
    iteration: int | None = None  # fixpoint iteration, when inside one
    mandatory: bool = False  # run by the backend's lowering, whatever the pipeline spec


# Hook signature: (event, pass_object, module, record_or_None) with event "before"/"after".
Hook = Callable[[str, Any, Module, Optional[PassRecord]], None]


@dataclass
class PassContext:
    """What a pipeline run carries: hooks, verification, and the records of every pass.

    With ``verify``, the module is verified after the first pass and then after every pass
    that changed it, as XLA's pipeline runs its invariant checkers only after a pass that
    reports a change: a pass that reports none leaves the module as the last verification
    saw it (the contract of ``run``). A pass that reports no change but leaves another
    instruction count broke that contract, and is verified all the same. ``verified``: the
    module was verified just before this run (the client checks its input), so an unchanged
    first pass needs no verification either. Issue 13: a cold compile of the Adam step
    verified its module after all 18 passes (~0.3 s) where 3 changed it."""
    verify: bool = False
    hooks: list[Hook] = field(default_factory=list)
    records: list[PassRecord] = field(default_factory=list)
    verified: bool = False
    _iteration: int | None = None

    def run_one(self, p: Any, module: Module) -> bool:
        before = count_instructions(module)
        for h in self.hooks:
            h("before", p, module, None)
        t0 = time.perf_counter()
        changed = bool(p.run(module))
        seconds = time.perf_counter() - t0
        after = count_instructions(module)
        record = PassRecord(pass_name(p), seconds, before, after, changed,
                            index=len(self.records), iteration=self._iteration)
        self.records.append(record)
        if self.verify and (changed or after != before or not self.verified):
            from hlo.verifier import verify
            from hlo.errors import VerifierError
            try:
                verify(module)
            except VerifierError as e:
                raise PassError(f"module fails verification after pass {record.name}: {e}") from e
            self.verified = True
        for h in self.hooks:
            h("after", p, module, record)
        return changed


def count_instructions(module: Module) -> int:
    return sum(len(c.instructions) for c in module.computations)


@dataclass(frozen=True)
class Pipeline:
    """Run passes in order; changed if any pass changed the module."""
    passes: tuple[Any, ...]
    name = "pipeline"

    def run(self, module: Module, ctx: PassContext | None = None) -> bool:
        ctx = ctx or PassContext()
        changed = False
        for p in self.passes:
            if isinstance(p, (Pipeline, FixedPoint)):
                changed |= p.run(module, ctx)
            else:
                changed |= ctx.run_one(p, module)
        return changed

    def __str__(self) -> str:
        return ",".join(str(p) if isinstance(p, (Pipeline, FixedPoint)) else pass_name(p)
                        for p in self.passes)


@dataclass(frozen=True)
class FixedPoint:
    """Repeat the inner pipeline until nothing changes (or ``max_iterations``)."""
    inner: Pipeline
    max_iterations: int = 16
    name = "fixpoint"

    def run(self, module: Module, ctx: PassContext | None = None) -> bool:
        ctx = ctx or PassContext()
        changed_any = False
        outer = ctx._iteration
        for i in range(self.max_iterations):
            ctx._iteration = i
            changed = self.inner.run(module, ctx)
            changed_any |= changed
            if not changed:
                break
        ctx._iteration = outer
        return changed_any

    def __str__(self) -> str:
        opt = "" if self.max_iterations == 16 else "{max_iterations=%d}" % self.max_iterations
        return f"fixpoint({self.inner}){opt}"


_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][\w\-.]*)|(?P<punct>[(){},=])|(?P<value>[^\s(){},=]+))")


class _SpecParser:
    def __init__(self, spec: str):
        self.spec = spec
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(spec):
            if spec[pos].isspace():
                pos += 1
                continue
            m = _TOKEN.match(spec, pos)
            if not m or m.end() == pos:
                raise self.error(f"unexpected character {spec[pos]!r}", pos)
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        self.i = 0

    def error(self, msg: str, pos: int | None = None) -> PassError:
        if pos is None:
            pos = self.tokens[self.i][2] if self.i < len(self.tokens) else len(self.spec)
        return PassError(f"pipeline spec column {pos + 1}: {msg}\n  {self.spec}\n  {' ' * pos}^")

    def peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        if self.i >= len(self.tokens):
            raise self.error(f"expected {expected or 'more'} but the spec ended")
        kind, text, pos = self.tokens[self.i]
        if expected is not None and text != expected:
            raise self.error(f"expected {expected!r} but found {text!r}")
        self.i += 1
        return text

    def parse(self) -> Pipeline:
        if not self.tokens:
            return Pipeline(())
        p = self.sequence()
        if self.i != len(self.tokens):
            raise self.error(f"unexpected {self.peek()!r}")
        return p

    def sequence(self) -> Pipeline:
        items = [self.item()]
        while self.peek() == ",":
            self.take(",")
            items.append(self.item())
        return Pipeline(tuple(items))

    def item(self) -> Any:
        if self.i >= len(self.tokens) or self.tokens[self.i][0] != "name":
            raise self.error("expected a pass name")
        name = self.take()
        if name == "fixpoint" and self.peek() == "(":
            self.take("(")
            inner = self.sequence()
            self.take(")")
            opts = self.options()
            extra = set(opts) - {"max_iterations"}
            if extra:
                raise self.error(f"fixpoint has only the option max_iterations, not {sorted(extra)}")
            return FixedPoint(inner, int(opts.get("max_iterations", 16)))
        return make_pass(name, self.options())

    def options(self) -> dict[str, str]:
        opts: dict[str, str] = {}
        if self.peek() != "{":
            return opts
        self.take("{")
        while True:
            key = self.take()
            self.take("=")
            opts[key] = self.option_value()
            if self.peek() == ",":
                self.take(",")
                continue
            self.take("}")
            return opts


    def option_value(self) -> str:
        """One option's text: touching tokens join (``f32+f64`` lexes as a name and a value)."""
        if self.i >= len(self.tokens) or self.tokens[self.i][0] == "punct":
            raise self.error("expected an option value")
        _, text, pos = self.tokens[self.i]
        self.i += 1
        end = pos + len(text)
        while self.i < len(self.tokens) and self.tokens[self.i][0] != "punct" \
                and self.tokens[self.i][2] == end:
            text += self.tokens[self.i][1]
            end += len(self.tokens[self.i][1])
            self.i += 1
        return text


def parse_pipeline(spec: str) -> Pipeline:
    """Parse a pipeline spec string; errors name the column and list the known passes."""
    from . import registry  # noqa: F401  (registers the built-in passes)
    return _SpecParser(spec).parse()


def run_pipeline(module: Module, pipeline: Pipeline | str | Sequence[Any], *, verify: bool = False,
                 hooks: Sequence[Hook] = (), verified: bool = False,
                 replay: Optional[Callable[[], Module]] = None) -> list[PassRecord]:
    """Run a pipeline (object, spec or list of passes) in place; returns the pass records.
    ``verify``: verify the module after the first pass and after each pass that changed it
    (``PassContext``); ``verified``: the caller has just verified ``module``.

    ``replay``: a function giving a fresh copy of ``module`` as it is now (the caller keeps
    the input). With ``verify`` and no hooks, the module is then verified once, after the
    whole pipeline (if any pass changed it), instead of after each pass; should that
    verification or any pass fail, the pipeline runs again on ``replay()`` verifying after
    each pass as above, so that the error names the pass that broke the module (a later
    pass may fail on what an earlier one broke), and that run's error is raised. Passes are
    deterministic, so the second run fails where the first did, or earlier; should it not
    fail at all, the first error is raised. Issue 13: the Adam step's compile verified
    after 4 passes (~20 ms); a valid program now pays one verification."""
    if isinstance(pipeline, str):
        pipeline = parse_pipeline(pipeline)
    elif not isinstance(pipeline, (Pipeline, FixedPoint)):
        pipeline = Pipeline(tuple(pipeline))
    if not (verify and replay is not None and not hooks):
        ctx = PassContext(verify=verify, hooks=list(hooks), verified=verified)
        pipeline.run(module, ctx)
        return ctx.records
    ctx = PassContext(verify=False)
    try:
        pipeline.run(module, ctx)
        unchanged = verified and all(not r.changed and r.instructions_after == r.instructions_before
                                     for r in ctx.records)
        if not unchanged:
            from hlo.verifier import verify as verify_module
            verify_module(module)
    except Exception as first:  # noqa: BLE001  (any failure: the per-pass run names the pass)
        again = PassContext(verify=True, verified=verified)
        pipeline.run(replay(), again)
        raise first
    return ctx.records
