"""Column reductions over rows whose width is not a multiple of 16 elements (issue 14,
mlp_train's [2048, 1000] bias gradient): the kept index keeps its contiguity past the end
(aligned runs instead of a clamp), and a uniform branch on the strides gives the loop a
copy with 16-byte loads for dense rows; other views take the plain loop. Programs run
through ``runtime.jit(backend="cuda")`` (Triton's interpreter without a GPU) against
``jax.jit``; kernels launched directly against numpy, dense and strided views."""
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
from codegen.triton import compile_fusion  # noqa: E402
from codegen.triton.reductions import finish_fusion, split_of  # noqa: E402
from hlo.ir import Computation, Instruction  # noqa: E402
from hlo.shape import array, scalar  # noqa: E402
from runtime.cuda import executable_of  # noqa: E402
from runtime.cuda.thunks import one_instruction_fusion  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("HLOTK_AUTOTUNE", "0")


def run(fn, *args, tol=1e-5):
    """``fn`` through hlotk's CUDA executable and jax.jit, every output within ``tol``
    (relative norm); returns the executable's kernels."""
    compiled = runtime.jit(fn, backend="cuda").lower(*args).compile()
    got, want = compiled(*args), jax.jit(fn)(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape
        err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)
        assert err < tol, (fn.__name__, err)
    return [k for t in executable_of(compiled).thunks() if (k := getattr(t, "kernel", None))]


def partials_source(kernels) -> str:
    src = [k.source for k in kernels if k.template == "split_partials"]
    assert src, [(k.name, k.template) for k in kernels]
    return src[0]


def test_bias_gradient_1000_columns_one_kernel_with_aligned_loop():
    # 8 MB whose one-kernel grid (125 programs of 8 columns) nearly fills the SMs: not
    # split (measured faster on the H200), and the loop has its 16-byte-load copy.
    x = np.random.default_rng(0).standard_normal((2048, 1000)).astype(np.float32)
    ks = run(lambda x: jnp.sum(x, 0), x)
    col = [k for k in ks if k.template == "column_onepass"]
    assert col and not any(k.template == "split_partials" for k in ks), [(k.name, k.template) for k in ks]
    assert "dense rows: strides are multiples of 8 elements" in col[0].source
    assert col[0].plan.grid(dict(col[0].config)) == (125,)


@pytest.mark.parametrize("rows,cols,dtype,want", [
    (2048, 1000, "f32", None),          # small, one kernel of 125 programs
    (2048, 4096, "f32", (128, 16)),     # 32 MB: split, 128 parts of 16 rows
    (8192, 256, "f32", (128, 64)),      # 8 MB but one kernel would have 32 programs
    (2048, 1000, "bf16", (128, 16)),    # one kernel: 63 programs of 16 columns
    # the layer-norm weight gradients over 8192 tokens: 256 parts of 32 rows (the fastest
    # of the cuts measured on the H200, i14-lnsplit)
    (8192, 1024, "bf16", (256, 32)),
])
def test_column_split_decisions(rows, cols, dtype, want):
    fusion = _column_sum(rows, cols, dtype)
    sp = split_of(fusion.attrs["calls"])
    assert (None if sp is None else (sp.parts, sp.chunk)) == want, sp


def test_split_bias_gradient_1000_columns_aligned_runs(monkeypatch):
    # The split path for 1000 kept elements in a 1024 block: aligned runs past the end.
    from codegen.triton import reductions
    monkeypatch.setattr(reductions, "SPLIT_COLUMN_ONEPASS_BYTES", 0)
    x = np.random.default_rng(0).standard_normal((2048, 1000)).astype(np.float32)
    src = partials_source(run(lambda x: jnp.sum(x, 0), x))
    assert "dense rows: strides are multiples of 8 elements" in src
    assert "tl.minimum(rows, 999)" not in src        # the clamp that hid contiguity
    assert "RUN: tl.constexpr = min(BLOCK_M, 8)" in src


@pytest.mark.parametrize("split", [True, False])
def test_relu_grad_beside_bias_grad_ragged_width_and_rows(split, monkeypatch):
    # 2050 rows (a ragged last part) of 1000 features; the full-shape ReLU gradient is
    # stored from the aligned copy of the loop through hinted output strides, by the
    # partials kernel (split forced at this size) or by the one column kernel.
    from codegen.triton import reductions
    if split:
        monkeypatch.setattr(reductions, "SPLIT_COLUMN_ONEPASS_BYTES", 0)

    def f(g, h):
        sel = jnp.where(h > 0, g, 0.0)
        return sel * 2.0, jnp.sum(sel, 0)
    r = np.random.default_rng(1)
    g = r.standard_normal((2050, 1000)).astype(np.float32)
    h = r.standard_normal((2050, 1000)).astype(np.float32)
    ks = run(f, g, h)
    src = partials_source(ks) if split else [k.source for k in ks if k.template == "column_onepass"][0]
    assert "h_so" in src and "h_s0_0" in src and "h_s1_0" in src


def test_unsplit_column_kernel_with_ragged_kept_block():
    # Too small to split: one column kernel whose 44 kept elements are not a multiple of
    # its block (runs of 4 past the end), strides hinted as multiples of 4.
    r = np.random.default_rng(2)
    a = r.standard_normal((300, 44)).astype(np.float32)
    b = r.standard_normal((300, 44)).astype(np.float32)
    ks = run(lambda a, b: (jnp.sum(a * b, 0), jnp.max(a, 0)), a, b)
    col = [k for k in ks if k.template == "column_onepass"]
    assert col, [(k.name, k.template) for k in ks]
    assert 44 % col[0].config["BLOCK_M"] != 0
    assert "rows % RUN" in col[0].source and "% 4 == 0" in col[0].source


def test_layer_norm_weight_gradient_bf16_1000_features():
    # dgamma-like: sum over (batch, tokens) of (x - mean) * rstd * dy, bf16 [4, 512, 1000].
    def f(x, mu, rs, dy):
        xh = (x.astype(jnp.float32) - mu) * rs
        return jnp.sum(xh * dy.astype(jnp.float32), (0, 1)), jnp.sum(dy.astype(jnp.float32), (0, 1))
    r = np.random.default_rng(3)
    x = r.standard_normal((4, 512, 1000)).astype(jnp.bfloat16)
    dy = r.standard_normal((4, 512, 1000)).astype(jnp.bfloat16)
    mu = r.standard_normal((4, 512, 1)).astype(np.float32)
    rs = np.abs(r.standard_normal((4, 512, 1))).astype(np.float32)
    src = partials_source(run(f, x, mu, rs, dy))
    assert "dense rows" in src


# --- kernels launched directly: both branches of the stride test -------------------------
def _column_sum(rows: int, cols: int, dtype: str = "f32") -> Instruction:
    add = Computation("add")
    a = add.add_instruction(Instruction("parameter", [], scalar(dtype), name="a", parameter_number=0))
    b = add.add_instruction(Instruction("parameter", [], scalar(dtype), name="b", parameter_number=1))
    add.root = add.add_instruction(Instruction("add", [a, b], scalar(dtype), name="s"))
    x = Instruction("parameter", [], array(dtype, (rows, cols), (1, 0)), name="x", parameter_number=0)
    z = Instruction("parameter", [], scalar(dtype), name="z", parameter_number=1)
    red = Instruction("reduce", [x, z], array(dtype, (cols,), (0,)),
                      {"dimensions": [0], "to_apply": add}, name="colsum")
    return one_instruction_fusion(red)


@pytest.mark.parametrize("pitch", [1000, 1001, 1004, 1008])
def test_split_column_sum_on_views_of_any_row_pitch(pitch):
    # pitch 1000 / 1008: the aligned loop (multiples of 8); 1001 and 1004: the plain one.
    from codegen.triton import reductions
    rows, cols = 1030, 1000
    fusion = _column_sum(rows, cols)
    old = reductions.SPLIT_COLUMN_ONEPASS_BYTES
    reductions.SPLIT_COLUMN_ONEPASS_BYTES = 0       # force the split at this small size
    try:
        split = split_of(fusion.attrs["calls"])
    finally:
        reductions.SPLIT_COLUMN_ONEPASS_BYTES = old
    assert split is not None and split.block_m == 1024
    part = compile_fusion(fusion, target="h200", split=split)
    fin = compile_fusion(finish_fusion(fusion, split), target="h200")
    base = np.random.default_rng(4).standard_normal((rows, pitch)).astype(np.float32)
    x = torch.from_numpy(base).to(DEV)[:, :cols]
    assert x.stride() == (pitch, 1)
    init = torch.tensor(0.5, dtype=torch.float32, device=DEV)
    partials = torch.full(tuple(part.output_shapes[0].dims), float("nan"), device=DEV)
    out = torch.full((cols,), float("nan"), device=DEV)
    part.launch([partials], [x, init])
    fin.launch([out], [x, init, partials])
    want = base[:, :cols].astype(np.float64).sum(0) + 0.5
    np.testing.assert_allclose(out.cpu().numpy(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA")
def test_gpu_mlp_bias_gradient_and_views():
    # The compiled kernels (not the interpreter): 16-byte loads in the aligned copy.
    x = np.random.default_rng(5).standard_normal((2048, 1000)).astype(np.float32)
    run(lambda x: jnp.sum(x, 0), x)
    for pitch in (1000, 1001):
        test_split_column_sum_on_views_of_any_row_pitch(pitch)


def _split_fusion_of(fn, *args) -> Instruction:
    """The split column reduction fusion of ``fn`` after the h200 CUDA pipeline (nothing
    runs: arguments only give shapes)."""
    from passes.fusion.pass_ import with_target
    from passes.pipelines import pipeline_spec
    from runtime.tools import compile_module
    m = runtime.jit(fn, pipeline="none").lower(*args).module
    compile_module(m, with_target(pipeline_spec("default", "cuda"), "h200"), backend="cuda")
    found = [i for c in m.computations for i in c.instructions
             if i.opcode == "fusion" and split_of(i.attrs["calls"]) is not None]
    assert len(found) == 1, [i.name for i in found]
    return found[0]


@pytest.mark.parametrize("case,warps", [("resid", 4), ("ln", 8), ("relu_bias", 8),
                                        ("bn_grad", 8)])
def test_split_partials_warps_follow_the_tile_registers(case, warps):
    # transformer_train's 80 MiB residual gradient (3 bf16 + 1 f32 inputs, two sums: ~144
    # registers a step at 8 warps) runs its partials kernel at 4 warps (35.2 -> 31.5 us on
    # the H200, i14-pdl); the bf16 LN gradients (~96) and mlp_train's ReLU/bias split
    # (128) stay at 8, where they measured faster. conv_bn_grad's batch-norm gradient
    # (2 bf16 inputs, a bf16 output, four sums: 176) stays at 8 too: at 4 warps its four
    # lane accumulators alone would take 4 x 64 = 256 registers a thread (it spilled,
    # and was its program's slowest Triton compile by 3x).
    from codegen.triton.autotune import ranked_candidates
    from codegen.triton.reductions import analyze, lane_accumulators, tile_registers
    from passes.fusion.cost_model import get_device
    z16 = np.zeros((4, 2048, 1024), jnp.bfloat16)
    z32 = np.zeros((4, 2048, 1024), np.float32)
    accs = 2
    if case == "bn_grad":
        f, args = _bn_grad_case()
        need, accs = 176, 4
    elif case == "resid":
        def f(a, b, c, d):
            s = ((a + b) + c).astype(jnp.float32)
            return s.sum((0, 1)), (d * s).sum((0, 1))
        args, need = (z16, z16, z16, z32), 144
    elif case == "ln":
        def f(x, mu, rs, dy):
            dyf = dy.astype(jnp.float32)
            return dyf.sum((0, 1)), (((x.astype(jnp.float32) - mu) * rs) * dyf).sum((0, 1))
        col = np.zeros((4, 2048, 1), np.float32)
        args, need = (z16, col, col, z16), 96
    else:
        def f(g, h, b):
            sel = jnp.where(h + b > 0, g, 0.0)
            return sel, jnp.sum(sel, 0)
        g = np.zeros((2048, 4096), np.float32)
        args, need, accs = (g, g, np.zeros((4096,), np.float32)), 128, 1
    fusion = _split_fusion_of(f, *args)
    sp = split_of(fusion.attrs["calls"])
    a = analyze(fusion.attrs["calls"])
    assert tile_registers(a, sp.block_m * sp.block_n // 256) == need
    assert lane_accumulators(a) == accs
    part = compile_fusion(fusion, target="h200", split=sp)
    assert part.config["num_warps"] == warps
    assert {c["num_warps"] for c in part.plan.candidates} == {4, 8}   # level 2 tries both
    # Level 1 compiles no candidate with more elements a thread than the default or 16:
    # at 8 warps the 4-warp one (twice the elements) is left out, at 4 warps the 8-warp
    # one is timed beside it; bn_grad's tile is cut to 8 a thread (split_tile_n), so its
    # 4-warp twin (16) is timed too.
    level1 = ranked_candidates(part, 1, get_device("h200"))
    assert [c["num_warps"] for c in level1] == \
        ([8, 4] if case == "bn_grad" else [8] if warps == 8 else [4, 8])


def _bn_grad_case():
    """conv_bn_grad's batch-norm gradient partials (ResNet block, bf16 NHWC C64): two bf16
    inputs, a bf16 full-shape output and four sums a lane."""
    def f(y, res, mean, rs, g):
        yf = y.astype(jnp.float32)
        xh = (yf - mean) * rs
        z = (xh * g).astype(jnp.bfloat16) + res
        d = jnp.where(z > 0, z * jnp.bfloat16(0.5), jnp.bfloat16(0)).astype(jnp.float32)
        dims = (0, 1, 2)
        return (z, d.sum(dims), (xh * d).sum(dims), ((yf - mean) * d * g).sum(dims),
                (-(d * g * rs)).sum(dims))
    y, v = np.zeros((32, 56, 56, 64), jnp.bfloat16), np.zeros((64,), np.float32)
    return f, (y, y, v, v, v)


@pytest.mark.parametrize("budget,block_n", [("", 32), ("0", 128), ("64", 64), ("32", 32),
                                            ("8", 32)])
def test_split_tile_n_bounds_the_lane_accumulators(budget, block_n, monkeypatch):
    # Four sums a lane at 64x128 and 8 warps are 4 x 32 = 128 accumulator registers a
    # thread, over half of 128 (244-254 registers in all for sm_90, one program per SM);
    # the default cuts them to 32: BLOCK_N 32 at 8 warps, 8 elements a thread (102-109
    # registers, two programs per SM; H200: 0.8% faster, its pool 0.3 s shorter). 0: no
    # cut (64x128); 64: 64x64; a bound under 4 x 8 stops at 8 elements a thread.
    from codegen.triton.autotune import ranked_candidates
    from passes.fusion.cost_model import get_device
    monkeypatch.setenv("HLOTK_SPLIT_ACC_REGISTERS", budget)
    f, args = _bn_grad_case()
    fusion = _split_fusion_of(f, *args)
    sp = split_of(fusion.attrs["calls"])
    assert (sp.block_m, sp.block_n) == (64, 128)       # the split itself does not move
    part = compile_fusion(fusion, target="h200", split=sp)
    assert (part.config["BLOCK_M"], part.config["BLOCK_N"], part.config["num_warps"]) == \
        (64, block_n, 8)
    # Level 1 compiles nothing heavier a thread than the default or 16 (the row tiles'
    # bound): at the default bound the default alone, at 8 a thread its 4-warp twin too.
    level1 = ranked_candidates(part, 1, get_device("h200"))
    assert [(c["BLOCK_N"], c["num_warps"]) for c in level1] == \
        [(block_n, 8)] + ([(block_n, 4)] if block_n * 64 // 256 < 16 else [])
    wider = [c for c in part.plan.candidates if c["BLOCK_N"] == 128 and c["num_warps"] == 8]
    assert len(wider) == 1                   # level 2 still times the unbounded tile


@pytest.mark.parametrize("case", ["resid", "ln", "relu_bias"])
def test_split_tile_n_leaves_two_sums_alone(case, monkeypatch):
    # Two sums a lane (or one) at 32 elements a thread take at most half of 128 registers:
    # transformer_train's and the LN/ReLU-bias partials keep the tiles they were measured
    # with, whatever the bound.
    monkeypatch.setenv("HLOTK_SPLIT_ACC_REGISTERS", "8")
    from codegen.triton.reductions import analyze, split_tile_n
    z16 = np.zeros((4, 2048, 1024), jnp.bfloat16)
    if case == "resid":
        def f(a, b, c, d):
            s = ((a + b) + c).astype(jnp.float32)
            return s.sum((0, 1)), (d * s).sum((0, 1))
        args = (z16, z16, z16, np.zeros((4, 2048, 1024), np.float32))
    elif case == "ln":
        def f(x, mu, rs, dy):
            dyf = dy.astype(jnp.float32)
            return dyf.sum((0, 1)), (((x.astype(jnp.float32) - mu) * rs) * dyf).sum((0, 1))
        col = np.zeros((4, 2048, 1), np.float32)
        args = (z16, col, col, z16)
    else:
        def f(g, h, b):
            sel = jnp.where(h + b > 0, g, 0.0)
            return sel, jnp.sum(sel, 0)
        g = np.zeros((2048, 4096), np.float32)
        args = (g, g, np.zeros((4096,), np.float32))
    fusion = _split_fusion_of(f, *args)
    sp = split_of(fusion.attrs["calls"])
    a = analyze(fusion.attrs["calls"])
    assert split_tile_n(a, sp.block_m, sp.block_n, 8) == sp.block_n
    part = compile_fusion(fusion, target="h200", split=sp)
    assert part.config["BLOCK_N"] == sp.block_n


@pytest.mark.parametrize("budget,block_n", [("0", 128), ("", 32), ("64", 64)])
def test_four_sums_a_lane_split_equal_jax_at_each_bound(budget, block_n, monkeypatch):
    # 4100 rows of 64 f32 channels, four sums a lane: split (17 parts of 256 rows), a
    # ragged end (4100 % BLOCK_N = 4) in the last part, at each tile the bound gives.
    monkeypatch.setenv("HLOTK_SPLIT_ACC_REGISTERS", budget)

    def f(x, m):
        d = x - m
        return (x.sum(0), (d * d).sum(0), jnp.abs(x).sum(0), (x * m).sum(0))
    r = np.random.default_rng(13)
    x = (r.standard_normal((4100, 64)) + 0.5).astype(np.float32)
    m = r.standard_normal((64,)).astype(np.float32)
    kernels = run(f, x, m)
    parts = [k for k in kernels if k.template == "split_partials"]
    assert [(k.config["BLOCK_M"], k.config["BLOCK_N"], k.config["num_warps"]) for k in parts] \
        == [(64, block_n, 8)]


def test_split_accumulator_bound_rejects_bad_values(monkeypatch):
    from codegen.triton.elemental import TritonCodegenError
    from codegen.triton.reductions import split_accumulator_registers
    for text in ("-1", "lots"):
        monkeypatch.setenv("HLOTK_SPLIT_ACC_REGISTERS", text)
        with pytest.raises(TritonCodegenError, match="HLOTK_SPLIT_ACC_REGISTERS"):
            split_accumulator_registers()
    monkeypatch.setenv("HLOTK_SPLIT_ACC_REGISTERS", " 96 ")
    assert split_accumulator_registers() == 96
