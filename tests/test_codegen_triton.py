"""Generated Triton kernels, run in Triton's interpreter (TRITON_INTERPRET=1) on CPU torch
tensors, against the reference interpreter (hlo.evaluate of the fused computation)."""
from __future__ import annotations

import os

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
if torch.cuda.is_available():
    # TRITON_INTERPRET is read per process: set here it would turn every GPU test collected
    # after this file into an interpreter run. The GPU tests run these kernels for real.
    pytest.skip("runs Triton's interpreter on CPU tensors; skipped where CUDA is present",
                allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton is imported
pytest.importorskip("triton")

import hlo  # noqa: E402
from hlo.layout_util import major_to_minor, to_physical  # noqa: E402
from codegen.triton import TritonCodegenError, compile_fusion  # noqa: E402
from codegen.triton.kernel import _to_torch  # noqa: E402

ANCHORS = "/work/shared/anchors/xla_gpu_h200"
TOL = {"f32": 2e-5, "f64": 1e-12, "bf16": 2e-2, "f16": 2e-3}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def random_input(shape, rng):
    dt = shape.dtype
    if dt.is_float:
        return rng.standard_normal(shape.dims).astype(dt.np_dtype)
    if dt.is_pred:
        return rng.integers(0, 2, shape.dims).astype(bool)
    return rng.integers(-50, 50, shape.dims).astype(dt.np_dtype)


def with_layout(x: np.ndarray, shape) -> "torch.Tensor":
    """A logical-shape torch view whose strides are those of ``shape``'s layout."""
    phys = _to_torch(to_physical(x, shape.layout))
    order = major_to_minor(shape.layout, x.ndim)
    inv = [order.index(d) for d in range(x.ndim)]
    return phys.permute(*inv) if x.ndim else phys


def from_torch(t: "torch.Tensor", dtype) -> np.ndarray:
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtype.np_dtype)
    return t.numpy()


def check_fusion(fusion, seed=0, args=None, **kw):
    rng = np.random.default_rng(seed)
    comp = fusion.attrs["calls"]
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    args = args or [random_input(p.shape, rng) for p in params]
    kernel = compile_fusion(fusion, **kw)
    root = comp.root
    outs_shapes = [o.shape for o in (root.operands if root.opcode == "tuple" else [root])]
    outs = []
    for s in outs_shapes:
        poison = np.full(s.dims, np.nan if s.dtype.is_float else 7).astype(s.dtype.np_dtype)
        outs.append(with_layout(poison, s))
    kernel.launch(outs, [with_layout(a, p.shape) for a, p in zip(args, params)])
    ref = hlo.evaluate(comp, args)
    refs = list(ref) if isinstance(ref, tuple) else [ref]
    for o, r, s in zip(outs, refs, outs_shapes):
        got = from_torch(o, s.dtype)
        if s.dtype.is_float:
            g, w = got.astype(np.float64), np.asarray(r).astype(np.float64)
            assert not np.isnan(g).any(), f"unwritten or NaN outputs in {kernel.name}"
            err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)
            assert err < TOL[s.dtype.name], (err, kernel.source)
        else:
            np.testing.assert_array_equal(got, np.asarray(r))
    return kernel


def fusions(module):
    return [i for c in module.computations for i in c.instructions if i.opcode == "fusion"]


def fusion_module(body: str, entry_params: str, call_args: str, root_shape: str, kind="kLoop",
                  extra="", backend_config=""):
    bc = f", backend_config={backend_config}" if backend_config else ""
    text = f"""HloModule m
{extra}
%fused ({entry_params}) -> {root_shape} {{
{body}
}}

ENTRY %main ({', '.join('e_' + p for p in entry_params.split(', '))}) -> {root_shape} {{
{call_args}
  ROOT %f = {root_shape} fusion({', '.join('%e_' + p.split(':')[0].strip() for p in entry_params.split(', '))}), kind={kind}, calls=%fused{bc}
}}
"""
    m = hlo.parse_hlo(text)
    return m.entry.root


def entry_params_lines(entry_params: str) -> str:
    lines = []
    for i, p in enumerate(entry_params.split(", ")):
        name, shape = p.split(": ")
        lines.append(f"  %e_{name} = {shape} parameter({i})")
    return "\n".join(lines)


def make(body, params, root_shape, **kw):
    ep = ", ".join(params)
    return fusion_module(body, ep, entry_params_lines(ep), root_shape, **kw)


ADD = """%add (ra: f32[], rb: f32[]) -> f32[] {
  %ra = f32[] parameter(0)
  %rb = f32[] parameter(1)
  ROOT %radd = f32[] add(%ra, %rb)
}
%max (ma: f32[], mb: f32[]) -> f32[] {
  %ma = f32[] parameter(0)
  %mb = f32[] parameter(1)
  ROOT %rmax = f32[] maximum(%ma, %mb)
}"""


# --- (b) XLA:GPU anchors, shrunk ----------------------------------------------------------------
def shrink(text: str, sizes: dict[str, str]) -> str:
    for big, small in sizes.items():
        text = text.replace(big, small)
    return text


@pytest.mark.skipif(not os.path.isdir(ANCHORS), reason="anchors not present")
def test_anchor_softmax():
    text = open(f"{ANCHORS}/xla_softmax_f32.hlo.txt").read()
    m = hlo.parse_hlo(shrink(text, {"8192": "8", "4096": "64"}))
    k = check_fusion(m.entry.root)
    assert k.template == "normalization"
    assert k.name == "fused_reduce_subtract_exponential_divide"
    assert k.path.name.startswith(k.name) and k.path.exists()
    assert "%reduce_max.6 = f32[8]{0} reduce(" in k.source   # one line per instruction


@pytest.mark.skipif(not os.path.isdir(ANCHORS), reason="anchors not present")
def test_anchor_layernorm_bf16():
    text = open(f"{ANCHORS}/xla_layernorm_bf16.hlo.txt").read()
    text = shrink(text, {"8192": "6", "4096": "96", "0.000244140625": "0.010416666666666666"})
    m = hlo.parse_hlo(text)
    k = check_fusion(m.entry.root)
    assert k.template == "normalization"


@pytest.mark.skipif(not os.path.isdir(ANCHORS), reason="anchors not present")
def test_anchor_mlp_gelu_loop_fusion():
    text = open(f"{ANCHORS}/xla_mlp_bf16.hlo.txt").read()
    m = hlo.parse_hlo(shrink(text, {"16384": "48", "4096": "16", "33554432": "64",
                                    "67108864": "768", "16777216": "256"}))
    (f,) = fusions(m)
    k = check_fusion(f)
    assert k.template == "loop" and "tanh" in k.name


# --- (a) XLA:CPU's own fusions from jax ----------------------------------------------------------
def test_xla_cpu_fusions_from_jax():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def f(x, y):
        z = jnp.concatenate([x, y[:, ::2]], axis=1)
        return jax.nn.softmax(jnp.tanh(z) * 2.0, axis=-1), jnp.sum(x * y[:, :16], axis=0)

    x = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    y = np.random.default_rng(2).standard_normal((8, 32)).astype(np.float32)
    text = jax.jit(f).lower(x, y).compile().as_text()
    m = hlo.parse_hlo(text)
    fs = fusions(m)
    assert fs, "XLA:CPU produced no fusions"
    for i, fu in enumerate(fs):
        check_fusion(fu, seed=i)


# --- (c) hand-written fusions covering every template --------------------------------------------
def test_transposed_parameter_layout():
    f = make("""  %p0 = f32[4,6]{0,1} parameter(0)
  %p1 = f32[4,6]{1,0} parameter(1)
  %e = f32[4,6]{1,0} exponential(%p0)
  ROOT %r = f32[4,6]{1,0} add(%e, %p1)""", ["p0: f32[4,6]{0,1}", "p1: f32[4,6]{1,0}"], "f32[4,6]{1,0}")
    check_fusion(f)


def test_loop_concat_pad_slice_iota_reverse_transpose():
    f = make("""  %p0 = f32[4,6] parameter(0)
  %p1 = f32[4,3] parameter(1)
  %c = f32[4,9] concatenate(%p0, %p1), dimensions={1}
  %z = f32[] constant(-1.5)
  %pd = f32[7,12] pad(%c, %z), padding=1_2x2_1
  %sl = f32[3,6] slice(%pd), slice={[1:7:2], [0:12:2]}
  %io = s32[3,6] iota(), iota_dimension=1
  %cv = f32[3,6] convert(%io)
  %rv = f32[3,6] reverse(%sl), dimensions={0}
  %t = f32[6,3] transpose(%cv), dimensions={1,0}
  %tt = f32[3,6] transpose(%t), dimensions={1,0}
  ROOT %o = f32[3,6] multiply(%rv, %tt)""", ["p0: f32[4,6]", "p1: f32[4,3]"], "f32[3,6]")
    k = check_fusion(f)
    assert k.template == "loop"


def test_integer_semantics_divide_by_zero_and_shifts():
    f = make("""  %p0 = s32[16] parameter(0)
  %p1 = s32[16] parameter(1)
  %d = s32[16] divide(%p0, %p1)
  %r = s32[16] remainder(%p0, %p1)
  %s = s32[16] shift-left(%d, %p1)
  ROOT %o = (s32[16], s32[16], s32[16]) tuple(%d, %r, %s)""", ["p0: s32[16]", "p1: s32[16]"],
             "(s32[16], s32[16], s32[16])")
    a = np.array([7, -7, 5, -2147483648, 9, 0, 3, -1, 100, 1, 2, 3, 4, 5, 6, 7], np.int32)
    b = np.array([2, 2, 0, -1, -3, 0, 40, 31, 3, 33, -1, 1, 2, 0, 3, 2], np.int32)
    check_fusion(f, args=[a, b])


@pytest.mark.parametrize("dt", ["s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64"])
def test_popcnt_and_count_leading_zeros(dt):
    np_dt = hlo.dtypes.by_name(dt).np_dtype
    f = make(f"""  %p0 = {dt}[12] parameter(0)
  %c = {dt}[12] popcnt(%p0)
  %z = {dt}[12] count-leading-zeros(%p0)
  ROOT %o = ({dt}[12], {dt}[12]) tuple(%c, %z)""", [f"p0: {dt}[12]"], f"({dt}[12], {dt}[12])")
    info = np.iinfo(np.dtype(np_dt))
    x = np.array([0, 1, 2, 3, 7, 8, 100, info.max, info.min, info.max // 3, info.max - 1, 64],
                 dtype=np.int64 if info.min else np.uint64).astype(np_dt)
    bits = info.bits
    count, clz = _run_outputs(f, x)
    # by hand: popcnt of 0, 1, 2, 3, 7, 8, 100 = 0, 1, 1, 2, 3, 1, 3; clz = bits - bit length
    np.testing.assert_array_equal(count[:7], [0, 1, 1, 2, 3, 1, 3])
    np.testing.assert_array_equal(clz[:7], [bits, bits - 1, bits - 2, bits - 2, bits - 3,
                                            bits - 4, bits - 7])
    assert clz[8] == (0 if info.min else bits)      # the sign bit set / unsigned 0
    check_fusion(f, args=[x])                       # every element vs the reference interpreter


def test_reduce_precision_round_even_overflow_underflow_nan():
    import ml_dtypes
    f = make("""  %p0 = f32[16] parameter(0)
  %h = f32[16] reduce-precision(%p0), exponent_bits=5, mantissa_bits=10
  %b = f32[16] reduce-precision(%p0), exponent_bits=8, mantissa_bits=7
  %e = f32[16] reduce-precision(%p0), exponent_bits=4, mantissa_bits=3
  ROOT %o = (f32[16], f32[16], f32[16]) tuple(%h, %b, %e)""", ["p0: f32[16]"],
             "(f32[16], f32[16], f32[16])")
    # 1 + 2^-11 ties in f16 (to 1.0, even); 1 + 3*2^-11 rounds up to 1 + 2^-9; 70000 and
    # 65520 overflow f16 to inf; 1e-6 and -2.5e-5 are below f16's normal range: +0 and -0
    # (flushed, where a real f16 keeps them as subnormals).
    x = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 70000.0, 1e-6, -2.5e-5, np.nan, np.inf, -np.inf,
                  0.0, -0.0, 3.14159, -65504.0, 65520.0, 1.00390625, 240.0, 0.0078125], np.float32)
    half, bf16, e4m3 = _run_outputs(f, x)
    np.testing.assert_array_equal(half[:5], np.array([1.0, 1 + 2 ** -9, np.inf, 0.0, -0.0],
                                                     np.float32))
    assert np.signbit(half[4]) and np.isnan(half[5]) and np.isnan(e4m3[5])
    normal = [i for i in range(16) if i not in (3, 4)]
    with np.errstate(over="ignore"):
        as_f16 = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(half[normal], as_f16[normal])
    np.testing.assert_array_equal(bf16, x.astype(ml_dtypes.bfloat16).astype(np.float32))
    # 4 exponent bits, 3 mantissa bits: 240 = 1.875 * 2^7 is its largest normal, 1 + 2^-8 rounds
    # to 1, 70000 overflows
    assert e4m3[14] == 240.0 and e4m3[13] == 1.0 and e4m3[2] == np.inf
    for got, want in zip((half, bf16, e4m3), hlo.evaluate(f.attrs["calls"], [x])):
        np.testing.assert_array_equal(got, want)      # NaN where the interpreter has NaN


@pytest.mark.parametrize("dt", ["f64", "bf16"])
def test_reduce_precision_f64_and_bf16_operands(dt):
    f = make(f"""  %p0 = {dt}[64] parameter(0)
  ROOT %r = {dt}[64] reduce-precision(%p0), exponent_bits=8, mantissa_bits=3""",
             [f"p0: {dt}[64]"], f"{dt}[64]")
    x = (np.random.default_rng(3).standard_normal(64) * 1e3).astype(hlo.dtypes.by_name(dt).np_dtype)
    got = _run_outputs(f, x)[0].astype(np.float64)
    # 3 mantissa bits: every result is m * 2^e with m an integer in [8, 15]
    mant = np.abs(got) / 2.0 ** (np.floor(np.log2(np.abs(got))) - 3)
    np.testing.assert_array_equal(mant, np.round(mant))
    np.testing.assert_array_equal(got, np.asarray(hlo.evaluate(f.attrs["calls"], [x]), np.float64))


def _run_outputs(fusion, *args):
    kernel = compile_fusion(fusion)
    root = fusion.attrs["calls"].root
    shapes = [o.shape for o in (root.operands if root.opcode == "tuple" else [root])]
    outs = [with_layout(np.zeros(s.dims, s.dtype.np_dtype), s) for s in shapes]
    params = sorted(fusion.attrs["calls"].parameters, key=lambda p: p.parameter_number)
    kernel.launch(outs, [with_layout(a, p.shape) for a, p in zip(args, params)])
    return [from_torch(o, s.dtype) for o, s in zip(outs, shapes)]


def test_column_reduction():
    f = make("""  %p0 = f32[37,24] parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[24] reduce(%p0, %z), dimensions={0}, to_apply=%add""", ["p0: f32[37,24]"],
             "f32[24]", kind="kInput", extra=ADD)
    k = check_fusion(f)
    assert k.template == "column_onepass"


def test_multi_output_column_reduction_stores_its_elementwise_root_in_the_same_pass():
    # A ReLU gradient and its bias gradient (the MLP backward's select + column sum): the
    # select is stored from the reduction's pass over the rows, so the inputs are read once.
    f = make("""  %g = f32[70,48] parameter(0)
  %h = f32[70,48] parameter(1)
  %z = f32[] constant(0)
  %zb = f32[70,48] broadcast(%z), dimensions={}
  %pos = pred[70,48] compare(%h, %zb), direction=GT
  %sel = f32[70,48] select(%pos, %g, %zb)
  %r = f32[48] reduce(%sel, %z), dimensions={0}, to_apply=%add
  ROOT %t = (f32[70,48], f32[48]) tuple(%sel, %r)""", ["g: f32[70,48]", "h: f32[70,48]"],
             "(f32[70,48], f32[48])", kind="kInput", extra=ADD)
    k = check_fusion(f)
    assert k.template == "column_onepass"
    assert k.source.count("for c0 in range(") == 1, k.source
    # 48 f32 columns: 8 per program (one 32-byte sector per row), so 6 programs, not 2.
    # (Large inputs with few columns are split over row chunks instead, 256-byte tiles:
    # codegen/triton/reductions.split_of.)
    assert k.config["BLOCK_M"] == 8


def test_multi_output_reduction_sum_and_sum_of_squares():
    f = make("""  %p0 = bf16[5,40] parameter(0)
  %x = f32[5,40] convert(%p0)
  %sq = f32[5,40] multiply(%x, %x)
  %z = f32[] constant(0)
  %s1 = f32[5] reduce(%x, %z), dimensions={1}, to_apply=%add
  %s2 = f32[5] reduce(%sq, %z), dimensions={1}, to_apply=%add
  ROOT %t = (f32[5], f32[5]) tuple(%s1, %s2)""", ["p0: bf16[5,40]"], "(f32[5], f32[5])",
             kind="kInput", extra=ADD)
    k = check_fusion(f)
    assert k.template == "normalization"


def _residual_layernorm(width: int):
    """x + y (the residual stream, an output) beside the layer norm of it: two row-shaped
    outputs of one Triton normalization fusion (a transformer block's second LN)."""
    w = width
    return make(f"""  %x = bf16[6,{w}] parameter(0)
  %y = bf16[6,{w}] parameter(1)
  %r = bf16[6,{w}] add(%x, %y)
  %rf = f32[6,{w}] convert(%r)
  %z = f32[] constant(0)
  %s = f32[6] reduce(%rf, %z), dimensions={{1}}, to_apply=%add
  %n = f32[] constant({w})
  %nb = f32[6] broadcast(%n), dimensions={{}}
  %mu = f32[6] divide(%s, %nb)
  %mub = f32[6,{w}] broadcast(%mu), dimensions={{0}}
  %d = f32[6,{w}] subtract(%rf, %mub)
  %sq = f32[6,{w}] multiply(%d, %d)
  %v = f32[6] reduce(%sq, %z), dimensions={{1}}, to_apply=%add
  %var = f32[6] divide(%v, %nb)
  %eps = f32[] constant(1e-05)
  %eb = f32[6] broadcast(%eps), dimensions={{}}
  %ve = f32[6] add(%var, %eb)
  %rs = f32[6] rsqrt(%ve)
  %rsb = f32[6,{w}] broadcast(%rs), dimensions={{0}}
  %h = f32[6,{w}] multiply(%d, %rsb)
  %hb = bf16[6,{w}] convert(%h)
  ROOT %t = (bf16[6,{w}], bf16[6,{w}]) tuple(%r, %hb)""", [f"x: bf16[6,{w}]", f"y: bf16[6,{w}]"],
                f"(bf16[6,{w}], bf16[6,{w}])", kind="kCustom", extra=ADD,
                backend_config='{"fusion_backend_config":{"kind":"__triton"}}')


@pytest.mark.parametrize("width,template", [(1000, "normalization"), (40000, "rows_onepass")])
def test_normalization_stores_a_second_row_shaped_output(width, template):
    k = check_fusion(_residual_layernorm(width))
    assert k.template == template


def _softmax_rows_20000():
    """A softmax over rows of 20000 (wider than one tile) as a Triton fusion."""
    return make("""  %p0 = f32[2,20000] parameter(0)
  %ninf = f32[] constant(-inf)
  %m = f32[2] reduce(%p0, %ninf), dimensions={1}, to_apply=%max
  %mxb = f32[2,20000] broadcast(%m), dimensions={0}
  %sub = f32[2,20000] subtract(%p0, %mxb)
  %e = f32[2,20000] exponential(%sub)
  %z = f32[] constant(0)
  %s = f32[2] reduce(%e, %z), dimensions={1}, to_apply=%add
  %sb = f32[2,20000] broadcast(%s), dimensions={0}
  ROOT %d = f32[2,20000] divide(%e, %sb)""", ["p0: f32[2,20000]"], "f32[2,20000]",
                kind="kCustom", extra=ADD,
                backend_config='{"fusion_backend_config":{"kind":"__triton"}}')


def test_looped_normalization_row_too_long():
    f = _softmax_rows_20000()
    k = check_fusion(f)
    assert k.template == "rows_onepass"
    # max and sum in one pass (online rescaling), then the output pass
    assert k.source.count("for c0 in range(") == 2


def test_looped_normalization_legacy_template(monkeypatch):
    monkeypatch.setenv("HLOTK_REDUCTION_TEMPLATES", "legacy")
    f = _softmax_rows_20000()
    k = check_fusion(f)
    assert k.template == "looped_rows"
    assert k.source.count("for c0 in range(0, 20000, BLOCK_N)") == 3   # max, sum, output


GEMM_CFG = '{"fusion_backend_config":{"kind":"__triton_gemm"}}'


def test_gemm_s8_prologue_scale_negate_epilogue():
    # -((a.astype(bf16) @ b) * 0.125)
    f = make("""  %a = s8[40,48] parameter(0)
  %b = bf16[48,24] parameter(1)
  %ac = bf16[40,48] convert(%a)
  %d = bf16[40,24] dot(%ac, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %c = bf16[] constant(0.125)
  %cb = bf16[40,24] broadcast(%c), dimensions={}
  %m = bf16[40,24] multiply(%d, %cb)
  ROOT %n = bf16[40,24] negate(%m)""", ["a: s8[40,48]", "b: bf16[48,24]"], "bf16[40,24]",
             kind="kCustom", backend_config=GEMM_CFG)
    k = check_fusion(f)
    assert k.template == "gemm" and "tl.dot(" in k.source


def test_batched_gemm_transposed_rhs_layout_and_k_tail():
    f = make("""  %a = f32[3,20,36] parameter(0)
  %b = f32[3,36,18]{1,2,0} parameter(1)
  ROOT %d = f32[3,20,18] dot(%a, %b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}""",
             ["a: f32[3,20,36]", "b: f32[3,36,18]{1,2,0}"], "f32[3,20,18]", kind="kCustom",
             backend_config=GEMM_CFG)
    # the interpreter computes tl.dot in f32: tolerance as for f32
    k = check_fusion(f)
    assert k.grid[1] == 3


def test_int8_gemm_s32():
    f = make("""  %a = s8[32,32] parameter(0)
  %b = s8[32,16] parameter(1)
  ROOT %d = s32[32,16] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}""",
             ["a: s8[32,32]", "b: s8[32,16]"], "s32[32,16]", kind="kCustom", backend_config=GEMM_CFG)
    k = check_fusion(f)
    assert "out_dtype=tl.int32" in k.source


def test_fallback_generic_reduce_of_transposed_reduce_result():
    # a reduce read through a transpose is not a row-tile: the generic serial kernel runs it
    f = make("""  %p0 = f32[4,5,6] parameter(0)
  %z = f32[] constant(0)
  %r = f32[4,5] reduce(%p0, %z), dimensions={2}, to_apply=%add
  ROOT %t = f32[5,4] transpose(%r), dimensions={1,0}""", ["p0: f32[4,5,6]"], "f32[5,4]",
             kind="kInput", extra=ADD)
    k = check_fusion(f)
    assert k.template == "generic"


def test_unsupported_op_names_fusion_and_keeps_partial_source(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path))
    f = make("""  %p0 = f32[8] parameter(0)
  %e = f32[8] exponential(%p0)
  ROOT %s = c64[8] complex(%e, %p0)""", ["p0: f32[8]"], "c64[8]")
    with pytest.raises(TritonCodegenError, match=r"%f.*complex") as info:
        compile_fusion(f)
    assert (tmp_path / "triton" / "failed" / "f.py").exists()
    assert "partial source kept" in str(info.value)


def test_kernel_cached_by_content():
    f = make("""  %p0 = f32[8] parameter(0)
  ROOT %e = f32[8] exponential(%p0)""", ["p0: f32[8]"], "f32[8]")
    k1 = compile_fusion(f)
    k2 = compile_fusion(f)
    assert k1.path == k2.path and k1.source == k2.source
    assert k1.source.splitlines()[0].startswith('"""fused_exponential')


def test_generated_file_defines_only_the_helpers_it_calls():
    # tanh and power call the _hl_tanh / _hl_pow helpers; the other math helpers are not
    # defined in the file (each @triton.jit function costs a warm process its construction)
    f = make("""  %p0 = f32[8] parameter(0)
  %p1 = f32[8] parameter(1)
  %t = f32[8] tanh(%p0)
  %a = f32[8] abs(%p1)
  %w = f32[8] power(%a, %p0)
  ROOT %s = f32[8] add(%t, %w)""", ["p0: f32[8]", "p1: f32[8]"], "f32[8]")
    a = np.linspace(-2.0, 2.0, 8).astype(np.float32)
    b = np.linspace(0.5, 3.0, 8).astype(np.float32)
    kernel = check_fusion(f, args=[a, b])
    defined = sorted(line[4:line.index("(")] for line in kernel.source.splitlines()
                     if line.startswith("def _hl_"))
    assert defined == ["_hl_pow", "_hl_tanh"]
    plain = compile_fusion(make("""  %p0 = f32[8] parameter(0)
  ROOT %n = f32[8] negate(%p0)""", ["p0: f32[8]"], "f32[8]"))
    assert "def _hl_" not in plain.source and "@triton.jit" in plain.source


def test_helpers_for_picks_called_helpers_in_a_fixed_order():
    from codegen.triton.elemental import helpers_for
    text = helpers_for("x = _hl_clz32(a) + _hl_popc32(b) + _hl_tanh(c)", interpret=False)
    names = [ln[4:ln.index("(")] for ln in text.splitlines() if ln.startswith("def ")]
    assert names == ["_hl_tanh", "_hl_popc32", "_hl_clz32"]
    assert "libdevice.tanh" in text
    assert helpers_for("y = tl.exp(x)", interpret=True) == ""
