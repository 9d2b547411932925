"""The held-out programs of benchmarks/heldout_programs.py at small sizes: the same answer as
jax.jit on the CPU backend, and the fusions the GPU benchmark relies on, deviceless."""
import numpy as np

import jax

import runtime
from benchmarks.heldout_programs import llama_args, llama_block
from passes.fusion import fusion_kind


def _small_llama():
    b, s, d, heads, kv = 1, 64, 64, 4, 2
    args = llama_args(np.random.default_rng(3), b, s, d, 96, heads=heads, kv_heads=kv)
    f = lambda *a: llama_block(*a, heads=heads, kv_heads=kv)  # noqa: E731
    return f, args, b * heads * s * s * 4


def test_llama_block_on_the_cpu_backend_equals_jax_jit():
    f, args, _ = _small_llama()
    want = np.asarray(jax.jit(f)(*args), np.float32)
    got = np.asarray(runtime.jit(f)(*args), np.float32)
    assert got.shape == want.shape == (1, 64, 64)
    # bf16 activations: a few roundings apart at most
    assert np.max(np.abs(got - want)) <= 2e-2 * np.max(np.abs(want))


def test_llama_block_for_h200_is_one_attention_fusion_without_scores():
    f, args, scores = _small_llama()
    c = runtime.jit(f, target="h200").lower(*args).compile()
    kinds = [fusion_kind(i) for comp in c.module.computations for i in comp.instructions
             if i.opcode == "fusion"]
    assert kinds.count("attention") == 1, c.as_text()
    assert max(bf.size for bf in c.buffer_assignment().buffers) < scores
    want = np.asarray(jax.jit(f)(*args), np.float32)
    got = np.asarray(c(*args), np.float32)      # the h200 pipeline, run on the CPU
    assert np.max(np.abs(got - want)) <= 2e-2 * np.max(np.abs(want))
