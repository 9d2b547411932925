"""Device time of gpu_suite programs (and held-out ones by name) with each loop emitter,
interleaved in one process.

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.emitter_ab \
        [--only adam_step] [--sides "auto;triton;c32:HLOTK_CUDA_C_FLAT_CHUNK=32"] [--rounds 5]

Each side is one executable compiled with ``HLOTK_LOOP_EMITTER`` set to it (the backend
reads it when it is made), or a label and settings (``label:K=V,K=V``: the emitter is
auto unless they set it) that hold while it compiles and makes its first calls; every round times each side's CUDA-graph replay
(``gpu_suite.device_ms``: do_bench, L2 flushed between replays) in a rotated order. Every
side's result is checked against jax.jit. Prints one JSON line per program: each side's
median ms over rounds and each round's ms.

``--staging``: what the replays' argument buffers hold: ``args`` (default) the program's
own arguments; ``zeros`` (before session 9: on zeros every IEEE division and square root of
an Adam step takes its slow path, which Triton's approximate ones never do, i13-flat-sass);
``random`` |N(0, 1)| * 1e-3 as f32 in every buffer (only for programs whose buffers are all
floats read elementwise, such as adam_step: an integer index read from such a buffer would
be garbage)."""
from __future__ import annotations

import argparse
import json
import os
import statistics


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="adam_step")
    ap.add_argument("--sides", default="auto;triton", help="';'-separated sides")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--staging", choices=("args", "zeros", "random"), default="args")
    ap.add_argument("--show", default="", help="a kernel template (split_partials): print "
                    "each side's configs of its kernels")
    ap.add_argument("--wall", action="store_true", help="also each round's wall ms of one "
                    "call (gpu_suite.wall_ms), and of jax.jit's compiled call ('xla')")
    a = ap.parse_args(argv)
    import jax
    import numpy as np
    import runtime
    from benchmarks.gpu_suite import device_ms, programs, wall_ms
    from runtime.cuda import executable_of
    sides, settings = [], {}
    for text in a.sides.split(";"):
        label, _, envs = text.partition(":")
        env = {"HLOTK_LOOP_EMITTER": label if not envs else "auto"}
        for kv in filter(None, envs.split(",")):
            k, _, v = kv.partition("=")
            env[k.strip()] = v.strip()
        sides.append(label)
        settings[label] = env
    from benchmarks.heldout_programs import NAMES, programs as heldout
    wanted = a.only.split(",")
    pool = programs() + (heldout() if any(n in NAMES for n in wanted) else [])
    for prog in pool:
        if prog[0] not in wanted:
            continue
        fn, args = prog[2], prog[3]
        dev_args = jax.device_put(args)
        xla = jax.jit(fn).lower(*dev_args).compile()
        want = jax.block_until_ready(xla(*dev_args))
        exes, errs, calls = {}, {}, {}
        for side in sides:
            saved = {k: os.environ.get(k) for k in settings[side]}
            os.environ.update(settings[side])
            try:
                c = runtime.jit(fn, backend="cuda").lower(*dev_args).compile()
                for _ in range(3):                  # first call, native graph, a replay
                    got = jax.block_until_ready(c(*dev_args))
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            errs[side] = max(
                float(np.linalg.norm(np.asarray(g, np.float64) - np.asarray(w, np.float64))
                      / max(np.linalg.norm(np.asarray(w, np.float64)), 1e-30))
                for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)))
            exes[side] = executable_of(c)
            calls[side] = c
            if a.show:
                print(json.dumps({"side": side, a.show: [
                    [k.name, k.config] for k in exes[side]._triton_kernels()
                    if k.template == a.show]}), flush=True)
        if a.staging == "random":
            _random_staging()
        times: dict[str, list[float]] = {s: [] for s in sides}
        walls: dict[str, list[float]] = {s: [] for s in sides + ["xla"]}
        for r in range(a.rounds):
            for s in sides[r % len(sides):] + sides[:r % len(sides)]:
                times[s].append(device_ms(exes[s], dev_args if a.staging == "args" else None))
            if a.wall:
                for s in sides[r % len(sides):] + sides[:r % len(sides)] + ["xla"]:
                    call = xla if s == "xla" else calls[s]
                    walls[s].append(wall_ms(lambda: jax.block_until_ready(call(*dev_args))))
        row = {"program": prog[0], "max_rel_err": errs,
               "median_ms": {s: round(statistics.median(t), 4) for s, t in times.items()},
               "rounds_ms": {s: [round(x, 4) for x in t] for s, t in times.items()}}
        if a.wall:
            row["wall_median_ms"] = {s: round(statistics.median(t), 4) for s, t in walls.items()}
        print(json.dumps(row), flush=True)


def _random_staging() -> None:
    """Make the native launcher's staging buffers (``replay_on_staging``) hold positive f32
    values instead of zeros, from here on in this process."""
    import torch
    from runtime.cuda.native import launcher

    def staging(self) -> list:
        bufs = []
        for n in self.sizes:
            raw = torch.zeros(max(n, 1) + launcher.STAGING_SKEW, dtype=torch.uint8,
                              device=self.exe.device)[launcher.STAGING_SKEW:]
            words = raw[:n - n % 4].view(torch.float32)
            words.normal_().abs_().mul_(1e-3)
            bufs.append(raw)
        return bufs
    launcher.NativeGraph.staging = staging


if __name__ == "__main__":
    main()
