"""A scatter of one scalar per batch row into a broadcast constant becomes a select over an
iota (passes/onehot_scatter.py): the gradient of take_along_axis, which otherwise writes a
[N, V] buffer of zeros before the softmax gradient can read it. Checked against the
reference interpreter on the scatter itself (out-of-range and negative indices skipped as
the scatter skips them, the combiner applied to the constant), and on cross-entropy
gradients against jax.jit with no [N, V] f32 buffer left for h200."""
import numpy as np
import pytest

import hlo
from passes import make_pass

# The scatter's computation (current value a, update b); "replace" returns the update.
COMBINERS = {
    "add": "  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] add(a, b)",
    "maximum": "  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] maximum(b, a)",
    "replace": "  a = f32[] parameter(0)\n  ROOT b = f32[] parameter(1)",
}


def _module(combiner: str, per_row: int = 1, fill: float = 2.5) -> hlo.Module:
    text = f"""HloModule onehot

comb {{
{COMBINERS[combiner]}
}}

ENTRY main {{
  c = f32[] constant({fill})
  zeros = f32[5,6]{{1,0}} broadcast(c), dimensions={{}}
  idx = s32[5,{per_row},1]{{2,1,0}} parameter(0)
  upd = f32[5,{per_row}]{{1,0}} parameter(1)
  ROOT s = f32[5,6]{{1,0}} scatter(zeros, idx, upd), update_window_dims={{}}, inserted_window_dims={{1}}, scatter_dims_to_operand_dims={{1}}, input_batching_dims={{0}}, scatter_indices_batching_dims={{0}}, index_vector_dim=2, to_apply=comb
}}
"""
    return hlo.parse_hlo(text)


@pytest.mark.parametrize("combiner", ["add", "maximum", "replace"])
def test_one_update_per_row_becomes_a_select_with_the_scatters_result(combiner):
    idx = np.array([3, -1, 6, 0, 5], np.int32).reshape(5, 1, 1)   # -1 and 6: skipped
    upd = np.array([1.5, 7.0, -3.0, -0.0, 9.0], np.float32).reshape(5, 1)
    want = np.asarray(hlo.evaluate(_module(combiner), [idx, upd]))
    m = _module(combiner)
    assert make_pass("simplify").run(m)
    ops = {i.opcode for i in m.entry.instructions}
    assert "scatter" not in ops and "select" in ops and "iota" in ops
    got = np.asarray(hlo.evaluate(m, [idx, upd]))
    np.testing.assert_array_equal(got, want)
    expect = np.full((5, 6), 2.5, np.float32)
    for row, (k, u) in enumerate(zip(idx.ravel(), upd.ravel())):
        if 0 <= k < 6:
            expect[row, k] = {"add": 2.5 + u, "maximum": max(2.5, u), "replace": u}[combiner]
    np.testing.assert_array_equal(got, expect)


def test_two_updates_per_row_stay_a_scatter():
    """Two indices per row may name one element twice (the adds accumulate): not a select."""
    m = _module("add", per_row=2)
    make_pass("simplify").run(m)
    assert any(i.opcode == "scatter" for i in m.entry.instructions)


def test_cross_entropy_gradient_without_vocabulary_sized_f32_buffers():
    """value_and_grad of a bf16 output layer + cross-entropy: equal to jax.jit on the CPU,
    and for h200 the only [N, V] buffer is the bf16 logits the gradient GEMMs read (before:
    the f32 zeros of the scatter, the scatter's result and the softmax numerator)."""
    jax = pytest.importorskip("jax")
    import ml_dtypes

    import runtime
    from benchmarks.heldout_programs import xent_32k
    rng = np.random.default_rng(2)
    n, d, v = 64, 32, 500
    args = ((rng.standard_normal((n, d))).astype(ml_dtypes.bfloat16),
            (rng.standard_normal((d, v)) * d ** -0.5).astype(ml_dtypes.bfloat16),
            rng.integers(0, v, n).astype(np.int32))
    want = jax.jit(xent_32k)(*args)
    c = runtime.jit(xent_32k, target="h200").lower(*args).compile()
    got = c(*args)
    assert abs(float(np.asarray(got[0])) - float(want[0])) <= 1e-3 * abs(float(want[0]))
    for g, w in zip(got[1], want[1]):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        assert np.max(np.abs(g - w)) <= 2e-2 * np.max(np.abs(w))
    wide = [bf.size for bf in c.buffer_assignment().buffers
            if bf.kind == "temp" and bf.size >= n * v * 2]
    assert wide == [n * v * 2], wide        # the bf16 logits alone
    assert not [i for i in c.module.entry.instructions if i.opcode == "scatter"]
