"""Adam's flat CUDA C update kernel alone, by ``HLOTK_CUDA_C_FLAT_DIVSQRT`` mode (issue 13).

    PYTHONUNBUFFERED=1 python3 -m benchmarks.flat_divsqrt [--modes ieee,chunk,approx]

The CUDA C flat kernel of one Adam parameter update (p, g, m, v in; m, v, p out: 3 f32
divisions and a square root an element), compiled in each mode (codegen/cuda_c/flat.py)
and launched on torch tensors: the median of ``triton.testing.do_bench`` (L2 flushed
between calls) per shape, and whether each mode's outputs are ``ieee``'s bit for bit.
``--ncu``: launch each mode's kernel 3 times and stop (for Nsight Compute to read).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")

import numpy as np  # noqa: E402

SHAPES = [(1536, 1536), (1536, 768), (6144,)]


def adam_fusion(shape: tuple):
    """The fused update of adam_step (benchmarks/gpu_suite.py) as one loop fusion: m, v,
    p and the two bias corrections (one-element parameters)."""
    from tests.test_cuda_c import make
    s = "[" + ",".join(map(str, shape)) + "]"
    return make(f"""  %m = f32{s} parameter(0)
  %g = f32{s} parameter(1)
  %v = f32{s} parameter(2)
  %c1 = f32[] parameter(3)
  %c2 = f32[] parameter(4)
  %p = f32{s} parameter(5)
  %b1 = f32[] constant(0.9)
  %b1b = f32{s} broadcast(%b1), dimensions={{}}
  %mb = f32{s} multiply(%b1b, %m)
  %k1 = f32[] constant(0.1)
  %k1b = f32{s} broadcast(%k1), dimensions={{}}
  %gb = f32{s} multiply(%k1b, %g)
  %m2 = f32{s} add(%mb, %gb)
  %b2 = f32[] constant(0.999)
  %b2b = f32{s} broadcast(%b2), dimensions={{}}
  %vb = f32{s} multiply(%b2b, %v)
  %k2 = f32[] constant(0.001)
  %k2b = f32{s} broadcast(%k2), dimensions={{}}
  %g1 = f32{s} multiply(%k2b, %g)
  %g2 = f32{s} multiply(%g1, %g)
  %v2 = f32{s} add(%vb, %g2)
  %one = f32[] constant(1)
  %d1 = f32[] subtract(%one, %c1)
  %d2 = f32[] subtract(%one, %c2)
  %d1b = f32{s} broadcast(%d1), dimensions={{}}
  %mh = f32{s} divide(%m2, %d1b)
  %lrm = f32{s} multiply(%k2b, %mh)
  %d2b = f32{s} broadcast(%d2), dimensions={{}}
  %vh = f32{s} divide(%v2, %d2b)
  %sq = f32{s} sqrt(%vh)
  %e = f32[] constant(1e-08)
  %eb = f32{s} broadcast(%e), dimensions={{}}
  %den = f32{s} add(%sq, %eb)
  %upd = f32{s} divide(%lrm, %den)
  %p2 = f32{s} subtract(%p, %upd)
  ROOT %t = (f32{s}, f32{s}, f32{s}) tuple(%m2, %v2, %p2)""",
                [f"m: f32{s}", f"g: f32{s}", f"v: f32{s}", "c1: f32[]", "c2: f32[]",
                 f"p: f32{s}"], f"(f32{s}, f32{s}, f32{s})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="ieee,chunk,approx")
    ap.add_argument("--ncu", action="store_true")
    a = ap.parse_args()
    import torch
    from triton.testing import do_bench
    from codegen.cuda_c.kernel import compile_loop_fusion
    arch = "".join(map(str, torch.cuda.get_device_capability()))
    rng = np.random.default_rng(0)
    rows = []
    for shape in (SHAPES[:1] if a.ncu else SHAPES):
        f = adam_fusion(shape)
        host = [rng.standard_normal(shape).astype(np.float32) * 1e-3,
                rng.standard_normal(shape).astype(np.float32) * 1e-3,
                np.abs(rng.standard_normal(shape)).astype(np.float32) * 1e-6,
                np.asarray(np.float32(0.9 ** 3)), np.asarray(np.float32(0.999 ** 3)),
                rng.standard_normal(shape).astype(np.float32) * 0.02]
        dev = [torch.from_numpy(x).cuda() for x in host]
        bits = {}
        for mode in a.modes.split(","):
            os.environ["HLOTK_CUDA_C_FLAT_DIVSQRT"] = mode
            k = compile_loop_fusion(f, arch=arch, target="h200")
            outs = [torch.empty(shape, dtype=torch.float32, device="cuda") for _ in range(3)]
            if a.ncu:
                for _ in range(3):
                    k.launch(outs, dev)
                torch.cuda.synchronize()
                continue
            k.launch(outs, dev)
            torch.cuda.synchronize()
            bits[mode] = [o.cpu().numpy().view(np.uint32) for o in outs]
            ms = do_bench(lambda: k.launch(outs, dev), warmup=25, rep=200, return_mode="median")
            first = bits[a.modes.split(",")[0]]
            same = all(np.array_equal(x, y) for x, y in zip(bits[mode], first))
            rows.append((shape, mode, k.threads, k.blocks, 1e3 * ms,
                         7 * 4 * int(np.prod(shape)) / (ms * 1e6), same))
    if rows:
        print("| shape | mode | threads | blocks | µs (L2 flushed) | GB/s | bits = first mode |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.2f} | {r[5]:.0f} | {r[6]} |")


if __name__ == "__main__":
    main()
