"""Forward flash-attention kernel variants timed against each other in one process (GPU).

``python -m benchmarks.flash_sweep [--cases causal128,causal64,full128] [--out f.json]``

For each case (the issue's causal attention B2 H16 S4096 D128 bf16; the suite transformer's
B8 S1024 H16 D64 causal; B2 H16 S4096 D128 without a mask) it builds the attention fusion
through ``runtime.jit(backend="cuda")``, then times with ``triton.testing.do_bench``
(median):

- ``main``: the kernel as merged before this change (``codegen/triton/attention_main.py``
  when present: a copy of main's file, not in the repository), per config;
- ``new``: this tree's kernel per (BM, BN, warps, stages) config, and its variants
  (``VARIANTS``: constexpr overrides; ``noheavy``: the heaviest causal query blocks not
  launched first);
- ``tma`` (``--tma``): a sketch of the same loop reading q, k, v through tensor descriptors (Hopper's
  bulk tensor copies; causal or not, no bias/mask, head dim = its block), to see whether
  that path is worth bringing into the real kernel.

Every variant's output is poisoned before its run and compared with torch SDPA's on the same
tensors (‖out − ref‖ / ‖ref‖). The table is printed last, the rows written to ``--out``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

import numpy as np

CASES = {"causal128": (2, 16, 4096, 128, True), "causal64": (8, 16, 1024, 64, True),
         "full128": (2, 16, 4096, 128, False)}
CONFIGS = {128: [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 8, 4),
                 (128, 128, 8, 2), (128, 64, 4, 3), (128, 64, 8, 2), (128, 128, 4, 3)],
           64: [(64, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 4), (128, 64, 4, 3),
                (128, 64, 4, 4), (128, 128, 4, 3), (128, 128, 8, 3)]}
# this tree's kernel: constexpr overrides per variant (FwdLaunch.flags holds the defaults).
# Tried on the H200 and removed (benchmarks/NOTES.md, i14-flash): a lazy rescale (acc and l
# rescaled only on a row-max jump over 2^8: +9-15%, the block-wide branch costs more than
# the multiplies it saves) and Triton's warp specialization of the unmasked loop (no gain).
VARIANTS = {"new": {}, "noheavy": {"HEAVY_FIRST": False}}


def attention(causal: bool):
    def f(q, k, v):
        import jax
        import jax.numpy as jnp
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(q.shape[-1])
        if causal:
            n = q.shape[1]
            s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -1e30)
        p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)
    return f


def _tma_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _tma_fwd(Q, K, V, O, H, M, N, SCALE, CAUSAL: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, BD: tl.constexpr):
        # q, k, v, o laid out [B, S, H, D]: one (z, h) is a 2-D [S, D] view, rows H*D apart
        zh = tl.program_id(0)
        pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
        z = zh // H
        h = zh % H
        row = H * BD
        qd = tl.make_tensor_descriptor(Q + z * M * row + h * BD, shape=[M, BD],
                                       strides=[row, 1], block_shape=[BM, BD])
        kd = tl.make_tensor_descriptor(K + z * N * row + h * BD, shape=[N, BD],
                                       strides=[row, 1], block_shape=[BN, BD])
        vd = tl.make_tensor_descriptor(V + z * N * row + h * BD, shape=[N, BD],
                                       strides=[row, 1], block_shape=[BN, BD])
        od = tl.make_tensor_descriptor(O + z * M * row + h * BD, shape=[M, BD],
                                       strides=[row, 1], block_shape=[BM, BD])
        q = qd.load([pid_m * BM, 0])
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, BD], tl.float32)
        if CAUSAL:
            full = pid_m * BM // BN * BN
            hi = tl.minimum(N, pid_m * BM + BM)
        else:
            full = N
            hi = N
        for start in range(0, full, BN):
            k = kd.load([start, 0])
            s = tl.dot(q, k.T)
            m_new = tl.maximum(m_i, tl.max(s, 1) * SCALE)
            p = tl.math.exp2(s * SCALE - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = vd.load([start, 0])
            acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_new
        offs_m = pid_m * BM + tl.arange(0, BM)
        for start in range(full, hi, BN):
            k = kd.load([start, 0])
            s = tl.dot(q, k.T) * SCALE
            offs_n = start + tl.arange(0, BN)
            s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = vd.load([start, 0])
            acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_new
        od.store([pid_m * BM, 0], (acc / l_i[:, None]).to(od.dtype))
    return _tma_fwd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="causal128,causal64,full128")
    ap.add_argument("--out", default="")
    ap.add_argument("--configs", type=int, default=4, help="the first N configs per case")
    ap.add_argument("--main-configs", type=int, default=3,
                    help="main's kernel on the first N configs (0: not at all)")
    ap.add_argument("--variants", default="new,noheavy", help=",".join(VARIANTS))
    ap.add_argument("--tma", action="store_true", help="also the tensor-descriptor sketch")
    opts = ap.parse_args()
    import jax
    import jax.numpy as jnp
    import torch
    import triton
    from triton.testing import do_bench

    import runtime
    from codegen.triton import attention as new
    from passes.fusion import fusion_kind
    try:
        old = importlib.import_module("codegen.triton.attention_main")
    except ImportError:
        old = None
    print("triton", triton.__version__, "torch", torch.__version__,
          torch.cuda.get_device_name(), flush=True)
    try:
        triton.set_allocator(lambda size, align, stream: torch.empty(
            size, dtype=torch.int8, device="cuda"))
    except AttributeError:
        pass
    rows: list[dict] = []

    def bench(fn) -> float:
        return do_bench(fn, warmup=25, rep=100, return_mode="median")

    for case in opts.cases.split(","):
        b, h, s, d, causal = CASES[case]
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        key = jax.random.PRNGKey(hash(case) % 1000)
        q, k, v = (jax.random.normal(kk, (b, s, h, d), jnp.bfloat16)
                   for kk in jax.random.split(key, 3))
        f = attention(causal)
        comp = runtime.jit(f, backend="cuda").lower(q, k, v).compile()
        (fa,) = [i for i in comp.module.entry.instructions
                 if i.opcode == "fusion" and fusion_kind(i) == "attention"]
        tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (tq, tk, tv)), is_causal=causal).transpose(1, 2)
        ref32 = ref.float()
        out = torch.empty_like(ref).contiguous()

        def err() -> float:
            return float((out.float() - ref32).norm() / ref32.norm())

        def record(variant: str, cfg: Any, run, timed) -> None:
            row = {"case": case, "variant": variant, "cfg": cfg}
            try:
                out.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                row["err"] = err()
                row["ms"] = bench(timed)
                row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
            except Exception as e:  # noqa: BLE001  (a config that does not fit, a compile error)
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)

        sdpa_args = tuple(t.transpose(1, 2) for t in (tq, tk, tv))
        record("sdpa", None, lambda: out.copy_(ref), lambda: torch.nn.functional
               .scaled_dot_product_attention(*sdpa_args, is_causal=causal))
        configs = CONFIGS[d][:opts.configs]
        for rep in range(2 if opts.main_configs else 0):   # twice: the run-to-run spread
            for cfg in CONFIGS[d][:opts.main_configs if rep == 0 else 1]:
                if old is None:
                    break
                old._TUNED.clear()
                old._candidates = lambda *a, cfg=cfg: [cfg]
                record(f"main{rep}", cfg, lambda: old.flash_attention(fa, [tq, tk, tv], out),
                       lambda: old.flash_attention(fa, [tq, tk, tv], out))
        run = new.FwdLaunch(fa, [tq, tk, tv], out)
        for cfg in configs:
            for name in opts.variants.split(","):
                flags = VARIANTS[name]
                if name == "noheavy" and not causal:
                    continue
                record(name, cfg, lambda: (run.launch(cfg, **flags), run.finish()),
                       lambda: run.launch(cfg, **flags))
        if not opts.tma:
            continue
        tma = _tma_kernel()
        scale = 1.4426950408889634 / float(np.sqrt(d))
        for cfg in configs[:6]:
            bm, bn, warps, stages = cfg
            grid = (b * h, triton.cdiv(s, bm))

            def go():
                tma[grid](tq, tk, tv, out, h, s, s, scale, CAUSAL=causal, BM=bm, BN=bn,
                          BD=d, num_warps=warps, num_stages=stages)
            record("tma", cfg, go, go)
    if opts.out:
        with open(opts.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    print(f"\n{'case':10s} {'variant':12s} {'config':18s} {'ms':>7s} {'TFLOP/s':>8s} {'err':>8s}")
    for r in rows:
        cfg = str(tuple(r["cfg"])) if r["cfg"] else "-"
        if "error" in r:
            print(f"{r['case']:10s} {r['variant']:12s} {cfg:18s} ERROR {r['error'][:60]}")
        else:
            print(f"{r['case']:10s} {r['variant']:12s} {cfg:18s} {r['ms']:7.3f} "
                  f"{r['tflops']:8.1f} {r['err']:8.1e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
