"""Whatever the pipeline spec, each backend runs the passes its executor needs.

The zoo (tests/zoo.py) through the CPU arena executor with ``pipeline="none"`` and with each
single pass alone, against ``jax.jit``. CI runs ``none`` on every program and each pass on a
few programs (round robin); the full cross
product is marked slow and runs with ``HLOTK_LONG_TESTS=1``.
"""
from __future__ import annotations

import functools
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import hlo  # noqa: E402
import runtime  # noqa: E402
from passes.pipelines import MANDATORY_LOWERING, mandatory_lowering, pipeline_spec  # noqa: E402
from tests.zoo import ZOO, assert_flat_close, by_name, x64_scope  # noqa: E402

# Every registered pass, each alone (options where the pass needs a target to mean much).
SINGLE_PASSES = [
    "inline", "flatten-call-graph", "simplify", "tuple-simplify", "control-flow-simplify",
    "constant-folding", "cse", "dce", "layout-assignment{target=cpu}",
    "layout-assignment{target=gpu}", "layout-normalization", "fusion", "fusion{policy=greedy}",
    "schedule", "schedule{algorithm=dfs}", "copy-insertion", "latency-hiding-scheduler",
    "all-reduce-combiner", "sharding-propagation", "async-collective-creator",
    "spmd-partitioner",
]
# The deviceless GPU pipeline (what backend="cuda" runs) on the CPU arena, also whole.
SINGLE_PASSES.append(pipeline_spec("default", "cuda"))
NAMES = [p.name for p in ZOO]


@functools.cache
def _imported(name: str) -> tuple[hlo.Module, list[np.ndarray], object]:
    """(module, flat arguments, jax.jit's result): traced once per program."""
    prog = by_name(name)
    with x64_scope(prog):
        args = prog.args()
        expected = jax.tree.map(np.asarray, jax.jit(prog.fn)(*args))
        return hlo.from_jax(prog.fn, *args), [np.asarray(a) for a in jax.tree.leaves(args)], \
            expected


def _check(name: str, pipeline: str) -> None:
    """``name`` compiled with ``pipeline`` for the CPU arena executor, against jax.jit."""
    module, args, expected = _imported(name)
    prog = by_name(name)
    client = runtime.client("cpu")
    exe = client.compile(module, pipeline=pipeline)
    got = [b.to_numpy() for b in exe.execute([client.buffer_from_pyval(a) for a in args])]
    assert_flat_close(tuple(got), expected, prog.rtol, prog.atol)


def test_random_bits_in_a_loop_with_shared_call_is_right_without_passes():
    """The issue's reproducer: threefry in a while loop whose body calls a computation; the
    callee returns its parameters permuted, so the call's result aliased the loop state."""
    fn = lambda k: jax.random.bits(jax.random.wrap_key_data(k), (3,))  # noqa: E731
    key = np.array([0, 42], np.uint32)
    expected = np.asarray(jax.jit(fn)(key))
    for pipeline in ("none", "flatten-call-graph", "copy-insertion", "default"):
        np.testing.assert_array_equal(runtime.jit(fn, pipeline=pipeline)(key), expected,
                                      err_msg=pipeline)


def test_mandatory_passes_are_recorded():
    fn = lambda x: jax.lax.fori_loop(0, 3, lambda i, v: v * 2.0, x)  # noqa: E731
    x = np.ones(4, np.float32)
    none = runtime.jit(fn, pipeline="none").lower(x).compile().executable.pass_records
    assert [(r.name, r.mandatory) for r in none] == [("schedule", True)]
    # A pipeline that ends in its own schedule keeps it: nothing mandatory runs after it.
    dfs = runtime.jit(fn, pipeline="schedule{algorithm=dfs}").lower(x).compile()
    assert [(r.name, r.mandatory) for r in dfs.executable.pass_records] == [
        ("schedule{algorithm=dfs}", False)]
    # A pass after the schedule changes the module: it is scheduled again.
    later = runtime.jit(fn, pipeline="schedule,inline,simplify").lower(x).compile()
    assert later.executable.pass_records[-1].mandatory
    interp = runtime.jit(fn, pipeline="none", backend="interpreter").lower(x).compile()
    assert interp.executable.pass_records == []
    np.testing.assert_array_equal(later(x), np.full(4, 8.0, np.float32))


def test_mandatory_lowering_table():
    assert set(MANDATORY_LOWERING) == {"cpu", "cuda", "interpreter"}
    assert mandatory_lowering("cpu") == "schedule"
    assert mandatory_lowering("interpreter") == ""


@pytest.mark.parametrize("name", NAMES)
def test_zoo_without_passes(name: str):
    _check(name, "none")


def _round_robin(k: int) -> list[str]:
    """Two zoo programs for the k-th pass, round robin over the zoo."""
    return sorted({NAMES[(2 * k) % len(NAMES)], NAMES[(2 * k + 1) % len(NAMES)]})


@pytest.mark.parametrize("pipeline,name", [(p, n) for k, p in enumerate(SINGLE_PASSES)
                                           for n in _round_robin(k)])
def test_single_pass(pipeline: str, name: str):
    _check(name, pipeline)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("HLOTK_LONG_TESTS") != "1",
                    reason="the whole cross product: HLOTK_LONG_TESTS=1 (about 3 minutes)")
@pytest.mark.parametrize("pipeline", SINGLE_PASSES)
def test_single_pass_whole_zoo(pipeline: str):
    failures = []
    for name in NAMES:
        try:
            _check(name, pipeline)
        except AssertionError as e:
            failures.append(f"{name}: {str(e)[:200]}")
    assert not failures, "\n".join(failures)
