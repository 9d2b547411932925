"""Run StableHLO interpreter test files (``check.expect_*``) through hlotk.

Each file holds cases split by ``// -----``; a case is a ``func.func`` with no arguments
whose ``check.*`` ops state expected values. JAX's MLIR context has no ``check`` dialect,
so each check op is rewritten (in the text) into
``stablehlo.custom_call @check.expect_*(%actual, %expected)`` with the expected ``dense``
constant as its own ``stablehlo.constant``; options (tolerance, ulp bounds) travel in
``backend_config``. The case is imported with ``hlo.from_stablehlo`` and evaluated with
``hlo.evaluate``; the custom-calls are answered by this module, which compares values.

Cases whose expectations are on the interpreter's printed output use FileCheck: each
``// RUN: [not] stablehlo-translate --interpret [--args=...] [--interpreter-print-dense]
... | FileCheck %s [--check-prefix(es)=...]`` line is modelled (``interpret``), the output
formatted as the reference interpreter prints it, and matched with runtime/filecheck.py
against the case's directives. Ops newer than JAX's StableHLO (collective_reduce,
dynamic-root collective_broadcast) become custom-calls that hlo.evaluator.collectives
answers; quantized types are lowered by the importer (hlo/stablehlo/quant.py).

    python -c 'from runtime.conformance import main_check; main_check(["add.mlir"])'
"""
from __future__ import annotations

import itertools
import re
import shlex
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, TextIO

import numpy as np

CHECK_TARGETS = ("expect_eq", "expect_eq_const", "expect_almost_eq", "expect_almost_eq_const",
                 "expect_close", "expect_serialized_eq")
# Defaults of StableHLO's check dialect (stablehlo/tests/CheckOps.td).
DEFAULT_TOLERANCE = 1e-4      # expect_almost_eq[_const] ``tolerance``
DEFAULT_MAX_ULP = 1           # expect_close ``max_ulp_difference``
# The custom-call spelling (``stablehlo.custom_call @check.expect_close(...)``, testdata's
# form) has no options; stablehlo-translate --interpret checks it with these bounds
# (stablehlo/tools/StablehloTranslateMain.cpp), looser than the check ops' defaults.
CUSTOM_CALL_TOLERANCE = 1e-3
CUSTOM_CALL_MAX_ULP = 3


@dataclass
class CaseResult:
    file: str
    name: str
    passed: bool
    reason: str = ""
    checks: int = 0

    @property
    def label(self) -> str:
        return f"{Path(self.file).name}:{self.name}"


class CheckRewriteError(Exception):
    pass


# --- splitting and rewriting ---------------------------------------------------------------
def split_cases(text: str) -> list[str]:
    return [c for c in re.split(r"^// -----\s*$", text, flags=re.M) if "func.func" in c]


def case_name(case: str) -> str:
    m = re.search(r"func\.func\s+(?:public\s+)?@([\w$.\-]+)", case)
    return m.group(1) if m else "<unnamed>"


def _statement_end(text: str, start: int) -> int:
    """End of the statement starting at ``start``: the first newline outside brackets."""
    depth = 0
    i = start
    in_str = False
    typed = False  # every check op ends with ``: type``; operands may span lines before it
    while i < len(text):
        c = text[i]
        if c == '"' and text[i - 1] != "\\":
            in_str = not in_str
        elif not in_str:
            if c in "<[({":
                depth += 1
            elif c in ">])}":
                if not (c == ">" and text[i - 1] == "-"):
                    depth -= 1
            elif c == ":" and depth <= 0:
                typed = True
            elif c == "\n" and depth <= 0 and typed:
                return i
        i += 1
    return i


def _balanced(text: str, i: int, open_ch: str = "<", close_ch: str = ">") -> int:
    """Index just past the bracket matching ``text[i]``."""
    depth = 0
    while i < len(text):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise CheckRewriteError("unbalanced brackets in check op")


def _split_top(s: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, ""
    for c in s:
        if c in "<[({":
            depth += 1
        elif c in ">])}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _rewrite_one(kind: str, body: str, n: int) -> str:
    """``body`` is the check op text after ``check.<kind>``; returns replacement lines."""
    body = " ".join(body.split())
    options: dict[str, str] = {}
    for key in ("tolerance", "max_ulp_difference", "min_ulp_difference", "probe_id", "iter"):
        m = re.search(key + r"\s*=\s*(\"[^\"]*\"|[-+0-9.eE]+)", body)
        if m:
            options[key] = m.group(1).strip('"')
    if kind.endswith("_const"):
        m = re.match(r"\s*(%[\w#$.\-]+)\s*,\s*", body)
        if not m:
            raise CheckRewriteError(f"cannot read check.{kind} operands")
        actual = m.group(1)
        d = body.index("dense<", m.end())
        end = _balanced(body, d + len("dense"))
        literal = body[d:end]
        rest = body[end:]
        tm = re.match(r"\s*:\s*", rest)
        if not tm:
            raise CheckRewriteError(f"check.{kind}: missing type after the literal")
        t_start = tm.end()
        t_end = _balanced(rest, rest.index("<", t_start)) if "<" in rest[t_start:t_start + 12] \
            else t_start + len(rest[t_start:].split()[0])
        ty = rest[t_start:t_end]
        const = f"%__check_expected_{n} = stablehlo.constant {literal} : {ty}"
        operands, types = [actual, f"%__check_expected_{n}"], [ty, ty]
        lines = [const]
    else:
        head, _, tys = body.rpartition(" : ")
        if not head:
            raise CheckRewriteError(f"check.{kind}: missing type")
        head = re.sub(r"\{[^}]*\}\s*$", "", head)
        operands = [p for p in _split_top(head) if p.startswith("%")]
        types = _split_top(tys)
        if len(types) == 1:
            types = types * len(operands)
        lines = []
    # The check op's defaults travel explicitly: a custom-call without them is testdata's
    # spelling, which has other bounds (CUSTOM_CALL_*).
    if kind == "expect_close":
        options.setdefault("max_ulp_difference", str(DEFAULT_MAX_ULP))
    elif kind.startswith("expect_almost_eq"):
        options.setdefault("tolerance", repr(DEFAULT_TOLERANCE))
    cfg = ",".join(f"{k}={v}" for k, v in options.items())
    lines.append(f'stablehlo.custom_call @check.{kind}({", ".join(operands)}) '
                 f'{{has_side_effect = true, backend_config = "{cfg}"}} : '
                 f'({", ".join(types)}) -> ()')
    return "\n".join(lines)


_CHECK_RE = re.compile(r"(?m)^(\s*)check\.(" + "|".join(sorted(CHECK_TARGETS, key=len,
                                                                 reverse=True)) + r")\b")


def rewrite_checks(case: str) -> str:
    """Replace each ``check.expect_*`` op by a constant + ``stablehlo.custom_call``."""
    out, pos, n = [], 0, 0
    for m in _CHECK_RE.finditer(case):
        if m.start() < pos:
            continue
        end = _statement_end(case, m.end())
        out.append(case[pos:m.start()])
        indent = m.group(1).lstrip("\n")
        repl = _rewrite_one(m.group(2), case[m.end():end], n)
        out.append("\n".join(indent + line for line in repl.split("\n")))
        pos = end
        n += 1
    out.append(case[pos:])
    return "".join(out)


# --- interpreter.* ops ---------------------------------------------------------------------
@dataclass
class ParallelRun:
    """One ``interpreter.run_parallel``: a grid of program names (rows are replicas,
    columns partitions) and the functions whose results fill the infeed queue."""
    programs: list[list[str]]
    infeed: list[str] = field(default_factory=list)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _type_end(text: str, i: int) -> int:
    """End of one MLIR type (or a parenthesized type list) starting at ``text[i]``."""
    if text[i] == "(":
        return _balanced(text, i, "(", ")")
    j = i
    while j < len(text) and not text[j].isspace() and text[j] not in ",)}":
        if text[j] == "<":
            j = _balanced(text, j)
        else:
            j += 1
    return j


_SYMS_RE = re.compile(r"@([\w$.\-]+)")


def rewrite_run_parallel(case: str) -> tuple[str, list[ParallelRun]]:
    """Replace each ``"interpreter.run_parallel"`` by ``stablehlo.custom_call
    @interpreter.run_parallel`` with the same operands and results; its grid goes into the
    returned list (``backend_config`` holds the index)."""
    runs: list[ParallelRun] = []
    out, pos = [], 0
    for m in re.finditer(r'"interpreter\.run_parallel"\s*\(', case):
        if m.start() < pos:
            continue
        ops_end = _balanced(case, m.end() - 1, "(", ")")
        operands = case[m.end():ops_end - 1].strip()
        i = _skip_ws(case, ops_end)
        attrs = ""
        if case[i] == "{":
            a_end = _balanced(case, i, "{", "}")
            attrs = case[i + 1:a_end - 1]
            i = _skip_ws(case, a_end)
        if case[i] != ":":
            raise CheckRewriteError("interpreter.run_parallel: missing function type")
        i = _skip_ws(case, i + 1)
        in_end = _type_end(case, i)
        in_types = case[i:in_end]
        i = _skip_ws(case, in_end)
        if not case.startswith("->", i):
            raise CheckRewriteError("interpreter.run_parallel: missing '->'")
        i = _skip_ws(case, i + 2)
        out_end = _type_end(case, i)
        out_types = case[i:out_end]
        pm = re.search(r"programs\s*=\s*\[", attrs)
        if not pm:
            raise CheckRewriteError("interpreter.run_parallel: missing programs")
        grid_text = attrs[pm.end() - 1:_balanced(attrs, pm.end() - 1, "[", "]")]
        rows = [_SYMS_RE.findall(r) for r in re.findall(r"\[([^\[\]]*)\]", grid_text)]
        im = re.search(r"infeed\s*=\s*\[([^\]]*)\]", attrs)
        runs.append(ParallelRun(rows, _SYMS_RE.findall(im.group(1)) if im else []))
        out.append(case[pos:m.start()])
        out.append(f"stablehlo.custom_call @interpreter.run_parallel({operands}) "
                   f'{{has_side_effect = true, backend_config = "index={len(runs) - 1}"}} : '
                   f"{in_types} -> {out_types}")
        pos = out_end
    out.append(case[pos:])
    return "".join(out), runs


_NEWER_COLLECTIVE_RE = re.compile(r'"stablehlo\.(collective_broadcast|collective_reduce)"\s*\(')


def _newer_collective_config(attrs: str) -> str:
    """backend_config text (an MLIR dictionary) for the custom-call that carries a
    collective_reduce / dynamic-root collective_broadcast (see hlo.evaluator.collectives)."""
    groups: list = []
    gm = re.search(r"replica_groups\s*=\s*dense<", attrs)
    if gm:
        body = attrs[gm.end() - 1:_balanced(attrs, gm.end() - 1)][1:-1]
        import json
        groups = json.loads(body) if body.strip() else []
        if groups and not isinstance(groups[0], list):
            groups = [groups]
    cm = re.search(r"channel_handle\s*=\s*#stablehlo\.channel_handle<\s*handle\s*=\s*(-?\d+)",
                   attrs)
    dm = re.search(r"\bhas_dynamic_root\b(\s*=\s*(true|false))?", attrs)
    dynamic = bool(dm) and dm.group(2) != "false"
    rg = "[" + ", ".join("[" + ", ".join(str(int(i)) for i in g) + "]" for g in groups) + "]"
    return (f"{{replica_groups = {rg}, channel_id = {int(cm.group(1)) if cm else 0}, "
            f"has_dynamic_root = {'true' if dynamic else 'false'}}}")


def _region_function(region: str, name: str) -> str:
    """A private ``func.func @name`` with the body of a one-block reducer region."""
    region = region.strip()
    if region.startswith("{") and region.endswith("}"):
        region = region[1:-1]
    m = re.search(r"\^[\w]+\s*\(", region)
    if not m:
        raise CheckRewriteError("collective_reduce: the reducer region has no block arguments")
    args_end = _balanced(region, m.end() - 1, "(", ")")
    args = region[m.end():args_end - 1]
    body = region[region.index(":", args_end) + 1:]
    rets = list(re.finditer(r"(?m)^(\s*)(?:stablehlo|mhlo)\.return\b(.*)$", body))
    if not rets:
        raise CheckRewriteError("collective_reduce: the reducer region has no return")
    last = rets[-1]
    types = last.group(2).rpartition(":")[2].strip()
    body = body[:last.start()] + f"{last.group(1)}func.return{last.group(2)}" + body[last.end():]
    return (f"func.func private @{name}({args}) -> ({types}) {{{body.rstrip()}\n}}\n")


def rewrite_newer_collectives(case: str) -> str:
    """``stablehlo.collective_reduce`` and ``stablehlo.collective_broadcast`` with
    ``has_dynamic_root`` (newer than the StableHLO JAX ships) -> ``stablehlo.custom_call``
    with the same target name, which hlo.evaluator.collectives answers. A reducer region
    becomes a private function named in ``called_computations``, placed before the function
    that uses it. Static-root collective_broadcast is left to the importer."""
    edits: list[tuple[int, int, str]] = []   # (start, end, replacement) on ``case``
    pos, n_funcs = 0, 0
    for m in _NEWER_COLLECTIVE_RE.finditer(case):
        if m.start() < pos:
            continue
        kind = m.group(1)
        ops_end = _balanced(case, m.end() - 1, "(", ")")
        operands = case[m.end():ops_end - 1].strip()
        i = _skip_ws(case, ops_end)
        region = ""
        if case.startswith("({", i):
            r_end = _balanced(case, i, "(", ")")
            region = case[i + 1:r_end - 1]
            i = _skip_ws(case, r_end)
        attrs = ""
        if case[i] == "{":
            a_end = _balanced(case, i, "{", "}")
            attrs = case[i + 1:a_end - 1]
            i = _skip_ws(case, a_end)
        if kind == "collective_broadcast" and not re.search(
                r"\bhas_dynamic_root\b(?!\s*=\s*false)", attrs):
            continue   # the importer reads the static-root form itself
        if case[i] != ":":
            raise CheckRewriteError(f"{kind}: missing function type")
        i = _skip_ws(case, i + 1)
        in_end = _type_end(case, i)
        in_types = case[i:in_end]
        i = _skip_ws(case, in_end)
        if not case.startswith("->", i):
            raise CheckRewriteError(f"{kind}: missing '->'")
        i = _skip_ws(case, i + 2)
        out_end = _type_end(case, i)
        extra = ""
        if region:
            fname = f"__{kind}_region_{n_funcs}"
            n_funcs += 1
            func_at = case.rfind("func.func", 0, m.start())
            func_at = case.rfind("\n", 0, func_at) + 1
            edits.append((func_at, func_at, _region_function(region, fname)))
            extra = f", called_computations = [@{fname}]"
        edits.append((m.start(), out_end,
                      f"stablehlo.custom_call @stablehlo.{kind}({operands}) "
                      f'{{has_side_effect = true, backend_config = '
                      f'"{_newer_collective_config(attrs)}"{extra}}} : '
                      f"{in_types} -> {case[i:out_end]}"))
        pos = out_end
    out, at = [], 0
    for start, end, text in sorted(edits, key=lambda e: (e[0], e[1])):
        out.append(case[at:start])
        out.append(text)
        at = end
    out.append(case[at:])
    return "".join(out)


_PROBE_RE = re.compile(r'(?m)^(\s*)((?:%[\w#$.\-:]+\s*=\s*)?)interpreter\.(probe|print)\s+'
                       r'(%[\w#$.\-]+)\s*(?:,\s*probe_id\s*=\s*"((?:[^"\\]|\\.)*)")?\s*'
                       r'(?:\{[^}\n]*\}\s*)?:\s*([^\n]+?)\s*$')


def rewrite_probes(case: str, shadow: bool = False) -> str:
    """``interpreter.probe``/``interpreter.print`` -> an identity ``stablehlo.custom_call``
    (target ``interpreter.probe``/``interpreter.print``) that the runner answers. Prints are
    numbered in text order (``print_index``). ``shadow``: prints keep no result, so the
    module numbers its values as the source does (see ``print_names``)."""
    prints = itertools.count()

    def repl(m: re.Match) -> str:
        indent, lhs, kind, operand, probe_id, ty = m.groups()
        cfg = f"probe_id={probe_id}" if probe_id is not None else ""
        if kind == "print":
            cfg = f"print_index={next(prints)}"
            if shadow:   # as in the source: interpreter.print has no result
                return (f"{indent}stablehlo.custom_call @interpreter.print({operand}) "
                        f'{{has_side_effect = true, backend_config = "{cfg}"}} : ({ty}) -> ()')
        return (f"{indent}{lhs}stablehlo.custom_call @interpreter.{kind}({operand}) "
                f'{{has_side_effect = true, backend_config = "{cfg}"}} : ({ty}) -> {ty}')
    return _PROBE_RE.sub(repl, case)


# --- the reference interpreter's printed output ------------------------------------------
# stablehlo-translate --interpret prints each result of the entry function on its own line,
# as ``tensor<2x2xi8> {`` + nested bracketed rows + ``}`` (Tensor::print), or with
# --interpreter-print-dense as the MLIR dense attribute (``dense<[1, 2]> : tensor<2xi8>``).
# interpreter.print writes ``<ssa name> = `` and the same tensor form. Elements and dense
# attributes are printed by JAX's MLIR itself, so the float spelling (``1.000000e+00``,
# ``0.333333343``, hex for NaN/inf) is MLIR's own.
_MLIR_LOCK = threading.Lock()     # print handlers run on the simulator's device threads
_MLIR_CTX: Any = None
_ELEMENT_CACHE: dict[tuple[str, int], str] = {}


def _mlir_context() -> Any:
    global _MLIR_CTX
    if _MLIR_CTX is None:
        from hlo.stablehlo.mlir_utils import make_context
        _MLIR_CTX = make_context()
    return _MLIR_CTX


def _mlir_attr_str(text: str) -> str:
    """MLIR's own printing of an attribute given as text (caller holds _MLIR_LOCK)."""
    from jaxlib.mlir import ir
    with _mlir_context(), ir.Location.unknown():
        try:
            return str(ir.Attribute.parse(text))
        except TypeError as e:   # complex dense attributes: the bindings cannot downcast
            m = re.search(r"\(Attribute\((.*)\)\)\s*$", str(e), re.S)
            if not m:
                raise
            return m.group(1)


def mlir_tensor_type(dims: Iterable[int], dtype: Any) -> str:
    """``tensor<2x3xf32>`` for dims and an hlo DType."""
    return "tensor<" + "".join(f"{d}x" for d in dims) + dtype.mlir + ">"


def _float_bits(x: Any, dtype: Any) -> int:
    a = np.asarray(x, dtype=dtype.np_dtype).reshape(1)
    return int(a.view(_UINT[a.dtype.itemsize])[0])


def _float_hex(x: Any, dtype: Any) -> str:
    a = np.asarray(x, dtype=dtype.np_dtype).reshape(1)
    return f"0x{_float_bits(x, dtype):0{a.dtype.itemsize * 2}X}"


def mlir_element(x: Any, dtype: Any) -> str:
    """One element as the reference interpreter prints it (MLIR attribute, type elided)."""
    if dtype.is_pred:
        return "true" if bool(x) else "false"
    if dtype.is_integer:
        return str(int(x))
    if dtype.is_complex:
        part = dtype.component
        return f"[{mlir_element(np.real(x), part)}, {mlir_element(np.imag(x), part)}]"
    key = (dtype.mlir, _float_bits(x, dtype))
    if key not in _ELEMENT_CACHE:
        with _MLIR_LOCK:
            text = _mlir_attr_str(f"{_float_hex(x, dtype)} : {dtype.mlir}")
        _ELEMENT_CACHE[key] = text.rsplit(" : ", 1)[0]
    return _ELEMENT_CACHE[key]


def format_tensor(value: Any, dtype: Any) -> str:
    """The reference interpreter's Tensor::print: the type, then ``{``, each dimension as a
    bracketed row on its own line indented two spaces per level, innermost rows inline;
    a scalar prints inline as ``tensor<ui8> {1}``."""
    a = np.asarray(value)
    parts = [mlir_tensor_type(a.shape, dtype), " {"]

    def rows(prefix: tuple[int, ...], indent: int) -> None:
        if len(prefix) == a.ndim:
            parts.append(mlir_element(a[prefix], dtype))
            if prefix and prefix[-1] != a.shape[len(prefix) - 1] - 1:
                parts.append(", ")
            return
        parts.append("\n" + "  " * indent + "[")
        for i in range(a.shape[len(prefix)]):
            rows(prefix + (i,), indent + 1)
        parts.append("]")
        last = not prefix or prefix[-1] == a.shape[len(prefix) - 1] - 1
        parts.append("\n" + "  " * (indent - 1) if last else ",")

    rows((), 1)
    parts.append("}")
    return "".join(parts)


def format_dense(value: Any, dtype: Any) -> str:
    """``--interpreter-print-dense``: the value as MLIR prints a DenseElementsAttr."""
    a = np.asarray(value)

    def elem(x: Any) -> str:
        if dtype.is_pred:
            return "true" if bool(x) else "false"
        if dtype.is_integer:
            return str(int(x))
        if dtype.is_complex:
            part = dtype.component
            return f"({_float_hex(np.real(x), part)}, {_float_hex(np.imag(x), part)})"
        return _float_hex(x, dtype)

    def nest(x: np.ndarray) -> str:
        if x.ndim == 0:
            return elem(x[()])
        return "[" + ", ".join(nest(x[i]) for i in range(x.shape[0])) + "]"

    body = "" if a.size == 0 else nest(a)
    with _MLIR_LOCK:
        return _mlir_attr_str(f"dense<{body}> : {mlir_tensor_type(a.shape, dtype)}")


def _walk_ops(op: Any) -> Iterable[Any]:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner
                yield from _walk_ops(inner.operation)


def print_names(case: str) -> list[str]:
    """For each ``interpreter.print`` of the case (in text order), what the reference
    interpreter writes before the tensor: the operand's defining op as MLIR prints it, up to
    and including ``= `` (``%0 = ``, ``%cst = ``, ``%0:2 = ``). MLIR numbers the values,
    so the case is parsed (with check ops dropped and the interpreter ops as custom-calls
    with the source's results) and the numbering read back. A block argument prints no
    ``=``; the reference then keeps only the first character of its description (``<``)."""
    if "interpreter.print" not in case:
        return []
    text, _ = rewrite_run_parallel(rewrite_newer_collectives(case))
    text = rewrite_probes(text, shadow=True)
    out, pos = [], 0
    for m in _CHECK_RE.finditer(text):    # checks define no values: drop them
        if m.start() < pos:
            continue
        out.append(text[pos:m.start()])
        pos = _statement_end(text, m.end())
    out.append(text[pos:])
    text = "".join(out)
    if "!quant." in text:
        from hlo.stablehlo.quant import lower_quantized
        text = lower_quantized(text)
    from jaxlib.mlir import ir
    names: dict[int, str] = {}
    with _MLIR_LOCK, _mlir_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        for op in _walk_ops(module.operation):
            if op.operation.name != "stablehlo.custom_call":
                continue
            if str(op.attributes["call_target_name"]).strip('"') != "interpreter.print":
                continue
            cfg = str(op.attributes["backend_config"]).strip('"')
            index = int(cfg.split("=", 1)[1])
            value = op.operands[0]
            if isinstance(value, ir.OpResult):
                printed = str(value.owner)
                eq = printed.find("=")
                names[index] = printed[:eq + 2] if eq >= 0 else printed[:1]
            else:
                names[index] = "<"
    return [names[i] for i in sorted(names)]


# --- RUN lines -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RunLine:
    """One ``// RUN: [not] stablehlo-translate --interpret ... | FileCheck ...`` line."""
    line: int                       # 1-based line in the file
    expect_fail: bool               # ``not``: the interpreter must fail
    args: Optional[str]             # ``--args=...`` text
    print_dense: bool               # ``--interpreter-print-dense``
    merge_stderr: bool              # ``2>&1``: FileCheck sees the error output too
    prefixes: tuple[str, ...]


def parse_run_lines(text: str) -> list[RunLine]:
    """The RUN lines that run the interpreter and FileCheck its output. Other RUN lines
    (no FileCheck, other tools, options this runner does not model) are left out."""
    runs: list[RunLine] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"\s*//\s*RUN:(.*)$", lines[i])
        start = i + 1
        i += 1
        if not m:
            continue
        cmd = m.group(1).rstrip()
        while cmd.endswith("\\") and i < len(lines):   # continued on the next RUN line
            nm = re.match(r"\s*//\s*RUN:(.*)$", lines[i])
            cmd = cmd[:-1] + " " + (nm.group(1).rstrip() if nm else "")
            i += 1
        run = _parse_run_command(cmd, start)
        if run is not None:
            runs.append(run)
    return runs


def _parse_run_command(cmd: str, line: int) -> Optional[RunLine]:
    try:
        tokens = shlex.split(cmd)
    except ValueError:
        return None
    stages, cur = [], []
    for t in tokens:
        if t == "|":
            stages.append(cur)
            cur = []
        else:
            cur.append(t)
    stages.append(cur)
    if len(stages) != 2 or not stages[1] or stages[1][0] != "FileCheck":
        return None
    tool = stages[0]
    expect_fail = bool(tool) and tool[0] == "not"
    tool = tool[1:] if expect_fail else tool
    if not tool or tool[0] != "stablehlo-translate" or "--interpret" not in tool:
        return None
    args, dense, merge = None, False, False
    for t in tool[1:]:
        if t.startswith("--args="):
            args = t[len("--args="):]
        elif t == "--interpreter-print-dense":
            dense = True
        elif t == "2>&1":
            merge = True
        elif t not in ("--interpret", "%s", "--split-input-file", "-split-input-file"):
            return None   # an option this runner does not model
    prefixes: list[str] = []
    fc = stages[1][1:]
    j = 0
    while j < len(fc):
        t = fc[j]
        if t.startswith(("--check-prefix=", "-check-prefix=", "--check-prefixes=",
                         "-check-prefixes=")):
            prefixes += t.split("=", 1)[1].split(",")
        elif t in ("--check-prefix", "--check-prefixes") and j + 1 < len(fc):
            prefixes += fc[j + 1].split(",")
            j += 1
        elif t != "%s":
            return None
        j += 1
    return RunLine(line, expect_fail, args, dense, merge, tuple(prefixes) or ("CHECK",))


# --- --args ----------------------------------------------------------------------------------
_ARGS_USAGE = "--args=[dense<1> : tensor<2xi32>, ...]"


def parse_args_option(text: str) -> list[np.ndarray]:
    """``--args`` as stablehlo-translate reads it: an MLIR array attribute of dense
    elements attributes, each one argument. Errors carry the tool's messages."""
    from jaxlib.mlir import ir
    from hlo.stablehlo.mlir_utils import parse_dense, to_shape
    with _MLIR_LOCK, _mlir_context(), ir.Location.unknown():
        try:
            attr = ir.Attribute.parse(text) if text else None
        except Exception:   # MLIRError: not an attribute at all
            attr = None
        if text and not isinstance(attr, ir.ArrayAttr):
            raise ArgsError("expectected array attribute string for args, i.e. " + _ARGS_USAGE)
        values = []
        for a in (attr if attr is not None else []):
            if not isinstance(a, ir.DenseElementsAttr):
                raise ArgsError("expected dense elements attribute for args elements, i.e. "
                                + _ARGS_USAGE)
            shape = to_shape(a.type)
            try:
                printed = str(a)
            except TypeError as e:
                printed = re.search(r"\(Attribute\((.*)\)\)\s*$", str(e), re.S).group(1)
            values.append(parse_dense(printed, shape))
    return values


class ArgsError(CheckRewriteError):
    pass


# --- comparing -------------------------------------------------------------------------------
def _options(inst: Any) -> dict[str, str]:
    cfg = inst.attrs.get("backend_config")
    text = str(cfg) if cfg is not None else ""
    text = text.strip('"')
    return dict(kv.split("=", 1) for kv in text.split(",") if "=" in kv)


def _fmt(x: np.ndarray) -> str:
    s = np.array2string(np.asarray(x), threshold=12, max_line_width=200)
    return " ".join(s.split())


def _floatish(a: np.ndarray) -> bool:
    return a.dtype.kind in "fcV" or "float" in str(a.dtype) or "bfloat" in str(a.dtype)


def _parts(a: np.ndarray) -> list[np.ndarray]:
    """Float components in their own type: [x] for reals, [re, im] for complex."""
    if a.dtype.kind == "c":
        return [a.real, a.imag]
    return [a]


def compare_eq(actual: np.ndarray, expected: np.ndarray) -> Optional[str]:
    """``check.expect_eq``: element ``==`` (for floats IEEE equality, as the reference
    interpreter compares APFloats: NaN never equals, -0 equals +0)."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return f"shape {a.shape} != expected {e.shape}"
    if _floatish(a):
        ok = np.ones(a.shape, bool)
        for pa, pe in zip(_parts(a), _parts(e)):
            ok &= pa.astype(np.float64) == pe.astype(np.float64)
    else:
        ok = a == e
    if not np.all(ok):
        return f"got {_fmt(a)}, expected {_fmt(e)}"
    return None


def _almost_equal(x: np.ndarray, y: np.ndarray, tol: float) -> np.ndarray:
    """The reference interpreter's areApproximatelyEqual on one float component: equal, or
    both NaN, or both finite and within ``tol`` absolutely (in double precision)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.isfinite(x) & np.isfinite(y) & (np.abs(x - y) <= tol)
    return (x == y) | (np.isnan(x) & np.isnan(y)) | close


def compare_almost_eq(actual: np.ndarray, expected: np.ndarray, tol: float) -> Optional[str]:
    """``check.expect_almost_eq``: each float (each complex part) equal, both NaN, or both
    finite with ``|actual - expected| <= tol`` (absolute only, no relative term)."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return f"shape {a.shape} != expected {e.shape}"
    if not _floatish(a):
        return compare_eq(a, e)
    ok = np.ones(a.shape, bool)
    for pa, pe in zip(_parts(a), _parts(e)):
        ok &= _almost_equal(pa, pe, tol)
    if not np.all(ok):
        return f"got {_fmt(a)}, expected {_fmt(e)} (tolerance {tol})"
    return None


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
UNBOUNDED_ULP = 2**64 - 1     # CheckOps.cpp: the ULP difference of finite vs non-finite


def _ulp_difference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The reference interpreter's ULP difference of one float component (object array of
    ints; -1 stands for "unbounded": one value non-finite and not bitwise equal)."""
    bits = x.dtype.itemsize * 8
    sign = 1 << (bits - 1)
    xb = x.view(_UINT[x.dtype.itemsize]).ravel()
    yb = y.view(_UINT[y.dtype.itemsize]).ravel()
    xf, yf = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    out = []
    for i in range(xb.size):
        bx, by = int(xb[i]), int(yb[i])
        if bx == by:
            out.append(0)
        elif np.isfinite(xf[i]) and np.isfinite(yf[i]):
            mx, my = bx & ~sign, by & ~sign      # ULP distance of |x|, |y| from zero
            out.append(mx + my if (bx & sign) != (by & sign) else abs(mx - my))
        elif np.isnan(xf[i]) and np.isnan(yf[i]):
            out.append(0)
        else:
            out.append(-1)
    return np.array(out, dtype=object).reshape(x.shape)


def compare_close(actual: np.ndarray, expected: np.ndarray, max_ulp: int,
                  min_ulp: int = 0) -> Optional[str]:
    """``check.expect_close``: ``min_ulp <= ulp_difference <= max_ulp`` per element (for
    complex, the larger of the parts' differences)."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return f"shape {a.shape} != expected {e.shape}"
    if not _floatish(a):
        return f"expect_close needs floating-point operands, got {a.dtype}"
    diffs = [_ulp_difference(pa, pe) for pa, pe in zip(_parts(a), _parts(e))]
    bad = []
    for idx in np.ndindex(a.shape):
        ds = [d[idx] for d in diffs]
        d = -1 if -1 in ds else max(ds)
        # "Unbounded" is the reference's largest uint64, which a bound may name exactly.
        value = UNBOUNDED_ULP if d == -1 else d
        if value > max_ulp or value < min_ulp:
            bad.append((idx, d))
    if bad:
        idx, d = bad[0]
        dtext = "unbounded" if d == -1 else str(d)
        # The first bad element leads: whole arrays of thousands of values say little.
        return (f"{len(bad)} element(s) off; first at index {list(idx)}: got {a[idx]!r}, "
                f"expected {e[idx]!r} (ULP difference {dtext} outside [{min_ulp}, {max_ulp}]); "
                f"got {_fmt(a)}, expected {_fmt(e)}")
    return None


# --- running ---------------------------------------------------------------------------------
def _eval_options() -> dict:
    """Evaluate in the StableHLO spec's numerics where the interpreter offers that mode
    (the suite's expected values come from the reference interpreter, not XLA:CPU)."""
    from hlo.evaluator.core import EvalContext
    fields = getattr(EvalContext, "__dataclass_fields__", {})
    return {"numerics": "spec"} if "numerics" in fields else {}


@dataclass
class _CaseState:
    """What one case's custom-call handlers share."""
    text: str                                  # the rewritten case (for per-program imports)
    runs: list[ParallelRun]
    failures: list[str] = field(default_factory=list)
    checks: int = 0
    probes: dict[str, list[np.ndarray]] = field(default_factory=dict)
    printed: list[str] = field(default_factory=list)
    modules: dict[str, Any] = field(default_factory=dict)
    print_names: list[str] = field(default_factory=list)   # see print_names()

    def module_for(self, sym: str) -> Any:
        """The case's function ``@sym`` imported as the entry of its own module."""
        if sym not in self.modules:
            import hlo
            self.modules[sym] = hlo.from_stablehlo(self.text, entry=sym)
        return self.modules[sym]


def _results_of(comp: Any, value: Any) -> list:
    """A function's results as a list (the importer returns several as one tuple)."""
    root = comp.root
    if root.opcode == "tuple" and isinstance(value, tuple):
        return list(value)
    return [value]


def _run_parallel(state: _CaseState, inst: Any, operands: list, ctx: Any) -> Any:
    from hlo.evaluator.collectives import simulate_programs
    run = state.runs[int(_options(inst)["index"])]
    grid = run.programs
    num_replicas, num_partitions = len(grid), len(grid[0]) if grid else 0
    if any(len(row) != num_partitions for row in grid):
        raise CheckRewriteError("interpreter.run_parallel: programs is not a rectangular grid")
    comps = [state.module_for(sym).entry for row in grid for sym in row]
    args, pos = [], 0
    for comp in comps:
        n = len(comp.parameters)
        args.append(operands[pos:pos + n])
        pos += n
    if pos != len(operands):
        raise CheckRewriteError(f"interpreter.run_parallel: the programs take {pos} inputs, "
                                f"got {len(operands)}")
    infeed = []
    for sym in run.infeed:
        import hlo
        infeed.append(hlo.evaluate(state.module_for(sym), [], **_eval_options()))
    handlers = _handlers(state)
    results, _outfeed = simulate_programs(comps, args, num_replicas, num_partitions,
                                          timeout=10.0, infeed=infeed,
                                          custom_calls=handlers, **_eval_options())
    flat = [r for comp, res in zip(comps, results) for r in _results_of(comp, res)]
    want = len(inst.shape.elements) if inst.shape.is_tuple else 1
    if len(flat) != want:
        raise CheckRewriteError(f"interpreter.run_parallel: the programs return {len(flat)} "
                                f"results, the op has {want}")
    return tuple(flat) if inst.shape.is_tuple else flat[0]


def _handlers(state: _CaseState) -> dict:
    def check(inst, operands, ctx):
        state.checks += 1
        kind = inst.attrs["custom_call_target"].split(".", 1)[1]
        opts = _options(inst)
        if kind in ("eq",):  # testdata form: returns i1 instead of asserting
            return np.array(compare_eq(operands[0], operands[1]) is None)
        actual = operands[0]
        if kind == "expect_serialized_eq":
            pid, it = opts.get("probe_id", ""), int(opts.get("iter", 0))
            seen = state.probes.get(pid, [])
            if it >= len(seen):
                err = f"probe {pid!r} recorded {len(seen)} value(s), no iteration {it}"
            elif seen[it].dtype != actual.dtype:
                err = f"probe {pid!r} recorded type {seen[it].dtype}, expected {actual.dtype}"
            else:
                err = compare_eq(actual, seen[it])
        elif kind in ("expect_eq", "expect_eq_const"):
            err = compare_eq(actual, operands[1])
        elif kind in ("expect_almost_eq", "expect_almost_eq_const"):
            err = compare_almost_eq(actual, operands[1],
                                    float(opts.get("tolerance", CUSTOM_CALL_TOLERANCE)))
        elif kind == "expect_close":
            err = compare_close(actual, operands[1],
                                int(opts.get("max_ulp_difference", CUSTOM_CALL_MAX_ULP)),
                                int(opts.get("min_ulp_difference", 0)))
        else:
            err = f"unknown check {kind}"
        if err:
            state.failures.append(f"{inst.attrs['custom_call_target']} (%{inst.name}): {err}")
        return ()

    def probe(inst, operands, ctx):
        # interpreter.probe: identity that records each value it sees (1 list per id).
        state.probes.setdefault(_options(inst).get("probe_id", ""), []).append(
            np.array(operands[0], copy=True))
        return operands[0]

    def print_(inst, operands, ctx):
        # interpreter.print: ``<ssa name> = `` and the tensor, as one line-group (so that
        # prints of several simulated devices never interleave).
        idx = int(_options(inst).get("print_index", -1))
        label = state.print_names[idx] if 0 <= idx < len(state.print_names) else ""
        state.printed.append(label + format_tensor(operands[0], inst.operands[0].shape.dtype))
        return operands[0]

    names = [f"check.{k}" for k in CHECK_TARGETS] + ["check.eq"]
    table: dict = {n: check for n in names}
    table["interpreter.probe"] = probe
    table["interpreter.print"] = print_
    table["interpreter.run_parallel"] = lambda inst, ops, ctx: _run_parallel(state, inst, ops,
                                                                             ctx)
    return table


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first}" if not first.startswith(type(e).__name__) else first


@dataclass
class Interpretation:
    """What ``stablehlo-translate --interpret`` would produce for one case."""
    stdout: str = ""
    stderr: str = ""
    ok: bool = True
    stage: str = ""              # "import" | "evaluate" | "args" | "" (where it failed)
    checks: int = 0
    failures: list[str] = field(default_factory=list)


def interpret(case: str, args: Optional[str] = None, print_dense: bool = False
              ) -> Interpretation:
    """Run one case as the reference interpreter would: check ops compared, prints and the
    entry function's results formatted (``print_dense``: as dense attributes), ``args`` (the
    ``--args`` text) fed to the entry function."""
    import hlo
    res = Interpretation()

    def fail(stage: str, message: str) -> Interpretation:
        res.ok, res.stage = False, stage
        res.stderr += f"error: {message}\n"
        return res

    try:
        inputs = parse_args_option(args) if args is not None else []
    except ArgsError as e:
        return fail("args", str(e))
    try:
        text, runs = rewrite_run_parallel(rewrite_newer_collectives(case))
        text = rewrite_checks(rewrite_probes(text))
        module = hlo.from_stablehlo(text)
        names = print_names(case)
    except Exception as e:  # noqa: BLE001  (a bad case must not stop the run)
        return fail("import", _one_line(e))
    entry = module.entry
    if len(inputs) != len(entry.parameters):
        return fail("args", f"the entry function takes {len(entry.parameters)} argument(s), "
                            f"got {len(inputs)} (pass them with {_ARGS_USAGE})")
    for i, (x, p) in enumerate(zip(inputs, entry.parameters)):
        if tuple(x.shape) != tuple(p.shape.dims) or x.dtype != p.shape.dtype.np_dtype:
            return fail("args", f"argument {i} has type "
                                f"{mlir_tensor_type(x.shape, _dtype_of(x))}, the entry "
                                f"function expects {mlir_tensor_type(p.shape.dims, p.shape.dtype)}")
    state = _CaseState(text, runs, print_names=names)
    try:
        value = hlo.evaluate(module, inputs, custom_calls=_handlers(state), **_eval_options())
    except Exception as e:  # noqa: BLE001
        res.checks = state.checks
        res.stdout = "".join(p + "\n" for p in state.printed)
        return fail("evaluate", _one_line(e))
    res.checks, res.failures = state.checks, list(state.failures)
    lines = list(state.printed)
    root = entry.root
    values = _results_of(entry, value)
    shapes = [o.shape for o in root.operands] if root.opcode == "tuple" and \
        isinstance(value, tuple) else [root.shape]
    try:
        for v, shape in zip(values, shapes):
            if shape.is_tuple or shape.is_token:
                continue
            lines.append(format_dense(v, shape.dtype) if print_dense
                         else format_tensor(v, shape.dtype))
    except Exception as e:  # noqa: BLE001
        return fail("evaluate", "cannot print the results: " + _one_line(e))
    res.stdout = "".join(line + "\n" for line in lines)
    for f in state.failures:
        fail("evaluate", f)
    return res


def _dtype_of(x: np.ndarray) -> Any:
    from hlo import dtypes as dt
    return dt.from_numpy(x.dtype)


def run_case(file: str, case: str, run_lines: Sequence[RunLine] = (),
             first_line: int = 1) -> CaseResult:
    """One case: its check ops, and each FileCheck RUN line whose prefixes the case uses
    (``first_line``: where the case starts in its file, for FileCheck's line numbers)."""
    from .filecheck import FileCheckError, filecheck, parse_directives
    name = case_name(case)
    try:
        fc_runs = [r for r in run_lines if parse_directives(case, r.prefixes)]
    except FileCheckError as e:
        return CaseResult(file, name, False, f"FileCheck: {e}")
    if not fc_runs:
        out = interpret(case)
        if not out.ok and out.stage in ("import", "args"):
            return CaseResult(file, name, False, f"{out.stage}: " +
                              out.stderr.strip().splitlines()[0][len("error: "):])
        if out.failures:
            return CaseResult(file, name, False, "wrong value: " + out.failures[0], out.checks)
        if not out.ok:
            return CaseResult(file, name, False,
                              "evaluate: " + out.stderr.strip().splitlines()[0][len("error: "):],
                              out.checks)
        if out.checks == 0 and re.search(r"//\s*CHECK", case):
            # The expectation is on printed output, but no RUN line here pipes to FileCheck.
            return CaseResult(file, name, False, "needs FileCheck of printed output")
        return CaseResult(file, name, True, "", out.checks)
    cache: dict[tuple, Interpretation] = {}
    checks = 0
    padded = "\n" * (first_line - 1) + case
    for run in fc_runs:
        key = (run.args, run.print_dense)
        if key not in cache:
            cache[key] = interpret(case, run.args, run.print_dense)
        out = cache[key]
        where = f"RUN line {run.line}"
        if run.expect_fail and out.ok:
            return CaseResult(file, name, False, f"{where}: expected the interpreter to fail "
                                                 "('not'), it succeeded", out.checks)
        if not run.expect_fail and not out.ok:
            return CaseResult(file, name, False, f"{where}: " +
                              out.stderr.strip().splitlines()[0], out.checks)
        output = out.stdout + (out.stderr if run.merge_stderr else "")
        errors = filecheck(padded, output, run.prefixes, Path(file).name)
        if errors:
            return CaseResult(file, name, False, f"FileCheck ({where}): {errors[0]}",
                              out.checks)
        checks += out.checks + len(parse_directives(case, run.prefixes))
    return CaseResult(file, name, True, "", checks)


def run_check_files(paths: Iterable[str | Path]) -> tuple[list[CaseResult], int, int]:
    """Run every case of every file; returns (results, passed, failed)."""
    results: list[CaseResult] = []
    for p in paths:
        p = str(p)
        try:
            text = Path(p).read_text()
        except OSError as e:
            results.append(CaseResult(p, "<file>", False, f"cannot read: {e}"))
            continue
        run_lines = parse_run_lines(text)
        at = 0
        for case in split_cases(text):
            at = text.find(case, at)
            results.append(run_case(p, case, run_lines, text.count("\n", 0, at) + 1))
            at += len(case)
    passed = sum(r.passed for r in results)
    return results, passed, len(results) - passed


def main_check(paths: Iterable[str | Path], out: TextIO = sys.stdout) -> int:
    """CLI entry: one line per failing case, then ``N passed, M failed``; 1 if any failed."""
    expanded: list[str] = []
    for p in paths:
        pp = Path(p)
        expanded.extend(sorted(str(x) for x in pp.glob("*.mlir")) if pp.is_dir() else [str(pp)])
    results, passed, failed = run_check_files(expanded)
    for r in results:
        if not r.passed:
            print(f"FAIL {r.label}: {r.reason}", file=out)
    print(f"{passed} passed, {failed} failed", file=out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main_check(sys.argv[1:]))
