"""Device (torch) thunks of the CUDA backend for gather, scatter, sort and reduce-window
(runtime/cuda/torch_ops.py): results equal jax.jit's, and none of these ops is left to a
host fallback where torch_ops.py claims it (a dispatcher that silently stops matching
fails here).

CPU mode as in test_cuda_runtime.py: the CUDA executable on CPU torch tensors with Triton's
interpreter; the ``gpu`` test runs the zoo programs on a real GPU, graphs included.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
HAS_CUDA = bool(torch.cuda.is_available())
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton is imported
pytest.importorskip("triton")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import runtime  # noqa: E402
from runtime.cuda import executable_of  # noqa: E402
from runtime.cuda.torch_ops import TorchOpThunk  # noqa: E402
from tests.zoo import by_name, x64_scope  # noqa: E402

interpret = pytest.mark.skipif(HAS_CUDA or os.environ.get("TRITON_INTERPRET") != "1",
                               reason="CPU-mode tests run Triton's interpreter (no GPU here)")

_OPS = {"gather", "scatter", "sort", "reduce-window"}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    if not os.environ.get("HLOTK_CACHE_DIR"):
        monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _holds_op(inst) -> bool:
    if inst.opcode == "fusion":
        return any(i.opcode in _OPS for i in inst.attrs["calls"].instructions)
    return inst.opcode in _OPS


def run_and_check(fn, *args, rtol=1e-6, atol=1e-6, host_ok=()):
    """Compile for the cuda backend, compare every leaf with jax.jit (ints, bools and NaN
    positions exactly), and require that no gather/scatter/sort/reduce-window ran on the
    host except instructions named in ``host_ok``."""
    c = runtime.jit(fn, backend="cuda").lower(*args).compile()
    exe = executable_of(c)
    stuck = [t.label() for t in exe.host_fallbacks()
             if _holds_op(t.inst) and not any(h in t.label() for h in host_ok)]
    assert not stuck, stuck
    got, want = jax.tree_util.tree_leaves(c(*args)), jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, g.dtype, w.shape, w.dtype)
        if g.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w, err_msg=f"leaf {k}")
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"leaf {k}")
    return exe


# --- the zoo -------------------------------------------------------------------------------
_ZOO = ["gather_indexing", "scatter_updates", "sort_argsort", "sort_nan_inf", "top_k",
        "cnn_nhwc", "cnn_nchw", "vmap_per_example", "cumulative_ops", "conv_grad_maxpool_grad"]
# What stays on the host and why: cumlogsumexp's reducer is logaddexp (not add/max/min/mul);
# select-and-scatter has no device thunk.
# Programs whose only torch-worthy ops are gathers: all Triton kernels now.
_ZOO_GATHERS_ONLY = {"gather_indexing", "vmap_per_example"}
_ZOO_HOST_OK = {"cumulative_ops": ("reduce-window.84",), "conv_grad_maxpool_grad": ()}


@interpret
@pytest.mark.parametrize("name", _ZOO)
def test_zoo_matches_jax_jit_without_host_fallbacks(name):
    prog = by_name(name)
    with x64_scope(prog):
        args = prog.args()
        exe = run_and_check(prog.fn, *args, rtol=prog.rtol, atol=prog.atol,
                            host_ok=_ZOO_HOST_OK.get(name, ()))
    torch_thunks = [t for t in exe.thunks() if isinstance(t, TorchOpThunk)]
    if name in _ZOO_GATHERS_ONLY:
        # Gathers are Triton kernels now (codegen/triton/gather.py): no torch op is left.
        assert not torch_thunks, [t.label() for t in torch_thunks]
        assert exe.kernel_count().get("kernel", 0) >= 1
    else:
        assert torch_thunks and all(t.capturable for t in torch_thunks)
    if name not in _ZOO_HOST_OK:
        assert not exe.host_fallbacks(), exe.report()


@pytest.mark.gpu
@pytest.mark.parametrize("name", _ZOO)
def test_zoo_on_gpu_with_graphs(name):
    prog = by_name(name)
    with x64_scope(prog):
        args = prog.args()
        c = runtime.jit(prog.fn, backend="cuda").lower(*args).compile()
        want = [np.asarray(w) for w in jax.tree_util.tree_leaves(jax.jit(prog.fn)(*args))]
        runs = [[np.asarray(g) for g in jax.tree_util.tree_leaves(c(*args))] for _ in range(3)]
        for got in runs:                 # eager, then captured, then replayed
            for g, w in zip(got, want):
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                           rtol=max(prog.rtol, 1e-4), atol=max(prog.atol, 1e-4),
                                           equal_nan=True)
        exe = executable_of(c)
        assert not exe.graphs.failures, exe.report()
        assert not [t for t in exe.host_fallbacks()
                    if _holds_op(t.inst) and name not in _ZOO_HOST_OK], exe.report()


# --- hand-made cases -----------------------------------------------------------------------
rng = np.random.default_rng(0)


@interpret
def test_gather_clamps_out_of_range_starts():
    x = rng.standard_normal((10, 6)).astype(np.float32)
    idx = np.array([[0, 5], [9, -2], [20, 1], [-7, 3]], np.int32)
    dn = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
                                    start_index_map=(0, 1))

    def f(x, idx):
        # PROMISE_IN_BOUNDS: jax adds no clamping of its own; XLA clamps the starts.
        return lax.gather(x, idx, dn, slice_sizes=(1, 3),
                          mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
    run_and_check(f, x, idx, rtol=0, atol=0)
    got = np.asarray(runtime.jit(f, backend="cuda")(x, idx))
    np.testing.assert_array_equal(got[0], x[0, 3:6])     # column start 5 clamped to 6 - 3
    np.testing.assert_array_equal(got[2], x[9, 1:4])     # row start 20 clamped to 9


@interpret
def test_gather_with_batching_dims_s64_operand():
    x = rng.integers(-1000, 1000, (4, 7, 5)).astype(np.int32)
    i = rng.integers(-2, 9, (4, 3)).astype(np.int32)
    # vmap of a dynamic index: operand_batching_dims with an int operand, exact.
    run_and_check(jax.vmap(lambda a, j: a[j]), x, i)


@interpret
def test_scatter_skips_out_of_bounds_window():
    x = rng.standard_normal((8, 6)).astype(np.float32)
    idx = np.array([[1, 0], [7, 3], [2, 4], [-1, 0], [5, 2]], np.int32)
    upd = rng.standard_normal((5, 3)).astype(np.float32)
    dn = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                     scatter_dims_to_operand_dims=(0, 1))

    def f(x, idx, upd):
        mode = lax.GatherScatterMode.PROMISE_IN_BOUNDS    # XLA's own skipping
        return (lax.scatter_add(x, idx, upd, dn, mode=mode),
                lax.scatter(x, idx, upd, dn, mode=mode, unique_indices=True),
                lax.scatter_max(x, idx, upd, dn, mode=mode))
    run_and_check(f, x, idx, upd)
    added = np.asarray(runtime.jit(f, backend="cuda")(x, idx, upd)[0])
    want = x.copy()
    want[1, 0:3] += upd[0]
    want[7, 3:6] += upd[1]
    want[5, 2:5] += upd[4]            # [2, 4] (4 + 3 > 6) and [-1, 0] are skipped whole
    np.testing.assert_allclose(added, want, rtol=1e-6)


@interpret
def test_scatter_add_duplicate_indices_int_and_float():
    xi = rng.integers(-100, 100, (6, 4)).astype(np.int32)
    xf = rng.standard_normal((6, 4)).astype(np.float32)
    idx = np.array([3, 0, 3, 3, 5, 0, 2], np.int32)
    ui = rng.integers(-100, 100, (7, 4)).astype(np.int32)
    uf = rng.standard_normal((7, 4)).astype(np.float32)

    def f(xi, xf, idx, ui, uf):
        return xi.at[idx].add(ui), xf.at[idx].add(uf), xi.at[idx].mul(ui), xf.at[idx].min(uf)
    exe = run_and_check(f, xi, xf, idx, ui, uf, rtol=1e-6, atol=1e-6)
    assert exe.kernel_count().get("torch-op", 0) >= 4
    got = np.asarray(runtime.jit(f, backend="cuda")(xi, xf, idx, ui, uf)[0])
    want = xi.copy()
    np.add.at(want, idx, ui)
    np.testing.assert_array_equal(got, want)


@interpret
def test_sort_three_operands_total_order():
    k = np.array([3.0, np.nan, -0.0, 0.0, -np.inf, 3.0, 1.5, -np.nan, np.inf, -1.0], np.float32)
    a = np.arange(10, dtype=np.int32)
    b = rng.standard_normal(10).astype(np.float32)
    kk = np.stack([k, k[::-1]])
    aa = np.stack([a, a[::-1]])
    bb = np.stack([b, -b])

    def f(kk, aa, bb):
        return (lax.sort((kk, aa, bb), dimension=1, num_keys=1, is_stable=True),
                lax.sort((kk, aa, bb), dimension=0, num_keys=1, is_stable=True),
                jnp.argsort(kk, axis=1, stable=True, descending=True))
    run_and_check(f, kk, aa, bb, rtol=0, atol=0)


@interpret
def test_sort_with_two_keys_stays_on_host_and_is_right():
    # A two-key comparator is not a single compare: torch_ops declines, the host sorts.
    k1 = np.array([2, 1, 2, 1, 0], np.int32)
    k2 = np.array([5, 4, 3, 2, 1], np.int32)
    f = lambda a, b: lax.sort((a, b), num_keys=2)  # noqa: E731
    c = runtime.jit(f, backend="cuda").lower(k1, k2).compile()
    assert [t.inst.opcode for t in executable_of(c).host_fallbacks()] == ["sort"]
    for g, w in zip(c(k1, k2), jax.jit(f)(k1, k2)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@interpret
def test_reduce_window_padding_stride_dilation():
    x = rng.standard_normal((7, 9)).astype(np.float32)
    xi = rng.integers(-50, 50, (7, 9)).astype(np.int32)

    def f(x, xi):
        kw = dict(window_dimensions=(2, 3), window_strides=(2, 1),
                  padding=((1, 2), (0, 1)), base_dilation=(1, 2), window_dilation=(2, 1))
        return (lax.reduce_window(x, -jnp.inf, lax.max, **kw),
                lax.reduce_window(x, 0.0, lax.add, **kw),
                lax.reduce_window(xi, 0, lax.add, **kw),
                lax.reduce_window(xi, jnp.iinfo(jnp.int32).max, lax.min, **kw),
                # a non-identity init: XLA pads with it and folds it in once more
                lax.reduce_window(x, 1.0, lax.add, (3, 2), (1, 2), ((2, 0), (1, 1))),
                lax.reduce_window(x, 0.5, lax.max, (3, 3), (2, 2), ((-1, 1), (1, -2))))
    run_and_check(f, x, xi, rtol=1e-5, atol=1e-5)


@interpret
def test_reduce_window_bf16_sum():
    x = rng.standard_normal((4, 16)).astype(jnp.bfloat16)
    def f(x):
        return lax.reduce_window(x, jnp.bfloat16(0), lax.add, (1, 4), (1, 2), "SAME")
    run_and_check(f, x, rtol=2e-2, atol=2e-2)


@interpret
@pytest.mark.parametrize("name", ["scatter_updates", "cnn_nchw", "sort_argsort"])
def test_unfused_ops_are_torch_thunks(name):
    # Without the fusion pass each op is its own thunk: ScatterThunk's in-place path (the
    # operand's buffer shared with the result) and its copy-first path both run here.
    prog = by_name(name)
    args = prog.args()
    c = runtime.jit(prog.fn, backend="cuda",
                    pipeline="inline,layout-assignment{target=gpu},schedule").lower(*args).compile()
    exe = executable_of(c)
    assert not exe.host_fallbacks(), exe.report()
    labels = [t.label() for t in exe.thunks() if t.kind == "torch-op"]
    assert labels and all("(torch " in s for s in labels)
    for g, w in zip(jax.tree_util.tree_leaves(c(*args)),
                    jax.tree_util.tree_leaves(jax.jit(prog.fn)(*args))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=prog.rtol, atol=prog.atol)
