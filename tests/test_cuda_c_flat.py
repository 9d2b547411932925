"""The flat form of the CUDA C loop emitter (codegen/cuda_c/flat.py, issue 13).

On the host (g++ through ``codegen/cuda_c/host.py``; NVRTC too where it is installed):
which fusions get the flat form, one source for every size, and the kernel's values against
the HLO interpreter at odd sizes, with misaligned buffers (the element-by-element path),
narrow stores, several outputs and an output written over an input. ``gpu``: through the
CUDA backend against jax.jit, and the launch on misaligned, non-dense and shared views.
"""
from __future__ import annotations

import numpy as np
import pytest

import hlo
from codegen.cuda_c import CudaCodegenError, emit_loop_kernel, host, nvrtc, takes
from codegen.cuda_c.emitter import compile_text
from codegen.cuda_c.flat import (INDEX32_MAX, divsqrt_mode, fitted_threads, flat_blocks,
                                 flat_key, flat_reason, launch_shape)
from tests.test_cuda_c import make, random_input

needs_cxx = pytest.mark.skipif(host.host_compiler() is None, reason="no host C++ compiler")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    for var in ("HLOTK_CUDA_C_FLAT", "HLOTK_CUDA_C_RESTRICT", "HLOTK_CUDA_C_FLAT_LAUNCH",
                "HLOTK_CUDA_C_FLAT_DIVSQRT"):
        monkeypatch.delenv(var, raising=False)


def adam_like(shape: str, out_dtype: str = "f32"):
    """p, g (full size), lr (a scalar) -> (p - lr * g in ``out_dtype``, g * g): one
    elementwise fusion with a one-element parameter and a powf on it."""
    conv = (f"  %o = {out_dtype}{shape} convert(%new)\n" if out_dtype != "f32" else "")
    first = "%o" if out_dtype != "f32" else "%new"
    return make(f"""  %p = f32{shape} parameter(0)
  %g = f32{shape} parameter(1)
  %lr = f32[] parameter(2)
  %two = f32[] constant(2)
  %c = f32[] power(%lr, %two)
  %b = f32{shape} broadcast(%c), dimensions={{}}
  %m = f32{shape} multiply(%g, %b)
  %new = f32{shape} subtract(%p, %m)
{conv}  %gg = f32{shape} multiply(%g, %g)
  ROOT %t = ({out_dtype}{shape}, f32{shape}) tuple({first}, %gg)""",
                [f"p: f32{shape}", f"g: f32{shape}", "lr: f32[]"],
                f"({out_dtype}{shape}, f32{shape})")


def reference(fusion, args) -> list[np.ndarray]:
    ref = hlo.evaluate(fusion.attrs["calls"], [np.asarray(a) for a in args])
    return [np.asarray(r) for r in (ref if isinstance(ref, tuple) else (ref,))]


def inputs_for(fusion, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    params = sorted(fusion.attrs["calls"].parameters, key=lambda p: p.parameter_number)
    return [random_input(p.shape, rng) for p in params]


def misaligned(a: np.ndarray, offset_bytes: int) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose data starts ``offset_bytes`` past a 64-byte
    boundary (numpy's own buffers are at least 16-byte aligned)."""
    raw = np.zeros(a.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset_bytes
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def run(ks, args, outs=None, **launch) -> list[np.ndarray]:
    if outs is None:
        outs = [np.full(s.dims, np.nan if s.dtype.is_float else 7).astype(s.dtype.np_dtype)
                for s in ks.output_shapes]
    host.run(ks, outs, args, **launch)
    return outs


def assert_equal(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64))


def divide_sqrt(shape: str):
    """x / y, sqrt(x) and x / (s - 1) (s one element: its subtraction before the loop) as
    one flat fusion: every full-size f32 division and square root of a flat kernel."""
    return make(f"""  %x = f32{shape} parameter(0)
  %y = f32{shape} parameter(1)
  %s = f32[] parameter(2)
  %one = f32[] constant(1)
  %sm1 = f32[] subtract(%s, %one)
  %d = f32{shape} divide(%x, %y)
  %r = f32{shape} sqrt(%x)
  %b = f32{shape} broadcast(%sm1), dimensions={{}}
  %q = f32{shape} divide(%x, %b)
  ROOT %t = (f32{shape}, f32{shape}, f32{shape}) tuple(%d, %r, %q)""",
                [f"x: f32{shape}", f"y: f32{shape}", "s: f32[]"],
                f"(f32{shape}, f32{shape}, f32{shape})")


def wide_floats(n: int, rng, lo: int = -149, hi: int = 128, specials: bool = True) -> np.ndarray:
    """f32 values with random significands and signs, exponents uniform in [lo, hi) (so
    subnormals, values near the fast paths' bounds 2^-62 and 2^62, and huge ones), and,
    with ``specials``, some zeros, infinities and NaNs."""
    sig = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    e = rng.integers(lo, hi, n)
    x = np.ldexp((1 + sig / float(1 << 23)).astype(np.float64), e)
    x = np.where(rng.random(n) < 0.5, -x, x).astype(np.float32)
    if specials:
        k = rng.integers(0, n, n // 50)
        x[k] = rng.choice(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0 ** -62, 2.0 ** 62,
                                    np.nextafter(np.float32(2.0 ** 62), np.float32(0))],
                                   np.float32), k.size)
    return x


# --- which form ----------------------------------------------------------------------------------
def test_flat_form_chosen_for_elementwise_fusions():
    ks = emit_loop_kernel(adam_like("[300,7]"))
    assert ks.flat and ks.per_thread == 4            # 16 bytes of f32 a chunk
    assert [t for t, _ in ks.params][-1] == "long long" and ks.params[-1][1] == "n_elements"
    code = compile_text(ks.source)
    assert "300" not in code and "2100" not in code  # no shape in what NVRTC compiles
    assert "typedef int hl_index;" in code
    assert "((const uint4*)(p0 + i))[0]" in code and "((uint4*)(out1 + i))[0]" in code
    assert "powf(" in code.split("for (hl_index c")[0]   # the scalar's powf before the loop
    # every load of a chunk before its first store
    body = code.split("for (hl_index c")[1]
    assert body.rindex("p1[") < body.index("out0[")


def test_division_and_sqrt_forms(monkeypatch):
    """"ieee" (default): "/" and sqrtf per op (the source before). "chunk": full-size f32
    divisions and square roots by the fast paths, their checks ANDed into hl_ok, an
    element loop with "/" and sqrtf where one fails; the one-element values before the
    loop keep "/". "approx": Triton's instructions. Kernels without them are the same."""
    f = divide_sqrt("[1000]")
    assert divsqrt_mode() == "ieee"
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT_DIVSQRT", "chunk")
    code = compile_text(emit_loop_kernel(f).source)
    before, body = code.split("for (hl_index c")
    fast, slow = body.split("#pragma unroll 1")
    assert "bool hl_ok = vec && i + 4 <= n;" in fast and "continue;" in fast
    assert fast.count("hl_ok &= hl_div_ok(") == 8 and fast.count("hl_ok &= hl_sqrt_ok(") == 4
    assert fast.count("hl_div_fast(") == 8 and " / " not in fast and "sqrtf(" not in fast
    assert fast.index("(p1 + i)") < fast.index("hl_div_fast(") < fast.rindex("if (hl_ok)") \
        < fast.index("(out0 + i)")
    # the element loop: one element's code, IEEE ops, its loads before its stores
    assert slow.count(" / ") == 2 and slow.count("sqrtf(") == 1 and "hl_div_fast(" not in slow
    assert slow.rindex("= p1[i + hl_j]") < slow.index("out0[i + hl_j] =")
    assert "(param2_" in before and "1.0f)" in before            # s - 1 once, before the loop
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT_DIVSQRT", "ieee")
    ieee = compile_text(emit_loop_kernel(f).source)
    assert "hl_ok" not in ieee and "hl_div_fast" not in ieee and ieee.count("sqrtf(") == 4
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT_DIVSQRT", "approx")
    approx = compile_text(emit_loop_kernel(f).source)
    assert approx.count("hl_div_full(") == 8 + 1 and approx.count("hl_sqrt_approx(") == 4 + 1
    keys = set()
    for mode in ("chunk", "ieee", "approx"):
        monkeypatch.setenv("HLOTK_CUDA_C_FLAT_DIVSQRT", mode)
        keys.add(flat_key(f))
    assert len(keys) == 3
    plain = adam_like("[1000]")                              # powf, no division or sqrt
    texts = set()
    for mode in ("chunk", "ieee"):
        monkeypatch.setenv("HLOTK_CUDA_C_FLAT_DIVSQRT", mode)
        texts.add(compile_text(emit_loop_kernel(plain).source))
    assert len(texts) == 1 and "hl_ok" not in texts.pop()
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT_DIVSQRT", "fast")
    with pytest.raises(CudaCodegenError, match="HLOTK_CUDA_C_FLAT_DIVSQRT"):
        divsqrt_mode()


def test_strided_form_where_elements_move_or_sizes_differ(monkeypatch):
    transpose = make("""  %x = f32[4,6] parameter(0)
  ROOT %t = f32[6,4] transpose(%x), dimensions={1,0}""", ["x: f32[4,6]"], "f32[6,4]")
    row = make("""  %x = f32[4,6] parameter(0)
  %r = f32[6] parameter(1)
  %b = f32[4,6] broadcast(%r), dimensions={1}
  ROOT %a = f32[4,6] add(%x, %b)""", ["x: f32[4,6]", "r: f32[6]"], "f32[4,6]")
    layouts = make("""  %x = f32[4,6]{0,1} parameter(0)
  %y = f32[4,6]{1,0} parameter(1)
  ROOT %a = f32[4,6] add(%x, %y)""", ["x: f32[4,6]{0,1}", "y: f32[4,6]{1,0}"], "f32[4,6]")
    one = make("""  %x = f32[1] parameter(0)
  ROOT %n = f32[1] negate(%x)""", ["x: f32[1]"], "f32[1]")
    wide = make("""  %x = f64[40] parameter(0)
  ROOT %c = u8[40] convert(%x)""", ["x: f64[40]"], "u8[40]")
    for f, why in ((transpose, "parameter %x"), (row, "parameter %r"), (layouts, "laid out"),
                   (one, "one output element"), (wide, "apart")):
        assert why in flat_reason(f)
        assert not emit_loop_kernel(f).flat
    with pytest.raises(CudaCodegenError, match="no flat form"):
        emit_loop_kernel(transpose, flat=True)
    f = adam_like("[64]")
    assert not emit_loop_kernel(f, flat=False).flat
    assert not emit_loop_kernel(f, per_thread=4).flat      # a strided per-thread count
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT", "0")
    assert "HLOTK_CUDA_C_FLAT=0" in flat_reason(f) and not emit_loop_kernel(f).flat


def test_one_source_for_two_sizes_and_wide_indices_only_past_2_30():
    from codegen.cuda_c.kernel import compile_loop_fusion
    small, big = adam_like("[3,5]"), adam_like("[1536,768]")
    a, b = emit_loop_kernel(small), emit_loop_kernel(big)
    assert compile_text(a.source) == compile_text(b.source)
    assert (a.elements, b.elements) == (15, 1536 * 768)
    ka = compile_loop_fusion(small, arch="90", start=False)
    kb = compile_loop_fusion(big, arch="90", start=False)
    assert ka.key == kb.key and ka.path == kb.path     # one file, one NVRTC compile
    assert (ka.blocks, kb.blocks) == (1, 1536 * 768 // (4 * 256))
    huge = emit_loop_kernel(adam_like(f"[{INDEX32_MAX + 4}]"))
    assert "typedef long long hl_index;" in huge.source
    assert compile_text(huge.source) != compile_text(a.source)
    bf = emit_loop_kernel(adam_like("[3,5]", "bf16"))
    assert bf.per_thread == 8 and compile_text(bf.source) != compile_text(a.source)


def test_memo_emits_once_per_fusion_up_to_names(monkeypatch):
    """With a build's ``memo``, a fusion equal to an earlier one up to names takes its
    emitted source (no second emit), and so does a flat one of another shape (its source
    names no size: flat.flat_key); other math is emitted anew. Each kernel keeps its own
    fusion's name and sizes."""
    from codegen.cuda_c import kernel as kmod
    emitted: list = []
    real = kmod.emit_loop_kernel
    monkeypatch.setattr(kmod, "emit_loop_kernel",
                        lambda f, *a, **k: emitted.append(f.name) or real(f, *a, **k))
    first, again, other_size = adam_like("[3,5]"), adam_like("[3,5]"), adam_like("[7]")
    again.name = "fusion.again"
    memo: dict = {}
    ka = kmod.compile_loop_fusion(first, arch="90", start=False, memo=memo)
    kb = kmod.compile_loop_fusion(again, arch="90", start=False, memo=memo)
    kc = kmod.compile_loop_fusion(other_size, arch="90", start=False, memo=memo)
    assert emitted == [first.name]
    assert kb.source is ka.source is kc.source and kb.key == ka.key == kc.key   # one compile
    assert (ka.fusion_name, kb.fusion_name) == (first.name, "fusion.again")
    assert (kb.elements, kc.elements) == (15, 7)
    assert [s.dims for s in kc.input_shapes + kc.output_shapes] == [(7,), (7,), (), (7,), (7,)]
    kmod.compile_loop_fusion(adam_like("[3,5]", "bf16"), arch="90", start=False, memo=memo)
    assert len(emitted) == 2


def test_launch_shape_and_blocks(monkeypatch):
    assert launch_shape() == (256, 0, False)
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT_LAUNCH", "128/4")
    assert launch_shape() == (128, 4, True)
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT_LAUNCH", "512")
    assert launch_shape() == (512, 0, True)
    for bad in ("100", "256/x", "256/4/1", "2048"):
        monkeypatch.setenv("HLOTK_CUDA_C_FLAT_LAUNCH", bad)
        with pytest.raises(CudaCodegenError, match="HLOTK_CUDA_C_FLAT_LAUNCH"):
            launch_shape()
    assert flat_blocks(1536 * 1536, 4, 128, 0, 132) == 4608        # one chunk a thread
    assert flat_blocks(1536 * 1536, 4, 256, 4, 132) == 2304          # under 4 waves: all
    assert flat_blocks(1536 * 1536, 4, 256, 1, 132) == 132 * 8       # capped at one wave
    assert flat_blocks(10, 4, 256, 4, 132) == 1
    # a small kernel's block shrinks (to 64 threads) until its blocks reach the SMs
    assert fitted_threads(1536 * 768, 4, 256, 132) == 256       # 1152 blocks
    assert fitted_threads(6144, 4, 256, 132) == 64             # 6 blocks -> 24
    assert fitted_threads(4 * 128 * 132, 4, 256, 132) == 128     # 66 blocks -> 132
    assert fitted_threads(15, 4, 256, 132) == 64


def test_kernel_launch_shape_from_the_target(monkeypatch):
    from codegen.cuda_c.kernel import compile_loop_fusion
    k = compile_loop_fusion(adam_like("[6144]"), arch="90", target="h200", start=False)
    assert (k.threads, k.blocks) == (64, 24)
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT_LAUNCH", "256/1")
    k = compile_loop_fusion(adam_like("[6144]"), arch="90", target="h200", start=False)
    assert (k.threads, k.blocks) == (256, 6)
    k = compile_loop_fusion(adam_like("[1536,1536]"), arch="90", target="h200", start=False)
    assert (k.threads, k.blocks) == (256, 132 * 8)             # one wave, grid-stride


def test_auto_takes_flat_loops_at_any_size(monkeypatch):
    from runtime.cuda.backend import _has_flat_form
    assert takes("auto", 1.0) and not takes("auto", 50.0)
    assert takes("auto", 50.0, flat=True) and not takes("triton", 1.0, flat=True)
    big = adam_like("[1536,1536]")
    moving = make("""  %x = f32[1536,1536] parameter(0)
  ROOT %t = f32[1536,1536] transpose(%x), dimensions={1,0}""", ["x: f32[1536,1536]"],
                  "f32[1536,1536]")
    assert _has_flat_form(big) and not _has_flat_form(moving)
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT", "0")
    assert not _has_flat_form(big)


# --- values on the host ----------------------------------------------------------------------
@needs_cxx
@pytest.mark.parametrize("n", [2, 3, 5, 7, 1001, 4 * 256 + 3, 3 * 4 * 256])
def test_odd_sizes_and_a_short_grid(n):
    f = adam_like(f"[{n}]")
    ks = emit_loop_kernel(f)
    if not nvrtc.unavailable():
        assert nvrtc.cubin_for(ks.source, ks.name, "90")[:4] == b"\x7fELF"
    args = inputs_for(f, n)
    want = reference(f, args)
    assert_equal(run(ks, args), want)
    assert_equal(run(ks, args, blocks=1, threads=32), want)     # the grid-stride loop


@needs_cxx
@pytest.mark.parametrize("seed, lo, hi", [(0, -149, 128), (1, -70, 70), (2, -62, 62)])
def test_fast_division_and_sqrt_round_as_ieee_on_the_host(seed, lo, hi, monkeypatch):
    """"chunk"'s results are IEEE's bit for bit: chunks whose operands all pass the checks
    (exponents in [-62, 62)) through the fast paths, the others through "/" and sqrtf (on
    the host the seeds are exact; the GPU's approximate ones: the gpu test below)."""
    n = 4099
    f = divide_sqrt(f"[{n}]")
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT_DIVSQRT", "chunk")
    ks = emit_loop_kernel(f)
    assert "hl_div_fast(" in ks.source
    rng = np.random.default_rng(seed)
    x, y = wide_floats(n, rng, lo, hi, specials=seed == 0), wide_floats(n, rng, lo, hi,
                                                                        specials=seed == 0)
    s = np.float32(1.0 + 2.0 ** -20)
    got = run(ks, [x, y, np.asarray(s)])
    with np.errstate(all="ignore"):
        want = [x / y, np.sqrt(x), x / (s - np.float32(1))]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint32)[~np.isnan(w)],
                                      w.view(np.uint32)[~np.isnan(w)])
        assert np.isnan(g[np.isnan(w)]).all()


@needs_cxx
def test_fast_division_and_sqrt_of_zeros(monkeypatch):
    """Zero numerators and roots of zeros pass the checks: the fast paths give IEEE's
    signed zeros (0 / -y = -0, sqrt(-0) = -0) with no element loop; a zero divisor fails."""
    n = 4096
    f = divide_sqrt(f"[{n}]")
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT_DIVSQRT", "chunk")
    ks = emit_loop_kernel(f)
    rng = np.random.default_rng(9)
    x, y = wide_floats(n, rng, -30, 30, False), wide_floats(n, rng, -30, 30, False)
    x[::3], x[1::5] = 0.0, -0.0
    y[7] = 0.0
    s = np.float32(0.5)
    with np.errstate(all="ignore"):
        want = [x / y, np.sqrt(x), x / (s - np.float32(1))]
    got = run(ks, [x, y, np.asarray(s)])
    for g, w in zip(got, want):
        ok = ~np.isnan(w)
        np.testing.assert_array_equal(g.view(np.uint32)[ok], w.view(np.uint32)[ok])
        assert np.isnan(g[~ok]).all()
    assert np.signbit(got[0][1::5][x[1::5] == 0]).sum() > 0      # a -0 quotient kept


@needs_cxx
@pytest.mark.parametrize("offset", [0, 4])
def test_fast_division_misaligned_and_written_over_its_input(offset, monkeypatch):
    """The element loop ("chunk"'s path for misaligned views and failed checks) reads an
    element's inputs before writing it: x / y written over x, with zero divisors (failed
    checks) mixed into the chunks, equals IEEE's."""
    n = 1001
    f = divide_sqrt(f"[{n}]")
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT_DIVSQRT", "chunk")
    ks = emit_loop_kernel(f)
    rng = np.random.default_rng(offset)
    x, y = wide_floats(n, rng, -30, 30, False), wide_floats(n, rng, -30, 30, False)
    y[::7] = 0.0
    s = np.float32(3.0)
    with np.errstate(all="ignore"):
        want = [x / y, np.sqrt(x), x / (s - np.float32(1))]
    xb = misaligned(x, offset)
    outs = [xb, misaligned(np.full(n, np.nan, np.float32), offset),
            misaligned(np.full(n, np.nan, np.float32), 0)]
    got = run(ks, [xb, misaligned(y, offset), np.asarray(s)], outs=outs)
    assert got[0] is xb
    for g, w in zip(got, want):
        ok = ~np.isnan(w)
        np.testing.assert_array_equal(g.view(np.uint32)[ok], w.view(np.uint32)[ok])
        assert np.isnan(g[~ok]).all()


@needs_cxx
@pytest.mark.parametrize("offset", [4, 8, 12])
def test_misaligned_buffers_take_the_element_path(offset):
    f = adam_like("[1001]")
    ks = emit_loop_kernel(f)
    args = inputs_for(f, offset)
    want = reference(f, args)
    moved = [misaligned(args[0], offset), args[1], args[2]]
    outs = [misaligned(np.full(1001, np.nan, np.float32), 0), misaligned(
        np.full(1001, np.nan, np.float32), offset)]
    assert_equal(run(ks, moved, outs), want)


@needs_cxx
@pytest.mark.parametrize("out_dtype", ["bf16", "f16"])
def test_narrow_stores_and_loads(out_dtype):
    f = adam_like("[37,3]", out_dtype)
    ks = emit_loop_kernel(f)
    assert ks.flat and ks.per_thread == 8
    args = inputs_for(f, 1)
    assert_equal(run(ks, args), reference(f, args))
    g = make(f"""  %x = {out_dtype}[1003] parameter(0)
  %y = {out_dtype}[1003] parameter(1)
  %s = {out_dtype}[1003] multiply(%x, %y)
  %e = {out_dtype}[1003] exponential(%s)
  %xf = f32[1003] convert(%x)
  ROOT %t = ({out_dtype}[1003], f32[1003]) tuple(%e, %xf)""",
             [f"x: {out_dtype}[1003]", f"y: {out_dtype}[1003]"], f"({out_dtype}[1003], f32[1003])")
    kg = emit_loop_kernel(g)
    assert kg.flat and kg.per_thread == 8
    args = inputs_for(g, 2)
    got, want = run(kg, args), reference(g, args)
    np.testing.assert_array_equal(got[1], want[1])
    # exp: the host libm against the interpreter's numpy, then one narrow rounding
    np.testing.assert_allclose(got[0].astype(np.float64), want[0].astype(np.float64),
                               rtol=1e-2)


@needs_cxx
def test_pred_and_integer_outputs_sixteen_a_chunk():
    f = make("""  %x = s8[333] parameter(0)
  %y = s8[333] parameter(1)
  %a = s8[333] add(%x, %y)
  %c = pred[333] compare(%a, %y), direction=GT
  ROOT %t = (s8[333], pred[333]) tuple(%a, %c)""", ["x: s8[333]", "y: s8[333]"],
             "(s8[333], pred[333])")
    ks = emit_loop_kernel(f)
    assert ks.flat and ks.per_thread == 16
    args = inputs_for(f, 3)
    got, want = run(ks, args), reference(f, args)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1].view(np.uint8) != 0, want[1])


@needs_cxx
@pytest.mark.parametrize("n, offset", [(1001, 0), (1001, 4), (4096, 0)])
def test_output_written_over_its_input(n, offset):
    """Buffer sharing: output 0 in input 0's buffer and output 1 in input 1's, element for
    element (the first output does not read the second's input)."""
    f = adam_like(f"[{n}]")
    ks = emit_loop_kernel(f)
    args = inputs_for(f, 4)
    want = reference(f, args)
    p, g = misaligned(args[0], offset), misaligned(args[1], offset)
    out = run(ks, [p, g, args[2]], outs=[p, g])
    assert out[0] is p and out[1] is g
    assert_equal([p, g], want)


@needs_cxx
def test_column_major_and_size_one_dims_read_in_memory_order():
    from tests.test_cuda_c import strided
    f = make("""  %x = f32[5,1,9]{0,1,2} parameter(0)
  %y = f32[5,1,9]{0,2,1} parameter(1)
  ROOT %a = f32[5,1,9]{0,1,2} subtract(%x, %y)""",
             ["x: f32[5,1,9]{0,1,2}", "y: f32[5,1,9]{0,2,1}"], "f32[5,1,9]{0,1,2}")
    ks = emit_loop_kernel(f)
    assert ks.flat
    args = inputs_for(f, 5)
    out = strided(np.full((5, 1, 9), np.nan, np.float32), ks.output_shapes[0])
    host.run(ks, [out], [strided(a, s) for a, s in zip(args, ks.input_shapes)])
    np.testing.assert_array_equal(np.array(out), args[0] - args[1])


@needs_cxx
def test_values_equal_jax_jit():
    """An elementwise JAX function's one loop fusion (after the CUDA pipeline), run flat on
    the host, against jax.jit (XLA:CPU's exp differs by ulps; exp(b) - s cancels near b = log s)."""
    import jax
    import jax.numpy as jnp
    from tests.test_cuda_c import _cuda_pipeline_loop_fusions

    def fn(a, b, s):
        return jnp.where(a > b, a * s + 1.0, jnp.exp(b) - s) * jnp.maximum(a, b) / (s + 2.0)
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal(2051).astype(np.float32) for _ in range(2))
    s = np.float32(0.75)
    fusions = _cuda_pipeline_loop_fusions(fn, a, b, s)
    assert len(fusions) == 1
    ks = emit_loop_kernel(fusions[0])
    assert ks.flat
    by_shape = {(): s, (2051,): None}
    params = sorted(fusions[0].attrs["calls"].parameters, key=lambda p: p.parameter_number)
    assert [tuple(p.shape.dims) for p in params].count((2051,)) == 2
    full = iter([a, b])
    args = [np.asarray(by_shape[()] if not p.shape.dims else next(full)) for p in params]
    got, = run(ks, args)
    np.testing.assert_allclose(got, np.asarray(jax.jit(fn)(a, b, s)), rtol=1e-6, atol=1e-7)


# --- on the GPU -----------------------------------------------------------------------------
def _gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    return torch


@pytest.mark.gpu
def test_gpu_adam_step_flat_under_auto_equals_jax(monkeypatch):
    import jax
    import runtime
    from runtime.cuda import executable_of
    from tests.test_cuda_c import _adam_program
    _gpu()
    monkeypatch.delenv("HLOTK_LOOP_EMITTER", raising=False)      # auto
    fn, args = _adam_program()
    want = jax.jit(fn)(*args)
    compiled = runtime.jit(fn, backend="cuda").lower(*args).compile()
    compiled(*args)
    got = compiled(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    kernels = [t.kernel for t in executable_of(compiled).thunks()
               if getattr(getattr(t, "kernel", None), "emitter", "") == "cuda"]
    flat = [k for k in kernels if k.flat]
    assert flat and len({k.key for k in flat}) < len(flat), [k.name for k in kernels]


@pytest.mark.gpu
def test_gpu_kernels_of_one_cubin_load_it_once():
    """Two kernels of one cubin (same math, other sizes) load one module per device and
    each computes its own fusion's values."""
    torch = _gpu()
    from codegen.cuda_c import kernel as kmod
    arch = "".join(map(str, torch.cuda.get_device_capability()))
    small, big = adam_like("[5,7]"), adam_like("[300]")
    ka = kmod.compile_loop_fusion(small, arch=arch)
    kb = kmod.compile_loop_fusion(big, arch=arch)
    assert ka.key == kb.key
    loaded = kmod.STATS["loaded"]
    for k, f in ((ka, small), (kb, big)):
        args = inputs_for(f, 3)
        want = reference(f, args)
        dev = [torch.from_numpy(a).cuda() for a in args]
        outs = [torch.empty(tuple(w.shape), dtype=torch.float32, device="cuda") for w in want]
        k.launch(outs, dev)
        for o, w in zip(outs, want):
            np.testing.assert_allclose(o.cpu().numpy(), w, rtol=1e-6, atol=1e-7)
    assert kmod.STATS["loaded"] - loaded <= 1
    assert ka._functions[torch.cuda.current_device()] is kb._functions[torch.cuda.current_device()]


@pytest.mark.gpu
def test_gpu_launch_on_misaligned_non_dense_and_shared_views():
    torch = _gpu()
    from codegen.cuda_c.kernel import compile_loop_fusion
    f = adam_like("[33,31]")
    k = compile_loop_fusion(f, arch="".join(map(str, torch.cuda.get_device_capability())))
    assert k.flat
    args = inputs_for(f, 7)
    want = reference(f, args)
    dev = [torch.from_numpy(a).cuda() for a in args]
    cases = {
        "aligned": (dev[0], dev[1]),
        "misaligned": (torch.empty(33 * 31 + 1, device="cuda")[1:].view(33, 31).copy_(dev[0]),
                       dev[1]),
        "non-dense": (dev[0].t().contiguous().t(), dev[1]),
    }
    for name, (p, g) in cases.items():
        outs = [torch.full((33, 31), float("nan"), device="cuda"),
                torch.empty(33 * 31 + 1, device="cuda")[1:].view(33, 31)]
        k.launch(outs, [p, g, dev[2]])
        torch.cuda.synchronize()
        for o, w in zip(outs, want):     # the GPU may contract into an FMA: ulps
            np.testing.assert_allclose(o.cpu().numpy(), w, rtol=1e-6, atol=1e-7, err_msg=name)
    p, g = dev[0].clone(), dev[1].clone()
    k.launch([p, g], [p, g, dev[2]])            # outputs over their inputs
    torch.cuda.synchronize()
    np.testing.assert_allclose(p.cpu().numpy(), want[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(g.cpu().numpy(), want[1], rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("lo, hi", [(-62, 62), (-149, 128)])
def test_gpu_fast_division_and_sqrt_bit_equal_to_ieee(monkeypatch, lo, hi):
    """On the GPU (approximate reciprocal and rsqrt seeds) "chunk" gives "ieee"'s bits for
    4M random operand pairs: all through the fast paths (exponents in [-62, 62)), and
    with subnormals, huge values, zeros, infinities and NaNs mixed in."""
    torch = _gpu()
    from codegen.cuda_c.kernel import compile_loop_fusion
    arch = "".join(map(str, torch.cuda.get_device_capability()))
    n = 1 << 22
    f = divide_sqrt(f"[{n}]")
    rng = np.random.default_rng(lo & 0xff)
    args = [wide_floats(n, rng, lo, hi, specials=lo < -62),
            wide_floats(n, rng, lo, hi, specials=lo < -62), np.asarray(np.float32(0.75))]
    dev = [torch.from_numpy(a).cuda() for a in args]
    got = {}
    for mode in ("ieee", "chunk"):
        monkeypatch.setenv("HLOTK_CUDA_C_FLAT_DIVSQRT", mode)
        k = compile_loop_fusion(f, arch=arch)
        assert ("hl_div_fast(" in k.source) == (mode == "chunk")
        outs = [torch.full((n,), float("nan"), device="cuda") for _ in range(3)]
        k.launch(outs, dev)
        torch.cuda.synchronize()
        got[mode] = [o.cpu().numpy().view(np.uint32) for o in outs]
    for a, b in zip(got["ieee"], got["chunk"]):
        np.testing.assert_array_equal(a, b)
    with np.errstate(all="ignore"):
        want = args[0] / args[1]
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got["chunk"][0][ok], want.view(np.uint32)[ok])
