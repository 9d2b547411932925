"""Host time per call against the number of buffers: hlotk (backend="cuda") vs jax.jit.

Run ON the GPU machine from the repository root:

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.host_overhead
        [--sizes 1,10,100,300] [--rounds 5] [--out benchmarks/host_overhead.md] [--no-adam]

Programs: ``n`` f32[16] arrays in, ``n`` out (``x * 2 + 1`` each: tiny kernels, so a call
is all host time), for n in ``--sizes``; then gpu_suite's ``adam_step`` (97 arrays in, 73
out), called with the same arguments and in a donated training loop. Arguments are already
on the GPU; JAX arrays in and out for everyone.

Who: ``jax.jit``; "floor": ``jax.jit`` of one FFI custom call that launches nothing (the
launcher's dry-run handler: it reads the addresses and returns), what any design that runs
inside JAX's dispatch pays; hlotk through ``runtime.jit`` (the native path where the
executable has one); "hlotk bare": the same jitted function without ``runtime.jit``'s
Python wrapper; hlotk's Python path (``Compiled`` with the native call off: DLPack, torch ops from
Python); "candidate 1" (issue 12): results allocated by JAX (one jitted allocation call),
every address read in Python (``unsafe_buffer_pointer``), the same patched graph launched
through ctypes on torch's stream with one event handshake, no DLPack export. Candidate 1 is
a timing prototype: nothing orders its kernels after the allocation's zero fill on JAX's
stream, so its results are not used.

Measures, per round (who interleaved, medians over ``--rounds``): "dispatch" = host µs per
call of back-to-back calls whose results are dropped (the device keeps up: the kernels are
tiny); "rotating" = the same while the last 4 results stay alive (XLA hands out other
buffers, so the native path re-patches addresses every call); "wall" = µs from an idle GPU
to the result being ready (block_until_ready). Fixed cost and cost per buffer: a least-
squares line through the dispatch times against 2n buffers.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")

import numpy as np  # noqa: E402


def tiny_program(n: int):
    def fn(*xs):
        return tuple(x * 2.0 + 1.0 for x in xs)
    fn.__name__ = f"tiny_{n}"
    return fn


def dispatch_us(call, keep: int = 0, budget_s: float = 0.12, max_calls: int = 2000) -> float:
    """Host µs per call of back-to-back calls (results dropped, or the last ``keep`` held)."""
    import jax
    held: list = []
    jax.block_until_ready(call())
    t0 = time.perf_counter()
    n = 0
    while n < max_calls and time.perf_counter() - t0 < budget_s:
        out = call()
        if keep:
            held.append(out)
            if len(held) > keep:
                held.pop(0)
        n += 1
    dt = time.perf_counter() - t0
    jax.block_until_ready(out)
    return dt / n * 1e6


def wall_us(call, reps: int = 30) -> float:
    import jax
    import torch
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (buffers, µs)."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def floor_function(in_types, out_types, aliases=None, donate=()):
    """``jax.jit`` of one FFI call to the dry-run handler (no nodes: it only reads the
    addresses), with these operand and result types."""
    import ctypes
    import jax
    from runtime.cuda import native
    lib = native.library()
    n_in, n_out = len(in_types), len(out_types)
    aliases = aliases or {}
    ret_buffer, k = [], n_in
    for j in range(n_out):
        if j in aliases.values():
            ret_buffer.append(-1)
        else:
            ret_buffer.append(k)
            k += 1
    err = ctypes.create_string_buffer(512)
    c = ctypes
    exe_id = lib.hk_exec_create_dry(0, None, None, None, k, n_in, n_out,
                                    native.int_array(ret_buffer, c.c_int32), 0, None, None,
                                    None, None, err, 512)
    native.check(exe_id, err, "the floor's dry-run plan")
    call = jax.ffi.ffi_call(native.DRY_RUN_TARGET, list(out_types),
                            input_output_aliases=aliases or None)
    attr = np.int64(exe_id)
    return jax.jit(lambda *xs: call(*xs, exe=attr), donate_argnums=donate)


def candidate1(compiled, leaves):
    """Issue 12's candidate 1 as a host-time prototype (see the module docstring)."""
    import jax
    import jax.numpy as jnp
    import torch
    from runtime.cuda import executable_of
    from runtime.cuda.arena import jax_handoff
    exe = executable_of(compiled)
    graph = exe.native
    if graph is None:
        return None
    outs = [(s.shape.dims, s.shape.dtype.np_dtype) for s in exe.output_slots]
    alloc = jax.jit(lambda: tuple(jnp.empty(d, t) for d, t in outs))
    handoff = jax_handoff(exe.device)
    if handoff is None:
        return None
    index = exe.device.index or 0
    raw_stream = torch._C._cuda_getCurrentRawStream

    def call():
        results = alloc()
        addresses = [x.unsafe_buffer_pointer() for x in leaves]
        addresses += [r.unsafe_buffer_pointer() for k, r in enumerate(results)
                      if graph.ret_buffer[k] >= 0]
        graph.launch(addresses, raw_stream(index))
        handoff.begin()
        return results
    return call


def measure_sizes(sizes, rounds: int) -> tuple[list[str], dict]:
    rows: dict = {}
    reports = []
    for n in sizes:
        try:
            reports.append(measure_size(n, rounds, rows))
        except Exception as e:  # noqa: BLE001  (the other sizes still measured)
            import traceback
            traceback.print_exc()
            rows[n] = {"err": float("nan"), "path": f"failed: {type(e).__name__}: {e}"[:200]}
    return reports, rows


def measure_size(n: int, rounds: int, rows: dict) -> str:
    import jax
    import runtime
    from runtime.cuda import executable_of
    fn = tiny_program(n)
    r = np.random.default_rng(n)
    args = [jax.device_put(r.standard_normal(16).astype(np.float32)) for _ in range(n)]
    jax.block_until_ready(args)
    xla = jax.jit(fn)
    ours = runtime.jit(fn, backend="cuda")
    want = xla(*args)
    got = ours(*args)                          # compiles, builds the native graph
    err = max(float(np.abs(np.asarray(g) - np.asarray(w)).max()) for g, w in zip(got, want))
    py = runtime.jit(fn, backend="cuda").lower(*args).compile()
    py._native = False                         # the Python path (DLPack)
    got_py = py(*args)
    err = max(err, max(float(np.abs(np.asarray(g) - np.asarray(w)).max())
                       for g, w in zip(got_py, want)))
    native_c = ours._cache[next(iter(ours._cache))]
    exe = executable_of(native_c)
    c1 = candidate1(native_c, args)
    types = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in args]
    floor = floor_function(types, types)
    bare = getattr(ours, "_front_jit", None)
    who = {"jax.jit": lambda: xla(*args), "floor": lambda: floor(*args),
           "hlotk": lambda: ours(*args), "hlotk bare": lambda: bare(*args),
           "hlotk python path": lambda: py(*args)}
    if bare is None:
        del who["hlotk bare"]
    if c1 is not None:
        who["candidate 1 (prototype)"] = c1
    res = {k: {"dispatch": [], "rotating": [], "wall": []} for k in who}
    for _ in range(rounds):
        for k, call in who.items():
            res[k]["dispatch"].append(dispatch_us(call))
            res[k]["rotating"].append(dispatch_us(call, keep=4))
            res[k]["wall"].append(wall_us(call))
    rows[n] = {"err": err, "path": "native" if exe.native is not None else exe.native_reason,
               **{k: {m: statistics.median(v) for m, v in d.items()} for k, d in res.items()}}
    if exe.native is not None:          # the report's host steps: rotating calls alone
        exe.native.reset_stats()
        exe.native_timing[:] = [0, 0.0]
        dispatch_us(lambda: ours(*args), keep=4)
    print(f"n={n}: " + ", ".join(f"{k} {v['dispatch']:.1f}/{v['rotating']:.1f}/{v['wall']:.1f}"
                                 for k, v in rows[n].items() if isinstance(v, dict)),
          flush=True)
    return f"### n = {n}\n\n```\n{exe.report()}\n```\n"


def measure_adam(rounds: int) -> tuple[list[str], dict]:
    import jax
    import runtime
    from benchmarks.gpu_suite import programs
    from runtime.cuda import executable_of
    prog = next(p for p in programs() if p[0] == "adam_step")
    fn, args = prog[2], jax.device_put(prog[3])
    jax.block_until_ready(args)
    xla = jax.jit(fn)
    ours = runtime.jit(fn, backend="cuda")
    want = xla(*args)
    got = ours(*args)
    err = max(float(np.linalg.norm(np.asarray(g, np.float64) - np.asarray(w, np.float64)) /
                    max(np.linalg.norm(np.asarray(w, np.float64)), 1e-30))
              for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)))
    py = runtime.jit(fn, backend="cuda").lower(*args).compile()
    py._native = False
    # A training loop: params, m, v and step donated, the results fed back.
    xla_d = jax.jit(fn, donate_argnums=(0, 2, 3, 4))
    ours_d = runtime.jit(fn, backend="cuda", donate_argnums=(0, 2, 3, 4))
    grads = args[1]

    def loop(f, state):
        def step():
            p, m, v, s = f(state[0], grads, state[1], state[2], state[3])
            state[:] = [p, m, v, s]
            return s
        return step
    fresh = lambda: [jax.tree.map(lambda a: a.copy(), args[k]) for k in (0, 2, 3, 4)]  # noqa: E731
    leaves = jax.tree_util.tree_leaves(args)
    out_types = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(want)]
    floor = floor_function([jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves], out_types)
    who = {"jax.jit": lambda: xla(*args), "floor": lambda: floor(*leaves),
           "hlotk": lambda: ours(*args), "hlotk python path": lambda: py(*args),
           "jax.jit, donated loop": loop(xla_d, fresh()),
           "hlotk, donated loop": loop(ours_d, fresh())}
    res = {k: {"dispatch": [], "wall": []} for k in who}
    for _ in range(rounds):
        for k, call in who.items():
            res[k]["dispatch"].append(dispatch_us(call, budget_s=0.3, max_calls=500))
            res[k]["wall"].append(wall_us(call, reps=20))
    row = {"err": err, **{k: {m: statistics.median(v) for m, v in d.items()}
                          for k, d in res.items()}}
    # Copies XLA adds around the FFI call of the donated loop (none: the donated buffers are
    # the results), against jax.jit's own donated program.
    state = fresh()
    texts = {"hlotk": ours_d._front_jit.lower(state[0], grads, *state[1:]).compile().as_text(),
             "jax.jit": xla_d.lower(state[0], grads, *state[1:]).compile().as_text()}
    row["copies"] = {k: sum(1 for ln in t.splitlines() if " copy(" in ln or "copy-start" in ln)
                     for k, t in texts.items()}
    exe = executable_of(ours._cache[next(iter(ours._cache))])
    print("adam: " + ", ".join(f"{k} {v['dispatch']:.1f}/{v['wall']:.1f}" for k, v in row.items()
                               if isinstance(v, dict) and "dispatch" in v) + f"; {row['copies']}",
          flush=True)
    return [f"### adam_step\n\n```\n{exe.report()}\n```\n"], row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,10,100,300")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-adam", action="store_true")
    ap.add_argument("--out", default="benchmarks/host_overhead.md")
    opts = ap.parse_args()
    import jax
    import torch
    sizes = [int(s) for s in opts.sizes.split(",")]
    dev = torch.cuda.get_device_name()
    reports, rows = measure_sizes(sizes, opts.rounds)
    whos = list(dict.fromkeys(k for n in sizes for k, v in rows[n].items()
                              if isinstance(v, dict)))
    cell = lambda r, w: (f"{r[w]['dispatch']:.1f} / {r[w]['rotating']:.1f} / "  # noqa: E731
                         f"{r[w]['wall']:.1f}" if w in r else "-")
    lines = ["# Host time per call (issue 12): hlotk vs jax.jit", "",
             f"Device: {dev}; torch {torch.__version__}, jax {jax.__version__}. Medians of "
             f"{opts.rounds} interleaved rounds; µs per call. n f32[16] arrays in, n out "
             "(2n buffers). dispatch = back-to-back calls, results dropped; rotating = the "
             "last 4 results held (new addresses every call); wall = idle GPU to result "
             "ready.", "",
             "| n (buffers) | " + " | ".join(f"{w}: dispatch / rotating / wall" for w in whos)
             + " | max abs err | hlotk path |",
             "|---|" + "---|" * (len(whos) + 2)]
    for n in sizes:
        r = rows[n]
        lines.append(f"| {n} ({2 * n}) | " + " | ".join(cell(r, w) for w in whos)
                     + f" | {r['err']:.1e} | {r['path']} |")
    lines += ["", "Fixed cost + cost per buffer (least squares over the dispatch times):", ""]
    for w in whos:
        for metric in ("dispatch", "rotating"):
            points = [(2 * n, rows[n][w][metric]) for n in sizes if w in rows[n]]
            if len(points) < 2:
                continue
            b, m = fit(points)
            lines.append(f"- {w} ({metric}): {b:.1f} µs + {m:.2f} µs per buffer")
    a = None
    if not opts.no_adam:
        try:
            adam_reports, a = measure_adam(opts.rounds)
        except Exception as e:  # noqa: BLE001  (the size table is still written)
            import traceback
            traceback.print_exc()
            lines += ["", f"Adam step: failed: {type(e).__name__}: {e}"]
    if a is not None:
        reports += adam_reports
        aw = [k for k, v in a.items() if isinstance(v, dict) and k != "copies"]
        lines += ["", "Adam step (gpu_suite's adam_step: 97 arrays in, 73 out; µs per call; "
                  f"max rel err hlotk vs jax.jit {a['err']:.1e}; copy instructions in the "
                  f"donated loop's compiled HLO: {a['copies']}):", "",
                  "| who | dispatch | wall | wall / jax.jit's |", "|---|---|---|---|"]
        for w in aw:
            ref = a["jax.jit, donated loop" if "donated" in w else "jax.jit"]["wall"]
            lines.append(f"| {w} | {a[w]['dispatch']:.1f} | {a[w]['wall']:.1f} | "
                         f"{a[w]['wall'] / ref:.2f} |")
    lines += ["", "## Executable reports (host steps)", ""] + reports
    write_report("\n".join(lines), opts.out)


def write_report(text: str, out: str) -> None:
    """Print ``text`` and write it to ``out`` and to $OUT (the device run's results)."""
    print(text)
    for path in (out, os.path.join(os.environ.get("OUT", "/tmp"), os.path.basename(out))):
        try:
            with open(path, "w") as f:
                f.write(text + "\n")
        except OSError:
            pass


if __name__ == "__main__":
    main()
