"""Which ways of writing attention become flash-attention fusions (issue 14), deviceless.

``python -m benchmarks.attention_forms [--out benchmarks/attention_forms.md]`` compiles each
form below, forward and ``jax.grad`` (w.r.t. q, k, v), through the CUDA pipeline for an
H200 on this machine (no GPU needed), and reports the fusions it got, the largest buffer and
whether any buffer holds the B·H·S·S scores; for a form that does not fuse, the matcher's
reason. Forms are the ones people write: ``jax.nn.dot_product_attention`` (also with grouped
kv heads, as Llama-style models call it), Flax's
(pre-scaled q, softmax in the input dtype, ``finfo.min`` fill), einsum with an f32 softmax,
a softmax written by hand, heads-first layouts, ``q @ k.T``, sliding windows, grouped-query
attention in its two group orders, and jax.nn's other arguments (a local window, key
lengths, a mask, a bias). The bias row's largest buffer is the bias itself in f32 (it
counts as "scores in memory" by size: [1, h, s, s] f32 is as large as the bf16 scores).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

B, S, H, D = 2, 256, 4, 64
SCALE = float(1 / np.sqrt(D))   # a Python float: weakly typed, q stays bf16


def _forms() -> dict:
    import jax
    import jax.numpy as jnp

    def softmax_attn(s, v, spec="bhqk,bkhd->bqhd", upcast=True):
        s = s.astype(jnp.float32) if upcast else s
        return jnp.einsum(spec, jax.nn.softmax(s, axis=-1).astype(v.dtype), v)

    def scores(q, k, spec="bqhd,bkhd->bhqk"):
        return jnp.einsum(spec, q, k)

    tril = jnp.tril(jnp.ones((S, S), bool))
    pos = jnp.arange(S)

    def hand(q, k, v):
        s = scores(q, k).astype(jnp.float32) * SCALE
        e = jnp.exp(s - s.max(-1, keepdims=True))
        return jnp.einsum("bhqk,bkhd->bqhd", (e / e.sum(-1, keepdims=True)).astype(v.dtype), v)

    def window(q, k, v):
        keep = (pos[:, None] >= pos[None, :]) & (pos[:, None] - pos[None, :] < 64)
        return softmax_attn(jnp.where(keep, scores(q, k) * SCALE, -jnp.inf), v)

    def gqa(group_major: bool, scale: float = SCALE):
        g = 2
        spec_s = "bqkgd,bskd->bgkqs" if group_major else "bqkgd,bskd->bkgqs"
        spec_o = "bgkqs,bskd->bqkgd" if group_major else "bkgqs,bskd->bqkgd"

        def f(q, k, v):
            s = jnp.einsum(spec_s, q.reshape(B, S, H // g, g, D), k)
            return softmax_attn(s * scale if scale != 1 else s, v, spec_o).reshape(B, S, H, D)
        return f

    bshd, bhsd = (B, S, H, D), (B, H, S, D)
    kv_gqa = (B, S, H // 2, D)
    rng = np.random.default_rng(0)
    lengths = jnp.array([S, S // 2], jnp.int32)
    user_mask = jnp.asarray(rng.random((B, 1, S, S)) > 0.2)
    user_bias = jnp.asarray(rng.standard_normal((1, H, S, S)), jnp.bfloat16)

    def dpa(**kw):
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw)
    return {
        "jax.nn.dot_product_attention causal": (
            lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                         implementation="xla"), bshd, bshd),
        "jax.nn.dot_product_attention, GQA (2 kv heads)": (
            lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                         implementation="xla"), bshd, kv_gqa),
        "jax.nn.dot_product_attention plain": (
            lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla"),
            bshd, bshd),
        "einsum, f32 softmax, causal where": (
            lambda q, k, v: softmax_attn(jnp.where(tril, scores(q, k) * SCALE, -1e30), v),
            bshd, bshd),
        "Flax style: q pre-scaled, softmax in bf16": (
            lambda q, k, v: softmax_attn(scores(q * SCALE, k), v, upcast=False), bshd, bshd),
        "finfo.min fill": (
            lambda q, k, v: softmax_attn(jnp.where(tril, scores(q, k) * SCALE,
                                                   jnp.finfo(jnp.float32).min), v), bshd, bshd),
        "softmax by hand (no stop_gradient)": (hand, bshd, bshd),
        "heads first [b,h,s,d]": (
            lambda q, k, v: softmax_attn(scores(q, k, "bhqd,bhkd->bhqk") * SCALE, v,
                                         "bhqk,bhkd->bhqd"), bhsd, bhsd),
        "q @ k.T, heads first": (
            lambda q, k, v: jax.nn.softmax((q @ jnp.swapaxes(k, -1, -2)).astype(jnp.float32)
                                           * SCALE, axis=-1).astype(v.dtype) @ v, bhsd, bhsd),
        "sliding window 64 (two iota compares)": (window, bshd, bshd),
        "GQA, kv heads repeated": (
            lambda q, k, v: softmax_attn(scores(q, jnp.repeat(k, 2, axis=2)) * SCALE,
                                         jnp.repeat(v, 2, axis=2)), bshd, kv_gqa),
        "GQA grouped einsum, [b,kv,g,q,k]": (gqa(False), bshd, kv_gqa),
        "GQA grouped einsum, [b,g,kv,q,k]": (gqa(True), bshd, kv_gqa),
        "GQA grouped einsum, [b,g,kv,q,k], no scale, no mask": (gqa(True, 1), bshd, kv_gqa),
        "jax.nn local_window_size=(64, 0), causal": (
            dpa(is_causal=True, local_window_size=(64, 0)), bshd, bshd),
        "jax.nn local_window_size=(64, 0), GQA": (
            dpa(is_causal=True, local_window_size=(64, 0)), bshd, kv_gqa),
        "jax.nn key_value_seq_lengths": (dpa(key_value_seq_lengths=lengths), bshd, bshd),
        "jax.nn mask= (a boolean [b,1,s,s] argument)": (dpa(mask=user_mask), bshd, bshd),
        "jax.nn bias= ([1,h,s,s]), GQA": (dpa(bias=user_bias), bshd, kv_gqa),
    }


def measure(fn, q_shape, kv_shape, grad: bool) -> dict:
    import jax
    import jax.numpy as jnp

    import runtime
    from passes.fusion import fusion_kind
    from passes.fusion.explain import report_for
    from passes.pipelines import PIPELINES
    args = (jax.ShapeDtypeStruct(q_shape, jnp.bfloat16),
            jax.ShapeDtypeStruct(kv_shape, jnp.bfloat16),
            jax.ShapeDtypeStruct(kv_shape, jnp.bfloat16))
    f = jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2), argnums=(0, 1, 2)) \
        if grad else fn
    c = runtime.jit(f, target="h200", pipeline=PIPELINES["default"]["cuda"]).lower(*args).compile()
    kinds = [fusion_kind(i) for i in c.module.entry.instructions if i.opcode == "fusion"]
    biggest = max((b.size for b in c.buffer_assignment().buffers), default=0)
    scores = B * H * S * S * 2          # the scores in bf16, the smallest they can be
    report = report_for(c.module)
    why = ""
    if report is not None and "attention" not in kinds:
        misses = [d.reason for d in report.decisions if "attention" in d.reason.lower()
                  and not d.fused]
        why = misses[0] if misses else ""
    fused = [i for i in c.module.entry.instructions if i.opcode == "fusion"
             and fusion_kind(i) in ("attention", "attention_backward")]
    # what the kernels read besides q, k, v (dO, m, l, O): a mask tensor, or the mask
    # recognized as causal / a band the kernels test (i14-window)
    masks = "operand" if any(o.shape.dtype.name == "pred" for i in fused for o in i.operands) \
        else ""
    for i in fused[:1]:
        cfg = str(i.attrs.get("backend_config", ""))
        if '"window":' in cfg:
            masks = cfg.split('"window":"')[1].split('"')[0]
        elif '"causal":true' in cfg and not masks:
            masks = "causal"
    return {"fwd": kinds.count("attention"), "bwd": kinds.count("attention_backward"),
            "biggest_mib": biggest / 2**20, "scores_in_memory": biggest >= scores, "why": why,
            "masks": masks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/attention_forms.md")
    opts = ap.parse_args()
    rows = []
    for name, (fn, qs, kvs) in _forms().items():
        for grad in (False, True):
            try:
                r = measure(fn, qs, kvs, grad)
            except Exception as e:  # noqa: BLE001  (a form the pipeline refuses: say so)
                r = {"fwd": "-", "bwd": "-", "biggest_mib": float("nan"), "masks": "",
                     "scores_in_memory": "?", "why": f"{type(e).__name__}: {e}"[:200]}
            fused = r["fwd"] == 1 and (not grad or r["bwd"] == 1)
            rows.append(f"| {name} | {'grad' if grad else 'forward'} | "
                        f"{'yes' if fused else 'no'} | {r['fwd']} / {r['bwd']} | "
                        f"{r['biggest_mib']:.2f} | {'yes' if r['scores_in_memory'] is True else 'no'}"
                        f" | {r['masks']} | {r['why'][:160]} |")
            print(rows[-1], flush=True)
    head = [f"# Attention forms that fuse (issue 14; deviceless, CUDA pipeline, target h200)",
            "", f"bf16 q/k/v, B={B} S={S} H={H} D={D} (GQA: {H // 2} kv heads); "
            "`python -m benchmarks.attention_forms`.", "",
            "| form | program | fused | attention / backward fusions | largest buffer MiB "
            "| B·H·S·S scores in memory | mask (operand, or tested in the kernels) | why not |",
            "|---|---|---|---|---|---|---|---|"]
    text = "\n".join(head + rows) + "\n"
    tmp = opts.out + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, opts.out)
    print(f"wrote {opts.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
