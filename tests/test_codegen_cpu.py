"""CPU codegen: one generated numpy function per fusion, bit-exact with the interpreter.

Fusions come from XLA itself: ``jax.jit(f).lower(*args).compile().as_text()`` prints the
CPU backend's optimized module (kLoop fusions, reductions, kCustom dot fusions, multi-output
fusions), which ``hlo.parse_hlo`` reads. For every zoo program:
  * every fusion's kernel equals the interpreter running the fused computation, bit for bit
    (NaNs equal), on random operands that include NaN, infinities, -0 and subnormals;
  * the whole optimized module, run with kernels for fusions and the interpreter for the
    rest, equals ``jax.jit`` within the program's tolerance.
Also: the XLA:GPU anchors' Triton fusions generate, compile and run; the disk cache.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import codegen.cpu as cg  # noqa: E402
import hlo  # noqa: E402
from codegen.cache import KernelCache  # noqa: E402
from hlo.errors import InvalidArgumentError  # noqa: E402
from hlo.evaluator.core import EvalContext, Evaluator  # noqa: E402
from tests.paths import ANCHORS  # noqa: E402
from tests.zoo import ZOO, ZooProgram, assert_flat_close, by_name, x64_scope  # noqa: E402



@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Kernels go to a per-session temporary cache, never to the user's ~/.cache."""
    root = tmp_path_factory.getbasetemp() / "hlotk-cache"
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(root))


# --- XLA:CPU's optimized module for each zoo program (computed once per session) ----------
@functools.cache
def _xla_cpu_module(name: str) -> tuple[hlo.Module, tuple, object]:
    prog = by_name(name)
    with x64_scope(prog):
        args = prog.args()
        text = jax.jit(prog.fn).lower(*args).compile().as_text()
        expected = jax.tree.map(np.asarray, jax.jit(prog.fn)(*args))
    return hlo.parse_hlo(text), args, expected


def _fusions(module: hlo.Module) -> list[hlo.Instruction]:
    return [i for i in module.all_instructions() if i.opcode == "fusion"]


# --- random operands ----------------------------------------------------------------------
def _random_value(shape, rng: np.random.RandomState):
    if shape.is_tuple:
        return tuple(_random_value(s, rng) for s in shape.elements)
    d = shape.dtype
    dims = tuple(shape.dims)
    if d.is_pred:
        return rng.rand(*dims) < 0.5
    if d.is_integer:
        lo, hi = (-9, 10) if d.kind == "sint" else (0, 19)
        return rng.randint(lo, hi, size=dims).astype(d.np_dtype)
    if d.is_complex:
        part = d.component.np_dtype
        return (rng.standard_normal(dims).astype(part)
                + 1j * rng.standard_normal(dims).astype(part)).astype(d.np_dtype)
    x = rng.standard_normal(dims).astype(np.float32)
    flat = x.reshape(-1)
    # A few special values where there is room: exactness must hold for them too.
    specials = [np.nan, np.inf, -np.inf, -0.0, 1e-40, -3e-39]
    if flat.size >= 32:
        idx = rng.choice(flat.size, size=len(specials), replace=False)
        flat[idx] = specials
    return x.astype(d.np_dtype)


def _assert_bit_equal(got, want, where: str) -> None:
    """Same dtype, shape and bits; NaNs equal whatever their payload."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_bit_equal(g, w, f"{where}[{i}]")
        return
    assert isinstance(got, np.ndarray), f"{where}: kernel returned {type(got).__name__}"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    if got.dtype.kind == "c":
        _assert_bit_equal(np.real(got).copy(), np.real(want).copy(), where + ".real")
        _assert_bit_equal(np.imag(got).copy(), np.imag(want).copy(), where + ".imag")
        return
    d = hlo.dtypes.from_numpy(got.dtype)
    if d.is_float:
        f32g, f32w = got.astype(np.float64), want.astype(np.float64)
        both_nan = np.isnan(f32g) & np.isnan(f32w)
        same = (got.view(f"u{got.dtype.itemsize}") == want.view(f"u{got.dtype.itemsize}"))
        bad = ~(same | both_nan)
    else:
        bad = got != want
    assert not bad.any(), (f"{where}: {int(bad.sum())} of {bad.size} elements differ, e.g. "
                           f"got {got[bad][:4]} want {want[bad][:4]}")


# --- the tests ----------------------------------------------------------------------------
@pytest.fixture(params=ZOO, ids=[p.name for p in ZOO])
def program(request) -> ZooProgram:
    prog = request.param
    with x64_scope(prog):
        yield prog


def test_every_fusion_matches_the_interpreter_bit_for_bit(program: ZooProgram):
    module, _, _ = _xla_cpu_module(program.name)
    rng = np.random.RandomState(7)
    for inst in _fusions(module):
        comp = inst.attrs["calls"]
        operands = [_random_value(o.shape, rng) for o in inst.operands]
        want = hlo.evaluate(comp, operands)
        kernel = cg.compile_fusion(inst)
        got = kernel(*operands)
        _assert_bit_equal(got, want, f"{program.name}: %{inst.name} ({kernel.name})")


class _KernelEvaluator(Evaluator):
    """The interpreter, except that fusions run their generated kernels (also inside
    while/conditional bodies, which the interpreter reaches through ``ctx.call``)."""

    def __init__(self):
        super().__init__()
        self.kernel_calls = 0

    def run_computation(self, comp, args, ctx):
        env = {id(p): a for p, a in zip(comp.parameters, args)}
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                continue
            operands = [env[id(o)] for o in inst.operands]
            if inst.opcode == "fusion":
                env[id(inst)] = cg.compile_fusion(inst)(*operands)
                self.kernel_calls += 1
            else:
                env[id(inst)] = inst.op.evaluate(inst, operands, ctx)
        return env[id(comp.root)]


def test_xla_cpu_module_with_kernels_matches_jax(program: ZooProgram):
    module, args, expected = _xla_cpu_module(program.name)
    leaves = [np.asarray(a) for a in jax.tree.leaves(args)]
    if len(leaves) != len(module.entry.parameters):
        pytest.skip("XLA dropped or split arguments")
    elided = [i.name for i in module.all_instructions()
              if i.opcode == "constant" and i.literal is None]
    if elided:
        pytest.skip(f"XLA's text elides constants {elided[:3]} as {{...}}; cannot run it")
    ev = _KernelEvaluator()
    values = [hlo.evaluator.core.to_value(a, p.shape)
              for a, p in zip(leaves, module.entry.parameters)]
    try:
        got = ev.run_computation(module.entry, values, EvalContext(ev))
    except hlo.EvaluationError as e:
        if "changes the element type" in str(e):
            # XLA:CPU emits element-type-changing bitcasts in sort comparators (outside any
            # fusion); the interpreter's bitcast rule refuses them (hlo/evaluator, not codegen).
            pytest.xfail(f"interpreter: {e}")
        raise
    # Every entry fusion ran as a kernel (fusions in while bodies may run several times).
    assert ev.kernel_calls >= sum(i.opcode == "fusion" for i in module.entry.instructions)
    assert_flat_close(got, expected, program.rtol, program.atol)


def test_zoo_exercises_every_fusion_shape():
    """The zoo's XLA:CPU output has what the brief promises: reductions, dot (kCustom)
    fusions and multi-output fusions; the test above runs all of them."""
    kinds, roots = set(), set()
    for prog in ZOO:
        with x64_scope(prog):
            for f in _fusions(_xla_cpu_module(prog.name)[0]):
                kinds.add(str(f.attrs["kind"]))
                roots.add(f.attrs["calls"].root.opcode)
    assert {"kLoop", "kCustom"} <= kinds
    # Variadic reduce (argmax) and reduce-window roots give tuple-shaped kernels; XLA:CPU
    # makes no tuple-rooted multi-output fusion for the zoo (the hand-written test has one).
    assert {"reduce", "dot", "reduce-window"} <= roots


# --- generated source ---------------------------------------------------------------------
_SOFTMAX_LIKE = """
HloModule m

%add_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_computation.3 (param_0: bf16[2,3]) -> (f32[2], bf16[2,3]) {
  %param_0 = bf16[2,3]{1,0} parameter(0)
  %exponential.1 = bf16[2,3]{1,0} exponential(%param_0)
  %constant.2 = bf16[] constant(0.5)
  %broadcast.2 = bf16[2,3]{1,0} broadcast(%constant.2), dimensions={}
  %add.1 = bf16[2,3]{1,0} add(%exponential.1, %broadcast.2)
  %convert.1 = f32[2,3]{1,0} convert(%add.1)
  %constant.0 = f32[] constant(0)
  %reduce.1 = f32[2]{0} reduce(%convert.1, %constant.0), dimensions={1}, to_apply=%add_f32
  ROOT %tuple.1 = (f32[2]{0}, bf16[2,3]{1,0}) tuple(%reduce.1, %add.1)
}

ENTRY %main (p: bf16[2,3]) -> (f32[2], bf16[2,3]) {
  %p = bf16[2,3]{1,0} parameter(0)
  ROOT %fusion.3 = (f32[2]{0}, bf16[2,3]{1,0}) fusion(%p), kind=kLoop, calls=%fused_computation.3
}
"""


def _fusion_of(text: str) -> hlo.Instruction:
    return _fusions(hlo.parse_hlo(text))[0]


def test_generated_source_is_readable_and_exact():
    fusion = _fusion_of(_SOFTMAX_LIKE)
    kernel = cg.compile_fusion(fusion)
    assert kernel.name == "fused_exp_add_convert_reduce_3"
    src = kernel.source
    assert f"def {kernel.name}(param_0):" in src
    # Header names the fused HLO; one statement per instruction with its name.
    assert "#   %fused_computation.3 (param_0: bf16[2,3]) -> (f32[2], bf16[2,3]) {" in src
    assert "#   %add_f32 (a: f32[], b: f32[]) -> f32[] {" in src
    for name in ("exponential.1", "constant.2", "broadcast.2", "add.1", "convert.1", "reduce.1"):
        assert re.search(rf"^\s+\w+ = .*  # %{re.escape(name)}$", src, re.M), name
    assert "S.fop(np.exp, BF16, param_0)" in src     # computed in f32, rounded to bf16
    assert "return (" in src                          # multi-output: a tuple
    x = np.array([[0.1, 1.7, -2.3], [5.5, -0.0, 3.0]], dtype=ml_dtypes.bfloat16)
    red, add = kernel(x)
    # bf16 rounding after each op: exp rounds to bf16, then + 0.5 rounds again.
    e = np.exp(x.astype(np.float32)).astype(ml_dtypes.bfloat16)
    want_add = (e.astype(np.float32) + np.float32(0.5)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(add.view(np.uint16), want_add.view(np.uint16))
    np.testing.assert_array_equal(red, want_add.astype(np.float32).sum(axis=1))
    _assert_bit_equal((red, add), hlo.evaluate(fusion.attrs["calls"], [x]), "softmax-like")


def test_kernel_outputs_never_alias_inputs():
    text = """
HloModule m
%fc (p0: f32[2,3]) -> f32[3,2] {
  %p0 = f32[2,3]{1,0} parameter(0)
  ROOT %t = f32[3,2]{1,0} transpose(%p0), dimensions={1,0}
}
ENTRY %e (a: f32[2,3]) -> f32[3,2] {
  %a = f32[2,3]{1,0} parameter(0)
  ROOT %f = f32[3,2]{1,0} fusion(%a), kind=kLoop, calls=%fc
}
"""
    kernel = cg.compile_fusion(_fusion_of(text))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = kernel(x)
    out[0, 0] = 99
    assert x[0, 0] == 0 and out.flags.writeable
    assert kernel.name == "fused_transpose"


def test_integer_semantics_follow_xla():
    """s32 divide by zero is -1, INT_MIN / -1 is INT_MIN; s8 add wraps."""
    text = """
HloModule m
%fc (p0: s32[4], p1: s32[4], p2: s8[4]) -> (s32[4], s8[4]) {
  %p0 = s32[4]{0} parameter(0)
  %p1 = s32[4]{0} parameter(1)
  %d = s32[4]{0} divide(%p0, %p1)
  %p2 = s8[4]{0} parameter(2)
  %a = s8[4]{0} add(%p2, %p2)
  ROOT %t = (s32[4]{0}, s8[4]{0}) tuple(%d, %a)
}
ENTRY %e (x: s32[4], y: s32[4], z: s8[4]) -> (s32[4], s8[4]) {
  %x = s32[4]{0} parameter(0)
  %y = s32[4]{0} parameter(1)
  %z = s8[4]{0} parameter(2)
  ROOT %f = (s32[4]{0}, s8[4]{0}) fusion(%x, %y, %z), kind=kLoop, calls=%fc
}
"""
    kernel = cg.compile_fusion(_fusion_of(text))
    q, s = kernel(np.array([7, -7, 5, -2**31], np.int32), np.array([2, 2, 0, -1], np.int32),
                  np.array([100, -100, 64, 1], np.int8))
    np.testing.assert_array_equal(q, [3, -3, -1, -2**31])
    np.testing.assert_array_equal(s, np.array([-56, 56, -128, 2], np.int8))
    assert "S.eval_rule(I['d'], p0, p1)" in kernel.source       # interpreter rule, said so
    assert "# %d (interpreter rule)" in kernel.source


@pytest.mark.parametrize("dtype", ["s8", "u8", "s32", "u32", "s64", "u64"])
def test_shifts_saturate_like_xla(dtype: str):
    """Amounts >= the bit width (and negative ones, read as unsigned) give 0 for the logical
    shifts and the sign fill for the arithmetic one; numpy alone is undefined there."""
    text = f"""
HloModule m
%fc (p0: {dtype}[9], p1: {dtype}[9]) -> ({dtype}[9], {dtype}[9], {dtype}[9]) {{
  %p0 = {dtype}[9]{{0}} parameter(0)
  %p1 = {dtype}[9]{{0}} parameter(1)
  %l = {dtype}[9]{{0}} shift-left(%p0, %p1)
  %r = {dtype}[9]{{0}} shift-right-logical(%p0, %p1)
  %a = {dtype}[9]{{0}} shift-right-arithmetic(%p0, %p1)
  ROOT %t = ({dtype}[9]{{0}}, {dtype}[9]{{0}}, {dtype}[9]{{0}}) tuple(%l, %r, %a)
}}
ENTRY %e (x: {dtype}[9], y: {dtype}[9]) -> ({dtype}[9], {dtype}[9], {dtype}[9]) {{
  %x = {dtype}[9]{{0}} parameter(0)
  %y = {dtype}[9]{{0}} parameter(1)
  ROOT %f = ({dtype}[9]{{0}}, {dtype}[9]{{0}}, {dtype}[9]{{0}}) fusion(%x, %y), kind=kLoop, calls=%fc
}}
"""
    fusion = _fusion_of(text)
    np_dtype = fusion.shape.elements[0].dtype.np_dtype
    info = np.iinfo(np_dtype)
    x = np.array([info.min, info.max, -1 if info.min else 1, 5, 5, 5, 5, 5, 5]).astype(np_dtype)
    y = np.array([1, 1, info.bits - 1, 0, info.bits, info.bits + 7, 3, 2, 1]).astype(np_dtype)
    if info.min:
        y[-1] = -1
    kernel = cg.compile_fusion(fusion)
    assert "S.shift_left(p0, p1)" in kernel.source
    left, logical, arith = kernel(x, y)
    assert left[3] == 5 and left[4] == 0 and left[5] == 0 and left[6] == 40
    assert logical[4] == 0 and logical[6] == 0
    assert arith[0] == (info.min >> 1) and arith[4] == 0
    if info.min:
        assert left[8] == 0 and arith[2] == -1   # amount -1 reads as huge
    _assert_bit_equal((left, logical, arith), hlo.evaluate(fusion.attrs["calls"], [x, y]), dtype)


def test_compile_fusion_rejects_non_fusions():
    module = hlo.parse_hlo(_SOFTMAX_LIKE)
    with pytest.raises(InvalidArgumentError, match="fusion"):
        cg.compile_fusion(module.entry.parameters[0])
    kernel = cg.compile_fusion(_fusions(module)[0])
    with pytest.raises(InvalidArgumentError, match="takes 1 operands, got 2"):
        kernel(np.zeros((2, 3), ml_dtypes.bfloat16), np.zeros((2, 3), ml_dtypes.bfloat16))


@pytest.mark.parametrize("anchor", sorted(p.name for p in ANCHORS.glob("*.hlo.txt"))
                         if ANCHORS.exists() else [])
def test_xla_gpu_anchor_fusions_generate(anchor: str):
    """XLA:GPU's Triton softmax/layer-norm/GEMM fusions generate valid, well-named kernels;
    those whose operands are small enough also run and match the interpreter."""
    module = hlo.parse_hlo((ANCHORS / anchor).read_text())
    fusions = _fusions(module)
    assert fusions
    rng = np.random.RandomState(3)
    for f in fusions:
        kernel = cg.compile_fusion(f)
        assert kernel.name.startswith("fused_") and f"def {kernel.name}(" in kernel.source
        compile(kernel.source, kernel.name, "exec")
        sizes = [int(np.prod(o.shape.dims)) for o in f.operands if not o.shape.is_tuple]
        if sum(sizes) <= 1 << 16 and not f.shape.is_tuple and np.prod(f.shape.dims) <= 1 << 16:
            operands = [_random_value(o.shape, rng) for o in f.operands]
            _assert_bit_equal(kernel(*operands), hlo.evaluate(f.attrs["calls"], operands),
                              f"{anchor}: %{f.name}")


# --- the kernel cache ---------------------------------------------------------------------
def _fresh_compile(text: str) -> cg.Kernel:
    """Compile with the in-memory memo cleared, so the disk cache is what answers."""
    cg._CODE.clear()
    return cg.compile_fusion(_fusion_of(text))


def test_second_compile_hits_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cg, "CACHE", KernelCache("cpu"))
    k1 = _fresh_compile(_SOFTMAX_LIKE)
    assert (cg.CACHE.stats.misses, cg.CACHE.stats.hits) == (1, 0)
    files = list((tmp_path / "cpu").glob("*.py"))
    assert [f.stem for f in files] == [k1.key]
    k2 = _fresh_compile(_SOFTMAX_LIKE)
    assert (cg.CACHE.stats.misses, cg.CACHE.stats.hits) == (1, 1)
    assert k2.source == k1.source and k2.key == k1.key
    # Repeat compiles of one instruction are memoised: the same Kernel object, no disk.
    f = _fusion_of(_SOFTMAX_LIKE)
    assert cg.compile_fusion(f) is cg.compile_fusion(f)
    assert cg.CACHE.stats.hits + cg.CACHE.stats.misses <= 3


def test_key_ignores_metadata_but_not_the_reducer(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path))
    base = _fresh_compile(_SOFTMAX_LIKE)
    with_meta = _SOFTMAX_LIKE.replace(
        "exponential(%param_0)", 'exponential(%param_0), metadata={op_name="jit(f)/exp"}')
    assert _fresh_compile(with_meta).key == base.key
    as_max = _SOFTMAX_LIKE.replace("ROOT %s = f32[] add(", "ROOT %s = f32[] maximum(")
    k = _fresh_compile(as_max)
    assert k.key != base.key and "S.reduce('maximum'" in k.source


def test_corrupt_cache_entry_is_regenerated(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cg, "CACHE", KernelCache("cpu"))
    k1 = _fresh_compile(_SOFTMAX_LIKE)
    path = tmp_path / "cpu" / f"{k1.key}.py"
    good = path.read_text()
    # A truncated file (a crash mid-write by some other tool) and garbage bytes.
    for bad in (good[: len(good) // 2], "\x00\xff not python"):
        path.write_text(bad, errors="surrogateescape") if bad.isascii() else path.write_bytes(
            bad.encode("latin-1"))
        k = _fresh_compile(_SOFTMAX_LIKE)
        assert k.source == k1.source
        assert path.read_text() == good
    assert cg.CACHE.stats.corrupt == 2
    x = np.ones((2, 3), ml_dtypes.bfloat16)
    _assert_bit_equal(k(x), k1(x), "regenerated kernel")


def test_cache_dir_default_and_unwritable(tmp_path, monkeypatch):
    from codegen.cache import cache_root
    monkeypatch.delenv("HLOTK_CACHE_DIR")
    assert cache_root() == Path.home() / ".cache" / "hlotk"
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(blocker))
    monkeypatch.setattr(cg, "CACHE", KernelCache("cpu"))
    with pytest.warns(RuntimeWarning, match="cannot write"):
        k = _fresh_compile(_SOFTMAX_LIKE)
    assert cg.CACHE.stats.write_errors == 1
    assert k(np.zeros((2, 3), ml_dtypes.bfloat16))[0].tolist() == [4.5, 4.5]


def test_jax_program_fusion_matches_jax():
    """End to end on one program: XLA:CPU's fusion for softmax, run as our kernel."""
    def softmax(x):
        return jax.nn.softmax(x, axis=-1)
    x = np.random.RandomState(0).standard_normal((4, 16)).astype(np.float32)
    module = hlo.parse_hlo(jax.jit(softmax).lower(x).compile().as_text())
    ev = _KernelEvaluator()
    got = ev.run_computation(module.entry, [x], EvalContext(ev))
    assert ev.kernel_calls >= 1
    np.testing.assert_allclose(got, np.asarray(jax.jit(softmax)(x)), rtol=1e-6, atol=1e-7)
