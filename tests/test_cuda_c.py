"""The CUDA C loop emitter (codegen/cuda_c, issue 13).

Three layers, none needing a GPU except the last:
- the emitted text, per op family (what each op becomes in C);
- the emitted kernel compiled by the host C++ compiler through ``codegen/cuda_c/host.py``'s
  shim and run on numpy buffers (with the layouts' strides), against the HLO interpreter on
  the fused computation: the zoo's loop fusions after the CUDA pipeline, an Adam step, and
  hand-written fusions for the corners (bf16/f16 in and out, NaN in max/min, odd sizes,
  multi-output of two shapes, integer wrap and division by zero); skipped without g++;
- with NVRTC (``HLOTK_NVRTC`` or the NVIDIA pip package; not in CPU CI): every emitted
  kernel compiles to a cubin, and a compile error names the fusion and the source file;
- ``gpu``: programs through ``runtime.jit(backend="cuda")`` with ``HLOTK_LOOP_EMITTER=cuda``
  against jax.jit.
"""
from __future__ import annotations

import numpy as np
import pytest

import hlo
from hlo.layout_util import major_to_minor, to_physical
from codegen.cuda_c import CudaCDeclined, CudaCodegenError, decline_reason, emit_loop_kernel
from codegen.cuda_c import host, nvrtc
from codegen.cuda_c.prelude import prelude_for

needs_cxx = pytest.mark.skipif(host.host_compiler() is None, reason="no host C++ compiler")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


# --- building fusions --------------------------------------------------------------------------
def make(body: str, params: list[str], root_shape: str, extra: str = ""):
    """A module whose entry calls one loop fusion of ``body``; returns the fusion."""
    entry = "\n".join(f"  %e{i} = {p.split(': ')[1]} parameter({i})" for i, p in enumerate(params))
    args = ", ".join(f"%e{i}" for i in range(len(params)))
    text = f"""HloModule m
{extra}
%fused ({', '.join(params)}) -> {root_shape} {{
{body}
}}

ENTRY %main ({', '.join(f'e{i}: ' + p.split(': ')[1] for i, p in enumerate(params))}) -> {root_shape} {{
{entry}
  ROOT %the_fusion = {root_shape} fusion({args}), kind=kLoop, calls=%fused
}}
"""
    return hlo.parse_hlo(text).entry.root


def random_input(shape, rng, positive: bool = False) -> np.ndarray:
    dt = shape.dtype
    if dt.is_float:
        x = rng.standard_normal(shape.dims)
        return (np.abs(x) + 0.1 if positive else x).astype(dt.np_dtype)
    if dt.is_pred:
        return rng.integers(0, 2, shape.dims).astype(bool)
    lo, hi = (0, 200) if dt.kind == "uint" else (-100, 100)
    return rng.integers(lo, hi, shape.dims).astype(dt.np_dtype)


def strided(x: np.ndarray, shape) -> np.ndarray:
    """A logical-shape numpy view whose strides are those of ``shape``'s layout."""
    phys = to_physical(x, shape.layout)
    order = major_to_minor(shape.layout, x.ndim)
    return np.transpose(phys, [order.index(d) for d in range(x.ndim)]) if x.ndim else phys


def run_host(fusion, args, round_narrow: bool = True, per_thread=None,
             flat=None) -> list[np.ndarray]:
    """The kernel run on the host (and, where NVRTC is here, also compiled by it for sm_90:
    the source the GPU gets is the one tested)."""
    ks = emit_loop_kernel(fusion, round_narrow, per_thread=per_thread, flat=flat)
    if not nvrtc.unavailable():
        assert nvrtc.cubin_for(ks.source, ks.name, "90")[:4] == b"\x7fELF"
    outs = []
    for s in ks.output_shapes:
        poison = np.full(s.dims, np.nan if s.dtype.is_float else 7).astype(s.dtype.np_dtype)
        outs.append(strided(poison, s))
    host.run(ks, outs, [strided(np.asarray(a), p) for a, p in zip(args, ks.input_shapes)])
    return [np.array(o, order="C") for o in outs]


def check(fusion, seed: int = 0, args=None, positive: bool = False, tol: float = 0.0,
          per_thread=None, flat=None) -> None:
    """The host-run kernel against hlo.evaluate of the fused computation: equal (NaN where
    NaN) for integers and, with ``tol`` 0, for floats; else within ``tol`` relative.
    ``flat``: emit_loop_kernel's choice of form (None: flat where the fusion has one)."""
    comp = fusion.attrs["calls"]
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    rng = np.random.default_rng(seed)
    args = args if args is not None else [random_input(p.shape, rng, positive) for p in params]
    got = run_host(fusion, args, per_thread=per_thread, flat=flat)
    ref = hlo.evaluate(comp, [np.asarray(a) for a in args])
    refs = list(ref) if isinstance(ref, tuple) else [ref]
    assert len(got) == len(refs)
    for g, r in zip(got, refs):
        r = np.asarray(r)
        assert g.shape == r.shape and g.dtype == r.dtype, (g.dtype, r.dtype)
        if r.dtype.kind in "fV" or r.dtype.name in ("bfloat16", "float16"):
            g64, r64 = g.astype(np.float64), r.astype(np.float64)
            np.testing.assert_array_equal(np.isnan(g64), np.isnan(r64))
            np.testing.assert_allclose(g64, r64, rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(g, r)


# --- (1) the emitted text ------------------------------------------------------------------------
def test_text_elementwise_and_accurate_math():
    f = make("""  %a = f32[37] parameter(0)
  %b = f32[37] parameter(1)
  %e = f32[37] exponential(%a)
  %d = f32[37] divide(%e, %b)
  %s = f32[37] sqrt(%d)
  %r = f32[37] rsqrt(%s)
  %t = f32[37] tanh(%r)
  %mx = f32[37] maximum(%t, %a)
  ROOT %mn = f32[37] minimum(%mx, %b)""", ["a: f32[37]", "b: f32[37]"], "f32[37]")
    src = emit_loop_kernel(f, flat=False).source      # the strided form (flat: test_cuda_c_flat)
    assert 'extern "C" __global__ void fused_exponential_divide_sqrt_rsqrt(' in src
    assert "expf(" in src and "__expf" not in src       # the accurate library function
    assert "sqrtf(" in src and "rsqrtf(" in src and "tanhf(" in src
    assert "/ b_" in src or "/ p" in src or " / " in src      # IEEE division: the operator
    assert "hl_maxf(" in src and "hl_minf(" in src and "fmaxf" not in src
    assert "if (t >= 37LL) return;" in src
    # the NaN-propagating helpers are defined, and only the ones used
    assert "hl_maxf(float a, float b)" in src and "hl_bf16_to_f32" not in src


def test_text_index_ops():
    f = make("""  %x = f32[4,6] parameter(0)
  %t = f32[6,4] transpose(%x), dimensions={1,0}
  %s = f32[3,4] slice(%t), slice={[1:6:2], [0:4]}
  %r = f32[3,4] reverse(%s), dimensions={1}
  %z = f32[] constant(0)
  %p = f32[5,4] pad(%r, %z), padding=1_1x0_0
  %i = s32[5,4] iota(), iota_dimension=0
  %c = f32[5,4] convert(%i)
  ROOT %a = f32[5,4] add(%p, %c)""", ["x: f32[4,6]"], "f32[5,4]")
    src = emit_loop_kernel(f).source
    assert "t / 4LL" in src and "(t) % 4LL" in src          # the output index, row-major
    assert "* 2LL" in src                                    # the slice's stride
    assert "3LL - " in src                                   # the reverse
    assert "in_pad_" in src and "? " in src                    # the pad's inside test
    assert "((float)" in src                                 # iota converted


def test_text_four_elements_a_thread_for_big_outputs():
    f = make("""  %a = f32[1024,600] parameter(0)
  %b = f32[1024,600] parameter(1)
  ROOT %s = f32[1024,600] add(%a, %b)""", ["a: f32[1024,600]", "b: f32[1024,600]"], "f32[1024,600]")
    ks = emit_loop_kernel(f, flat=False)
    assert ks.per_thread == 4 and ks.blocks == 1024 * 600 // (4 * 256)
    body = ks.source.split("__global__")[1]
    assert "t0 + 768LL" in body and "u3 < 614400LL ? u3 : 614399LL" in body
    # every load before the first store; stores past the end guarded
    assert body.rindex("p1[") < body.index("out0[")
    assert "if (u3 < 614400LL) out0[" in body and body.count("out0[") == 4
    small = make("""  %a = f32[1000] parameter(0)
  ROOT %n = f32[1000] negate(%a)""", ["a: f32[1000]"], "f32[1000]")
    assert emit_loop_kernel(small, flat=False).per_thread == 1


def test_per_thread_override(monkeypatch):
    f = make("""  %a = f32[1000] parameter(0)
  ROOT %n = f32[1000] negate(%a)""", ["a: f32[1000]"], "f32[1000]")
    monkeypatch.setenv("HLOTK_CUDA_C_PER_THREAD", "2")
    ks = emit_loop_kernel(f, flat=False)
    assert ks.per_thread == 2 and ks.blocks == 2
    monkeypatch.setenv("HLOTK_CUDA_C_PER_THREAD", "many")
    with pytest.raises(CudaCodegenError, match="HLOTK_CUDA_C_PER_THREAD"):
        emit_loop_kernel(f, flat=False)


def test_text_narrow_floats_round_per_op():
    f = make("""  %a = bf16[8] parameter(0)
  %b = bf16[8] parameter(1)
  %m = bf16[8] multiply(%a, %b)
  ROOT %s = bf16[8] add(%m, %a)""", ["a: bf16[8]", "b: bf16[8]"], "bf16[8]")
    src = emit_loop_kernel(f).source
    assert "const unsigned short* p0" in src and "unsigned short* out0" in src
    assert src.count("hl_round_bf16(") >= 3      # the definition and one per op
    assert "hl_f32_to_bf16(" in src              # the store
    kept = emit_loop_kernel(f, round_narrow_each_op=False).source
    assert "hl_round_bf16((" not in kept.split("__global__")[1]   # f32 between ops


def test_same_code_under_other_names_compiles_once():
    """Two fusions that differ only in HLO names: the same code apart from comments (the
    cubin cache's and the compile's key), each file naming its own HLO."""
    from codegen.cuda_c.emitter import compile_text
    body = """  %{a} = f32[16] parameter(0)
  %{e} = f32[16] exponential(%{a})
  ROOT %{n} = f32[16] negate(%{e})"""
    k1 = emit_loop_kernel(make(body.format(a="x", e="ex", n="neg"), ["x: f32[16]"], "f32[16]"))
    k2 = emit_loop_kernel(make(body.format(a="y", e="e2", n="out"), ["y: f32[16]"], "f32[16]"))
    assert k1.source != k2.source and "%ex = " in k1.source and "%e2 = " in k2.source
    assert compile_text(k1.source) == compile_text(k2.source)
    assert "%ex" not in compile_text(k1.source)
    assert compile_text(k1.source).count("\n") == k1.source.count("\n")   # NVRTC's line numbers


def test_prelude_only_what_is_called():
    assert prelude_for("x = hl_round_f16(y);").count("__device__") == 3   # + its two callees
    assert prelude_for("x = a + b;") == ""


def test_declines_with_reason():
    f = make("""  %x = f32[4,6] parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[4] reduce(%x, %z), dimensions={1}, to_apply=%add""", ["x: f32[4,6]"],
             "f32[4]", extra="""%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}""")
    assert "rows fusion" in decline_reason(f)
    with pytest.raises(CudaCDeclined, match="fusion %the_fusion"):
        emit_loop_kernel(f)
    g = make("""  %x = f32[8] parameter(0)
  %i = s32[] parameter(1)
  ROOT %d = f32[2] dynamic-slice(%x, %i), dynamic_slice_sizes={2}""",
             ["x: f32[8]", "i: s32[]"], "f32[2]")
    assert "dynamic-slice" in decline_reason(g)
    c = make("""  %x = c64[8] parameter(0)
  ROOT %n = c64[8] negate(%x)""", ["x: c64[8]"], "c64[8]")
    assert "c64" in decline_reason(c)


def test_bad_emitter_choice_raises(monkeypatch):
    from codegen.cuda_c import loop_emitter
    monkeypatch.setenv("HLOTK_LOOP_EMITTER", "cuda")
    assert loop_emitter() == "cuda"
    monkeypatch.setenv("HLOTK_LOOP_EMITTER", "nvcc")
    with pytest.raises(CudaCodegenError, match="HLOTK_LOOP_EMITTER='nvcc'"):
        loop_emitter()
    monkeypatch.delenv("HLOTK_LOOP_EMITTER")
    assert loop_emitter() == "auto"


def test_auto_takes_small_loop_kernels_only():
    from codegen.cuda_c import AUTO_MAX_US, takes
    assert takes("auto", 2.0) and takes("auto", AUTO_MAX_US - 0.01)
    assert not takes("auto", AUTO_MAX_US) and not takes("auto", 50.0)
    assert takes("cuda", 50.0) and not takes("triton", 1.0)


def test_a_failed_nvrtc_compile_launches_the_fallback_kernel(monkeypatch):
    """NVRTC failing on a source costs the fusion its Triton kernel's compile, not the call:
    the launch goes to the fallback kernel, and the reason is kept."""
    from concurrent.futures import Future
    from pathlib import Path

    torch = pytest.importorskip("torch")

    from codegen.cuda_c import kernel as kmod
    from codegen.cuda_c.nvrtc import NvrtcCompileError
    launched = []

    class Fallback:
        def launch(self, outputs, inputs, stream=None):
            launched.append((outputs, inputs))
            outputs[0].copy_(inputs[0] * 2)
    failed: Future = Future()
    failed.set_exception(NvrtcCompileError("fusion %f: error: identifier \"x\" is undefined"))
    from hlo.shape import array
    k = kmod.CudaCKernel(name="k", source="", path=Path("k.cu"), key="k", fusion_name="f",
                         input_shapes=[array("f32", (4,))], output_shapes=[array("f32", (4,))],
                         threads=256, elements=4, arch="90", fallback=Fallback)
    k._future = failed
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    x, out = torch.arange(4.0), torch.zeros(4)
    k.launch([out], [x])
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0] and len(launched) == 1
    assert "is undefined" in k.fell_back
    k.launch([out], [x])                       # later launches go there directly
    assert len(launched) == 2
    no_fallback = kmod.CudaCKernel(name="k", source="", path=Path("k.cu"), key="k",
                                   fusion_name="f", input_shapes=k.input_shapes,
                                   output_shapes=k.output_shapes, threads=256, elements=4,
                                   arch="90")
    no_fallback._future = failed
    with pytest.raises(NvrtcCompileError, match="is undefined"):
        no_fallback.launch([out], [x])


# --- (2) run on the host ----------------------------------------------------------------------------
@needs_cxx
def test_host_elementwise_math_equals_interpreter():
    f = make("""  %a = f32[37] parameter(0)
  %b = f32[37] parameter(1)
  %e = f32[37] exponential(%a)
  %l = f32[37] log(%b)
  %d = f32[37] divide(%e, %b)
  %s = f32[37] sqrt(%b)
  %w = f32[37] power(%b, %a)
  %g = f32[37] logistic(%a)
  %n = f32[37] negate(%g)
  %x1 = f32[37] add(%d, %s)
  %x2 = f32[37] multiply(%x1, %l)
  %x3 = f32[37] subtract(%x2, %w)
  ROOT %x4 = f32[37] add(%x3, %n)""", ["a: f32[37]", "b: f32[37]"], "f32[37]")
    check(f, positive=True, tol=2e-6)


@needs_cxx
def test_host_nan_in_max_min_and_clamp():
    f = make("""  %a = f32[6] parameter(0)
  %b = f32[6] parameter(1)
  %mx = f32[6] maximum(%a, %b)
  %mn = f32[6] minimum(%a, %b)
  %lo = f32[] constant(-1)
  %hi = f32[] constant(1)
  %cl = f32[6] clamp(%lo, %a, %hi)
  ROOT %t = (f32[6], f32[6], f32[6]) tuple(%mx, %mn, %cl)""", ["a: f32[6]", "b: f32[6]"],
             "(f32[6], f32[6], f32[6])")
    nan = np.float32(np.nan)
    a = np.array([nan, 1, nan, -3, 5, 0.5], np.float32)
    b = np.array([2, nan, nan, 4, -5, 0.25], np.float32)
    mx, mn, cl = run_host(f, [a, b])
    np.testing.assert_array_equal(mx, [nan, nan, nan, 4, 5, 0.5])
    np.testing.assert_array_equal(mn, [nan, nan, nan, -3, -5, 0.25])
    np.testing.assert_array_equal(cl, [nan, 1, nan, -1, 1, 0.5])
    check(f, args=[a, b])


@needs_cxx
def test_host_bf16_f16_in_and_out():
    f = make("""  %a = bf16[7,5] parameter(0)
  %b = f16[7,5] parameter(1)
  %bc = bf16[7,5] convert(%b)
  %m = bf16[7,5] multiply(%a, %bc)
  %s = bf16[7,5] add(%m, %a)
  %h = f16[7,5] convert(%s)
  %e = f16[7,5] exponential(%h)
  %f = f32[7,5] convert(%e)
  ROOT %t = (bf16[7,5], f16[7,5], f32[7,5]) tuple(%s, %e, %f)""",
             ["a: bf16[7,5]", "b: f16[7,5]"], "(bf16[7,5], f16[7,5], f32[7,5])")
    for seed in range(3):
        check(f, seed=seed, tol=1e-2)     # exp: host libm vs numpy, then one narrow rounding
    # the conversions themselves are exact: specials, subnormals, ties
    g = make("""  %a = f32[12] parameter(0)
  %h = f16[12] convert(%a)
  %b = bf16[12] convert(%a)
  ROOT %t = (f16[12], bf16[12]) tuple(%h, %b)""", ["a: f32[12]"], "(f16[12], bf16[12])")
    a = np.array([np.nan, np.inf, -np.inf, 65504, 65520, 65519.99, 1e-8, -3e-5, 6e-8,
                  1.0009765625 + 2**-12, 1 + 2**-8, -0.0], np.float32)
    check(g, args=[a])


@needs_cxx
def test_host_integers_wrap_divide_shift():
    f = make("""  %a = s32[9] parameter(0)
  %b = s32[9] parameter(1)
  %m = s32[9] multiply(%a, %b)
  %d = s32[9] divide(%a, %b)
  %r = s32[9] remainder(%a, %b)
  %sl = s32[9] shift-left(%a, %b)
  %sr = s32[9] shift-right-arithmetic(%a, %b)
  %su = s32[9] shift-right-logical(%a, %b)
  %u = u8[9] convert(%a)
  %x = u8[9] not(%u)
  ROOT %t = (s32[9], s32[9], s32[9], s32[9], s32[9], s32[9], u8[9]) tuple(%m, %d, %r, %sl, %sr, %su, %x)""",
             ["a: s32[9]", "b: s32[9]"], "(s32[9], s32[9], s32[9], s32[9], s32[9], s32[9], u8[9])")
    lo = np.iinfo(np.int32).min
    a = np.array([7, -7, lo, lo, 123456789, 5, -1, 3, 0], np.int32)
    b = np.array([2, 2, -1, 0, 1000, 33, 31, -2, 0], np.int32)
    check(f, args=[a, b])


@needs_cxx
def test_host_bit_counts_and_64_bit_integers():
    f = make("""  %a = s64[6] parameter(0)
  %b = u8[6] parameter(1)
  %pc = s64[6] popcnt(%a)
  %lz = s64[6] count-leading-zeros(%a)
  %pb = u8[6] popcnt(%b)
  %zb = u8[6] count-leading-zeros(%b)
  %m = s64[6] constant({-9223372036854775808, -1, 0, 1, 9223372036854775807, 5})
  %d = s64[6] divide(%m, %a)
  %n = s64[6] negate(%m)
  ROOT %t = (s64[6], s64[6], u8[6], u8[6], s64[6], s64[6]) tuple(%pc, %lz, %pb, %zb, %d, %n)""",
             ["a: s64[6]", "b: u8[6]"], "(s64[6], s64[6], u8[6], u8[6], s64[6], s64[6])")
    a = np.array([-1, 0, 1, 1 << 40, -(1 << 63), 3], np.int64)
    b = np.array([0, 1, 128, 255, 17, 64], np.uint8)
    check(f, args=[a, b])


@needs_cxx
def test_host_float_to_int_saturates():
    f = make("""  %a = f32[8] parameter(0)
  %i = s8[8] convert(%a)
  %u = u32[8] convert(%a)
  %l = s64[8] convert(%a)
  ROOT %t = (s8[8], u32[8], s64[8]) tuple(%i, %u, %l)""", ["a: f32[8]"], "(s8[8], u32[8], s64[8])")
    a = np.array([np.nan, 1e30, -1e30, 127.9, -128.9, -0.5, 3.7, 4e9], np.float32)
    check(f, args=[a])


@needs_cxx
def test_host_index_ops_with_layouts():
    f = make("""  %x = f32[4,6]{0,1} parameter(0)
  %y = f32[2,6] parameter(1)
  %t = f32[6,4] transpose(%x), dimensions={1,0}
  %s = f32[3,4] slice(%t), slice={[1:6:2], [0:4]}
  %r = f32[3,4] reverse(%s), dimensions={0,1}
  %z = f32[] constant(-2.5)
  %p = f32[6,4] pad(%r, %z), padding=0_1_1x0_0_0
  %yt = f32[6,2] transpose(%y), dimensions={1,0}
  %c = f32[6,6] concatenate(%p, %yt), dimensions={1}
  %i = s32[6,6] iota(), iota_dimension=1
  %ic = f32[6,6] convert(%i)
  %a = f32[6,6] add(%c, %ic)
  %rs = f32[4,9] reshape(%a)
  %b = f32[4,9,3] broadcast(%rs), dimensions={0,1}
  ROOT %o = f32[4,9,3]{1,2,0} negate(%b)""", ["x: f32[4,6]{0,1}", "y: f32[2,6]"], "f32[4,9,3]{1,2,0}")
    check(f)


@needs_cxx
def test_host_multi_output_of_two_shapes_and_array_constant():
    f = make("""  %x = f32[5,3] parameter(0)
  %k = f32[3] constant({1, -2, 0.5})
  %kb = f32[5,3] broadcast(%k), dimensions={1}
  %m = f32[5,3] multiply(%x, %kb)
  %s = f32[1,3] slice(%x), slice={[2:3], [0:3]}
  %sr = f32[3] reshape(%s)
  ROOT %t = (f32[5,3], f32[3]) tuple(%m, %sr)""", ["x: f32[5,3]"], "(f32[5,3], f32[3])")
    check(f)


@needs_cxx
def test_host_array_constants_of_every_kind():
    """Non-uniform constants inlined as arrays (floats by their bits: NaN and infinities
    are no constant expressions), and uniform ones (all NaN too) as literals."""
    f = make("""  %x = f32[4] parameter(0)
  %k = f32[4] constant({nan, inf, -inf, -0.5})
  %kn = f32[4] constant({nan, nan, nan, nan})
  %kd = f64[4] constant({1e300, -2.5, inf, 1e-300})
  %kb = bf16[4] constant({1.5, -3, 0.25, 7})
  %ki = s8[4] constant({-128, 127, 0, 5})
  %kp = pred[4] constant({1, 0, 0, 1})
  %a = f32[4] add(%x, %k)
  %b = f32[4] add(%a, %kn)
  %dx = f64[4] convert(%x)
  %d = f64[4] multiply(%dx, %kd)
  %bx = bf16[4] convert(%x)
  %bb = bf16[4] multiply(%bx, %kb)
  %sel = s8[4] select(%kp, %ki, %ki)
  ROOT %t = (f32[4], f32[4], f64[4], bf16[4], s8[4]) tuple(%a, %b, %d, %bb, %sel)""",
             ["x: f32[4]"], "(f32[4], f32[4], f64[4], bf16[4], s8[4])")
    src = emit_loop_kernel(f).source
    assert "0x7fc00000u" in src and "__device__ const unsigned int c0[4]" in src
    assert src.count("__device__ const") == 5         # %kn (all NaN) is a literal
    check(f, args=[np.array([1.0, 2.0, 3.0, 4.0], np.float32)])


@needs_cxx
def test_host_compare_select_pred_and_is_finite():
    f = make("""  %a = f32[10] parameter(0)
  %b = f32[10] parameter(1)
  %lt = pred[10] compare(%a, %b), direction=LT
  %fin = pred[10] is-finite(%a)
  %both = pred[10] and(%lt, %fin)
  %sel = f32[10] select(%both, %a, %b)
  ROOT %t = (f32[10], pred[10]) tuple(%sel, %both)""", ["a: f32[10]", "b: f32[10]"],
             "(f32[10], pred[10])")
    a = np.array([1, np.inf, np.nan, -np.inf, 2, 3, -1, 0, 5, 6], np.float32)
    b = np.array([2, 5, 1, 0, 1, 3, 0, 1, 4, 7], np.float32)
    check(f, args=[a, b])


@needs_cxx
def test_host_f64_and_bitcast_convert():
    f = make("""  %a = f64[11] parameter(0)
  %e = f64[11] exponential(%a)
  %h = bf16[11] convert(%e)
  %f = f32[11] convert(%a)
  %bits = s32[11] bitcast-convert(%f)
  ROOT %t = (f64[11], bf16[11], s32[11]) tuple(%e, %h, %bits)""", ["a: f64[11]"],
             "(f64[11], bf16[11], s32[11])")
    check(f, tol=1e-15)


def _cuda_pipeline_loop_fusions(fn, *args):
    from runtime.tools import compile_module
    m = hlo.from_jax(fn, *args)
    compile_module(m, "default", backend="cuda")
    return [i for c in m.computations for i in c.instructions
            if i.opcode == "fusion" and not decline_reason(i)]


def _one_output_shape(f) -> bool:
    root = f.attrs["calls"].root
    outs = root.operands if root.opcode == "tuple" else [root]
    return len({tuple(o.shape.dims) for o in outs}) == 1


# Their fusions also run with four elements a thread (odd sizes: lanes past the end).
PER_THREAD_ALSO = {"giou_boxes", "elementwise_math", "pad_concat_reverse",
                   "iota_broadcast_transpose", "int_overflow_bitwise"}
ZOO_LOOPS = ["giou_boxes", "elementwise_math", "where_clip_select", "pad_concat_reverse",
             "iota_broadcast_transpose", "int_overflow_bitwise", "unsigned_and_convert",
             "f64_program"]


@needs_cxx
@pytest.mark.parametrize("name", ZOO_LOOPS)
def test_host_zoo_loop_fusions_equal_interpreter(name):
    from tests.zoo import by_name, x64_scope
    prog = by_name(name)
    with x64_scope(prog):
        fusions = _cuda_pipeline_loop_fusions(prog.fn, *prog.args())
        assert fusions, f"{name}: no loop fusion the CUDA C emitter takes"
        for k, f in enumerate(fusions):
            check(f, seed=k, positive=name == "elementwise_math", tol=1e-5)
            if name in PER_THREAD_ALSO and _one_output_shape(f):
                check(f, seed=k, positive=name == "elementwise_math", tol=1e-5, per_thread=4)


@needs_cxx
def test_host_adam_step_fusions():
    import jax.numpy as jnp
    from benchmarks.gpu_suite import adam_step
    shapes = [(33, 7), (5,), (2, 3, 4)]
    p = [jnp.ones(s, jnp.float32) for s in shapes]
    fusions = _cuda_pipeline_loop_fusions(adam_step, p, p, p, p, jnp.int32(3))
    assert len(fusions) >= 3
    for k, f in enumerate(fusions):
        check(f, seed=k, positive=True, tol=1e-6)
        check(f, seed=k, positive=True, tol=1e-6, flat=False)     # the strided form too
        if _one_output_shape(f):
            check(f, seed=k, positive=True, tol=1e-6, per_thread=4)


# --- (3) NVRTC ------------------------------------------------------------------------------------
needs_nvrtc = pytest.mark.skipif(bool(nvrtc.unavailable()), reason="no NVRTC here "
                                 "(set HLOTK_NVRTC to libnvrtc.so to run these)")


@needs_nvrtc
@pytest.mark.parametrize("name", ["giou_boxes", "elementwise_math", "int_overflow_bitwise",
                                  "f64_program", "pad_concat_reverse"])
def test_nvrtc_compiles_zoo_kernels(name):
    from tests.zoo import by_name, x64_scope
    prog = by_name(name)
    with x64_scope(prog):
        fusions = _cuda_pipeline_loop_fusions(prog.fn, *prog.args())
    nvrtc.warm_up("90")       # the prewarm thread's compile (runtime/cuda/prewarm.py)
    for f in fusions:
        ks = emit_loop_kernel(f)
        cubin = nvrtc.cubin_for(ks.source, ks.name, "90")
        assert cubin[:4] == b"\x7fELF"
        assert nvrtc.cubin_for(ks.source, ks.name, "90") == cubin      # from the disk cache


def test_compile_error_names_fusion_and_source(monkeypatch, tmp_path):
    """A source NVRTC rejects: NvrtcCompileError with the fusion, the file and the log
    (a stand-in NVRTC where none is installed; the real one where it is)."""
    f = make("""  %a = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%a)""", ["a: f32[4]"], "f32[4]")
    from codegen.cuda_c.kernel import compile_loop_fusion
    k = compile_loop_fusion(f, arch="90", start=False)
    assert k.path.exists() and "negate" in k.path.read_text()
    if nvrtc.unavailable():
        class Fake:
            version = (0, 0)

            def compile(self, source, name, arch):
                raise nvrtc.NvrtcCompileError("kernel.cu(3): error: identifier \"oops\" is undefined")
        monkeypatch.setattr(nvrtc, "load", lambda: Fake())
    k.source = k.source.replace("(-", "(oops + -")
    with pytest.raises(nvrtc.NvrtcCompileError) as e:
        k.cubin()
    msg = str(e.value)
    assert "%the_fusion" in msg and str(k.path) in msg and "oops" in msg


def test_cubin_cache_rejects_a_damaged_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path))
    path = nvrtc.cubin_path("src", "90", (13, 0))
    nvrtc._write_cubin(path, b"\x7fELF-cubin-bytes")
    assert nvrtc._read_cubin(path) == b"\x7fELF-cubin-bytes"
    path.write_bytes(path.read_bytes()[:-3])
    assert nvrtc._read_cubin(path) is None
    assert nvrtc.cubin_path("src", "90", (13, 0)) != nvrtc.cubin_path("src", "80", (13, 0))
    assert nvrtc.cubin_path("src", "90", (13, 0)) != nvrtc.cubin_path("src", "90", (12, 8))


# --- (4) on the GPU ----------------------------------------------------------------------------------
def _adam_program():
    import jax.numpy as jnp
    from benchmarks.gpu_suite import adam_step
    rng = np.random.default_rng(0)
    shapes = [(1000, 33), (7,), (3, 5, 129)]
    tree = [[jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes] for _ in range(4)]
    tree[3] = [abs(v) for v in tree[3]]
    return adam_step, (*tree, jnp.int32(3))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["giou_boxes", "elementwise_math", "pad_concat_reverse",
                                  "where_clip_select", "iota_broadcast_transpose",
                                  "int_overflow_bitwise", "unsigned_and_convert", "adam_step"])
def test_gpu_cuda_emitter_equals_jax(name, monkeypatch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    import contextlib
    import jax
    import runtime
    from runtime.cuda import executable_of
    from tests.zoo import by_name, x64_scope
    monkeypatch.setenv("HLOTK_LOOP_EMITTER", "cuda")
    if name == "adam_step":
        fn, args = _adam_program()
        rtol, atol, scope = 1e-5, 1e-6, contextlib.nullcontext()
    else:
        prog = by_name(name)
        fn, args = prog.fn, prog.args()
        rtol, atol, scope = max(prog.rtol, 1e-5), max(prog.atol, 1e-5), x64_scope(prog)
    with scope:
        want = jax.jit(fn)(*args)
        compiled = runtime.jit(fn, backend="cuda").lower(*args).compile()
        compiled(*args)
        got = compiled(*args)          # the second call replays the graph
    gl, wl = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(gl) == len(wl)
    for g, w in zip(gl, wl):
        g, w = np.asarray(g), np.asarray(w)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=rtol, atol=atol)
    exe = executable_of(compiled)
    assert exe.stats.get("cuda_c_kernels", 0) >= 1, exe.report()
    assert "CUDA C kernels" in exe.report()
