"""Run StableHLO interpreter test files (``check.expect_*``) through hlotk.

Each file holds cases split by ``// -----``; a case is a ``func.func`` with no arguments
whose ``check.*`` ops state expected values. JAX's MLIR context has no ``check`` dialect,
so each check op is rewritten (in the text) into
``stablehlo.custom_call @check.expect_*(%actual, %expected)`` with the expected ``dense``
constant as its own ``stablehlo.constant``; options (tolerance, ulp bounds) travel in
``backend_config``. The case is imported with ``hlo.from_stablehlo`` and evaluated with
``hlo.evaluate``; the custom-calls are answered by this module, which compares values.

    python -c 'from runtime.conformance import main_check; main_check(["add.mlir"])'
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, TextIO

import numpy as np

CHECK_TARGETS = ("expect_eq", "expect_eq_const", "expect_almost_eq", "expect_almost_eq_const",
                 "expect_close", "expect_serialized_eq")
# Defaults of StableHLO's check dialect (stablehlo/tests/CheckOps.td).
DEFAULT_TOLERANCE = 1e-4      # expect_almost_eq[_const] ``tolerance``
DEFAULT_MAX_ULP = 1           # expect_close ``max_ulp_difference``


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


_PROBE_RE = re.compile(r'(?m)^(\s*)((?:%[\w#$.\-:]+\s*=\s*)?)interpreter\.(probe|print)\s+'
                       r'(%[\w#$.\-]+)\s*(?:,\s*probe_id\s*=\s*"((?:[^"\\]|\\.)*)")?\s*'
                       r'(?:\{[^}\n]*\}\s*)?:\s*([^\n]+?)\s*$')


def rewrite_probes(case: str) -> str:
    """``interpreter.probe``/``interpreter.print`` -> an identity ``stablehlo.custom_call``
    (target ``interpreter.probe``/``interpreter.print``) that the runner answers."""
    def repl(m: re.Match) -> str:
        indent, lhs, kind, operand, probe_id, ty = m.groups()
        cfg = f"probe_id={probe_id}" if probe_id is not None else ""
        return (f"{indent}{lhs}stablehlo.custom_call @interpreter.{kind}({operand}) "
                f'{{has_side_effect = true, backend_config = "{cfg}"}} : ({ty}) -> {ty}')
    return _PROBE_RE.sub(repl, case)


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
        if d == -1 or d > max_ulp or d < min_ulp:
            bad.append((idx, d))
    if bad:
        idx, d = bad[0]
        dtext = "unbounded" if d == -1 else str(d)
        return (f"got {_fmt(a)}, expected {_fmt(e)} (ULP difference {dtext} at index "
                f"{list(idx)} outside [{min_ulp}, {max_ulp}]; {len(bad)} element(s) off)")
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
                                    float(opts.get("tolerance", DEFAULT_TOLERANCE)))
        elif kind == "expect_close":
            err = compare_close(actual, operands[1],
                                int(opts.get("max_ulp_difference", DEFAULT_MAX_ULP)),
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
        state.printed.append(np.array2string(np.asarray(operands[0])))
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


def run_case(file: str, case: str) -> CaseResult:
    name = case_name(case)
    if re.search(r"func\.func\s+(?:public\s+)?@\w+\(%", case) and "--args" in case:
        return CaseResult(file, name, False, "needs --args inputs and FileCheck output")
    import hlo
    try:
        text, runs = rewrite_run_parallel(case)
        text = rewrite_checks(rewrite_probes(text))
        module = hlo.from_stablehlo(text)
    except Exception as e:  # noqa: BLE001  (a bad case must not stop the run)
        return CaseResult(file, name, False, "import: " + _one_line(e))
    state = _CaseState(text, runs)
    try:
        hlo.evaluate(module, [], custom_calls=_handlers(state), **_eval_options())
    except Exception as e:  # noqa: BLE001
        return CaseResult(file, name, False, "evaluate: " + _one_line(e), state.checks)
    if state.checks == 0 and re.search(r"//\s*CHECK", case):
        # The expectation is on the interpreter's printed output (FileCheck), not a check op.
        return CaseResult(file, name, False, "needs FileCheck of printed output")
    if state.failures:
        return CaseResult(file, name, False, "wrong value: " + state.failures[0], state.checks)
    return CaseResult(file, name, True, "", state.checks)


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
        for case in split_cases(text):
            results.append(run_case(p, case))
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
