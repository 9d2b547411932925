"""Does cuBLASLt's GELU epilogue beat a GEMM plus a separate GELU kernel? (issue 14, the
transformer block's MLP: gelu(h @ w1), bf16 [8192,1024] x [1024,4096])

    python -m benchmarks.gemm_epilogue_probe      (GPU; prints µs per call, do_bench medians)

Rows: torch.mm alone; torch.mm then torch's tanh-GELU (two kernels, as hlotk runs it now);
torch._addmm_activation(zero bias, use_gelu=True) (one cuBLASLt call with the GELU_BIAS
epilogue); the largest difference of the fused result from jax.nn.gelu(approximate=True)
of jax's own bf16 matmul, in bf16 ulps of the reference.
"""
from __future__ import annotations


def main() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import triton.testing
    rows = []
    for m, k, n in ((8192, 1024, 4096), (8192, 4096, 1024), (2048, 4096, 4096)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / 32
        zero = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

        def mm() -> None:
            torch.mm(a, b, out=out)

        def mm_gelu() -> None:
            torch.mm(a, b, out=out)
            torch.nn.functional.gelu(out, approximate="tanh")

        def lt_gelu() -> None:
            torch._addmm_activation(zero, a, b, use_gelu=True)

        t = {name: triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median") * 1e3
             for name, f in (("mm", mm), ("mm+gelu", mm_gelu), ("lt gelu", lt_gelu))}
        fused = torch._addmm_activation(zero, a, b, use_gelu=True).float().cpu().numpy()
        mm_gelu()
        split = out.float().cpu().numpy()
        ja = jnp.asarray(a.float().cpu().numpy(), jnp.bfloat16)
        jb = jnp.asarray(b.float().cpu().numpy(), jnp.bfloat16)
        want = np.asarray(jax.jit(lambda x, y: jax.nn.gelu(x @ y, approximate=True))(ja, jb),
                          np.float32)
        scale = float(np.max(np.abs(want)))

        def err(x: np.ndarray) -> str:
            d = np.abs(x - want)
            i = np.unravel_index(np.argmax(d), d.shape)
            return f"max |diff| {d[i]:.2e} at want={want[i]:.4f} (max |want| {scale:.2f})"
        rows.append(f"{m}x{k}x{n}: mm {t['mm']:.1f} us, mm+gelu {t['mm+gelu']:.1f}, "
                    f"cuBLASLt gelu epilogue {t['lt gelu']:.1f}; epilogue vs jax: {err(fused)}; "
                    f"mm+gelu vs jax: {err(split)}")
        print(rows[-1], flush=True)


if __name__ == "__main__":
    main()
