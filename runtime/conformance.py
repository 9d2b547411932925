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
DEFAULT_TOLERANCE = 1e-4      # check.expect_almost_eq's default
DEFAULT_MAX_ULP = 4           # check.expect_close's default


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


# --- comparing -------------------------------------------------------------------------------
def _options(inst: Any) -> dict[str, str]:
    cfg = inst.attrs.get("backend_config")
    text = str(cfg) if cfg is not None else ""
    text = text.strip('"')
    return dict(kv.split("=", 1) for kv in text.split(",") if "=" in kv)


def _fmt(x: np.ndarray) -> str:
    s = np.array2string(np.asarray(x), threshold=12, max_line_width=200)
    return " ".join(s.split())


def _as_float(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "fc" and a.dtype.itemsize >= 4:
        return a
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    return a.astype(np.float64)


def _floatish(a: np.ndarray) -> bool:
    return a.dtype.kind in "fcV" or "float" in str(a.dtype) or "bfloat" in str(a.dtype)


def compare_eq(actual: np.ndarray, expected: np.ndarray) -> Optional[str]:
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return f"shape {a.shape} != expected {e.shape}"
    if _floatish(a):
        af, ef = _as_float(a), _as_float(e)
        ok = (af == ef) | (np.isnan(af) & np.isnan(ef))
    else:
        ok = a == e
    if not np.all(ok):
        return f"got {_fmt(a)}, expected {_fmt(e)}"
    return None


def compare_almost_eq(actual: np.ndarray, expected: np.ndarray, tol: float) -> Optional[str]:
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return f"shape {a.shape} != expected {e.shape}"
    if not _floatish(a):
        return compare_eq(a, e)
    af, ef = _as_float(a).astype(np.complex128), _as_float(e).astype(np.complex128)

    def part_ok(x, y):
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(x - y)
            close = (diff <= tol) | (diff <= tol * np.maximum(np.abs(x), np.abs(y)))
        return same | (np.isfinite(x) & np.isfinite(y) & close)
    ok = part_ok(af.real, ef.real) & part_ok(af.imag, ef.imag)
    if not np.all(ok):
        return f"got {_fmt(a)}, expected {_fmt(e)} (tolerance {tol})"
    return None


def _ulp_index(x: np.ndarray) -> np.ndarray:
    """Maps floats to integers so that adjacent floats differ by 1 (sign-magnitude fix)."""
    bits = x.dtype.itemsize * 8
    u = x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])
    u = u.astype(object)
    sign = 1 << (bits - 1)
    return np.array([-(int(v) - sign) if int(v) & sign else int(v) for v in u.ravel()],
                    dtype=object).reshape(x.shape)


def compare_close(actual: np.ndarray, expected: np.ndarray, max_ulp: int,
                  min_ulp: int = 0) -> Optional[str]:
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return f"shape {a.shape} != expected {e.shape}"
    if not _floatish(a) or a.dtype.kind == "c":
        return compare_almost_eq(a, e, DEFAULT_TOLERANCE)
    an, en = np.isnan(_as_float(a)), np.isnan(_as_float(e))
    d = np.abs(_ulp_index(a) - _ulp_index(e))
    ok = (an & en) | (~an & ~en & (d <= max_ulp) & (d >= min_ulp))
    if not np.all(ok):
        return f"got {_fmt(a)}, expected {_fmt(e)} (ulp difference outside [{min_ulp}, {max_ulp}])"
    return None


# --- running ---------------------------------------------------------------------------------
def _handlers(failures: list[str], counter: list[int]) -> dict:
    def check(inst, operands, ctx):
        counter[0] += 1
        kind = inst.attrs["custom_call_target"].split(".", 1)[1]
        opts = _options(inst)
        if kind == "expect_serialized_eq":
            failures.append("needs interpreter.probe")
            return ()
        if kind in ("eq",):  # testdata form: returns i1 instead of asserting
            return np.array(compare_eq(operands[0], operands[1]) is None)
        actual, expected = operands[0], operands[1]
        if kind in ("expect_eq", "expect_eq_const"):
            err = compare_eq(actual, expected)
        elif kind in ("expect_almost_eq", "expect_almost_eq_const"):
            err = compare_almost_eq(actual, expected,
                                    float(opts.get("tolerance", DEFAULT_TOLERANCE)))
        elif kind == "expect_close":
            err = compare_close(actual, expected,
                                int(opts.get("max_ulp_difference", DEFAULT_MAX_ULP)),
                                int(opts.get("min_ulp_difference", 0)))
        else:
            err = f"unknown check {kind}"
        if err:
            failures.append(f"{inst.attrs['custom_call_target']} (%{inst.name}): {err}")
        return ()
    names = [f"check.{k}" for k in CHECK_TARGETS] + ["check.eq"]
    return {n: check for n in names}


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first}" if not first.startswith(type(e).__name__) else first


def run_case(file: str, case: str) -> CaseResult:
    name = case_name(case)
    if "interpreter.run_parallel" in case:
        return CaseResult(file, name, False, "needs interpreter.run_parallel")
    if re.search(r"func\.func\s+(?:public\s+)?@\w+\(%", case) and "--args" in case:
        return CaseResult(file, name, False, "needs --args inputs and FileCheck output")
    if "interpreter.probe" in case:
        return CaseResult(file, name, False, "needs interpreter.probe")
    import hlo
    try:
        module = hlo.from_stablehlo(rewrite_checks(case))
    except Exception as e:  # noqa: BLE001  (a bad case must not stop the run)
        return CaseResult(file, name, False, "import: " + _one_line(e))
    failures: list[str] = []
    counter = [0]
    try:
        hlo.evaluate(module, [], custom_calls=_handlers(failures, counter))
    except Exception as e:  # noqa: BLE001
        return CaseResult(file, name, False, "evaluate: " + _one_line(e), counter[0])
    if counter[0] == 0 and re.search(r"//\s*CHECK", case):
        # The expectation is on the interpreter's printed output (FileCheck), not a check op.
        return CaseResult(file, name, False, "needs FileCheck of printed output")
    if failures:
        return CaseResult(file, name, False, "wrong value: " + failures[0], counter[0])
    return CaseResult(file, name, True, "", counter[0])


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
