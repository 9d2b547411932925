"""Generated Triton kernels for the anchor fusions at full size, on the GPU, next to jax.jit.

Run ON the GPU machine from the repository root (the repo is not installed there):

    PYTHONUNBUFFERED=1 python3 benchmarks/triton_kernels.py [--no-autotune] [--out FILE]

For each kernel: ‖out − ref‖/‖ref‖ against torch on upcast (f32/f64) inputs, the median time
(triton.testing.do_bench, CUDA events), jax.jit of the same function on the same inputs
(median wall per call: do_bench around a call + block_until_ready), the floor from the two
numbers (bytes / measured copy bandwidth, flops / measured bf16 matmul rate), and the
achieved GB/s or TFLOP/s. Prints a markdown table last.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

import hlo  # noqa: E402
from codegen.triton import compile_fusion  # noqa: E402

ANCHORS = "/work/shared/anchors/xla_gpu_h200"
HERE = os.path.dirname(os.path.abspath(__file__))


def anchor_text(name: str) -> str:
    for d in (ANCHORS, os.path.join(HERE, "..", "passes", "fusion"), os.path.join(HERE, "anchors")):
        p = os.path.join(d, name)
        if os.path.exists(p):
            return open(p).read()
    raise FileNotFoundError(name)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def ceilings() -> tuple[float, float]:
    n = 1 << 28   # 1 GiB of f32
    a = torch.empty(n, device="cuda")
    a.normal_()
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a))
    bw = 2 * a.numel() * 4 / (ms * 1e-3)
    del a, b
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench(lambda: x @ y)
    rate = 2 * 8192 ** 3 / (ms * 1e-3)
    return bw, rate


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    if torch.isnan(o).any():
        return float("nan")
    return float(torch.linalg.norm(o - r) / torch.linalg.norm(r))


GEMM_FUSIONS = """HloModule gemms

%fused_gemm_gelu (x: bf16[4096,4096], w: bf16[4096,16384]) -> bf16[4096,16384] {
  %x = bf16[4096,4096]{1,0} parameter(0)
  %w = bf16[4096,16384]{1,0} parameter(1)
  %d = bf16[4096,16384]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %m2 = bf16[4096,16384]{1,0} multiply(%d, %d)
  %m3 = bf16[4096,16384]{1,0} multiply(%m2, %d)
  %c1 = bf16[] constant(0.04468)
  %b1 = bf16[4096,16384]{1,0} broadcast(%c1), dimensions={}
  %m4 = bf16[4096,16384]{1,0} multiply(%m3, %b1)
  %a1 = bf16[4096,16384]{1,0} add(%d, %m4)
  %c2 = bf16[] constant(0.7969)
  %b2 = bf16[4096,16384]{1,0} broadcast(%c2), dimensions={}
  %m5 = bf16[4096,16384]{1,0} multiply(%a1, %b2)
  %cv = f32[4096,16384]{1,0} convert(%m5)
  %th = f32[4096,16384]{1,0} tanh(%cv)
  %cb = bf16[4096,16384]{1,0} convert(%th)
  %c3 = bf16[] constant(1)
  %b3 = bf16[4096,16384]{1,0} broadcast(%c3), dimensions={}
  %a2 = bf16[4096,16384]{1,0} add(%cb, %b3)
  %c4 = bf16[] constant(0.5)
  %b4 = bf16[4096,16384]{1,0} broadcast(%c4), dimensions={}
  %m6 = bf16[4096,16384]{1,0} multiply(%a2, %b4)
  ROOT %m7 = bf16[4096,16384]{1,0} multiply(%d, %m6)
}

%fused_s8_gemm (a: s8[1024,512], b: bf16[512,2048]) -> bf16[1024,2048] {
  %a = s8[1024,512]{1,0} parameter(0)
  %b = bf16[512,2048]{1,0} parameter(1)
  %ac = bf16[1024,512]{1,0} convert(%a)
  %d2 = bf16[1024,2048]{1,0} dot(%ac, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %c = bf16[] constant(0.125)
  %cb2 = bf16[1024,2048]{1,0} broadcast(%c), dimensions={}
  %mul = bf16[1024,2048]{1,0} multiply(%d2, %cb2)
  ROOT %neg = bf16[1024,2048]{1,0} negate(%mul)
}

ENTRY %main (px: bf16[4096,4096], pw: bf16[4096,16384], pa: s8[1024,512], pb: bf16[512,2048]) -> (bf16[4096,16384], bf16[1024,2048]) {
  %px = bf16[4096,4096]{1,0} parameter(0)
  %pw = bf16[4096,16384]{1,0} parameter(1)
  %pa = s8[1024,512]{1,0} parameter(2)
  %pb = bf16[512,2048]{1,0} parameter(3)
  %g1 = bf16[4096,16384]{1,0} fusion(%px, %pw), kind=kCustom, calls=%fused_gemm_gelu, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %g2 = bf16[1024,2048]{1,0} fusion(%pa, %pb), kind=kCustom, calls=%fused_s8_gemm, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  ROOT %t = (bf16[4096,16384]{1,0}, bf16[1024,2048]{1,0}) tuple(%g1, %g2)
}
"""


def gelu_t(d: torch.Tensor) -> torch.Tensor:
    return d * (0.5 * (1 + torch.tanh(0.7969 * (d + 0.04468 * d * d * d))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-autotune", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "triton_kernels.md"))
    opts = ap.parse_args()
    autotune = not opts.no_autotune
    import jax
    import jax.numpy as jnp
    dev = torch.cuda.get_device_name()
    print(f"device {dev}; torch {torch.__version__}, triton {triton.__version__}, jax {jax.__version__}")
    bw, rate = ceilings()
    print(f"measured copy bandwidth {bw / 1e9:.0f} GB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(shape, dtype):
        return torch.randn(shape, device="cuda", generator=g).to(dtype)

    def to_jax(t):
        return jax.dlpack.from_dlpack(t)

    cases = []   # (label, fusion, inputs, ref_fn, jax_fn, bytes, flops)
    sm = hlo.parse_hlo(anchor_text("xla_softmax_f32.hlo.txt")).entry.root
    x = randn((8192, 4096), torch.float32)
    cases.append(("softmax f32 [8192,4096]", sm, [x], lambda: torch.softmax(x.double(), -1),
                  lambda a: jax.nn.softmax(a, axis=-1), 2 * x.numel() * 4, 0))
    ln = hlo.parse_hlo(anchor_text("xla_layernorm_bf16.hlo.txt")).entry.root
    xb, gg, bb = randn((8192, 4096), torch.bfloat16), randn((4096,), torch.bfloat16), randn((4096,), torch.bfloat16)

    def ln_ref():
        xf = xb.float()
        mu = xf.mean(-1, keepdim=True)
        var = ((xf - mu) ** 2).mean(-1, keepdim=True)
        return (xf - mu) * torch.rsqrt(var + 1e-5) * gg.float() + bb.float()

    def ln_jax(g_, x_, b_):
        mu = jnp.mean(x_.astype(jnp.float32), -1, keepdims=True).astype(x_.dtype)
        d = x_ - mu
        var = jnp.mean((d * d).astype(jnp.float32), -1, keepdims=True).astype(x_.dtype)
        return d * jax.lax.rsqrt(var + jnp.bfloat16(1e-5)) * g_ + b_
    cases.append(("layer norm bf16 [8192,4096]", ln, [gg, xb, bb], ln_ref, ln_jax,
                  2 * xb.numel() * 2, 0))
    mlp = hlo.parse_hlo(anchor_text("xla_mlp_bf16.hlo.txt"))
    (gelu_f,) = [i for i in mlp.entry.instructions if i.opcode == "fusion"]
    h = randn((4096, 16384), torch.bfloat16)

    def gelu_j(a):
        return a * (0.5 * (1 + jnp.tanh(jnp.bfloat16(0.7969) * (a + jnp.bfloat16(0.04468) * a * a * a))))
    cases.append(("MLP gelu loop fusion bf16 [4096,16384]", gelu_f, [h], lambda: gelu_t(h.float()),
                  gelu_j, 2 * h.numel() * 2, 0))
    gm = hlo.parse_hlo(GEMM_FUSIONS)
    g1, g2 = gm.entry.root.operands
    xx, w1 = randn((4096, 4096), torch.bfloat16) * 0.05, randn((4096, 16384), torch.bfloat16) * 0.05
    cases.append(("GEMM+gelu epilogue bf16 4096x4096 @ 4096x16384", g1, [xx, w1],
                  lambda: gelu_t(xx.float() @ w1.float()), lambda a, b: gelu_j(a @ b),
                  (xx.numel() + w1.numel() + 4096 * 16384) * 2, 2 * 4096 * 4096 * 16384))
    a8 = torch.randint(-128, 128, (1024, 512), device="cuda", dtype=torch.int8, generator=g)
    b16 = randn((512, 2048), torch.bfloat16)
    cases.append(("-((a.astype(bf16) @ b) * 0.125) s8[1024,512] bf16[512,2048]", g2, [a8, b16],
                  lambda: -((a8.float() @ b16.float()) * 0.125),
                  lambda a, b: -((a.astype(jnp.bfloat16) @ b) * jnp.bfloat16(0.125)),
                  a8.numel() + b16.numel() * 2 + 1024 * 2048 * 2, 2 * 1024 * 512 * 2048))

    rows = []
    for label, fusion, ins, ref_fn, jfn, nbytes, flops in cases:
        t0 = time.time()
        k = compile_fusion(fusion, target="h200" if "H200" in dev else "h100", autotune=autotune)
        root = fusion.attrs["calls"].root
        dt = {"f32": torch.float32, "bf16": torch.bfloat16}[root.shape.dtype.name]
        out = torch.full(tuple(root.shape.dims), float("nan"), device="cuda", dtype=dt)
        k.launch([out], ins)          # autotunes on first use when asked
        torch.cuda.synchronize()
        out.fill_(float("nan"))
        k.launch([out], ins)
        torch.cuda.synchronize()
        gen_s = time.time() - t0
        err = rel_err(out, ref_fn())
        ms = bench(lambda: k.launch([out], ins))
        jins = [to_jax(t) for t in ins]
        jf = jax.jit(jfn)
        jout = jf(*jins).block_until_ready()
        jerr = rel_err(torch.from_dlpack(jout), ref_fn())
        xms = bench(lambda: jf(*jins).block_until_ready())
        floor = max(nbytes / bw, flops / rate) * 1e3
        ach = (f"{flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s" if flops and flops / rate > nbytes / bw
               else f"{nbytes / (ms * 1e-3) / 1e9:.0f} GB/s ({nbytes / (ms * 1e-3) / bw:.0%} of copy)")
        rows.append((label, k.name, k.template, k.config, ms, xms, floor, ach, err, jerr, gen_s))
        print(f"{label}: {k.name} {k.template} {k.config} {ms:.4f} ms vs XLA {xms:.4f} ms, "
              f"floor {floor:.4f} ms, err {err:.2e} (xla {jerr:.2e}), generate+compile+tune {gen_s:.1f} s",
              flush=True)
        del jins, jout
    lines = [f"Device: {dev}. Ceilings measured: copy {bw / 1e9:.0f} GB/s, bf16 matmul "
             f"{rate / 1e12:.0f} TFLOP/s. Autotune: {autotune}.", "",
             "| kernel | template / config | hlotk ms | XLA ms (wall) | ratio | floor ms | achieved | rel err (hlotk / XLA) |",
             "|---|---|---|---|---|---|---|---|"]
    for label, name, tmpl, cfg, ms, xms, floor, ach, err, jerr, _ in rows:
        lines.append(f"| {label} (`{name}`) | {tmpl} {cfg} | {ms:.4f} | {xms:.4f} | {ms / xms:.2f} | "
                     f"{floor:.4f} | {ach} | {err:.1e} / {jerr:.1e} |")
    table = "\n".join(lines)
    print(table)
    try:
        with open(opts.out, "w") as f:
            f.write(table + "\n")
    except OSError:
        pass


if __name__ == "__main__":
    main()
