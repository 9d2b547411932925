"""Issue 14's reduction templates (codegen/triton/reductions.py) end to end: programs through
``runtime.jit(backend="cuda")`` run on the CPU in Triton's interpreter, results against
``jax.jit``; which template each reduction got; the legacy templates still reachable.

On a machine with CUDA the same programs run for real (``gpu`` tests at the end)."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton is imported
elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    pytest.skip("TRITON_INTERPRET set on a CUDA machine", allow_module_level=True)
pytest.importorskip("triton")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import runtime  # noqa: E402
from runtime.cuda import executable_of  # noqa: E402

GPU = torch.cuda.is_available()
BF16 = jnp.bfloat16


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("HLOTK_AUTOTUNE", "0")


def run(fn, *args, tol=1e-5, pipeline="default"):
    """``fn`` through hlotk's CUDA executable and through jax.jit: every output leaf within
    ``tol`` (relative norm). Returns {kernel name: template} of the executable."""
    compiled = runtime.jit(fn, backend="cuda", pipeline=pipeline).lower(*args).compile()
    got = compiled(*args)
    want = jax.jit(fn)(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g = np.asarray(g, np.float64)
        w = np.asarray(w, np.float64)
        assert g.shape == w.shape
        assert not np.isnan(g).any()
        err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)
        assert err < tol, (fn.__name__, err)
    exe = executable_of(compiled)
    return [(k.name, k.template) for t in exe.thunks()
            if (k := getattr(t, "kernel", None)) is not None]


def templates(kernels) -> set:
    return {t for _, t in kernels}


def rng(seed=0):
    return np.random.default_rng(seed)


def cross_entropy(x, labels):
    lp = jax.nn.log_softmax(x.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(lp, labels[:, None], axis=-1)[:, 0]


def masked_mean_nll(x, labels):
    valid = labels != -100
    lp = jax.nn.log_softmax(x.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(lp, jnp.where(valid, labels, 0)[:, None], axis=-1)[:, 0]
    return -jnp.sum(jnp.where(valid, picked, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (BF16, 1e-5)])
def test_cross_entropy_wide_rows_one_pass(dtype, tol):
    # 5000 > 4096: the row is walked in tiles, max and exp-sum in the same pass.
    r = rng()
    x = r.standard_normal((12, 5000)).astype(np.float32).astype(dtype) * 3
    labels = r.integers(0, 5000, (12,)).astype(np.int32)
    ks = run(cross_entropy, x, labels, tol=tol)
    assert "rows_onepass" in templates(ks)


def test_cross_entropy_narrow_rows_one_tile():
    r = rng(1)
    x = r.standard_normal((40, 1000)).astype(np.float32)
    labels = r.integers(0, 1000, (40,)).astype(np.int32)
    ks = run(cross_entropy, x, labels)
    assert "normalization" in templates(ks)


def test_masked_mean_nll_bf16():
    r = rng(2)
    x = r.standard_normal((10, 4500)).astype(BF16)
    labels = r.integers(0, 4500, (10,)).astype(np.int32)
    labels[::3] = -100
    run(masked_mean_nll, x, labels)


def test_online_max_with_minus_inf_rows_and_tails():
    # Masked logits (-inf) everywhere but a few columns, the last tile ragged: the running
    # max starts at -inf and the rescaling must not make NaNs.
    r = rng(3)
    x = np.full((6, 4100), -np.inf, np.float32)
    for i in range(6):
        cols = r.integers(0, 4100, 5)
        x[i, cols] = r.standard_normal(5)
    x[5, 4099] = 2.0
    labels = np.array([np.flatnonzero(np.isfinite(row))[0] for row in x], np.int32)
    run(cross_entropy, x, labels)


def test_softmax_one_tile_and_looped_with_output_pass():
    sm = lambda x: jax.nn.softmax(x, axis=-1)  # noqa: E731
    r = rng(4)
    assert "normalization" in templates(run(sm, r.standard_normal((8, 6000)).astype(np.float32)))
    # 20000 f32 > 64 KiB of row: looped, a pass for max+sum, a pass for the outputs.
    assert "rows_onepass" in templates(run(sm, r.standard_normal((3, 20000)).astype(np.float32)))


def test_layer_norm_forward_and_grad_column_reductions():
    def ln(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b

    def loss(x, g, b):
        return jnp.sum(ln(x, g, b) ** 2 * 0.5)
    r = rng(5)
    x = r.standard_normal((2048, 128)).astype(np.float32)
    g = (1 + 0.1 * r.standard_normal(128)).astype(np.float32)
    b = (0.1 * r.standard_normal(128)).astype(np.float32)
    run(ln, x, g, b)
    ks = run(jax.grad(loss, argnums=(0, 1, 2)), x, g, b, tol=1e-4)
    # dgamma/dbeta: sums over 2048 rows of 128 columns: too few column tiles for the GPU,
    # so a split (partials over row chunks, then a finishing kernel).
    assert "split_partials" in templates(ks), ks


def test_row_statistics_shaped_m_by_1():
    def stats(x):
        return jnp.sum(x, -1, keepdims=True), jnp.max(x, -1, keepdims=True)
    r = rng(6)
    ks = run(stats, r.standard_normal((16, 300)).astype(np.float32))
    assert "generic" not in templates(ks), ks
    ks = run(stats, r.standard_normal((4, 9000)).astype(np.float32))
    assert "generic" not in templates(ks), ks


@pytest.mark.parametrize("rows,cols", [(4096, 96), (24, 20000)])
def test_column_sums_few_and_many_columns(rows, cols):
    def f(a, b):
        return jnp.sum(a * b, 0), jnp.sum(a, 0)
    r = rng(7)
    a = r.standard_normal((rows, cols)).astype(np.float32)
    b = r.standard_normal((rows, cols)).astype(np.float32)
    ks = run(f, a, b)
    want = "split_partials" if cols < 1000 else "column_onepass"
    assert want in templates(ks), ks


def test_relu_grad_beside_bias_grad_split():
    # A multi-output column reduction with a full-shape output that needs no reduction
    # (the MLP backward's ReLU gradient and bias gradient): the partials kernel stores
    # the select, the finishing kernel the column sums.
    def f(g, h):
        sel = jnp.where(h > 0, g, 0.0)
        return sel * 1.0, jnp.sum(sel, 0)
    r = rng(12)
    g = r.standard_normal((1024, 320)).astype(np.float32)
    h = r.standard_normal((1024, 320)).astype(np.float32)
    ks = run(f, g, h)
    assert "split_partials" in templates(ks), ks


def test_scalar_loss_split_over_the_grid():
    def mse(a, b):
        return jnp.mean((a.astype(jnp.float32) - b) ** 2)
    r = rng(8)
    a = r.standard_normal((64, 8192)).astype(BF16)
    b = r.standard_normal((64, 8192)).astype(np.float32)
    # The CUDA pipeline's split-reductions pass splits this loss in HLO already (a row
    # reduction, then a small one): two reduction kernels, no template split needed.
    ks = run(mse, a, b)
    assert "split_partials" not in templates(ks), ks
    assert sum(t in ("rows_onepass", "normalization") for _, t in ks) == 2, ks
    # Without that pass the template splits the one reduction over the grid itself.
    from passes.pipelines import PIPELINES
    no_pass = PIPELINES["default"]["cuda"].replace("split-reductions,", "")
    ks = run(mse, a, b, pipeline=no_pass)
    assert "split_partials" in templates(ks), ks
    assert any(n.endswith("_finish") for n, _ in ks), ks


def test_split_argmax_variadic_reducer(monkeypatch):
    # A variadic reducer's partials (value and index) finished by the same reducer; the
    # split threshold lowered so that the interpreter runs a small input.
    from codegen.triton import reductions
    monkeypatch.setattr(reductions, "SPLIT_MIN_ELEMENTS", 1 << 12)
    r = rng(9)
    x = r.standard_normal((4, 20000)).astype(np.float32)
    x[2, 19990] = x[2].max() + 1          # the max in the ragged end of the last part
    ks = run(lambda x: jnp.argmax(x, -1), x)
    assert "split_partials" in templates(ks), ks


def test_legacy_templates_stay_reachable(monkeypatch):
    monkeypatch.setenv("HLOTK_REDUCTION_TEMPLATES", "legacy")
    r = rng(10)
    x = r.standard_normal((3, 20000)).astype(np.float32)      # over the legacy 16K tile
    labels = r.integers(0, 20000, (3,)).astype(np.int32)
    ks = run(cross_entropy, x, labels)
    assert "looped_rows" in templates(ks) and "rows_onepass" not in templates(ks), ks


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA")
def test_gpu_cross_entropy_and_split_loss_at_size():
    r = rng(11)
    x = r.standard_normal((1024, 32000)).astype(BF16)
    labels = r.integers(0, 32000, (1024,)).astype(np.int32)
    assert "rows_onepass" in templates(run(cross_entropy, x, labels))
    ln_in = r.standard_normal((8192, 1024)).astype(np.float32)
    ks = run(lambda a, b: (jnp.sum(a * b, 0), jnp.sum(a, 0)), ln_in, ln_in[::-1].copy())
    assert "split_partials" in templates(ks)
    # A scalar loss: split in HLO by the CUDA pipeline's split-reductions pass (a row
    # reduction over the minor dim, then a small one), so no template split.
    ks = run(lambda a: jnp.mean(a.astype(jnp.float32) ** 2), ln_in.astype(BF16))
    assert "split_partials" not in templates(ks), ks
    assert sum(t in ("rows_onepass", "normalization") for _, t in ks) == 2, ks


def test_variadic_reduce_operands_are_whole_tiles():
    # argmin over 7-wide rows, several rows per program: the iota operand is [1, N] and
    # the values [M, N]; Triton's compiler (not its interpreter) needs every operand of a
    # variadic tl.reduce the same shape (the zoo's argmax_argmin failed so on the H200).
    r = rng(13)
    ks = run(lambda x: jnp.argmin(x, -1), r.standard_normal((6, 7)).astype(np.float32))
    names = [n for n, t in ks if t == "normalization"]
    assert names, ks
    src = [k.source for t in executable_of(runtime.jit(lambda x: jnp.argmin(x, -1), backend="cuda")
                                          .lower(np.zeros((6, 7), np.float32)).compile()).thunks()
           if (k := getattr(t, "kernel", None)) is not None][0]
    for line in src.splitlines():
        if line.strip().startswith("x_reduce"):
            assert "tl.broadcast_to(" in line or "tl.zeros([BLOCK_M, BLOCK_N]" in line, line


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA")
def test_gpu_cross_entropy_label_gather_in_the_row_kernel_on_the_native_path():
    # The label gather is elemental in the row kernel (codegen/triton/gather.py): one
    # kernel, no torch op, so the native launcher can patch every node.
    r = rng(14)
    x = r.standard_normal((1024, 32000)).astype(BF16)
    labels = r.integers(0, 32000, (1024,)).astype(np.int32)
    labels[::5] = -100
    for fn, n_kernels in ((cross_entropy, 1), (masked_mean_nll, None)):
        compiled = runtime.jit(fn, backend="cuda").lower(x, labels).compile()
        want = np.asarray(jax.jit(fn)(x, labels), np.float64)
        for _ in range(3):                       # eager, captured, replayed
            got = np.asarray(compiled(x, labels), np.float64)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        exe = executable_of(compiled)
        kinds = [t.kind for t in exe.thunks()]
        assert "torch-op" not in kinds and not exe.host_fallbacks(), exe.describe()
        if n_kernels is not None:
            assert kinds == ["kernel"] * n_kernels, exe.describe()
        # (A machine without the native library says so here; a torch kernel said
        # "NotPatchable".)
        assert "NotPatchable" not in exe.native_reason, exe.native_reason
