"""The FFI handler's steps per call (gather, patch, launch) for one gpu_suite program, with
1 and 4 graph slots, and the native graph's node kinds (issue 12).

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.handler_split [--only adam_step]

Three call patterns: back-to-back (results dropped: two output address sets alternate),
one call at a time on an idle GPU, and calls keeping the last 4 results (five sets).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="adam_step")
    opts = ap.parse_args()
    import jax
    import torch
    import runtime
    from benchmarks.gpu_suite import programs
    from benchmarks.host_overhead import dispatch_us
    from runtime.cuda import executable_of
    for name, _, fn, args, *_ in programs():
        if name not in opts.only.split(","):
            continue
        dev = jax.device_put(args)
        for slots in ("4", "1"):
            os.environ["HLOTK_NATIVE_SLOTS"] = slots
            hc = runtime.jit(fn, backend="cuda").lower(*dev).compile()
            for _ in range(3):
                jax.block_until_ready(hc(*dev))
            g = executable_of(hc).native
            print(f"{name} slots={slots}: {g.describe()}", flush=True)
            g.reset_stats()
            d = dispatch_us(lambda: hc(*dev), budget_s=0.2, max_calls=300)
            s = g.stats()
            print(f"  back-to-back: {d:.1f} µs/call; handler gather {s['gather_us']:.2f} patch "
                  f"{s['patch_us']:.2f} launch {s['launch_us']:.2f} µs, nodes patched "
                  f"{s['nodes_patched'] / max(s['calls'], 1):.2f}", flush=True)
            g.reset_stats()
            walls = []
            for _ in range(30):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                jax.block_until_ready(hc(*dev))
                walls.append((time.perf_counter() - t0) * 1e6)
            s = g.stats()
            print(f"  idle GPU, one at a time: wall {sorted(walls)[15]:.1f} µs; handler gather "
                  f"{s['gather_us']:.2f} patch {s['patch_us']:.2f} launch {s['launch_us']:.2f}",
                  flush=True)
            g.reset_stats()
            d = dispatch_us(lambda: hc(*dev), keep=4, budget_s=0.1, max_calls=200)
            s = g.stats()
            print(f"  rotating (5 sets): {d:.1f} µs/call; handler gather {s['gather_us']:.2f} "
                  f"patch {s['patch_us']:.2f} launch {s['launch_us']:.2f}, nodes patched "
                  f"{s['nodes_patched'] / max(s['calls'], 1):.2f}", flush=True)
            del hc, g
        os.environ.pop("HLOTK_NATIVE_SLOTS", None)


if __name__ == "__main__":
    main()
