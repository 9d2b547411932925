"""Facts the native launcher (runtime/cuda/native) rests on, checked on the GPU machine.

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.native_probe [--out DIR]

1. The environment: torch's CUDAGraph(keep_graph=True) / raw_cuda_graph, the compiler and
   jax.ffi.include_dir(), building graph_launch.cc (seconds), loading the driver (hk_init).
2. Per program (gpu_suite's, plus a 16-element add): which host path the executable takes
   and why; the captured graph (nodes by kind, patch sites); results against jax.jit on the
   first and third call.
3. The floor of a call through JAX's dispatch: ``jax.jit`` of one FFI call that launches
   nothing, with n operands and n results, n and 1, 1 and n, and n donated into n (a loop
   feeding results back): where JAX's per-buffer cost is, inputs or outputs.
4. The driver's per-call costs through ctypes on a graph of many small kernels:
   cuGraphLaunch alone (addresses unchanged), and with every node re-pointed each call
   (two staging sets alternating): µs per launch and per patched node.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")

import numpy as np  # noqa: E402


def environment(out: list[str]) -> None:
    import jax
    import torch
    from runtime.cuda import native
    try:
        torch.cuda.CUDAGraph(keep_graph=True)
        keep = "yes"
    except TypeError as e:
        keep = f"no ({e})"
    out.append(f"- torch {torch.__version__}; CUDAGraph(keep_graph=True): {keep}; "
               f"raw_cuda_graph: {hasattr(torch.cuda.CUDAGraph, 'raw_cuda_graph')}")
    out.append(f"- jax {jax.__version__}, devices {jax.devices()}; include dir "
               f"{jax.ffi.include_dir()}; compiler {native.compiler()}")
    t0 = time.perf_counter()
    path = native.build()
    out.append(f"- built {path} in {time.perf_counter() - t0:.1f} s")
    native.driver_library()
    out.append("- hk_init: driver loaded")


def programs_part(out: list[str], names: set[str]) -> None:
    import jax
    import runtime
    from benchmarks.gpu_suite import programs, rel_err
    from runtime.cuda import executable_of
    cases = [("tiny_add", lambda x: x + 1.0, (np.ones(16, np.float32),), 1e-6)]
    cases += [(p[0], p[2], p[3], p[7]) for p in programs() if not names or p[0] in names]
    out.append("\n| program | host path | first call s | max rel err (call 1 / 3) | graph |")
    out.append("|---|---|---|---|---|")
    for name, fn, args, tol in cases:
        try:
            dev_args = jax.device_put(args)
            want = jax.jit(fn)(*dev_args)
            c = runtime.jit(fn, backend="cuda").lower(*dev_args).compile()
            t0 = time.perf_counter()
            got1 = jax.block_until_ready(c(*dev_args))
            first = time.perf_counter() - t0
            for _ in range(2):
                got3 = jax.block_until_ready(c(*dev_args))
            errs = [max(rel_err(g, w) for g, w in zip(jax.tree_util.tree_leaves(got),
                                                      jax.tree_util.tree_leaves(want)))
                    for got in (got1, got3)]
            exe = executable_of(c)
            path = "native" if exe.native is not None else f"python: {exe.native_reason}"
            graph = exe.native.describe() if exe.native is not None else ""
            out.append(f"| {name} | {path[:400]} | {first:.1f} | {errs[0]:.1e} / {errs[1]:.1e} "
                       f"(tol {tol}) | {graph} |")
            del c, exe, got1, got3, want
        except Exception:  # noqa: BLE001
            out.append(f"| {name} | FAILED | | | {traceback.format_exc()[-1500:]} |")
        print(out[-1], flush=True)


def floor_part(out: list[str], n: int = 100) -> None:
    import jax
    import jax.numpy as jnp
    from benchmarks.host_overhead import dispatch_us, floor_function
    t = jax.ShapeDtypeStruct((16,), jnp.float32)
    xs = [jnp.ones(16) for _ in range(n)]
    cases = {f"{n} in, {n} out": (floor_function([t] * n, [t] * n), xs),
             f"{n} in, 1 out": (floor_function([t] * n, [t]), xs),
             f"1 in, {n} out": (floor_function([t], [t] * n), xs[:1]),
             "1 in, 1 out": (floor_function([t], [t]), xs[:1])}
    donated = floor_function([t] * n, [t] * n, aliases={i: i for i in range(n)},
                             donate=tuple(range(n)))
    state = [jnp.ones(16) for _ in range(n)]

    def loop():
        state[:] = donated(*state)
        return state[0]
    res = {k: dispatch_us(lambda f=f, a=a: f(*a)) for k, (f, a) in cases.items()}
    res[f"{n} donated into {n}"] = dispatch_us(loop)
    out.append("\nfloor (jax.jit of an FFI call that launches nothing), µs per call: " +
               ", ".join(f"{k}: {v:.1f}" for k, v in res.items()))
    print(out[-1], flush=True)


def driver_costs(out: list[str], n: int = 300, calls: int = 2000) -> None:
    import jax
    import torch
    import runtime
    from runtime.cuda import executable_of
    fn = lambda *xs: tuple(x * 2.0 + 1.0 for x in xs)  # noqa: E731
    args = [jax.device_put(np.ones(16, np.float32)) for _ in range(n)]
    c = runtime.jit(fn, backend="cuda").lower(*args).compile()
    jax.block_until_ready(c(*args))
    g = executable_of(c).native
    if g is None:
        out.append(f"driver costs: no native graph ({executable_of(c).native_reason})")
        return
    sets = [g.staging(), g.staging()]
    addrs = [[t.data_ptr() for t in s] for s in sets]
    stream = torch.cuda.current_stream().cuda_stream
    patched_nodes = len({s.node for s in g.sites})
    for label, pick in (("same addresses", lambda i: addrs[0]),
                        ("all re-pointed", lambda i: addrs[i % 2])):
        g.launch(pick(1), stream)
        torch.cuda.synchronize()
        g.reset_stats()
        t0 = time.perf_counter()
        for i in range(calls):
            g.launch(pick(i), stream)
        dt = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        s = g.stats()
        out.append(f"- {n} kernels, {label}: {dt:.1f} µs per ctypes launch "
                   f"({patched_nodes} nodes with sites); in the library per launch: gather "
                   f"{s['gather_us']:.2f}, patch {s['patch_us']:.2f} "
                   f"({s['nodes_patched'] / max(s['calls'], 1):.0f} nodes), cuGraphLaunch "
                   f"{s['launch_us']:.2f}")
        print(out[-1], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--programs", default="", help="gpu_suite names (default all)")
    opts = ap.parse_args()
    out = ["# native launcher probe\n"]
    names = set(filter(None, opts.programs.split(",")))
    for part in (environment, floor_part, lambda o: programs_part(o, names), driver_costs):
        try:
            part(out)
        except Exception:  # noqa: BLE001
            out.append(f"```\n{traceback.format_exc()}\n```")
            print(out[-1], flush=True)
    text = "\n".join(out)
    print(text)
    with open(os.path.join(opts.out, "native_probe.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
