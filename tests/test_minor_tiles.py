"""Loop kernels reading a small minor dim at constant positions load it as one tile
(codegen/triton/minor_tiles.py): the values must be the loaded bits, for dense and strided
views alike, and the tile must appear only where it applies.

Each case runs twice: in Triton's interpreter on CPU tensors (skipped where CUDA is present:
the interpreter must not be switched on beside real kernels) and on the GPU (marked ``gpu``).
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

import hlo  # noqa: E402
from codegen.triton import compile_fusion  # noqa: E402
from codegen.triton.kernel import _to_torch  # noqa: E402

interp = pytest.mark.skipif(HAS_CUDA, reason="Triton's interpreter runs only without CUDA")
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def fusion_of(body: str, params: list[str], root: str) -> hlo.Instruction:
    ep = ", ".join(params)
    entry = "\n".join(f"  %e{i} = {p.split(': ')[1]} parameter({i})" for i, p in enumerate(params))
    args = ", ".join(f"%e{i}" for i in range(len(params)))
    text = f"""HloModule m
%fused ({ep}) -> {root} {{
{body}
}}

ENTRY %main ({', '.join(f'e{i}: ' + p.split(': ')[1] for i, p in enumerate(params))}) -> {root} {{
{entry}
  ROOT %f = {root} fusion({args}), kind=kLoop, calls=%fused
}}
"""
    return hlo.parse_hlo(text).entry.root


def column(dtype: str, n: int, m: int, k: int) -> hlo.Instruction:
    """out[i] = p[i, k] of p: dtype[n, m] (a slice of one position, squeezed)."""
    return fusion_of(f"""  %p = {dtype}[{n},{m}] parameter(0)
  %s = {dtype}[{n},1] slice(%p), slice={{[0:{n}], [{k}:{k + 1}]}}
  ROOT %r = {dtype}[{n}] reshape(%s)""", [f"p: {dtype}[{n},{m}]"], f"{dtype}[{n}]")


def run(kernel, inputs: list, out_shape, out_dtype) -> "torch.Tensor":
    out = torch.full(out_shape, 7, dtype=out_dtype, device=DEVICE)   # poison
    kernel.launch([out], inputs)
    if HAS_CUDA:
        torch.cuda.synchronize()
    return out.cpu()


def special_f32(n: int, m: int) -> np.ndarray:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, m)).astype(np.float32)
    x.flat[::7] = -0.0
    x.flat[3::11] = np.inf
    x.flat[5::13] = -np.inf
    x.view(np.uint32).flat[2::17] = 0x7FC01234        # a NaN with a payload
    return x


def bits(t: "torch.Tensor") -> np.ndarray:
    return t.contiguous().view(torch.int8).numpy()


# --- what the generator emits (no device needed) ----------------------------------------------
def test_tile_emitted_only_for_small_power_of_two_minor_dims():
    assert "tl.split" in compile_fusion(column("f32", 64, 4, 2)).source
    assert "tl.split" in compile_fusion(column("f32", 64, 2, 1)).source
    assert "tl.split" in compile_fusion(column("bf16", 64, 8, 5)).source
    assert "tl.split" in compile_fusion(column("s8", 64, 16, 9)).source
    # 3 is not a power of two; 4 x f64 is 32 bytes (more than one vector load)
    assert "tl.split" not in compile_fusion(column("f32", 64, 3, 1)).source
    assert "tl.split" not in compile_fusion(column("f64", 64, 4, 1)).source


def test_switch_off_keeps_scalar_loads(monkeypatch):
    monkeypatch.setenv("HLOTK_MINOR_TILES", "0")
    src = compile_fusion(column("f32", 64, 4, 2)).source
    assert "tl.split" not in src and "tl.load(p0 + " in src and "max_contiguous" not in src


def test_tiled_kernels_default_to_more_programs():
    # 262144 rows: BLOCK 256 / 2 warps (1024 programs) after a tile, as measured fastest;
    # a plain elementwise kernel of the same size keeps BLOCK 1024.
    tiled = compile_fusion(column("f32", 262144, 4, 1))
    assert (tiled.config["BLOCK"], tiled.config["num_warps"], tiled.grid) == (256, 2, (1024,))
    f = fusion_of("""  %p = f32[262144] parameter(0)
  ROOT %r = f32[262144] exponential(%p)""", ["p: f32[262144]"], "f32[262144]")
    plain = compile_fusion(f)
    assert plain.config["BLOCK"] == 1024
    assert {"BLOCK": 256, "num_warps": 2, "num_stages": 1} in plain.plan.candidates


def test_stores_unmarked_without_a_tile():
    # An elementwise kernel with no tile keeps Triton's vector stores.
    f = fusion_of("""  %p = f32[64,4] parameter(0)
  ROOT %r = f32[64,4] exponential(%p)""", ["p: f32[64,4]"], "f32[64,4]")
    src = compile_fusion(f).source
    assert "tl.split" not in src and "max_contiguous" not in src


def test_the_same_position_read_twice_is_one_load():
    # Two slices of column 1 (one through [1:3] then [0:1]): one tile, column 1 used twice.
    f = fusion_of("""  %p = f32[32,4] parameter(0)
  %a = f32[32,1] slice(%p), slice={[0:32], [1:2]}
  %b2 = f32[32,2] slice(%p), slice={[0:32], [1:3]}
  %b = f32[32,1] slice(%b2), slice={[0:32], [0:1]}
  %s = f32[32,1] add(%a, %b)
  ROOT %r = f32[32] reshape(%s)""", ["p: f32[32,4]"], "f32[32]")
    src = compile_fusion(f).source
    assert src.count("tl.load(p0") == 2        # the dense and the strided branch of one tile


# --- values: the loaded bits, dense and strided -------------------------------------------------
def _column_bits(dtype: str, m: int, k: int) -> None:
    n = 96
    x = special_f32(n, m)
    if dtype == "bf16":
        t = torch.from_numpy(x).to(torch.bfloat16)
    elif dtype == "s8":
        t = torch.from_numpy(np.random.default_rng(4).integers(-128, 128, (n, m)).astype(np.int8))
    else:
        t = torch.from_numpy(x)
    t = t.to(DEVICE)
    kernel = compile_fusion(column(dtype, n, m, k))
    got = run(kernel, [t], (n,), t.dtype)
    np.testing.assert_array_equal(bits(got), bits(t[:, k].cpu()))


def _strided_views() -> None:
    # The same kernel on a view whose rows are padded (dense minor dim, row stride 8) and on
    # one whose minor dim has stride 2 (the general tile load): both read the right bits.
    n = 40
    kernel = compile_fusion(column("f32", n, 4, 3))
    base = torch.from_numpy(special_f32(n, 8)).to(DEVICE)
    for view in (base[:, 2:6], base[:, ::2], base.t().contiguous().t()[:, 4:]):
        got = run(kernel, [view], (n,), torch.float32)
        np.testing.assert_array_equal(bits(got), bits(view[:, 3].cpu()), err_msg=str(view.stride()))


def _giou_matches_scalar_loads(monkeypatch) -> None:
    # GIOU through the CUDA pipeline (one loop fusion reading [.., 4] boxes at constant
    # positions): with and without tiles the kernels compute the same bits.
    import jax.numpy as jnp  # noqa: F401  (tests.zoo's programs use it)
    import runtime
    from passes.fusion.pass_ import with_target
    from passes.pipelines import pipeline_spec
    from runtime.tools import compile_module
    from tests.zoo import giou_boxes
    rng = np.random.default_rng(5)

    def boxes():
        xy = np.abs(rng.standard_normal((16, 24, 2))).astype(np.float32) * 5
        wh = np.abs(rng.standard_normal((16, 24, 2))).astype(np.float32) * 3 + 0.1
        return np.concatenate([xy, xy + wh], axis=-1)

    b1, b2 = boxes(), boxes()
    module = runtime.jit(giou_boxes, pipeline="none").lower(b1, b2).module
    compile_module(module, with_target(pipeline_spec("default", "cuda"), "h200"), backend="cuda")
    (f,) = [i for i in module.entry.instructions if i.opcode == "fusion"]
    ins = [torch.from_numpy(b).to(DEVICE) for b in (b1, b2)]
    tiled = compile_fusion(f)
    monkeypatch.setenv("HLOTK_MINOR_TILES", "vstore")
    vstore = compile_fusion(f)
    monkeypatch.setenv("HLOTK_MINOR_TILES", "0")
    plain = compile_fusion(f)
    assert "tl.split" in tiled.source and "tl.split" not in plain.source
    # the stores after a tile are marked one element per thread, unless asked not to
    assert "tl.max_contiguous" in tiled.source
    assert "tl.max_contiguous" not in vstore.source + plain.source
    out = tuple(f.shape.dims)      # [16, 24, 1]: the reshape to [16, 24] follows the fusion
    a = run(tiled, ins, out, torch.float32)
    b = run(plain, ins, out, torch.float32)
    np.testing.assert_array_equal(bits(a), bits(b))
    np.testing.assert_array_equal(bits(run(vstore, ins, out, torch.float32)), bits(b))
    want = np.asarray(giou_boxes(b1, b2))
    np.testing.assert_allclose(a.numpy().reshape(want.shape), want, rtol=2e-6, atol=1e-6)


@interp
@pytest.mark.parametrize("dtype,m,k", [("f32", 4, 0), ("f32", 4, 3), ("f32", 2, 1),
                                       ("bf16", 8, 6), ("s8", 16, 13)])
def test_column_bits_interpreter(dtype, m, k):
    _column_bits(dtype, m, k)


def _minor_dim_first_in_logical_order() -> None:
    # f32[4,64]{0,1}: dim 0 (size 4) is minor in memory; out[i] = (p[2,i] - p[3,i]) * p[0,i]
    # (no a*b+c, which the GPU may contract into one FMA: the comparison is bit for bit).
    f = fusion_of("""  %p = f32[4,64]{0,1} parameter(0)
  %a = f32[1,64]{0,1} slice(%p), slice={[2:3], [0:64]}
  %b = f32[1,64]{0,1} slice(%p), slice={[3:4], [0:64]}
  %c = f32[1,64]{0,1} slice(%p), slice={[0:1], [0:64]}
  %ab = f32[1,64]{0,1} subtract(%a, %b)
  %d = f32[1,64]{0,1} multiply(%ab, %c)
  ROOT %r = f32[64] reshape(%d)""", ["p: f32[4,64]{0,1}"], "f32[64]")
    k = compile_fusion(f)
    assert "tl.split" in k.source
    x = special_f32(64, 4)                                   # physical [64, 4] rows
    view = torch.from_numpy(x).to(DEVICE).t()                # logical [4, 64], strides (1, 4)
    got = run(k, [view], (64,), torch.float32).numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        want = (x[:, 2] - x[:, 3]) * x[:, 0]
    np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(want)],
                                  want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()


@interp
@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # inf - inf in Triton's interpreter
def test_minor_dim_first_in_logical_order_interpreter():
    _minor_dim_first_in_logical_order()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_minor_dim_first_in_logical_order_gpu():
    _minor_dim_first_in_logical_order()


@interp
def test_strided_views_interpreter():
    _strided_views()


@interp
def test_giou_matches_scalar_loads_interpreter(monkeypatch):
    _giou_matches_scalar_loads(monkeypatch)


@pytest.mark.parametrize("dtype,m,k", [("f32", 4, 0), ("f32", 4, 3), ("f32", 2, 1),
                                       ("bf16", 8, 6), ("s8", 16, 13)])
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_column_bits_gpu(dtype, m, k):
    _column_bits(dtype, m, k)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_strided_views_gpu():
    _strided_views()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_giou_matches_scalar_loads_gpu(monkeypatch):
    _giou_matches_scalar_loads(monkeypatch)
