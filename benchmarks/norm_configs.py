"""Issue 13: what each candidate config of a row-normalization kernel costs to compile and
gains at run time (H200), to decide which candidates the pruned autotuning level compiles.

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.norm_configs

For softmax and layer norm at the suite's shapes and a few others users run (a vocabulary
softmax, short rows, bf16 RMSNorm), the program's single normalization kernel is generated
by the CUDA backend's compile, then each of its template's candidate configs is compiled
alone (wall seconds of the first launch, a fresh Triton cache, after one warm-up compile of
another kernel) and timed with ``triton.testing.do_bench`` (median, L2 flushed). Every
config's output is checked against the default config's.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, ".")
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="norm_configs_triton_")
os.environ.setdefault("HLOTK_CACHE_DIR", tempfile.mkdtemp(prefix="norm_configs_hlotk_"))
os.environ["HLOTK_AUTOTUNE"] = "0"

import numpy as np  # noqa: E402


def programs() -> list[tuple]:
    import jax
    import jax.numpy as jnp
    from jax import lax
    bf16 = jnp.bfloat16
    r = np.random.default_rng(0)

    def softmax(x):
        return jax.nn.softmax(x, axis=-1)

    def layernorm(g, x, b):
        mu = jnp.mean(x.astype(jnp.float32), -1, keepdims=True).astype(x.dtype)
        d = x - mu
        var = jnp.mean((d * d).astype(jnp.float32), -1, keepdims=True).astype(x.dtype)
        return d * lax.rsqrt(var + bf16(1e-5)) * g + b

    def rmsnorm(g, x):
        xf = x.astype(jnp.float32)
        return (xf * lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype) * g

    def f32(*s):
        return r.standard_normal(s).astype(np.float32)

    def b16(*s):
        return jnp.asarray(r.standard_normal(s), bf16)
    return [("softmax 8192x4096 f32", softmax, (f32(8192, 4096),)),
            ("softmax 4096x1024 f32", softmax, (f32(4096, 1024),)),
            ("softmax 2048x32000 f32", softmax, (f32(2048, 32000),)),
            ("layernorm 8192x4096 bf16", layernorm, (b16(4096), b16(8192, 4096), b16(4096))),
            ("rmsnorm 4096x2048 bf16", rmsnorm, (b16(2048), b16(4096, 2048)))]


def main() -> None:
    import torch
    import triton.testing

    import runtime
    from runtime.cuda import executable_of
    rows = []
    for name, fn, args in programs():
        c = runtime.jit(fn, backend="cuda", target="h200").lower(*args).compile()
        kernels = [k for k in executable_of(c)._triton_kernels() if k.template != "loop"]
        if len(kernels) != 1:
            print(name, "kernels", [(k.name, k.template) for k in kernels])
            continue
        (k,) = kernels
        from runtime.cuda.arena import torch_dtype
        # the kernel's own operands (its fused computation's parameters, in their order)
        ins = [torch.randn(tuple(s.dims), device="cuda").to(torch_dtype(s.dtype))
               for s in k.input_shapes]
        outs = [torch.empty(tuple(s.dims), device="cuda", dtype=torch_dtype(s.dtype))
                for s in k.output_shapes]
        cands = list(k.plan.candidates or [k.config])
        ref = None
        for cfg in cands:
            t0 = time.perf_counter()
            k.launch(outs, ins, config=cfg)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            got = outs[0].float().cpu().numpy().copy()
            if ref is None:
                ref = got
            err = float(np.max(np.abs(got - ref)) / max(1e-30, np.max(np.abs(ref))))
            ms = triton.testing.do_bench(lambda: k.launch(outs, ins, config=cfg), warmup=5,
                                         rep=40, return_mode="median")
            rows.append({"program": name, "config": cfg, "default": cfg == k.config,
                         "compile_s": compile_s, "us": ms * 1e3, "rel_err": err,
                         "predicted_us": k.predicted_us})
            print(f"| {name} | {json.dumps(cfg)} | {'*' if cfg == k.config else ''} | "
                  f"{compile_s:.3f} | {ms * 1e3:.1f} | {err:.1e} |", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "norm_configs.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
