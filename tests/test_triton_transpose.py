"""The Triton transpose template: fusions and copies that move the minor dimension.

Run in Triton's interpreter on CPU torch tensors (as the CPU half of test_cuda_runtime.py);
on a GPU the same tests run the compiled kernels. Each case states its expected values
from the reference interpreter, and checks that the tiled template (not the loop one) was
chosen, so a change that silently drops back to per-element strided copies fails here.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import hlo  # noqa: E402
from codegen.triton.templates import transpose_tile_dims  # noqa: E402
from passes.scheduling import Schedule  # noqa: E402
from runtime.cuda.backend import CudaExecutable  # noqa: E402

needs_kernels = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs a GPU or Triton's interpreter")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    if not os.environ.get("HLOTK_CACHE_DIR"):
        monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def build(text: str) -> tuple[hlo.Module, CudaExecutable]:
    m = hlo.parse_hlo(text)
    Schedule().run(m)
    hlo.verify(m)
    return m, CudaExecutable.build(m)


def templates(exe: CudaExecutable) -> dict[str, str]:
    return {t.inst.name: getattr(getattr(t, "kernel", None), "template", t.kind)
            for t in exe.thunks()}


def run_both(m: hlo.Module, exe: CudaExecutable, args: list[np.ndarray], rtol: float = 0) -> None:
    want = hlo.evaluate(m, args)
    want = list(want) if isinstance(want, tuple) else [want]
    got = exe.run(args, output="numpy")
    for g, w in zip(got, want):
        if rtol:
            np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                       rtol=rtol)
        else:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@needs_kernels
def test_layout_changing_copy_of_s8_is_a_tiled_transpose():
    # The K-major copy layout assignment makes of an 8-bit GEMM operand; 200 rows is not a
    # multiple of the 128-row tile, so the ragged edge's masks are exercised too.
    m, exe = build("""HloModule m
ENTRY e {
  p = s8[200,136]{1,0} parameter(0)
  ROOT c = s8[200,136]{0,1} copy(p)
}""")
    assert templates(exe)["c"] == "transpose"
    x = np.random.default_rng(0).integers(-128, 128, (200, 136)).astype(np.int8)
    run_both(m, exe, [x])


@needs_kernels
def test_transpose_fusion_with_elementwise_and_batch_dim():
    m, exe = build("""HloModule m
fc {
  a = f32[3,40,72]{2,1,0} parameter(0)
  t = f32[3,72,40]{2,1,0} transpose(a), dimensions={0,2,1}
  k = f32[] constant(2)
  kb = f32[3,72,40]{2,1,0} broadcast(k), dimensions={}
  mul = f32[3,72,40]{2,1,0} multiply(t, kb)
  ROOT cv = bf16[3,72,40]{2,1,0} convert(mul)
}
ENTRY e {
  p = f32[3,40,72]{2,1,0} parameter(0)
  ROOT f = bf16[3,72,40]{2,1,0} fusion(p), kind=kLoop, calls=fc
}""")
    comp = m.entry.root.attrs["calls"]
    # Output minor dim 2 (size 40); the input is minor in its dim 2, which is dim 1 here.
    assert transpose_tile_dims(comp) == (2, 1)
    assert templates(exe)["f"] == "transpose"
    x = np.random.default_rng(1).standard_normal((3, 40, 72)).astype(np.float32)
    # Triton's interpreter truncates to bf16 where a GPU rounds: within one bf16 ulp.
    run_both(m, exe, [x], rtol=8e-3)


@needs_kernels
def test_copy_that_keeps_the_minor_dim_stays_a_torch_copy():
    m, exe = build("""HloModule m
ENTRY e {
  p = f32[4,6,32]{2,1,0} parameter(0)
  ROOT c = f32[4,6,32]{2,0,1} copy(p)
}""")
    assert templates(exe)["c"] == "copy"
    x = np.arange(4 * 6 * 32, dtype=np.float32).reshape(4, 6, 32)
    run_both(m, exe, [x])


def test_small_or_minor_preserving_fusions_are_not_transposes():
    m = hlo.parse_hlo("""HloModule m
ENTRY e {
  p = f32[8,200]{1,0} parameter(0)
  ROOT c = f32[8,200]{0,1} copy(p)
}""")
    from runtime.cuda.thunks import one_instruction_fusion
    # 8 rows: too few for a tile to pay for its shared-memory round trip.
    assert transpose_tile_dims(one_instruction_fusion(m.entry.root).attrs["calls"]) is None


@needs_kernels
def test_layout_changing_reshape_of_an_attention_output_is_a_tiled_transpose():
    # An attention kernel's output stored [b,h,d,s] (s minor), viewed as [b,s,h,d] and
    # reshaped to [b,s,h*d] row-major for the next GEMM: the source's minor dim s survives
    # as output dim 1 while the output's minor dim is h*d, so it tiles like a transpose.
    m, exe = build("""HloModule m
fc {
  a = f32[2,4,16,48]{3,2,1,0} parameter(0)
  v = f32[2,48,4,16]{1,3,2,0} bitcast(a)
  ROOT r = f32[2,48,64]{2,1,0} reshape(v)
}
ENTRY e {
  p = f32[2,4,16,48]{3,2,1,0} parameter(0)
  ROOT f = f32[2,48,64]{2,1,0} fusion(p), kind=kLoop, calls=fc
}""")
    comp = m.entry.root.attrs["calls"]
    assert transpose_tile_dims(comp) == (2, 1)
    assert templates(exe)["f"] == "transpose"
    x = np.random.default_rng(2).standard_normal((2, 4, 16, 48)).astype(np.float32)
    run_both(m, exe, [x])
    # The reference, by hand: out[b, s, h*16 + d] = x[b, h, d, s].
    got = exe.run([x], output="numpy")[0]
    np.testing.assert_array_equal(np.asarray(got), x.transpose(0, 3, 1, 2).reshape(2, 48, 64))


def test_reshape_that_keeps_the_minor_dim_is_not_a_transpose():
    m = hlo.parse_hlo("""HloModule m
fc {
  a = f32[2,4,48,16]{3,2,1,0} parameter(0)
  v = f32[2,48,4,16]{3,1,2,0} bitcast(a)
  ROOT r = f32[2,48,64]{2,1,0} reshape(v)
}
ENTRY e {
  p = f32[2,4,48,16]{3,2,1,0} parameter(0)
  ROOT f = f32[2,48,64]{2,1,0} fusion(p), kind=kLoop, calls=fc
}""")
    assert transpose_tile_dims(m.entry.root.attrs["calls"]) is None


@needs_kernels
def test_large_transpose_with_a_dim_of_8_is_tiled():
    """A [T, D, 8] array re-laid out with the 8 major (a mixture-of-experts dispatch made
    expert-major for the batched GEMM): from 2^20 elements a tile of [8, 128] reads and
    writes whole runs (as a loop kernel it read each sector for 2 of its elements). The
    ragged D (not a multiple of 128) exercises the masks."""
    m, exe = build("""HloModule m
ENTRY e {
  p = bf16[1024,136,8]{2,1,0} parameter(0)
  ROOT c = bf16[1024,136,8]{1,0,2} copy(p)
}""")
    assert templates(exe)["c"] == "transpose"
    import ml_dtypes
    x = np.random.default_rng(1).standard_normal((1024, 136, 8)).astype(ml_dtypes.bfloat16)
    run_both(m, exe, [x])
    small = hlo.parse_hlo("""HloModule m
ENTRY e {
  p = bf16[64,136,8]{2,1,0} parameter(0)
  ROOT c = bf16[64,136,8]{1,0,2} copy(p)
}""")
    from runtime.cuda.thunks import one_instruction_fusion
    assert transpose_tile_dims(one_instruction_fusion(small.entry.root).attrs["calls"]) is None
