"""Sweep of the flash-attention backward kernels (codegen/triton/attention_backward.py) on
the GPU, beside torch SDPA's backward in the same process (issue 14).

For each shape (causal, bf16, [B, H, S, D]): the forward's row max / row sum from torch
(the inputs the fused backward reads), SDPA's gradients as the reference, then every
(kernel, config) of the sweep timed on its own with do_bench (median) and its output
checked against SDPA's (‖ours − SDPA‖ / ‖SDPA‖, outputs poisoned with NaN first). The
three kernels are separate launches, so the best total is the sum of each kernel's best
time; delta from the forward's output O (``run_delta_o``, what runs when the fusion reads
O) beside the rowsum(P∘dP) delta kernel. Optionally (``--old DIR``) the kernels of an
earlier version of the file (a copy importable as ``old_attention_backward``) at the
configs its autotuner chose.

    python -m benchmarks.attention_bwd_sweep --out sweep.json [--old path/to/dir]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

SHAPES = {"d128": (2, 16, 4096, 128), "d64": (4, 16, 2048, 64)}

# (BM, BN, warps, stages) per kernel and head dim (the first run's winners and neighbours;
# the first run also had a "fused" delta+dQ kernel and atomic dQ: both lost, see NOTES.md)
SWEEP = {
    128: {"delta": [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (128, 64, 4, 3)],
          "dq": [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (128, 32, 8, 3),
                 (64, 32, 4, 3)],
          "dkdv": [(64, 128, 8, 3), (64, 128, 8, 4), (32, 128, 8, 3), (64, 64, 8, 3),
                   (128, 64, 8, 3), (128, 128, 8, 3), (32, 64, 4, 3)]},
    64: {"delta": [(128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4), (64, 64, 4, 3)],
         "dq": [(64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (128, 64, 8, 4),
                (64, 32, 4, 3)],
         "dkdv": [(64, 128, 4, 3), (64, 128, 4, 4), (32, 128, 4, 3), (64, 64, 4, 4),
                  (128, 128, 8, 3), (64, 128, 8, 4)]},
}
# the configs the old autotuner chose (benchmarks/NOTES.md, issue 14 stage 4)
OLD = {128: [(False, (64, 32, 4, 3), (32, 64, 4, 3))], 64: [(True, (64, 64, 4, 3), (64, 64, 4, 3))]}


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def row_stats(q, k, scale):
    """The forward's row max and row sum of the causal scaled scores, per (b, h) chunk."""
    import torch
    B, H, S, _ = q.shape
    m = torch.empty(B, H, S, device=q.device, dtype=torch.float32)
    l_ = torch.empty_like(m)
    causal = torch.ones(S, S, device=q.device, dtype=torch.bool).tril()
    for b in range(B):
        s = torch.einsum("hqd,hkd->hqk", q[b].float(), k[b].float()) * scale
        s = s.masked_fill(~causal, float("-inf"))
        m[b] = s.amax(-1)
        l_[b] = torch.exp(s - m[b][..., None]).sum(-1)
        del s
    return m, l_


DEVICE = "cuda"
DTYPE = "bfloat16"     # --smoke: float16 (the interpreter mis-reads bf16 tensors)


def bench(fn) -> float:
    import triton.testing
    if DEVICE != "cuda":        # --smoke: the interpreter, one run, no timing
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def run_shape(name: str, old_mod, rows: list, fold_off: bool) -> dict:
    import torch
    from codegen.triton import attention_backward as ab
    from codegen.triton.parallel import collecting, precompile
    B, H, S, D = SHAPES[name]
    scale = 1.0 / math.sqrt(D)
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, S, D, device=DEVICE, dtype=getattr(torch, DTYPE))
                   for _ in range(4))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    og = sdpa(qg, kg, vg, is_causal=True, scale=scale)
    ref = torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True)
    t_sdpa_fwd = bench(lambda: sdpa(qg, kg, vg, is_causal=True, scale=scale))
    t_sdpa_bwd = bench(lambda: torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True))
    o = og.detach()
    rmax, rsum = row_stats(q, k, scale)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    # (H, M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C, FILL_M,
    #  DS_SCALE)
    common = (H, S, S, D, D, S, 1, scale, 1.0, 1.0, 0, ab.NO_WINDOW, float("-inf"), 0.0, scale)

    def launches(fold: bool):
        flags = dict(HAS_BIAS=False, HAS_MASK=False, MASK_KEEP=True, IEEE=False, FOLD=fold,
                     BD=D, BDV=D, CAUSAL=True, DIR=0, SKIP=True)
        return ab.Launches(q, k, v, do, rmax, rsum, dq, dk, dv, q, (0,) * 4, q, (0,) * 4,
                           common, flags, o)
    L = launches(True)
    sw = SWEEP[D]
    jobs = [("delta", c, lambda c=c: L.run_delta(c)) for c in sw["delta"]] + \
        [("dq", c, lambda c=c: L.run_dq(c)) for c in sw["dq"]] + \
        [("dkdv", c, lambda c=c: L.run_dkdv(c)) for c in sw["dkdv"]]
    t0 = time.time()
    with collecting() as collected:
        for _, _, fn in jobs:
            fn()
    st = precompile([], collected)
    print(f"[{name}] precompile {st} in {time.time() - t0:.1f}s", flush=True)
    # a correct delta first: every dQ and dK/dV check reads it
    L.run_delta(sw["delta"][0])
    delta_ref = (do.float() * o.float()).sum(-1)
    out = {"shape": name, "sdpa_fwd": t_sdpa_fwd, "sdpa_bwd": t_sdpa_bwd, "times": {}}
    print(f"[{name}] SDPA fwd {t_sdpa_fwd:.3f} ms, bwd {t_sdpa_bwd:.3f} ms; delta err "
          f"{rel(L.delta, delta_ref):.2e}", flush=True)
    best: dict[str, tuple] = {}
    for kind, cfg, fn in jobs:
        try:
            t = bench(fn)
        except Exception as e:  # noqa: BLE001  (out of resources: reported, skipped)
            print(f"[{name}] {kind} {cfg}: FAILED {type(e).__name__}: {str(e)[:120]}")
            continue
        # check: poison, run once, compare
        if kind == "delta":
            L.delta.fill_(float("nan"))
            fn()
            err = {"delta": rel(L.delta, delta_ref)}
        elif kind == "dq":
            dq.fill_(float("nan"))
            fn()
            err = {"dq": rel(dq, ref[0])}
        else:
            dk.fill_(float("nan"))
            dv.fill_(float("nan"))
            fn()
            err = {"dk": rel(dk, ref[1]), "dv": rel(dv, ref[2])}
        ok = all(e < 2e-2 for e in err.values())
        kern = fn()
        regs = (getattr(kern, "n_regs", -1), getattr(kern, "n_spills", -1))
        rows.append({"shape": name, "kernel": kind, "cfg": cfg, "ms": t, "err": err, "ok": ok,
                     "regs_spills": regs})
        out["times"][f"{kind} {cfg}"] = t
        print(f"[{name}] {kind:6s} {str(cfg):18s} {t:7.3f} ms  "
              + " ".join(f"{n} {e:.2e}" for n, e in err.items()) + ("" if ok else "  BAD")
              + f"  regs {regs[0]} spills {regs[1]}", flush=True)
        if ok and (kind not in best or t < best[kind][1]):
            best[kind] = (cfg, t)
        if kind == "delta":      # leave a correct delta for the next checks
            L.run_delta(sw["delta"][0])
    tb = {k: v[1] for k, v in best.items()}
    modes = {"split": tb.get("delta", 1e9) + tb.get("dq", 1e9) + tb.get("dkdv", 1e9)}
    # with O (the fusion reads the forward's output): delta = rowsum(dO ∘ O)
    t_delta_o = bench(L.run_delta_o)
    L.delta.fill_(float("nan"))
    L.run_delta_o()
    out["delta_from_O_err"] = rel(L.delta, delta_ref)
    print(f"[{name}] delta from O {t_delta_o:.3f} ms, err {out['delta_from_O_err']:.2e}",
          flush=True)
    modes["split_with_O"] = t_delta_o + tb.get("dq", 1e9) + tb.get("dkdv", 1e9)
    out["best"] = {k: [list(v[0]), v[1]] for k, v in best.items()}
    out["modes"] = modes
    out["delta_from_O"] = t_delta_o
    if fold_off and {"delta", "dq", "dkdv"} <= set(best):   # the exp2 fold's share
        L2 = launches(False)
        nf = {"delta": bench(lambda: L2.run_delta(best["delta"][0])),
              "dq": bench(lambda: L2.run_dq(best["dq"][0])),
              "dkdv": bench(lambda: L2.run_dkdv(best["dkdv"][0]))}
        dq.fill_(float("nan"))
        L2.run_dq(best["dq"][0])
        nf["dq_err"] = rel(dq, ref[0])
        out["no_fold"] = nf
        print(f"[{name}] FOLD off at the best configs: {nf}", flush=True)
    if old_mod is not None:
        # (the old kernels take no Q_DIV)
        out["old"] = run_old(old_mod, L, q, k, v, do, rmax, rsum, dq, dk, dv,
                             common[:6] + common[7:], D,
                             ref, name)
    print(f"[{name}] modes (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in modes.items()),
          flush=True)
    return out


def run_old(old, L, q, k, v, do, rmax, rsum, dq, dk, dv, common, D, ref, name) -> dict:
    """The previous kernels at the configs their autotuner chose: total ms, errors."""
    import torch
    import triton
    Z, H, M, _ = q.shape
    delta = torch.empty(Z, H, M, device=DEVICE, dtype=torch.float32)
    acc = torch.zeros(Z, H, M, D, device=DEVICE, dtype=torch.float32)
    flags = dict(HAS_BIAS=False, HAS_MASK=False, MASK_KEEP=True, IEEE=False, BD=D, BDV=D,
                 CAUSAL=True, DIR=0, SKIP=True)
    ins = (q, k, v, do, rmax, rsum, delta)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *rmax.stride(),
               *rsum.stride(), *delta.stride())
    res = {}
    launches = []
    for atomic, (bm, bn, w, s), (bm2, bn2, w2, s2) in OLD[D]:
        def launch(atomic=atomic, bm=bm, bn=bn, w=w, s=s, bm2=bm2, bn2=bn2, w2=w2, s2=s2):
            a = acc if atomic else delta
            if atomic:
                acc.zero_()
            old._bwd_dq[(triton.cdiv(M, bm), Z * H)](
                *ins, dq, q, q, *strides, *dq.stride(), *(0,) * 8, *common,
                DQ_PASS=not atomic, BM=bm, BN=bn, num_warps=w, num_stages=s, **flags)
            old._bwd_dkdv[(triton.cdiv(M, bn2), Z * H)](
                *ins, dk, dv, a, q, q, *strides, *dk.stride(), *dv.stride(),
                *(a.stride() if atomic else (0, 0, 0, 0)), *(0,) * 8, *common,
                ATOMIC_DQ=atomic, BM=bm2, BN=bn2, num_warps=w2, num_stages=s2, **flags)
            if atomic:
                dq.copy_(acc)
        launches.append((atomic, (bm, bn, w, s), (bm2, bn2, w2, s2), launch))
    if DEVICE == "cuda":
        from codegen.triton.parallel import collecting, precompile
        with collecting() as collected:
            for *_, launch in launches:
                launch()
        precompile([], collected)
    for atomic, (bm, bn, w, s), (bm2, bn2, w2, s2), launch in launches:
        t = bench(launch)
        for x in (dq, dk, dv):
            x.fill_(float("nan"))
        launch()
        err = [rel(a, b) for a, b in zip((dq, dk, dv), ref)]
        key = f"old {'atomic' if atomic else 'two-pass'} {(bm, bn, w, s)} {(bm2, bn2, w2, s2)}"
        res[key] = {"ms": t, "err": err}
        print(f"[{name}] {key}: {t:.3f} ms, err dq/dk/dv "
              + " ".join(f"{e:.2e}" for e in err), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--old", default="", help="a directory holding old_attention_backward.py")
    ap.add_argument("--shapes", default="d128,d64")
    ap.add_argument("--fold-off", action="store_true", help="also time FOLD=False")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on the CPU (TRITON_INTERPRET=1): checks only")
    opts = ap.parse_args()
    import torch
    if opts.smoke:
        global DEVICE, DTYPE
        DEVICE, DTYPE = "cpu", "float16"
        SHAPES.update(d128=(1, 2, 160, 128), d64=(1, 2, 200, 64))
        torch.cuda.get_device_name = lambda: "cpu (interpreter)"
    old = None
    if opts.old:
        sys.path.insert(0, opts.old)
        import old_attention_backward as old  # type: ignore[import-not-found]
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    rows: list = []
    results = []
    for name in opts.shapes.split(","):
        results.append(run_shape(name, old, rows, opts.fold_off))
        if opts.out:
            with open(opts.out, "w") as fh:
                json.dump({"device": torch.cuda.get_device_name(), "results": results,
                           "rows": rows}, fh, indent=1, default=str)
    print("\nshape  SDPA bwd   split  with O  old(best)")
    for r in results:
        old_best = min((v["ms"] for v in r.get("old", {}).values()), default=float("nan"))
        m = r["modes"]
        print(f"{r['shape']:5s} {r['sdpa_bwd']:8.3f} {m['split']:7.3f} {m['split_with_O']:7.3f}"
              f" {old_best:9.3f}  best {r['best']}")


if __name__ == "__main__":
    main()
