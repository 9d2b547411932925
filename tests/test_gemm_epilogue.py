"""GELU (tanh form) after a GEMM runs as cuBLASLt's epilogue (passes/fusion/gemm_epilogue.py):
the matcher reads the computation after the dot by value, the fusion pass prices the
GEMM + GELU fusion as one GEMM (split_gemm.py) and fuses it, the CPU backend's result equals
jax.jit's, and on a GPU the fusion is one library call with no epilogue kernel."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import runtime
from passes import run_pipeline
from passes.fusion.gemm_epilogue import library_epilogue
from passes.pipelines import PIPELINES, SIMPLIFY

bf16 = jnp.bfloat16
K = math.sqrt(2 / math.pi)


def _gelu_jax(x):
    return jax.nn.gelu(x, approximate=True)


def _gelu_flax_order(x):            # x * 0.5 * (1 + tanh(k * (x + c * x**3)))
    return x * 0.5 * (1.0 + jnp.tanh(K * (x + 0.044715 * x ** 3)))


def _gelu_expanded(x):              # 0.5x + 0.5x * tanh(k x + k c x*x*x), k folded by hand
    t = jnp.tanh(K * x + (K * 0.044715) * (x * x * x))
    return 0.5 * x + 0.5 * x * t


def _gelu_upcast(x):                # computed in f32, rounded back at the end
    return jax.nn.gelu(x.astype(jnp.float32), approximate=True).astype(x.dtype)


def _not_gelu_erf(x):               # exact GELU: erf, not the epilogue's tanh form
    return jax.nn.gelu(x, approximate=False)


def _not_gelu_constant(x):          # 0.05 is not 0.044715, even in bf16
    return 0.5 * x * (1.0 + jnp.tanh(K * (x + 0.05 * x ** 3)))


def _not_gelu_tanh_only(x):
    return jnp.tanh(x)


def _not_gelu_squared(x):           # tanh twice
    t = jnp.tanh(K * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1.0 + t * t)


def _epilogue_of(act, dtype):
    """library_epilogue's answer for ``act(a @ w)`` after simplification."""
    a = jnp.zeros((64, 32), dtype)
    w = jnp.zeros((32, 48), dtype)
    module = runtime.jit(lambda a, w: act(a @ w), pipeline="none").lower(a, w).module
    run_pipeline(module, f"inline,{SIMPLIFY}")
    comp = module.entry
    dot = next(i for i in comp.instructions if i.opcode == "dot")
    order = comp.post_order()
    above = set()
    for inst in order:
        if inst is dot or any(id(o) in above or o is dot for o in inst.operands):
            above.add(id(inst))
    epilogue = [i for i in order if id(i) in above and i is not dot]
    constants = [i for i in order if id(i) not in above and i.opcode in ("constant", "broadcast")]
    return library_epilogue(dot, constants + epilogue, [comp.root])


@pytest.mark.parametrize("act", [_gelu_jax, _gelu_flax_order, _gelu_expanded, _gelu_upcast])
@pytest.mark.parametrize("dtype", [bf16, jnp.float32, jnp.float16])
def test_gelu_forms_match(act, dtype):
    assert _epilogue_of(act, dtype) == "gelu_tanh"


@pytest.mark.parametrize("act", [_not_gelu_erf, _not_gelu_constant, _not_gelu_tanh_only,
                                 _not_gelu_squared, lambda x: x * jax.nn.sigmoid(1.702 * x)])
@pytest.mark.parametrize("dtype", [bf16, jnp.float32])
def test_other_activations_do_not_match(act, dtype):
    assert _epilogue_of(act, dtype) is None


def test_epilogue_reading_another_array_does_not_match():
    a, w, bias = jnp.zeros((64, 32), bf16), jnp.zeros((32, 48), bf16), jnp.zeros((48,), bf16)
    module = runtime.jit(lambda a, w, b: _gelu_jax(a @ w + b), pipeline="none") \
        .lower(a, w, bias).module
    run_pipeline(module, f"inline,{SIMPLIFY}")
    comp = module.entry
    dot = next(i for i in comp.instructions if i.opcode == "dot")
    rest = [i for i in comp.post_order() if i.opcode not in ("parameter", "dot")]
    assert library_epilogue(dot, rest, [comp.root]) is None


def _mlp(x, w1, w2):
    """A transformer MLP on a rank-3 activation: the GEMMs run split on the GPU."""
    return jax.nn.gelu(x @ w1, approximate=True) @ w2


def _mlp_args(b=2, s=64, d=64, f=256, seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal((b, s, d)).astype(ml_dtypes.bfloat16),
            (r.standard_normal((d, f)) / np.sqrt(d)).astype(ml_dtypes.bfloat16),
            (r.standard_normal((f, d)) / np.sqrt(f)).astype(ml_dtypes.bfloat16))


def test_gelu_fuses_into_the_split_gemm_and_matches_jax():
    args = _mlp_args()
    jf = runtime.jit(_mlp, target="h200", pipeline=PIPELINES["default"]["cuda"])
    compiled = jf.lower(*args).compile()
    entry = compiled.module.entry
    gelu_fusions = [i for i in entry.instructions if i.opcode == "fusion" and
                    any(j.opcode == "dot" for j in i.attrs["calls"].instructions) and
                    any(j.opcode == "tanh" for j in i.attrs["calls"].instructions)]
    assert len(gelu_fusions) == 1, compiled.as_text()
    # No fusion computes the GELU apart from its GEMM.
    assert not [i for i in entry.instructions if i.opcode == "fusion" and i not in gelu_fusions
                and any(j.opcode == "tanh" for j in i.attrs["calls"].instructions)]
    got = np.asarray(compiled(*args), np.float32)
    want = np.asarray(jax.jit(_mlp)(*args), np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def _cuda():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_gpu_gelu_is_one_cublaslt_call():
    from runtime.cuda import executable_of
    args = _mlp_args(b=4, s=256, d=256, f=1024)
    compiled = runtime.jit(_mlp, backend="cuda").lower(*args).compile()
    got = np.asarray(compiled(*args), np.float32)
    want = np.asarray(jax.jit(_mlp)(*args), np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    described = executable_of(compiled).describe()
    assert "GELU epilogue" in described, described
    assert "epilogue [" not in described and ".epilogue" not in described, described
