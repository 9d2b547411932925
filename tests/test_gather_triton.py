"""Gathers as Triton kernels (codegen/triton/gather.py): the gathered operand's producer is
computed at the gathered index inside the consumer's kernel. Programs through
``runtime.jit(backend="cuda")`` run in Triton's interpreter on the CPU, results against
``jax.jit``; the thunk kinds say no torch op is left; hand-written HLO covers dimension
numbers JAX does not emit (index_vector_dim not last) against the reference interpreter."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():
    pytest.skip("runs Triton's interpreter on CPU tensors; skipped where CUDA is present",
                allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton is imported
pytest.importorskip("triton")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import runtime  # noqa: E402
from runtime.cuda import executable_of  # noqa: E402
from tests.test_codegen_triton import check_fusion, make  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from attention import cross_entropy, masked_mean_nll  # noqa: E402

BF16 = jnp.bfloat16


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("HLOTK_AUTOTUNE", "0")


def rng(seed=0):
    return np.random.default_rng(seed)


def run(fn, *args, tol=1e-6, pipeline="default"):
    """``fn`` through hlotk's CUDA executable and jax.jit: integer leaves equal, float
    leaves within ``tol`` (relative norm); no gather left to torch or the host. Returns
    the executable."""
    compiled = runtime.jit(fn, backend="cuda", pipeline=pipeline).lower(*args).compile()
    got = jax.tree_util.tree_leaves(compiled(*args))
    want = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if g.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w)
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        np.testing.assert_array_equal(np.isnan(g64), np.isnan(w64))
        g64, w64 = np.nan_to_num(g64), np.nan_to_num(w64)
        err = np.linalg.norm(g64 - w64) / max(np.linalg.norm(w64), 1e-30)
        assert err <= tol, (fn.__name__, err)
    exe = executable_of(compiled)
    kinds = {t.kind for t in exe.thunks()}
    assert "torch-op" not in kinds, exe.describe()
    assert not exe.host_fallbacks(), exe.report()
    assert not exe.stats.get("gather_torch_fallbacks"), exe.stats["gather_torch_fallbacks"]
    return exe


def body(t) -> list:
    """The instructions a thunk computes (a fusion's body, or the one instruction)."""
    return list(t.inst.attrs["calls"].instructions) if t.inst.opcode == "fusion" else [t.inst]


def gather_kernels(exe) -> list:
    return [t for t in exe.thunks() if t.kind == "kernel"
            and any(i.opcode == "gather" for i in body(t))]


# --- take_along_axis and the vocabulary cross-entropy ---------------------------------------
def test_take_along_axis_last_axis():
    x = rng(0).standard_normal((9, 13)).astype(np.float32)
    idx = rng(1).integers(-13, 13, (9, 4)).astype(np.int32)     # negative indices wrap

    def f(x, idx):
        return jnp.take_along_axis(x, idx, axis=-1)
    exe = run(f, x, idx, tol=0)
    assert gather_kernels(exe)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_cross_entropy_gathers_in_a_kernel_without_log_probabilities(dtype):
    n, v = 24, 100
    x = rng(2).standard_normal((n, v)).astype(dtype)
    labels = rng(3).integers(0, v, n).astype(np.int32)
    exe = run(cross_entropy, x, labels, tol=1e-6)
    # One row kernel: the label's logit is gathered beside the row's max and sum
    # (passes/fusion/legality.py lets a gather join a normalization fusion).
    assert [(t.kind, t.kernel.template) for t in exe.thunks()] == [("kernel", "normalization")], \
        exe.describe()
    assert gather_kernels(exe)
    # No buffer the size of the f32 [N, V] log-probabilities: the gather reads the logits;
    # the only temp is the [N] result at most.
    assert exe.assignment.temp_size < n * v * 4, exe.report()


def test_masked_mean_nll_with_ignore_index():
    n, v = 32, 77
    x = rng(4).standard_normal((n, v)).astype(np.float32)
    labels = rng(5).integers(0, v, n).astype(np.int32)
    labels[::3] = -100
    exe = run(masked_mean_nll, x, labels, tol=1e-6)
    assert gather_kernels(exe)
    assert exe.assignment.temp_size < n * v * 4, exe.report()


def test_masked_mean_nll_bf16():
    n, v = 16, 64
    x = rng(6).standard_normal((n, v)).astype(BF16)
    labels = rng(7).integers(0, v, n).astype(np.int32)
    labels[1] = labels[7] = -100
    run(masked_mean_nll, x, labels, tol=1e-6)


# --- row gathers (embedding lookups) of computed values ---------------------------------------
def test_embedding_lookup_of_a_computed_table():
    w = rng(8).standard_normal((50, 16)).astype(np.float32)
    ids = rng(9).integers(0, 50, (4, 6)).astype(np.int32)

    def f(w, ids):
        return (w * 2 + 1)[ids]
    exe = run(f, w, ids, tol=0)
    ks = gather_kernels(exe)
    assert len(ks) == 1 and len(exe.thunks()) == 1, exe.describe()
    # The producer is computed at the gathered index: the kernel reads w itself.
    src = ks[0].kernel.source
    assert "multiply" in src and "add" in src


def test_unfused_gather_is_a_one_op_kernel():
    x = rng(10).standard_normal((10, 6)).astype(np.float32)
    idx = rng(11).integers(-10, 10, (7,)).astype(np.int32)
    exe = run(lambda x, idx: x[idx], x, idx, tol=0,
              pipeline="inline,layout-assignment{target=gpu},schedule")
    assert any("(one-op)" in t.label() for t in gather_kernels(exe)), exe.describe()


# --- index modes, out-of-range and negative indices -------------------------------------------
@pytest.mark.parametrize("mode", ["clip", "fill"])
def test_take_modes_out_of_range_and_negative(mode):
    x = rng(12).standard_normal((8, 5)).astype(np.float32)
    idx = np.array([0, 7, 8, 100, -1, -8, -9, -1000, 3], np.int32)

    def f(x, idx):
        return (jnp.take(x, idx, axis=0, mode=mode), jnp.take(x, idx[:4] % 5, axis=1, mode=mode),
                jnp.take(x * 3.0, idx, mode=mode))       # flattened operand
    run(f, x, idx, tol=0)


def test_int_and_s64_indices_clamp():
    x = rng(13).integers(-100, 100, (6, 4)).astype(np.int32)
    idx = np.array([[0, 1], [5, 3], [9, -2], [-7, 8]], np.int32)
    dn = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
                                    start_index_map=(0, 1))

    def f(x, idx):
        return lax.gather(x + 1, idx, dn, slice_sizes=(1, 3),
                          mode=lax.GatherScatterMode.CLIP)
    run(f, x, idx, tol=0)


# --- batched gathers ---------------------------------------------------------------------------
def test_vmapped_gather():
    x = rng(14).standard_normal((3, 10, 4)).astype(np.float32)
    idx = rng(15).integers(0, 10, (3, 5)).astype(np.int32)

    def f(x, idx):
        return jax.vmap(lambda a, i: jnp.exp(a)[i])(x, idx)
    exe = run(f, x, idx, tol=1e-6)
    gs = [i for t in gather_kernels(exe) for i in body(t) if i.opcode == "gather"]
    assert gs and any(g.attrs.get("operand_batching_dims") for g in gs), \
        [str(g.attrs) for g in gs]


def test_dynamic_slice_with_clamped_starts():
    x = rng(16).standard_normal((8, 9)).astype(np.float32)

    def f(x, i, j):
        y = jnp.tanh(x)
        return (lax.dynamic_slice(y, (i, j), (3, 4)),              # starts clamped high
                lax.dynamic_slice(x * 2, (j - 20, i), (5, 2)))     # and low
    exe = run(f, x, np.int32(7), np.int32(8), tol=1e-6)
    assert all(t.kind == "kernel" for t in exe.thunks()), exe.describe()


# --- dimension numbers JAX does not emit (against the reference interpreter) -------------------
def test_index_vector_dim_not_last():
    # Start indices s32[2, 5]: index vectors run along dim 0; the operand is a fused
    # producer (exp of a parameter), gathered as 1x3 windows with dim 0 collapsed.
    fusion = make("""  %p0 = f32[7,6] parameter(0)
  %e = f32[7,6] exponential(%p0)
  %p1 = s32[2,5] parameter(1)
  ROOT %g = f32[5,3] gather(%e, %p1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0,1}, index_vector_dim=0, slice_sizes={1,3}""",
                  ["p0: f32[7,6]", "p1: s32[2,5]"], "f32[5,3]")
    idx = np.array([[0, 6, 9, -3, 2], [0, 5, 1, 2, -8]], np.int32)
    x = rng(17).standard_normal((7, 6)).astype(np.float32)
    kernel = check_fusion(fusion, args=[x, idx])
    assert kernel.template == "loop"


def test_batching_dims_with_index_vector_dim_in_the_middle():
    # operand f32[3,8,4] with batch dim 0; indices s32[3,1,2] (batch, vector, window).
    fusion = make("""  %p0 = f32[3,8,4] parameter(0)
  %p1 = s64[3,1,2] parameter(1)
  ROOT %g = f32[3,2,4] gather(%p0, %p1), offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=1, slice_sizes={1,1,4}""",
                  ["p0: f32[3,8,4]", "p1: s64[3,1,2]"], "f32[3,2,4]")
    idx = np.array([[[1, 7]], [[-5, 3]], [[2**40, 0]]], np.int64)   # 2**40 clamps to 7
    x = rng(18).standard_normal((3, 8, 4)).astype(np.float32)
    check_fusion(fusion, args=[x, idx])


# --- gathers inside reduction kernels ----------------------------------------------------------
def test_gathered_rows_reduced_along_rows_and_columns():
    w = rng(19).standard_normal((40, 24)).astype(np.float32)
    ids = rng(20).integers(-40, 40, (30,)).astype(np.int32)

    def f(w, ids):
        g = jnp.exp(w * 0.5)[ids]
        return g.sum(axis=1), g.max(axis=0), jax.nn.softmax(g, axis=-1)
    exe = run(f, w, ids, tol=1e-5)
    assert gather_kernels(exe), exe.describe()


# --- unsigned and 64-bit indices ---------------------------------------------------------------
def test_u64_and_u8_indices_clamp_without_wrapping():
    # 2**63 + 3 is above int64: it must clamp to the last row (the reference interpreter
    # used to wrap it to a negative int64 and clamp to row 0).
    dn = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
                                    start_index_map=(0,))
    x = np.arange(12.0, dtype=np.float32).reshape(6, 2)

    def f(x, i64, i8):
        g = lambda i: lax.gather(x * 2, i, dn, slice_sizes=(1, 2),  # noqa: E731
                                 mode=lax.GatherScatterMode.CLIP)
        return g(i64), g(i8)
    with jax.enable_x64(True):
        i64 = np.array([[1], [5], [2**63 + 3], [2**64 - 1]], np.uint64)
        i8 = np.array([[0], [255], [4]], np.uint8)
        exe = run(f, x, i64, i8, tol=0)
        got = runtime.jit(f)(x, i64, i8)[0]                  # the CPU backend too
    np.testing.assert_array_equal(np.asarray(got), [[4, 6], [20, 22], [20, 22], [20, 22]])
    assert gather_kernels(exe)


# --- what the generator refuses, and a kernel Triton cannot compile: torch ops take over ------
def test_complex_gather_is_refused_with_a_reason_and_runs_as_torch_ops():
    x = (np.arange(12.0) + 1j).astype(np.complex64).reshape(6, 2)
    idx = np.array([1, 5, -1, 9], np.int32)
    f = lambda x, idx: x[idx]  # noqa: E731
    compiled = runtime.jit(f, backend="cuda").lower(x, idx).compile()
    np.testing.assert_array_equal(np.asarray(compiled(x, idx)), np.asarray(jax.jit(f)(x, idx)))
    exe = executable_of(compiled)
    assert [t.kind for t in exe.thunks()] == ["torch-op"], exe.describe()
    (why,) = exe.stats["gather_torch_fallbacks"]
    assert "c64 is not supported by the Triton code generator" in why


def test_gather_kernel_that_fails_at_launch_falls_back_to_torch(monkeypatch):
    from runtime.cuda.torch_ops import TorchOpThunk
    x = rng(21).standard_normal((10, 6)).astype(np.float32)
    idx = rng(22).integers(-10, 10, (7,)).astype(np.int32)
    f = lambda x, idx: jnp.sin(x)[idx]  # noqa: E731
    compiled = runtime.jit(f, backend="cuda").lower(x, idx).compile()
    exe = executable_of(compiled)
    (t,) = gather_kernels(exe)
    assert isinstance(t.fallback, TorchOpThunk)

    def fail(*a, **k):
        raise RuntimeError("simulated Triton compile failure")
    monkeypatch.setattr(t.kernel, "launch", fail)
    np.testing.assert_allclose(np.asarray(compiled(x, idx)), np.asarray(jax.jit(f)(x, idx)),
                               rtol=1e-6)
    assert exe.stats["kernel_compile_fallbacks"] == 1 and t.state == "host"


def test_embedding_lookup_then_layer_norm_is_one_row_kernel():
    table = rng(23).standard_normal((64, 48)).astype(np.float32)
    ids = rng(24).integers(0, 64, (2, 9)).astype(np.int32)

    def f(table, ids):
        e = table[ids]
        mu = e.mean(-1, keepdims=True)
        var = ((e - mu) ** 2).mean(-1, keepdims=True)
        return (e - mu) * lax.rsqrt(var + 1e-5)
    exe = run(f, table, ids, tol=1e-5)
    ks = gather_kernels(exe)
    assert ks and ks[0].kernel.template != "loop", exe.describe()


# --- slices and dynamic slices join row kernels too ---------------------------------------------
def test_softmax_of_a_dynamic_slice_and_log_softmax_of_a_slice_are_one_kernel_each():
    x = rng(25).standard_normal((32, 40)).astype(np.float32)

    def f(x, i):      # i = 29: the start clamps to 24 so the 8 rows fit
        return jax.nn.softmax(lax.dynamic_slice(x * 2, (i, 3), (8, 30)), axis=-1)

    def g(x):
        return jax.nn.log_softmax(x[:, 1:], axis=-1)
    for fn, args in ((f, (x, np.int32(29))), (g, (x,))):
        exe = run(fn, *args, tol=1e-6)
        assert [t.kernel.template for t in exe.thunks()] == ["normalization"], exe.describe()
