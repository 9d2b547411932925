"""Differential fuzzing: random JAX programs (tests/fuzz_programs.py) run by ``jax.jit`` and
by every hlotk backend/pipeline combination this machine has, compared element by element.

Combinations (``COMBOS``): each pipeline of ``PIPELINE_SPECS`` runs once per program --
none, the CPU default, the default with fusion deciding for the H200 (``target="h200"``),
and the CUDA backend's whole pipeline (GPU layouts, library dots unfused) deviceless -- and
its module runs on both executors: the reference interpreter and the CPU arena executor
(thunks over one buffer arena, generated numpy fusion kernels). The pipelined module is
verified once after its pipeline.

CI runs a fixed-seed slice (``derandomize``; ``FUZZ_CI_EXAMPLES`` programs).
``HLOTK_FUZZ_EXAMPLES=N`` runs N random programs instead; with ``HLOTK_FUZZ_LOG=FILE`` a
mismatch is appended to FILE (program, combination, message) and the run goes on, so a long
run lists every failing program rather than stopping and shrinking the first.

Tolerances (``TOLERANCE``): float32/complex64 1e-5 relative, f16 and bf16 1e-2 -- or
the loosest of the float types the program passes through (``program_tolerance``) --
with an absolute floor of the same size times the output's largest magnitude (sums and
dots of values of both signs cancel); NaN and infinity positions must agree; integers and
booleans exactly.
"""
from __future__ import annotations

import os
import traceback

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

import hlo  # noqa: E402
from passes import run_pipeline  # noqa: E402
from passes.fusion.pass_ import with_target  # noqa: E402
from passes.pipelines import PIPELINES  # noqa: E402
from runtime.jit import default_client  # noqa: E402
from runtime.client import flatten_value  # noqa: E402
from tests.fuzz_programs import Program, np_dtype, programs  # noqa: E402

FUZZ_CI_EXAMPLES = 100
EXAMPLES = int(os.environ.get("HLOTK_FUZZ_EXAMPLES", FUZZ_CI_EXAMPLES))
LONG = "HLOTK_FUZZ_EXAMPLES" in os.environ
LOG = os.environ.get("HLOTK_FUZZ_LOG")

# Pipelines, each run once per program; every one runs on both executors.
PIPELINE_SPECS = {
    "none": "",
    "default": PIPELINES["default"]["cpu"],
    "default@h200": with_target(PIPELINES["default"]["cpu"], "h200"),
    "cuda-pipeline@h200": with_target(PIPELINES["default"]["cuda"], "h200"),
}
EXECUTORS = ("interpreter", "cpu")
COMBOS = [f"{executor}/{pipeline}" for pipeline in PIPELINE_SPECS for executor in EXECUTORS]

TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.complex64): 1e-5,
             np.dtype(np.float16): 1e-2}   # f16 half-ulp 5e-4: chains of exp amplify it


def tolerance(dtype: np.dtype) -> float:
    import ml_dtypes
    if dtype == np.dtype(ml_dtypes.bfloat16):
        return 1e-2
    return TOLERANCE[dtype]


def program_tolerance(prog: Program) -> float:
    """The loosest tolerance of the float types a program's values pass through: XLA
    computes bf16/f16 operations in f32 and, allowed excess precision (its default), skips
    the rounding between them (``sin`` of a bf16 converted to f32 is the f32 sine), so an
    f32 result downstream of bf16 values is only as close as bf16."""
    import ml_dtypes
    tols = [tolerance(np_dtype(v.dtype)) for v in prog.values
            if np_dtype(v.dtype).kind == "f" or np_dtype(v.dtype) == ml_dtypes.bfloat16]
    return max(tols, default=0.0)


def compare(actual: np.ndarray, expected: np.ndarray, min_tol: float = 0.0) -> str | None:
    """None when ``actual`` matches ``expected`` (see the module docstring), else why not;
    floats with at least ``min_tol`` relative tolerance."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return (f"type {actual.dtype}{list(actual.shape)}, expected "
                f"{expected.dtype}{list(expected.shape)}")
    if expected.dtype.kind in "biu":
        bad = actual != expected
    else:
        tol = max(tolerance(expected.dtype), min_tol)
        a = actual.astype(np.complex128 if expected.dtype.kind == "c" else np.float64)
        e = expected.astype(a.dtype)
        parts_a = (a.real, a.imag) if a.dtype.kind == "c" else (a,)
        parts_e = (e.real, e.imag) if e.dtype.kind == "c" else (e,)
        bad = np.zeros(e.shape, bool)
        finite = np.concatenate([np.abs(p[np.isfinite(p)]) for p in parts_e] + [np.zeros(1)])
        scale = max(1.0, float(finite.max()))
        for pa, pe in zip(parts_a, parts_e):
            nan_a, nan_e = np.isnan(pa), np.isnan(pe)
            inf_mismatch = (np.isinf(pe) | np.isinf(pa)) & ~(nan_a | nan_e) & (pa != pe)
            with np.errstate(invalid="ignore"):
                far = np.abs(pa - pe) > tol * (scale + np.abs(pe))
            bad |= (nan_a != nan_e) | inf_mismatch | (far & np.isfinite(pe) & np.isfinite(pa))
    if not bad.any():
        return None
    where = np.argwhere(bad)[:3]
    got = [actual[tuple(i)] for i in where]
    want = [expected[tuple(i)] for i in where]
    return (f"{int(bad.sum())} of {bad.size} elements differ; at {[tuple(map(int, i)) for i in where]}"
            f" got {got}, jax.jit {want}")


def pipelined(module: hlo.Module, pipeline: str) -> hlo.Module:
    """``module`` after one of ``PIPELINE_SPECS`` (verified once, at the end)."""
    spec = PIPELINE_SPECS[pipeline]
    if not spec:
        return module
    out = module.clone()
    run_pipeline(out, spec)
    hlo.verify(out)
    return out


def execute(module: hlo.Module, executor: str, args: list[np.ndarray]) -> list[np.ndarray]:
    """Run an already compiled ``module``: the reference interpreter or the CPU arena."""
    if executor == "interpreter":
        return [np.asarray(x) for x in flatten_value(hlo.evaluate(module, args))]
    client = default_client("cpu")
    exe = client.compile(module, pipeline="none", verify=False)
    return [b.to_numpy() for b in exe.execute([client.buffer_from_pyval(a) for a in args])]


def run_combo(module: hlo.Module, combo: str, args: list[np.ndarray]) -> list[np.ndarray]:
    executor, pipeline = combo.split("/", 1)
    return execute(pipelined(module, pipeline), executor, args)


def differences(prog: Program) -> list[tuple[str, str]]:
    """(combination, message) for every combination that disagrees with jax.jit."""
    fn = prog.function()
    args = prog.inputs()
    try:
        expected = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(fn)(*args))]
    except Exception as e:  # noqa: BLE001
        if LOG:   # a generator bug: JAX refuses the program; listed, the long run goes on
            return [("jax.jit", f"generator: {type(e).__name__}: {e}")]
        raise
    module = hlo.from_jax(fn, *args)
    min_tol = program_tolerance(prog)
    found: list[tuple[str, str]] = []
    for pipeline in PIPELINE_SPECS:
        try:
            compiled = pipelined(module, pipeline)
        except Exception as e:  # noqa: BLE001  (any exception is a finding)
            found.append((f"*/{pipeline}", _describe(e)))
            continue
        for executor in EXECUTORS:
            name = f"{executor}/{pipeline}"
            COUNTS[name] = COUNTS.get(name, 0) + 1
            try:
                got = execute(compiled, executor, args)
            except Exception as e:  # noqa: BLE001
                found.append((name, _describe(e)))
                continue
            msgs = [f"output {k}: {m}" for k, (a, e) in enumerate(zip(got, expected))
                    if (m := compare(a, e, min_tol))]
            if len(got) != len(expected):
                msgs = [f"{len(got)} results, expected {len(expected)}"]
            found += [(name, m) for m in msgs]
    return found


def _describe(e: Exception) -> str:
    tb = "".join(traceback.format_tb(e.__traceback__)[-3:])
    return f"{type(e).__name__}: {e}\n{tb}"


def _record(prog: Program, found: list[tuple[str, str]]) -> None:
    with open(LOG, "a") as f:
        f.write("=" * 80 + f"\n{prog!r}\n")
        for name, msg in found:
            f.write(f"--- {name}: {msg}\n")


COUNTS: dict[str, int] = {}


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG, database=None,
          suppress_health_check=list(HealthCheck), print_blob=True)
@given(programs())
def test_random_programs_match_jax_jit(prog: Program) -> None:
    found = differences(prog)
    COUNTS["programs"] = COUNTS.get("programs", 0) + 1
    if LOG and COUNTS["programs"] % 100 == 0:
        with open(LOG, "a") as f:
            f.write(f"# progress: {COUNTS}\n")
    if found and LOG:
        _record(prog, found)
        return
    assert not found, "\n".join(f"{name}: {msg}" for name, msg in found)


def test_compare_catches_differences() -> None:
    """The comparison itself: NaN positions, tolerances, integer exactness."""
    f = np.float32
    assert compare(np.array([1.0, np.nan], f), np.array([1.0, np.nan], f)) is None
    assert compare(np.array([1.0, 2.0], f), np.array([1.0, np.nan], f)) is not None
    assert compare(np.array([1.0 + 1e-6], f), np.array([1.0], f)) is None
    assert compare(np.array([1.001], f), np.array([1.0], f)) is not None
    assert compare(np.array([np.inf], f), np.array([-np.inf], f)) is not None
    assert compare(np.array([3], np.int32), np.array([4], np.int32)) is not None
    assert compare(np.array([1], np.int32), np.array([1.0], f)) is not None
    import ml_dtypes
    bf = ml_dtypes.bfloat16
    assert compare(np.array([1.0078125], bf), np.array([1.0], bf)) is None
    assert compare(np.array([1.0625], bf), np.array([1.0], bf)) is not None
    assert compare(np.array([1 + 2j], np.complex64), np.array([1 + 2.1j], np.complex64))


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
