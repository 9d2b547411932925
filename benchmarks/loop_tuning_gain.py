"""What timing a kernel's candidate configs gains over the template's own config (issue 13,
i13-cold5): each program compiled on the GPU at ``HLOTK_AUTOTUNE=2`` (every candidate of
every Triton kernel timed with ``triton.testing.do_bench``), then, per kernel, the default
config's time beside the best one's, read back from the tuning table
(``codegen/triton/autotune.py``: ``measured_us`` keeps every timed config), and the config
the cost model's ranking puts first (``predict_config_us``) with its measured time.

    PYTHONUNBUFFERED=1 python3 -m benchmarks.loop_tuning_gain [--only adam_step,giou,...]
        [--out benchmarks/loop_tuning_gain.md]

Decides whether level 1 should time the loop kernels' candidates: a gain under ~3% of the
kernel or under 1 µs is not worth a Triton compile per candidate on the first call.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, ".")

DEFAULT = ("adam_step", "giou", "softmax", "layernorm", "mlp_train", "transformer",
           "lion_step")


def _program(name: str):
    from benchmarks.gpu_suite import programs
    from benchmarks.heldout_programs import NAMES, programs as heldout
    for prog in programs() + (heldout() if name in NAMES else []):
        if prog[0] == name:
            return prog
    raise SystemExit(f"unknown program {name!r}")


def _cfg_key(c: dict) -> str:
    return json.dumps(c, sort_keys=True)


def check_configs(kernel, configs: list[dict]) -> dict:
    """Each config's outputs on fresh random inputs (contiguous), against the template's
    default config's: {config: True/False}; {} where an input is not a float array. A
    "best" time under the memory floor would be a config that skips work."""
    import torch
    from codegen.triton.kernel import _to_torch
    import numpy as np
    rng = np.random.default_rng(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"    # cpu: Triton's interpreter
    ins = []
    for sh in kernel.input_shapes:
        if not sh.dtype.is_float:
            return {}
        ins.append(_to_torch(rng.standard_normal(sh.dims).astype(sh.dtype.np_dtype)).to(dev)
                   .abs() + 0.5)         # positive: sqrt and division stay finite
    def run(c: dict) -> list:
        outs = [torch.full(sh.dims, float("nan"), device=dev,
                           dtype=_to_torch(np.zeros((), sh.dtype.np_dtype)).dtype)
                for sh in kernel.output_shapes]
        kernel.launch(outs, ins, config=c)
        if dev == "cuda":
            torch.cuda.synchronize()
        return outs
    want = run(kernel.plan.config)
    got = {}
    for c in configs:
        out = run(c)
        got[_cfg_key(c)] = all(torch.equal(a, b) for a, b in zip(out, want))
    return got


def _checked(kernel, configs: list[dict]) -> dict:
    try:
        return check_configs(kernel, configs)
    except Exception as e:  # noqa: BLE001  (a check that cannot run is reported, not fatal)
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def rows_for(name: str) -> list[dict]:
    """Compile and run ``name`` at level 2; one row per Triton kernel it tuned."""
    import jax

    import runtime
    from codegen.triton import autotune as at
    from passes.fusion.cost_model import get_device
    from runtime.cuda import executable_of
    fn, args = _program(name)[2:4]
    dev_args = jax.device_put(args)
    compiled = runtime.jit(fn, backend="cuda").lower(*dev_args).compile()
    jax.block_until_ready(compiled(*dev_args))
    exe = executable_of(compiled)
    table = at.load_table()
    rows = []
    seen: set[str] = set()
    for k in exe._triton_kernels():
        if k.key in seen:        # fusions sharing one kernel (codegen/triton/canonical.py)
            continue
        seen.add(k.key)
        entry = table.get(at.tuning_key(k.key))
        if not isinstance(entry, dict) or not entry.get("measured_us"):
            continue
        measured = entry["measured_us"]
        default = _cfg_key(k.plan.config)
        if default not in measured:
            continue
        best_cfg, best_us = min(measured.items(), key=lambda kv: kv[1])
        spec = get_device(k.target)
        base = getattr(k, "predicted_us", 0.0) or 10.0
        cands = list(k.plan.candidates or [k.plan.config])
        # The cost model's single pick among every candidate (the default included; ties
        # keep the candidate list's order).
        pick = min(cands, key=lambda c: at.predict_config_us(base, k.plan.grid(dict(c)), c,
                                                             spec))
        moved = sum(math.prod(sh.dims) * sh.dtype.itemsize
                    for sh in list(k.input_shapes) + list(k.output_shapes))
        rows.append({"program": name, "kernel": k.name, "template": k.template,
                     "bytes": moved, "measured_us": measured,
                     "same_output": _checked(k, [json.loads(c) for c in measured]),
                     "fusions": sum(1 for o in exe._triton_kernels() if o.key == k.key),
                     "elements": max((math.prod(s.dims) for s in k.output_shapes), default=0),
                     "configs": len(measured), "default": json.loads(default),
                     "default_us": measured[default], "best": json.loads(best_cfg),
                     "best_us": best_us, "pick": pick,
                     "pick_us": measured.get(_cfg_key(pick))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(DEFAULT))
    ap.add_argument("--out", default="")
    opts = ap.parse_args()
    os.environ["HLOTK_AUTOTUNE"] = "2"
    os.environ.setdefault("HLOTK_CACHE_DIR", tempfile.mkdtemp(prefix="hlotk_gain_"))
    rows: list[dict] = []
    lines = ["| program | kernel | template | elements | MB | configs | default µs | best µs "
             "| gain µs | gain % | best config | best TB/s | cost model's pick µs "
             "| outputs equal default's |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in filter(None, opts.only.split(",")):
        t0 = time.perf_counter()
        try:
            got = rows_for(name)
        except Exception as e:  # noqa: BLE001  (report it, go on with the next program)
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
            continue
        print(f"{name}: {len(got)} kernels tuned in {time.perf_counter() - t0:.1f} s",
              flush=True)
        for r in got:
            gain = r["default_us"] - r["best_us"]
            b = r["best"]
            same = r["same_output"]
            equal = "-" if not same or "error" in same else sum(same.values())
            lines.append(f"| {name} | {r['kernel'][:40]} | {r['template']} | {r['elements']} "
                         f"| {r['bytes'] / 1e6:.1f} "
                         f"| {r['configs']} | {r['default_us']:.2f} | {r['best_us']:.2f} "
                         f"| {gain:.2f} | {100 * gain / max(r['default_us'], 1e-9):.1f} "
                         f"| {b.get('BLOCK', b)}/{b.get('num_warps', '')} "
                         f"| {r['bytes'] / max(r['best_us'], 1e-9) / 1e6:.2f} "
                         f"| {r['pick_us'] if r['pick_us'] is None else round(r['pick_us'], 2)} "
                         f"| {equal}/{len(same)} |")
            print(lines[-1], flush=True)
        rows += got
        if opts.out:
            with open(opts.out, "w") as f:
                f.write("\n".join(lines) + "\n")
            with open(opts.out.replace(".md", ".json"), "w") as f:
                json.dump(rows, f, indent=1)
    loops = [r for r in rows if r["template"] in ("loop", "generic")]
    if loops:
        d = sum(r["default_us"] for r in loops)
        b = sum(r["best_us"] for r in loops)
        big = [r for r in loops if r["default_us"] - r["best_us"] >= 1.0
               and r["default_us"] - r["best_us"] >= 0.03 * r["default_us"]]
        print(f"loop kernels: {len(loops)}; sum default {d:.1f} µs, sum best {b:.1f} µs "
              f"({100 * (d - b) / max(d, 1e-9):.1f}%); gaining >= 3% and >= 1 µs: {len(big)}",
              flush=True)


if __name__ == "__main__":
    main()
