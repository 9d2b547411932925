"""Does choosing cuBLAS's algorithm by measurement (as XLA's GEMM autotuner does) pay for
hlotk's library GEMMs? (lead, fourth 2026-11-26 session; run in the fifth: no.)

i14-qkv measured XLA's 8192x1024x3072 bf16 GEMM at 65.3 µs (an autotuned nvjet kernel)
against 72.6 µs for ``torch.mm`` (cuBLAS's heuristic pick) on the H200; the transformer
block's six GEMMs are ~295 of its ~400 µs. This times, per shape of the suite's
transformer block, on the same inputs:

- ``torch``: ``torch.mm`` / ``torch._addmm_activation`` as hlotk calls them today;
- ``cublasLt``: the same calls with ``torch.backends.cuda.preferred_blas_library("cublaslt")``
  (cuBLASLt's heuristic, the library XLA's GEMMs go through);
- ``tunable``: the same calls with PyTorch's TunableOp on (``torch.cuda.tunable``: it
  times the cuBLAS/cuBLASLt algorithms of each new GEMM shape once, then reuses the
  fastest; results go to a CSV file hlotk could keep in its cache directory);
- ``xla``: ``jax.jit`` of the same product (and epilogue).

Each number is device time per call from CUPTI (kernels and memsets summed over 20 calls:
``kernel_profile._trace_kernels``), so JAX's host dispatch does not count against XLA.

    python -m benchmarks.gemm_algo_probe [--out FILE]

Prediction: tunable within 2% of torch for the 1024-wide GEMMs, 5-10% faster for the
3072- and 4096-wide ones (the shapes where XLA's pick beat the heuristic); if so, the
transformer's device time drops by ~15 µs and the CSV belongs in the compile cache.

Result (H200, fifth 2026-11-26 session, benchmarks/NOTES.md): wrong. The three torch paths
are within 0.4% of each other on every shape; XLA's pick is 6% faster on 8192x1024x3072 and
3% on the residual GEMM, out of reach through torch.
"""
from __future__ import annotations

import argparse
import os
import tempfile

SHAPES = [  # (M, K, N, epilogue)
    (8192, 1024, 1024, "none"), (8192, 1024, 3072, "none"),
    (8192, 1024, 4096, "gelu"), (8192, 4096, 1024, "residual")]


def _torch_call(epi: str):
    import torch

    def run(a, b, bias, c):
        if epi == "gelu":
            return torch._addmm_activation(bias, a, b, use_gelu=True)
        if epi == "residual":
            return torch.addmm(c, a, b)
        return torch.mm(a, b)
    return run


def _xla_call(epi: str):
    import jax
    import jax.numpy as jnp

    def f(a, b, bias, c):
        y = a @ b
        if epi == "gelu":
            return jax.nn.gelu(y + bias, approximate=True)
        if epi == "residual":
            return y + c
        return y
    return jax.jit(f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    opts = ap.parse_args()
    import jax
    import torch
    from benchmarks.kernel_profile import _trace_kernels

    def bench(fn, steps: int = 20) -> float:
        """Device µs per call (ms, as the table's callers scale it by 1e3)."""
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        recs = _trace_kernels(fn, steps)
        return sum(r["dur"] for r in recs) / steps / 1e3
    rows = ["| M x K x N | epilogue | torch µs | cublasLt µs | tunable µs | XLA µs | "
            "lt / torch | tunable / torch |", "|---|---|---|---|---|---|---|---|"]
    for m, k, n, epi in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        bias = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
        c = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        call = _torch_call(epi)
        t_torch = bench(lambda: call(a, b, bias, c)) * 1e3
        torch.backends.cuda.preferred_blas_library("cublaslt")
        t_lt = bench(lambda: call(a, b, bias, c)) * 1e3
        torch.backends.cuda.preferred_blas_library("default")
        csv = os.path.join(tempfile.mkdtemp(), "tunable.csv")
        torch.cuda.tunable.enable(True)
        torch.cuda.tunable.tuning_enable(True)
        torch.cuda.tunable.set_filename(csv)
        call(a, b, bias, c)                 # tunes this shape
        torch.cuda.synchronize()
        t_tune = bench(lambda: call(a, b, bias, c)) * 1e3
        torch.cuda.tunable.enable(False)
        xa, xb, xbias, xc = (jax.dlpack.from_dlpack(t) for t in (a, b, bias, c))
        xf = _xla_call(epi)
        jax.block_until_ready(xf(xa, xb, xbias, xc))
        t_xla = bench(lambda: jax.block_until_ready(xf(xa, xb, xbias, xc))) * 1e3
        rows.append(f"| {m} x {k} x {n} | {epi} | {t_torch:.1f} | {t_lt:.1f} | {t_tune:.1f} | "
                    f"{t_xla:.1f} | {t_lt / t_torch:.3f} | {t_tune / t_torch:.3f} |")
        print(rows[-1], flush=True)
    text = "\n".join(rows)
    print(text)
    if opts.out:
        with open(opts.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
