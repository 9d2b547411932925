"""One emit per distinct flat kernel (codegen/cuda_c/flat.flat_key, kernel.compile_loop_fusion's
memo; issue 13): fusions sharing a key emit the same source up to comments, whatever their
sizes, and each kernel made from a shared emit is the one a fresh emit makes for its own
fusion. A wrong share is a wrong kernel, so the property is checked on every loop fusion of
optimizer steps and zoo programs, with one memo across all of them. Host only (no NVRTC
call: ``start=False``)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import runtime
from codegen.cuda_c import emit_loop_kernel
from codegen.cuda_c import kernel as kmod
from codegen.cuda_c.emitter import compile_text, decline_reason
from codegen.cuda_c.flat import INDEX32_MAX, flat_key, flat_reason
from codegen.triton.kernel import classify
from passes.fusion.pass_ import with_target
from passes.pipelines import pipeline_spec
from runtime.tools import compile_module

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_c import make  # noqa: E402
from test_cuda_c_flat import adam_like  # noqa: E402
from test_fusion_caches import _adam, _adam_args  # noqa: E402
from test_fusion_chains import _lion, _steps  # noqa: E402
from zoo import by_name, x64_scope  # noqa: E402

SPEC = with_target(pipeline_spec("default", "cuda"), "h200")
ZOO = ["giou_boxes", "elementwise_math", "where_clip_select", "gelu_exact_erf",
       "unsigned_and_convert", "int_overflow_bitwise", "layer_norm_bf16", "dropout",
       "complex_arith", "iota_broadcast_transpose", "f64_program"]


@pytest.fixture(autouse=True)
def _env(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    for var in ("HLOTK_CUDA_C_FLAT", "HLOTK_CUDA_C_RESTRICT", "HLOTK_CUDA_C_FLAT_LAUNCH"):
        monkeypatch.delenv(var, raising=False)


def _loop_fusions(fn, args) -> list:
    module = runtime.jit(fn, pipeline="none").lower(*args).module
    compile_module(module, SPEC, backend="cuda")
    return [i for c in module.computations for i in c.instructions
            if i.opcode == "fusion" and classify(i) == "loop" and not decline_reason(i)]


@pytest.fixture(scope="module")
def fusions() -> dict[str, list]:
    out = {"adam": _loop_fusions(_adam, _adam_args()),
           "adam_pairs": _loop_fusions(_adam, _steps(3)),
           "lion": _loop_fusions(_lion, _steps(2))}
    for name in ZOO:
        prog = by_name(name)
        with x64_scope(prog):
            out[name] = _loop_fusions(prog.fn, prog.args())
    return out


def _fields(k) -> tuple:
    return (k.name, k.key, compile_text(k.source), k.fusion_name, k.input_shapes,
            k.output_shapes, k.elements, k.per_thread, k.flat, k.threads, k.blocks, k.waves)


def test_a_shared_emit_makes_each_fusion_its_fresh_kernel(fusions, monkeypatch):
    emitted: list = []
    real = kmod.emit_loop_kernel
    monkeypatch.setattr(kmod, "emit_loop_kernel",
                        lambda f, *a, **k: emitted.append(f.name) or real(f, *a, **k))
    memo: dict = {}
    every = [f for fs in fusions.values() for f in fs]
    shared = [kmod.compile_loop_fusion(f, arch="90", target="h200", start=False, memo=memo)
              for f in every]
    assert len(emitted) < len(every)
    for f, k in zip(every, shared):
        fresh = kmod.compile_loop_fusion(f, arch="90", target="h200", start=False)
        assert _fields(k) == _fields(fresh), f.name
    # the Adam step's five parameter updates (three sizes) are three flat kernels, one of
    # them shared by updates of 64 and 8192 elements
    updates = [f for f in fusions["adam"] if flat_key(f) is not None]
    by_key: dict = {}
    for f in updates:
        by_key.setdefault(flat_key(f), set()).add(emit_loop_kernel(f).elements)
    assert len(updates) == 5 and len(by_key) == 3
    assert max(len(sizes) for sizes in by_key.values()) == 2


def test_equal_keys_mean_equal_compile_text(fusions):
    """Over every flat fusion of the programs: fusions of one key emit one compile text,
    and most keys are shared by fusions of other sizes (the point of the key)."""
    groups: dict = {}
    for fs in fusions.values():
        for f in fs:
            key = flat_key(f)
            assert (key is None) == bool(flat_reason(f)), f.name
            if key is not None:
                groups.setdefault(key, []).append(f)
    assert len(groups) >= 8
    across_sizes = 0
    for members in groups.values():
        texts = {compile_text(emit_loop_kernel(f).source) for f in members}
        assert len(texts) == 1, [f.name for f in members]
        across_sizes += len({emit_loop_kernel(f).elements for f in members}) > 1
    assert across_sizes >= 2


def _cmp(shape: str, direction: str = "LT", two: str = "2", dtype: str = "f32"):
    return make(f"""  %a = {dtype}{shape} parameter(0)
  %b = {dtype}{shape} parameter(1)
  %c = {dtype}[] constant({two})
  %cb = {dtype}{shape} broadcast(%c), dimensions={{}}
  %m = {dtype}{shape} multiply(%a, %cb)
  %p = pred{shape} compare(%m, %b), direction={direction}
  ROOT %s = {dtype}{shape} select(%p, %m, %b)""",
                [f"a: {dtype}{shape}", f"b: {dtype}{shape}"], f"{dtype}{shape}")


def test_key_ignores_sizes_ranks_and_layouts():
    base = flat_key(_cmp("[3,5]"))
    assert base is not None
    for shape in ("[15]", "[7,1,9]", "[3,5]{0,1}", "[100000]"):
        assert flat_key(_cmp(shape)) == base, shape
        assert compile_text(emit_loop_kernel(_cmp(shape)).source) == \
            compile_text(emit_loop_kernel(_cmp("[3,5]")).source)


def test_key_holds_what_the_source_reads(monkeypatch):
    base = flat_key(_cmp("[3,5]"))
    others = {"direction": _cmp("[3,5]", direction="GT"), "constant": _cmp("[3,5]", two="3"),
              "-0.0": _cmp("[3,5]", two="-0"), "dtype": _cmp("[3,5]", dtype="f64"),
              "bf16": _cmp("[3,5]", dtype="bf16"), "wide": _cmp(f"[{INDEX32_MAX + 1}]")}
    assert flat_key(_cmp("[3,5]", two="0")) != flat_key(others["-0.0"])
    for what, f in others.items():
        assert flat_key(f) != base, what
    assert flat_key(_cmp("[3,5]"), round_narrow_each_op=False) != base
    # a power of a one-element parameter (once a thread) against one of a full-size one
    assert flat_key(adam_like("[3,5]")) != flat_key(make(
        """  %p = f32[3,5] parameter(0)
  %g = f32[3,5] parameter(1)
  %lr = f32[3,5] parameter(2)
  %two = f32[] constant(2)
  %b = f32[3,5] broadcast(%two), dimensions={}
  %c = f32[3,5] power(%lr, %b)
  %m = f32[3,5] multiply(%g, %c)
  %new = f32[3,5] subtract(%p, %m)
  %gg = f32[3,5] multiply(%g, %g)
  ROOT %t = (f32[3,5], f32[3,5]) tuple(%new, %gg)""",
        ["p: f32[3,5]", "g: f32[3,5]", "lr: f32[3,5]"], "(f32[3,5], f32[3,5])"))
    monkeypatch.setenv("HLOTK_CUDA_C_RESTRICT", "1")
    assert flat_key(_cmp("[3,5]")) != base


def test_no_key_without_a_flat_form(monkeypatch):
    moved = make("""  %a = f32[3,5] parameter(0)
  ROOT %t = f32[5,3] transpose(%a), dimensions={1,0}""", ["a: f32[3,5]"], "f32[5,3]")
    assert flat_key(moved) is None and kmod._memo_key(moved, True)[0] == "cuda_c"
    monkeypatch.setenv("HLOTK_CUDA_C_FLAT", "0")
    assert flat_key(_cmp("[3,5]")) is None


def test_uniform_array_constant_keyed_by_its_value():
    def f(shape: str, value: str):
        return make(f"""  %a = f32{shape} parameter(0)
  %c = f32{shape} constant({value})
  ROOT %m = f32{shape} multiply(%a, %c)""", [f"a: f32{shape}"], f"f32{shape}")
    assert flat_key(f("[4]", "{2, 2, 2, 2}")) == flat_key(f("[2,2]", "{{2, 2}, {2, 2}}"))
    assert flat_key(f("[4]", "{2, 2, 2, 2}")) != flat_key(f("[4]", "{3, 3, 3, 3}"))
    np.testing.assert_equal(compile_text(emit_loop_kernel(f("[4]", "{2, 2, 2, 2}")).source),
                            compile_text(emit_loop_kernel(f("[2,2]", "{{2, 2}, {2, 2}}")).source))
