"""Programmatic dependent launch of generated kernels (issue 14, codegen/triton/pdl.py):
which kernels ``HLOTK_PDL`` gives a role, what the generated source and launch config
then hold (the wait before any load, the launch attribute exactly where the wait is),
results under Triton's interpreter (no PDL there), the sm_90 PTX order (Triton compiles
here without a GPU), and on a GPU the split pair replayed in CUDA graphs over new inputs;
results against float64 numpy over hlotk's bf16 arithmetic."""
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
from codegen.triton import TritonCodegenError, compile_fusion, pdl  # noqa: E402
from codegen.triton.reductions import finish_fusion, split_of  # noqa: E402
from hlo.ir import Computation, Instruction  # noqa: E402
from hlo.shape import array, scalar  # noqa: E402
from runtime.cuda import executable_of  # noqa: E402
from runtime.cuda.thunks import one_instruction_fusion  # noqa: E402

GPU = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("HLOTK_AUTOTUNE", "0")


def _column_sum(rows: int, cols: int) -> Instruction:
    add = Computation("add")
    a = add.add_instruction(Instruction("parameter", [], scalar("f32"), name="a", parameter_number=0))
    b = add.add_instruction(Instruction("parameter", [], scalar("f32"), name="b", parameter_number=1))
    add.root = add.add_instruction(Instruction("add", [a, b], scalar("f32"), name="s"))
    x = Instruction("parameter", [], array("f32", (rows, cols), (1, 0)), name="x", parameter_number=0)
    z = Instruction("parameter", [], scalar("f32"), name="z", parameter_number=1)
    red = Instruction("reduce", [x, z], array("f32", (cols,), (0,)),
                      {"dimensions": [0], "to_apply": add}, name="colsum")
    return one_instruction_fusion(red)


def _resid_grad(a, b, c, d):
    """transformer_train's residual-stream gradient sums (benchmarks/ln_split_probe.py),
    the three bf16 inputs added in f32 (the split and its kernels are the same; bf16 adds
    under Triton's interpreter land 0.4% from numpy's and from the CPU backend's, on main
    too, with or without the split: not this test's subject)."""
    s = a.astype(jnp.float32) + b.astype(jnp.float32) + c.astype(jnp.float32)
    return s.sum((0, 1)), (d * s).sum((0, 1))


def _body(source: str, name: str) -> list[str]:
    """The kernel function's body lines (after its def)."""
    lines = source.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"def {name}("))
    return lines[start + 1:]


# --- the roles --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,kind,want", [
    ("off", "kernel", pdl.NONE), ("off", "split_finish", pdl.NONE),
    ("split", "kernel", pdl.NONE),
    ("split", "split_partials", pdl.Pdl(signal=True)),
    ("split", "split_finish", pdl.Pdl(wait=True)),
    ("all", "kernel", pdl.Pdl(wait=True, signal=True)),
    ("all", "split_finish", pdl.Pdl(wait=True, signal=True)),
])
def test_roles_of_each_mode(mode, kind, want, monkeypatch):
    monkeypatch.setattr(pdl, "unavailable", lambda: "")
    monkeypatch.setenv(pdl.ENV, mode)
    assert pdl.role(kind) == want


def test_no_roles_where_pdl_is_unavailable(monkeypatch):
    monkeypatch.setenv(pdl.ENV, "all")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "interpreter" in pdl.unavailable()
    assert pdl.role("split_finish") == pdl.NONE


def test_bad_mode_and_kind_raise_the_codegen_error(monkeypatch):
    monkeypatch.setenv(pdl.ENV, "sometimes")
    with pytest.raises(TritonCodegenError, match="HLOTK_PDL='sometimes'.*off, split, all"):
        pdl.mode()
    with pytest.raises(TritonCodegenError, match="unknown PDL kernel kind"):
        pdl.role("gemm")


def test_bad_mode_fails_the_compile_not_each_kernel(monkeypatch):
    # (kernels compiled with a bad mode would each fall back to the host otherwise)
    monkeypatch.setenv(pdl.ENV, "1")
    x = np.ones((8, 16), np.float32)
    with pytest.raises(TritonCodegenError, match="HLOTK_PDL='1'"):
        runtime.jit(lambda x: jnp.sum(x, 0), backend="cuda").lower(x).compile()


# --- generated source and config --------------------------------------------------------------
def test_split_pair_source_and_config(monkeypatch):
    # Codegen only (nothing launched): the finishing kernel's first statement is the wait
    # and its configs (those autotuning may try too) carry launch_pdl; the partials kernel
    # signals at its top and is launched normally.
    monkeypatch.setattr(pdl, "unavailable", lambda: "")
    monkeypatch.setenv(pdl.ENV, "split")
    fusion = _column_sum(8192, 1024)
    sp = split_of(fusion.attrs["calls"])
    assert sp is not None
    part = compile_fusion(fusion, target="h200", split=sp)
    fin = compile_fusion(finish_fusion(fusion, sp), target="h200", pdl=pdl.role("split_finish"))
    assert pdl.IMPORT in fin.source and pdl.IMPORT in part.source
    body = _body(fin.source, fin.name)
    assert body[0].strip().startswith("gdc_wait()")
    assert "gdc_launch_dependents()" not in fin.source
    assert fin.config["launch_pdl"] is True
    assert fin.plan.candidates and all(c["launch_pdl"] for c in fin.plan.candidates)
    pbody = _body(part.source, part.name)
    assert pbody[0].strip().startswith("gdc_launch_dependents()")
    assert "gdc_wait()" not in part.source and "launch_pdl" not in part.config
    # the same fusion without PDL: another source, so another cache entry
    monkeypatch.setenv(pdl.ENV, "off")
    plain = compile_fusion(finish_fusion(fusion, sp), target="h200", pdl=pdl.role("split_finish"))
    assert "gdc_" not in plain.source and "launch_pdl" not in plain.config
    assert plain.key != fin.key


def test_all_mode_every_kernel_waits_first(monkeypatch):
    monkeypatch.setattr(pdl, "unavailable", lambda: "")
    monkeypatch.setenv(pdl.ENV, "all")
    k = compile_fusion(_column_sum(64, 48), target="h200")
    body = _body(k.source, k.name)
    assert body[0].strip().startswith("gdc_wait()")
    assert body[1].strip().startswith("gdc_launch_dependents()")
    assert k.config["launch_pdl"] is True


# --- results under the interpreter (no PDL there) ---------------------------------------------
@pytest.mark.skipif(GPU, reason="the interpreter path; the GPU test below runs the kernels")
@pytest.mark.parametrize("mode", ["split", "all"])
def test_split_layer_norm_like_gradients_equal_jax_under_the_interpreter(mode, monkeypatch):
    monkeypatch.setenv(pdl.ENV, mode)
    r = np.random.default_rng(0)
    x = [r.standard_normal((2, 512, 256)).astype(t)
         for t in (jnp.bfloat16, jnp.bfloat16, jnp.bfloat16, np.float32)]
    c = runtime.jit(_resid_grad, backend="cuda").lower(*x).compile()
    ks = [k for t in executable_of(c).thunks() if (k := getattr(t, "kernel", None))]
    assert [k.template for k in ks] == ["split_partials", "column_onepass"]
    assert not any("gdc_" in k.source or k.config.get("launch_pdl") for k in ks)
    _check(c(*x), x)


# --- sm_90 code (Triton compiles here, nothing runs) ------------------------------------------
_PTX_CHECK = r"""
import importlib.util, json, re, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.language.extra import cuda as tl_cuda
if not hasattr(tl_cuda, "gdc_wait"):
    print(json.dumps({"skip": "this Triton has no gdc_wait"})); sys.exit(0)
from codegen.triton import compile_fusion, pdl
from codegen.triton.reductions import finish_fusion, split_of
from hlo.ir import Computation, Instruction
from hlo.shape import array, scalar
from runtime.cuda.thunks import one_instruction_fusion
add = Computation("add")
a = add.add_instruction(Instruction("parameter", [], scalar("f32"), name="a", parameter_number=0))
b = add.add_instruction(Instruction("parameter", [], scalar("f32"), name="b", parameter_number=1))
add.root = add.add_instruction(Instruction("add", [a, b], scalar("f32"), name="s"))
x = Instruction("parameter", [], array("f32", (8192, 1024), (1, 0)), name="x", parameter_number=0)
z = Instruction("parameter", [], scalar("f32"), name="z", parameter_number=1)
fusion = one_instruction_fusion(Instruction("reduce", [x, z], array("f32", (1024,), (0,)),
                                            {"dimensions": [0], "to_apply": add}, name="colsum"))
sp = split_of(fusion.attrs["calls"])
fin = compile_fusion(finish_fusion(fusion, sp), target="h200", pdl=pdl.role("split_finish"))
path = tempfile.mkdtemp() + f"/{fin.name}.py"
open(path, "w").write(fin.source)
spec = importlib.util.spec_from_file_location("pdl_fin", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
fn = getattr(mod, fin.name)
cfg = {k: v for k, v in fin.config.items() if k.isupper()}
sig, consts = {}, {}
for i, a in enumerate(fn.arg_names):
    if a in cfg:
        sig[a], consts[(i,)] = "constexpr", cfg[a]
    else:
        sig[a] = "*fp32" if re.fullmatch(r"(p|out)\d+", a) else "i32"
k = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": fin.config["num_warps"],
                            "launch_pdl": bool(fin.config.get("launch_pdl"))})
ptx = k.asm["ptx"].splitlines()
print(json.dumps({"launch_pdl": bool(k.metadata.launch_pdl),
                  "wait": [i for i, ln in enumerate(ptx) if "griddepcontrol.wait" in ln],
                  "loads": [i for i, ln in enumerate(ptx) if re.search(r"\bld\.global", ln)]}))
"""


def test_sm90_ptx_waits_before_the_first_global_load(tmp_path):
    # In a process of its own without the interpreter (Triton compiles for sm_90 here;
    # nothing is launched).
    import json
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(HLOTK_PDL="split", HLOTK_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _PTX_CHECK], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["launch_pdl"]
    assert len(got["wait"]) == 1 and got["loads"] and got["wait"][0] < got["loads"][0]


# --- on the GPU -------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA")
@pytest.mark.parametrize("mode", ["split", "all"])
def test_gpu_split_pair_replays_new_inputs_equal_to_jax(mode, monkeypatch):
    # transformer_train's 80 MiB residual gradient shape: the finishing kernel launches
    # while the partials kernel runs. Each call's new arrays go through the captured graph
    # (the native path, or the Python path's replays); a wait after the first read would
    # show as stale partials.
    monkeypatch.setenv(pdl.ENV, mode)
    if pdl.unavailable():
        pytest.skip(pdl.unavailable())
    f = _resid_grad
    shape = (4, 2048, 1024)
    r = np.random.default_rng(0)

    def args():
        return [jax.device_put(r.standard_normal(shape).astype(t))
                for t in (jnp.bfloat16, jnp.bfloat16, jnp.bfloat16, np.float32)]
    first = args()
    c = runtime.jit(f, backend="cuda").lower(*first).compile()
    exe = executable_of(c)
    ks = [k for t in exe.thunks() if (k := getattr(t, "kernel", None))]
    fin = [k for k in ks if k.name.endswith("_finish")]
    assert fin and fin[0].config.get("launch_pdl") and "gdc_wait()" in fin[0].source
    for x in [first] * 3 + [args() for _ in range(3)]:
        _check(c(*x), [np.asarray(a) for a in x])
    # the Python path's graph replays over tensors rewritten in place
    leaves = [torch.from_dlpack(a).clone() for a in first]
    for _ in range(4):
        for t in leaves:
            t.copy_(torch.randn(t.shape, device=t.device).to(t.dtype))
        host = [np.asarray(t.float().cpu()).astype(np.asarray(a).dtype)
                for t, a in zip(leaves, first)]
        _check(exe.run(leaves, output="numpy"), host)


def _check(got, x) -> None:
    """The two sums against float64 numpy: relative norm error under 1e-5."""
    a, b, c, d = (np.asarray(v, np.float64) for v in x)
    s = a + b + c
    want = [s.sum((0, 1)), (d * s).sum((0, 1))]
    for g, w in zip(got, want):
        g = np.asarray(g, np.float64)
        assert g.shape == w.shape
        assert np.linalg.norm(g - w) / np.linalg.norm(w) < 1e-5
