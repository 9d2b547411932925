"""The held-out programs of benchmarks/heldout_programs.py at small sizes: the same answer as
jax.jit on the CPU backend, and the fusions the GPU benchmark relies on, deviceless."""
import numpy as np
import pytest

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


def _small_gpt(layers: int = 2):
    from benchmarks.heldout_programs import gpt_args
    b, s, d, heads, vocab = 2, 64, 32, 4, 64
    return gpt_args(np.random.default_rng(5), b, s, d, layers, vocab), heads, b * heads * s * s


def _score_sized(module, elements: int) -> list[str]:
    """Values in memory (the entry's instructions: fusions' outputs and what runs alone) of
    B·H·S·S elements: scores, probabilities or a mask."""
    out = []
    for inst in module.entry.instructions:
        shapes = inst.shape.elements if inst.shape.is_tuple else [inst.shape]
        out += [inst.name for sh in shapes
                if not sh.is_tuple and int(np.prod(sh.dims)) == elements]
    return out


def test_gpt_train_step_on_the_cpu_backend_equals_jax_jit():
    """A two-layer GPT's training step (plain causal attention, tied embedding, cross-
    entropy, AdamW): the loss as jax.jit's, the moments (linear in the gradients) within
    bf16 noise, the updated parameters within twice the learning rate."""
    import functools

    from benchmarks.heldout_programs import gpt_train_step
    args, heads, _ = _small_gpt()
    f = functools.partial(gpt_train_step, heads=heads)
    want = jax.jit(f)(*args)
    got = runtime.jit(f)(*args)
    assert abs(float(np.asarray(got[0])) - float(want[0])) <= 1e-3 * abs(float(want[0]))
    for which in (2, 3):                             # m, v
        for k, w in want[which].items():
            w, g = np.asarray(w, np.float64), np.asarray(got[which][k], np.float64)
            assert np.max(np.abs(g - w)) <= 3e-2 * np.max(np.abs(w)), (which, k)
    for k, w in want[1].items():                     # parameters: lr 1e-3
        assert np.max(np.abs(np.asarray(got[1][k], np.float64) - np.asarray(w))) <= 2e-3, k
    assert float(np.asarray(got[4])) == float(want[4]) == 4.0


def test_every_layers_attention_fuses_though_cse_shared_their_causal_mask():
    """Both layers' attentions (forward and jax.grad's backward) become flash-attention
    fusions for h200, though CSE made the two layers read one causal mask and one -inf
    fill: each fusion takes its own copy (before, the two-layer training step fused no
    attention and the forward-only loss read the fill as an operand and failed to run).
    No buffer holds B·H·S·S scores or a mask of that size."""
    import functools

    from benchmarks.heldout_programs import gpt_loss, gpt_train_step
    args, heads, scores = _small_gpt()
    f = functools.partial(gpt_train_step, heads=heads)
    c = runtime.jit(f, target="h200").lower(*args).compile()
    kinds = [fusion_kind(i) for comp in c.module.computations for i in comp.instructions
             if i.opcode == "fusion"]
    assert kinds.count("attention") == 2 and kinds.count("attention_backward") == 2, kinds
    assert not _score_sized(c.module, scores)
    loss = functools.partial(gpt_loss, heads=heads)
    c = runtime.jit(loss, target="h200").lower(args[0], args[4]).compile()
    kinds = [fusion_kind(i) for comp in c.module.computations for i in comp.instructions
             if i.opcode == "fusion"]
    assert kinds.count("attention") == 2, kinds
    assert not _score_sized(c.module, scores)
    want = float(jax.jit(loss)(args[0], args[4]))
    assert abs(float(np.asarray(c(args[0], args[4]))) - want) <= 1e-3 * abs(want)


@pytest.mark.parametrize("name,tol", [("kv_decode", 1e-2), ("moe_grad", 2e-2),
                                      ("conv_bn_grad", 1e-5), ("lstm_grad", 1e-5)])
def test_more_heldout_programs_equal_jax_jit(name, tol):
    """A KV-cache decoding step, a top-2 mixture of experts' gradient, a ResNet block's
    gradient and an LSTM's (lax.scan) gradient, at small sizes: every output as jax.jit's
    on the CPU backend, with the default pipeline and with h200's."""
    import benchmarks.heldout_programs as hp
    fn = getattr(hp, name)
    args = hp.more_args(np.random.default_rng(11), name, small=True)
    want = jax.tree.leaves(jax.jit(fn)(*args))
    for kw in ({}, {"target": "h200"}):
        got = jax.tree.leaves(runtime.jit(fn, **kw)(*args))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
            assert g.shape == w.shape
            assert np.max(np.abs(g - w)) <= tol * max(np.max(np.abs(w)), 1e-30), (name, kw)


def test_a_decoding_step_is_not_a_flash_attention_and_says_why():
    """One query row per head over a KV cache: the dots stay library GEMMs (the flash
    kernel's grid would be one program per head), and explain-fusion says so."""
    import benchmarks.heldout_programs as hp
    from passes.fusion import report_for
    args = hp.more_args(np.random.default_rng(3), "kv_decode", small=True)
    c = runtime.jit(hp.kv_decode, target="h200").lower(*args).compile()
    kinds = [fusion_kind(i) for i in c.module.entry.instructions if i.opcode == "fusion"]
    assert "attention" not in kinds, kinds
    reasons = [d.reason for d in report_for(c.module).decisions if d.action == "attention"]
    assert any("1 query row(s) per batch and head (a decoding step)" in r for r in reasons)


def test_layout_copies_around_the_expert_gemms_are_not_gemm_prologues_or_epilogues():
    """The mixture of experts' dispatch einsum gives [T, D, E]; layout assignment re-lays
    it out expert-major for the batched GEMMs. Those copies change which dim is contiguous,
    so no GEMM fusion takes them in (read or stored across the old order, the expert GEMMs
    ran at a tenth of cuBLAS's rate on the H200), and explain-fusion says why."""
    import benchmarks.heldout_programs as hp
    from passes.fusion import report_for
    from passes.fusion.legality import _moves_minor_dim
    from passes.pipelines import PIPELINES
    args = hp.more_args(np.random.default_rng(0), "moe_grad", small=True)
    c = runtime.jit(hp.moe_grad, target="h200", pipeline=PIPELINES["default"]["cuda"]) \
        .lower(*args).compile()
    gemms = [i for i in c.module.entry.instructions
             if i.opcode == "fusion" and fusion_kind(i) == "gemm"]
    assert not [g.name for g in gemms
                if any(_moves_minor_dim(b) for b in g.attrs["calls"].instructions)]
    reasons = " ".join(d.reason for d in report_for(c.module).decisions)
    assert "operand is contiguous" in reasons and "re-lays out" in reasons


def test_a_scans_stacked_outputs_are_not_one_sibling_fusion():
    """Two stacked outputs of a scan written from one 128 KB carry: each is its own
    in-place update-slice fusion, not one multi-output fusion writing every stack each
    step (an LSTM's eleven stacks: 176 MB per step)."""
    import jax.numpy as jnp
    from passes.pipelines import PIPELINES

    def f(xs, w):
        def step(h, x):
            h = jnp.tanh(h @ w + x)
            return h, (h * 2.0, h + 1.0)
        return jax.lax.scan(step, jnp.zeros(xs.shape[1:], xs.dtype), xs)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((8, 64, 512)).astype(np.float32)
    w = (rng.standard_normal((512, 512)) * 0.03).astype(np.float32)
    c = runtime.jit(f, target="h200", pipeline=PIPELINES["default"]["cuda"]) \
        .lower(xs, w).compile()
    loop = next(i for i in c.module.entry.instructions if i.opcode == "while")
    updates = [sum(b.opcode == "dynamic-update-slice" for b in i.attrs["calls"].instructions)
               for i in loop.attrs["body"].instructions if i.opcode == "fusion"]
    assert updates.count(1) >= 2 and max(updates) == 1, updates
    got, want = jax.tree.leaves(c(xs, w)), jax.tree.leaves(jax.jit(f)(xs, w))
    for g, wv in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(wv), rtol=2e-5, atol=2e-5)
