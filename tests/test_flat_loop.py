"""Shape-generic loop kernels (codegen/triton/flat_loop.py): a purely elementwise fusion reads
and writes flat offsets up to a runtime element count, so fusions that differ only in shape
share one kernel; anything that reads elements by coordinates keeps the strided form.

Value checks run in Triton's interpreter on CPU tensors (skipped where CUDA is present: the
interpreter must not be switched on beside real kernels) and on the GPU (marked ``gpu``),
against the reference interpreter (``hlo.evaluate`` of the fused computation) and jax.jit.
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
from codegen.triton import autotune as at  # noqa: E402
from codegen.triton import parallel  # noqa: E402
from codegen.triton.canonical import canonical_text  # noqa: E402
from codegen.triton.flat_loop import flat_reason, int_specialization  # noqa: E402
from codegen.triton.kernel import _to_torch  # noqa: E402
from codegen.triton.templates import outputs_of  # noqa: E402
from hlo.layout_util import major_to_minor, to_physical  # noqa: E402

interp = pytest.mark.skipif(HAS_CUDA, reason="Triton's interpreter runs only without CUDA")
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path / "cache"))


def fusion_of(body: str, params: list[str], root: str) -> hlo.Instruction:
    """The fusion instruction of a module whose entry calls ``body`` on ``params``."""
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


def adam_like(dims: str) -> hlo.Instruction:
    """m' = 0.9 m + 0.1 g; p' = p - lr * m' / (|m'| + eps) over f32[dims], lr a scalar
    parameter: two outputs, one scalar read."""
    s = f"f32[{dims}]"
    return fusion_of(f"""  %m = {s} parameter(0)
  %g = {s} parameter(1)
  %p = {s} parameter(2)
  %lr = f32[] parameter(3)
  %c9 = f32[] constant(0.9)
  %b9 = {s} broadcast(%c9), dimensions={{}}
  %c1 = f32[] constant(0.1)
  %b1 = {s} broadcast(%c1), dimensions={{}}
  %m9 = {s} multiply(%b9, %m)
  %g1 = {s} multiply(%b1, %g)
  %mn = {s} add(%m9, %g1)
  %blr = {s} broadcast(%lr), dimensions={{}}
  %ab = {s} abs(%mn)
  %ce = f32[] constant(1e-8)
  %be = {s} broadcast(%ce), dimensions={{}}
  %den = {s} add(%ab, %be)
  %q = {s} divide(%mn, %den)
  %st = {s} multiply(%blr, %q)
  %pn = {s} subtract(%p, %st)
  ROOT %t = ({s}, {s}) tuple(%mn, %pn)""", [f"m: {s}", f"g: {s}", f"p: {s}", "lr: f32[]"],
        f"({s}, {s})")


def body_of(source: str) -> str:
    """The kernel function's lines (the module docstring quotes the HLO, shapes included)."""
    return source[source.index("@triton.jit\ndef fused"):]


# --- which fusions are flat ---------------------------------------------------------------------
def test_elementwise_fusion_with_scalars_is_flat_and_names_no_shape():
    k = compile_fusion(adam_like("37,5"), target="h200")
    assert k.flat_n == 185 and k.template == "loop"
    body = body_of(k.source)
    assert "mask = offs < n" in body and ", n, BLOCK: tl.constexpr)" in body
    assert "tl.load(p0 + offs, mask=mask)" in body and "tl.load(p3)" in body   # lr: one element
    code = canonical_text(k.source)           # without the comments, which quote the HLO
    for shape_text in ("185", "37", "s0_0", "so0_0", "//", "tl.minimum"):
        assert shape_text not in code, shape_text
    # one config for every size above one element: the compiles do not split by size
    assert k.config == {"BLOCK": 1024, "num_warps": 4, "num_stages": 1}
    assert k.grid == (1,)
    assert compile_fusion(adam_like("3000,7"), target="h200").grid == (21,)


ROW = "f32[37,5]"
NOT_FLAT = {
    "broadcast of a row": (f"""  %r = f32[5] parameter(0)
  ROOT %b = {ROW} broadcast(%r), dimensions={{1}}""", ["r: f32[5]"], ROW, "parameter %r"),
    "transposed parameter layout": (f"""  %p = f32[37,5]{{0,1}} parameter(0)
  ROOT %n = {ROW}{{1,0}} negate(%p)""", ["p: f32[37,5]{0,1}"], f"{ROW}{{1,0}}", "laid out"),
    "iota": (f"""  %p = {ROW} parameter(0)
  %i = {ROW} iota(), iota_dimension=1
  ROOT %a = {ROW} add(%p, %i)""", [f"p: {ROW}"], ROW, "(iota)"),
    "slice": (f"""  %p = f32[37,6] parameter(0)
  ROOT %s = {ROW} slice(%p), slice={{[0:37], [1:6]}}""", ["p: f32[37,6]"], ROW, "parameter %p"),
    "reshape that moves elements": (f"""  %p = f32[185] parameter(0)
  %r = {ROW} reshape(%p)
  ROOT %n = {ROW} negate(%r)""", ["p: f32[185]"], ROW, "parameter %p"),
    "transpose": (f"""  %p = {ROW} parameter(0)
  %q = f32[5,37] parameter(1)
  %t = {ROW} transpose(%q), dimensions={{1,0}}
  ROOT %a = {ROW} add(%p, %t)""", [f"p: {ROW}", "q: f32[5,37]"], ROW, "parameter %q"),
    "reverse": (f"""  %p = {ROW} parameter(0)
  ROOT %r = {ROW} reverse(%p), dimensions={{0}}""", [f"p: {ROW}"], ROW, "(reverse)"),
    "outputs of different dims": (f"""  %p = {ROW} parameter(0)
  %s = f32[] parameter(1)
  %n = {ROW} negate(%p)
  %e = f32[] exponential(%s)
  ROOT %t = ({ROW}, f32[]) tuple(%n, %e)""", [f"p: {ROW}", "s: f32[]"], f"({ROW}, f32[])",
        "different dims"),
    "outputs in different layouts": (f"""  %p = {ROW} parameter(0)
  %n = {ROW}{{1,0}} negate(%p)
  %c = {ROW}{{0,1}} copy(%p)
  ROOT %t = ({ROW}{{1,0}}, {ROW}{{0,1}}) tuple(%n, %c)""", [f"p: {ROW}"],
        f"({ROW}{{1,0}}, {ROW}{{0,1}})", "different layouts"),
    "non-uniform array constant": (f"""  %p = f32[4] parameter(0)
  %c = f32[4] constant({{1, 2, 3, 4}})
  ROOT %a = f32[4] add(%p, %c)""", ["p: f32[4]"], "f32[4]", "(constant)"),
}


@pytest.mark.parametrize("case", sorted(NOT_FLAT))
def test_fusions_that_read_coordinates_keep_the_strided_form(case):
    body, params, root, why = NOT_FLAT[case]
    fusion = fusion_of(body, params, root)
    comp = fusion.attrs["calls"]
    assert why in flat_reason(comp, outputs_of(comp))
    k = compile_fusion(fusion, target="h200")
    assert k.flat_n is None and ", n, BLOCK" not in k.source


def test_switch_keeps_every_loop_kernel_strided(monkeypatch):
    monkeypatch.setenv("HLOTK_FLAT_LOOPS", "0")
    k = compile_fusion(adam_like("37,5"), target="h200")
    assert k.flat_n is None and "s0_0" in body_of(k.source)


# --- one kernel for every shape -----------------------------------------------------------------
SHAPES = ("3072", "6144", "48,64", "1000", "1536,768", "768,1536")


def test_fusions_differing_only_in_shape_share_one_kernel(monkeypatch):
    kernels = [compile_fusion(adam_like(d), target="h200") for d in SHAPES]
    texts = {canonical_text(k.source) for k in kernels}
    assert len(texts) == 1
    assert len({k.key for k in kernels}) == 1 and len({str(k.path) for k in kernels}) == 1
    assert kernels[0].fn is kernels[1].fn                 # one module, one JIT function
    assert [k.flat_n for k in kernels] == [3072, 6144, 3072, 1000, 1179648, 1179648]
    # each keeps its own grid over its own elements
    assert [k.grid for k in kernels] == [(3,), (6,), (3,), (1,), (1152,), (1152,)]
    # Triton compiles one binary per class of n: divisible by 16 (all here but 1000) or not
    assert {k.variant_tag for k in kernels} == {"n=i32D", "n=i32"}
    # the strided form names the shape: one kernel per shape, as before
    monkeypatch.setenv("HLOTK_FLAT_LOOPS", "0")
    strided = [compile_fusion(adam_like(d), target="h200") for d in SHAPES]
    assert len({k.key for k in strided}) == len(SHAPES)


def test_a_shared_kernel_is_tuned_once():
    small, large = (compile_fusion(adam_like(d), target="h200", autotune=2)
                    for d in ("3072", "1536,1536"))
    assert small.key == large.key and small.autotune == 2 and large.autotune == 2
    best = {"BLOCK": 2048, "num_warps": 8, "num_stages": 1}
    at.store(small, best, [(dict(small.config), 5.0), (best, 4.0)])
    again = compile_fusion(adam_like("768,1536"), target="h200", autotune=2)
    assert again.config == best and again.autotune == 0      # nothing left to time


def test_the_pool_compiles_a_shared_kernel_once_per_class_of_n(monkeypatch):
    """Six fusions, one source: two pool jobs (n divisible by 16, and 1000), keyed by the
    real ``variant_key``."""
    kernels = [compile_fusion(adam_like(d), target="h200") for d in SHAPES]
    handed: list = []

    class Pool:
        def run_stream(self, source, expected, idle=None):
            for job, _ in source:
                handed.append(job[2])
            return [True] * len(handed)
    monkeypatch.setattr(parallel, "_pool", lambda: Pool())
    monkeypatch.setattr(parallel, "_POOL", object())
    monkeypatch.setattr(parallel, "_done", lambda: set())
    marked: list = []
    monkeypatch.setattr(parallel, "_mark", lambda keys: marked.extend(keys))
    monkeypatch.setattr(parallel, "current_target", lambda: "{}")
    # what Triton would tell apart: the source, the config and n's specialization
    monkeypatch.setattr(parallel, "_specialization", lambda k, args, config: json_spec(k, config))
    stats = parallel.precompile([(k, [], dict(k.config)) for k in kernels])
    assert stats["compiled"] == 2 and stats["known"] == 4
    assert len(handed) == 2 and len(set(marked)) == 2
    assert {m.rsplit("|", 1)[1] for m in marked} == {"n=i32D", "n=i32"}


def json_spec(kernel, config) -> str:
    import json
    return json.dumps([kernel.key, int_specialization(kernel.flat_n), config], sort_keys=True)


def test_int_specialization_is_tritons():
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:
        pytest.skip("this Triton has no native_specialize_impl to compare with")
    for n in (1, 2, 15, 16, 1000, 3072, 2 ** 31 - 16, 2 ** 31, 2 ** 33 + 1):
        ty, attr = native_specialize_impl(BaseBackend, n, False, True, True)[:2]
        want = "1" if ty == "constexpr" else ty + attr
        assert int_specialization(n) == want, n


# --- values -------------------------------------------------------------------------------------
def with_layout(x: np.ndarray, shape) -> "torch.Tensor":
    """A logical-shape view on DEVICE whose strides are those of ``shape``'s layout."""
    phys = _to_torch(to_physical(x, shape.layout)).to(DEVICE)
    order = major_to_minor(shape.layout, x.ndim)
    inv = [order.index(d) for d in range(x.ndim)]
    return phys.permute(*inv) if x.ndim else phys.reshape(())


def to_numpy(t: "torch.Tensor", dtype) -> np.ndarray:
    t = t.cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtype.np_dtype)
    return t.numpy()


def check(fusion, seed: int = 0, views=None) -> list[np.ndarray]:
    """Launch the kernel of ``fusion`` on random inputs (``views``: per input, a function
    making the tensor the kernel gets from the dense one) and compare every output with the
    reference interpreter; returns the outputs."""
    rng = np.random.default_rng(seed)
    comp = fusion.attrs["calls"]
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    args = [(rng.standard_normal(p.shape.dims) + 2.0).astype(p.shape.dtype.np_dtype)
            for p in params]
    kernel = compile_fusion(fusion, target="h200")
    assert kernel.flat_n is not None
    shapes = [o.shape for o in outputs_of(comp)]
    outs = [with_layout(np.full(s.dims, np.nan).astype(s.dtype.np_dtype), s) for s in shapes]
    ins = [with_layout(a, p.shape) for a, p in zip(args, params)]
    if views:
        ins = [v(t) if v else t for v, t in zip(views, ins)]
    kernel.launch(outs, ins)
    want = hlo.evaluate(comp, args)
    want = list(want) if isinstance(want, tuple) else [want]
    got = []
    for o, w, s in zip(outs, want, shapes):
        g = to_numpy(o, s.dtype).astype(np.float64)
        w = np.asarray(w).astype(np.float64)
        assert not np.isnan(g).any(), "an output element left unwritten (NaN poison)"
        # |got - want| / |want| over the whole array: the GPU contracts a * b + c into one
        # FMA where the reference rounds twice, which moves an element that nearly cancels
        # (0.9 m + 0.1 g near 0) by far more than its own rtol; wrong indexing moves it by ~1
        err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)
        assert err < (2e-2 if s.dtype.name == "bf16" else 1e-5), (s, err)
        got.append(g)
    return got


BF16_MIXED = """  %x = bf16[{d}] parameter(0)
  %y = f32[{d}] parameter(1)
  %s = f32[] parameter(2)
  %one = f32[1] parameter(3)
  %xf = f32[{d}] convert(%x)
  %bs = f32[{d}] broadcast(%s), dimensions={{}}
  %o1 = f32[] reshape(%one)
  %bo = f32[{d}] broadcast(%o1), dimensions={{}}
  %a = f32[{d}] multiply(%xf, %bs)
  %b = f32[{d}] add(%a, %y)
  %c = f32[{d}] subtract(%b, %bo)
  %e = f32[{d}] exponential(%c)
  %cb = bf16[{d}] convert(%e)
  ROOT %t = (f32[{d}], bf16[{d}], f32[{d}]) tuple(%b, %cb, %y)"""


def bf16_mixed(d: str) -> hlo.Instruction:
    return fusion_of(BF16_MIXED.format(d=d),
                     [f"x: bf16[{d}]", f"y: f32[{d}]", "s: f32[]", "one: f32[1]"],
                     f"(f32[{d}], bf16[{d}], f32[{d}])")


SIZES = ("1", "3", "1000", "1025", "33,65")     # none a multiple of the block but "1"


def _values(d: str) -> None:
    check(adam_like(d), seed=1)
    check(bf16_mixed(d), seed=2)


@interp
@pytest.mark.parametrize("d", SIZES)
def test_values_interpreter(d):
    _values(d)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("d", SIZES + ("3072", "1536,768"))
def test_values_gpu(d):
    _values(d)


def _layouts() -> None:
    # column-major parameters and outputs alike: flat over memory order
    s = "f32[33,65]{0,1}"
    f = fusion_of(f"""  %p = {s} parameter(0)
  %q = {s} parameter(1)
  ROOT %a = {s} multiply(%p, %q)""", [f"p: {s}", f"q: {s}"], s)
    check(f, seed=3)
    # a size-1 dim anywhere in the layout moves no element
    g = fusion_of("""  %p = f32[1,999]{0,1} parameter(0)
  ROOT %n = f32[1,999]{1,0} negate(%p)""", ["p: f32[1,999]{0,1}"], "f32[1,999]{1,0}")
    check(g, seed=4)


@interp
def test_layouts_interpreter():
    _layouts()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_layouts_gpu():
    _layouts()


def _views_not_dense() -> None:
    """A caller's views that are not dense in the layout (a strided slice in, a transposed
    view out) are read and written through dense copies."""
    s = "f32[40,24]"
    f = fusion_of(f"""  %p = {s} parameter(0)
  %q = {s} parameter(1)
  ROOT %a = {s} subtract(%p, %q)""", [f"p: {s}", f"q: {s}"], s)
    kernel = compile_fusion(f, target="h200")
    rng = np.random.default_rng(5)
    big = torch.from_numpy(rng.standard_normal((40, 48)).astype(np.float32)).to(DEVICE)
    p = big[:, ::2]                                       # strides (48, 2)
    q = torch.from_numpy(rng.standard_normal((40, 24)).astype(np.float32)).to(DEVICE)
    base = torch.full((24, 40), float("nan"), device=DEVICE)
    out = base.t()                                        # strides (1, 40)
    kernel.launch([out], [p, q])
    np.testing.assert_array_equal(out.cpu().numpy(), (p - q).cpu().numpy())
    assert tuple(p.stride()) == (48, 2)                   # the caller's views, unchanged


@interp
def test_views_not_dense_interpreter():
    _views_not_dense()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_views_not_dense_gpu():
    _views_not_dense()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_gpu_optimizer_step_of_mixed_shapes_equals_jax(tmp_path, monkeypatch):
    """Adam over arrays of five shapes (odd sizes, a scalar step): every result equals
    jax.jit's, and the per-array updates run fewer kernel files than there are shapes."""
    # Triton's kernels are the subject: small loop kernels would be CUDA C under the
    # default HLOTK_LOOP_EMITTER=auto (codegen/cuda_c).
    monkeypatch.setenv("HLOTK_LOOP_EMITTER", "triton")
    import jax
    import jax.numpy as jnp

    import runtime
    from runtime.cuda import executable_of

    def step(params, grads, m, v, t):
        t = t + 1.0
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
        c1, c2 = 1.0 - 0.9 ** t, 1.0 - 0.999 ** t
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - 1e-3 * (m / c1) / (jnp.sqrt(v / c2) + 1e-8), params, m, v)
        return params, m, v, t
    rng = np.random.default_rng(6)
    shapes = {"a": (3072,), "b": (6144,), "c": (1000, 7), "d": (37,), "e": (48, 64)}
    tree = lambda: {k: rng.standard_normal(s).astype(np.float32)  # noqa: E731
                    for k, s in shapes.items()}
    args = (tree(), tree(), tree(), {k: np.abs(a) for k, a in tree().items()}, np.float32(3))
    c = runtime.jit(step, backend="cuda").lower(*args).compile()
    got = c(*args)
    want = jax.jit(step)(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-7)
    kernels = [k for k in executable_of(c)._triton_kernels() if k.flat_n and k.flat_n > 1]
    assert len({k.flat_n for k in kernels}) >= 4
    assert len({str(k.path) for k in kernels}) < len({k.flat_n for k in kernels})
