"""What a call could cost outside ``jax.jit``'s dispatch (issue 12, candidate 2), measured.

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.dispatch_floor
        [--rounds 3] [--out benchmarks/dispatch_floor.md]

The native path runs the whole executable as one FFI call inside ``jax.jit``: its host cost
per call is JAX's dispatch of that call plus the handler's few µs. Issue 12's targets (≤ 20 µs
fixed, ≤ 1 µs per buffer, Adam ≤ 0.8× jax.jit's wall) lie below JAX's dispatch of an empty
FFI call on the H200 host. A design outside that dispatch still needs, per call: the input
buffers' device addresses, fresh output ``jax.Array``s (held outputs are never overwritten),
and a graph launch. Each of those is timed here on its own, for n inputs and n outputs
(f32[16]) and for the Adam step's 97 inputs / 73 outputs, in one process, µs per call
(medians of ``--rounds`` interleaved rounds of back-to-back calls):

- ``jit`` : ``jax.jit`` of one FFI call that launches nothing (the launcher's dry-run handler):
  the floor of the current design;
- ``jit, n in / 1 out`` and ``jit, 1 in / n out``: the same with one side cut to one f32[1]
  (where JAX's per-buffer cost lies: operands or results);
- ``compiled`` : the same, ``.lower(...).compile()`` called directly (``jax.stages.Compiled``);
- ``pjrt`` : its PJRT executable called directly, ``execute_sharded(leaves)`` and the results
  taken apart into ``jax.Array``s (no pytrees, no argument checks: the least JAX can do to
  run a compiled program and hand back new arrays);
- ``pointers`` : ``unsafe_buffer_pointer()`` of every input (what a launcher outside JAX
  reads); ``cai``: the same through ``__cuda_array_interface__``;
- outputs, the cheapest ways to get n new ``jax.Array``s: ``alloc`` (a jitted function
  returning n ``jnp.empty``: one JAX dispatch and fills), ``recycle`` (a pool of n arrays
  passed through a donated identity ``jax.jit``: one dispatch, no device work), ``dlpack``
  (n preallocated torch tensors imported with ``jax.dlpack.from_dlpack``; a real design would
  also allocate them: ``torch.empty`` is timed separately), ``dlpack (one handshake)`` (the
  Python path's export: one stream handshake a call, ``arena.JaxHandoff``);
- ``launch`` : ``hk_exec_launch`` of the Adam step's patched graph through ctypes (addresses
  unchanged, then alternating: every address word re-patched), on torch's stream.

Also the Adam step's wall time (idle GPU to result ready) for jax.jit and hlotk.

The "outside dispatch" sum for a call = pointers + the cheapest outputs + launch (+ a stream
handshake between torch's and JAX's streams, not counted: a lower bound). It is compared
with the native path's own dispatch (``hlotk``) on the Adam step.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")

import numpy as np  # noqa: E402

from benchmarks.host_overhead import dispatch_us, floor_function, write_report  # noqa: E402


def per_call_us(fn, budget_s: float = 0.08, max_calls: int = 5000) -> float:
    """Host µs per call of ``fn`` (no device work to wait for)."""
    fn()
    t0 = time.perf_counter()
    n = 0
    while n < max_calls and time.perf_counter() - t0 < budget_s:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n * 1e6


def case(name: str, leaves: list, out_types: list, on_gpu: bool) -> dict:
    """Callables for every measured step, for these inputs and output types."""
    import jax
    import jax.numpy as jnp
    in_types = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    floor = floor_function(in_types, out_types)
    compiled = floor.lower(*leaves).compile()
    pjrt = compiled.runtime_executable()
    m = len(out_types)
    alloc = jax.jit(lambda: tuple(jnp.empty(t.shape, t.dtype) for t in out_types))
    pool = list(alloc())
    recycle = jax.jit(lambda *xs: xs, donate_argnums=tuple(range(m)))

    def recycled():
        pool[:] = recycle(*pool)
        return pool
    one_in = [jax.ShapeDtypeStruct((1,), np.float32)]
    floor_in = floor_function(in_types, one_in)          # JAX's cost per input ...
    floor_out = floor_function(one_in, out_types)        # ... and per output
    x1 = jnp.zeros(1, np.float32)
    calls = {
        "jit": lambda: floor(*leaves),
        "jit, n in / 1 out": lambda: floor_in(*leaves),
        "jit, 1 in / n out": lambda: floor_out(x1),
        "compiled": lambda: compiled(*leaves),
        "pjrt": lambda: pjrt.execute_sharded(leaves).disassemble_into_single_device_arrays(),
        "pointers": lambda: [x.unsafe_buffer_pointer() for x in leaves],
        "alloc": alloc,
        "recycle": recycled,
    }
    if on_gpu:
        import torch
        calls["cai"] = lambda: [x.__cuda_array_interface__["data"][0] for x in leaves]
        tensors = [torch.empty(t.shape, dtype=getattr(torch, np.dtype(t.dtype).name),
                               device="cuda") for t in out_types]
        calls["dlpack"] = lambda: [jax.dlpack.from_dlpack(t) for t in tensors]
        from runtime.cuda.arena import jax_handoff
        handoff = jax_handoff(tensors[0].device)
        if handoff is not None:       # the Python path's export: one handshake a call
            def handed():
                handoff.begin()
                return [handoff.export(t) for t in tensors]
            calls["dlpack (one handshake)"] = handed
        calls["torch.empty"] = lambda: [torch.empty(t.shape, dtype=t.dtype, device=t.device)
                                        for t in tensors]
    else:
        import torch
        tensors = [torch.empty(t.shape, dtype=getattr(torch, np.dtype(t.dtype).name))
                   for t in out_types]
        calls["dlpack"] = lambda: [jax.dlpack.from_dlpack(t) for t in tensors]
    # The results must agree: the direct calls return what jax.jit's does (the dry run
    # writes nothing, so compare shapes and types).
    got = calls["pjrt"]()
    assert [(a[0].shape, a[0].dtype) for a in got] == [(t.shape, t.dtype) for t in out_types]
    return calls


def adam_launch(on_gpu: bool) -> tuple[dict, list, list, dict]:
    """The Adam step: its leaves, output types, hlotk's native call and ctypes launches."""
    import jax
    import runtime
    from benchmarks.gpu_suite import programs
    from runtime.cuda import executable_of
    prog = next(p for p in programs() if p[0] == "adam_step")
    fn, args = prog[2], jax.device_put(prog[3])
    leaves = jax.tree_util.tree_leaves(args)
    want = jax.jit(fn)(*args)
    out_types = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(want)]
    xla = jax.jit(fn)
    calls: dict = {"jax.jit": lambda: xla(*args)}
    info: dict = {}
    if on_gpu:
        import torch
        from runtime.cuda.native import _ERRBUF, int_array
        ours = runtime.jit(fn, backend="cuda")
        ours(*args)
        exe = executable_of(ours._cache[next(iter(ours._cache))])
        calls["hlotk"] = lambda: ours(*args)
        graph = exe.native
        info["path"] = "native" if graph is not None else exe.native_reason
        if graph is not None:
            bare = ours._front_jit
            calls["hlotk bare"] = lambda: bare(*args)
            sets = [graph.staging(), graph.staging()]
            addr = [int_array([t.data_ptr() for t in s], ctypes.c_uint64) for s in sets]
            err = ctypes.create_string_buffer(_ERRBUF)
            launch = graph.lib.hk_exec_launch
            stream = torch.cuda.current_stream().cuda_stream
            n = len(graph.buffers)
            flip = [0]

            def same():
                launch(graph.id, addr[0], n, stream, err, _ERRBUF)

            def moving():
                flip[0] ^= 1
                launch(graph.id, addr[flip[0]], n, stream, err, _ERRBUF)
            from benchmarks.host_overhead import wall_us
            info["wall"] = {"jax.jit": lambda: wall_us(calls["jax.jit"], reps=20),
                            "hlotk": lambda: wall_us(calls["hlotk"], reps=20)}
            calls["launch (same addresses)"] = same
            calls["launch (every address moved)"] = moving
            info["sync"] = torch.cuda.synchronize
            info["keep"] = sets
    return calls, leaves, out_types, info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="1,10,100")
    ap.add_argument("--out", default="benchmarks/dispatch_floor.md")
    opts = ap.parse_args()
    import jax
    try:
        on_gpu = bool(jax.devices("gpu"))
    except RuntimeError:
        on_gpu = False
    if on_gpu:
        from runtime.cuda.native import driver_library
        driver_library()
    else:
        from runtime.cuda.native import library
        library()
    results: dict = {}
    cases: dict = {}
    for n in (int(s) for s in opts.sizes.split(",")):
        xs = [jax.device_put(np.full(16, k, np.float32)) for k in range(n)]
        cases[f"{n} in, {n} out"] = case(f"n={n}", xs, [jax.ShapeDtypeStruct((16,), np.float32)] * n,
                                         on_gpu)
    adam_calls, leaves, out_types, info = adam_launch(on_gpu)
    adam = case("adam", leaves, out_types, on_gpu)
    adam.update(adam_calls)
    cases["Adam: 97 in, 73 out"] = adam
    for _ in range(opts.rounds):
        for cname, calls in cases.items():
            for who, fn in calls.items():
                timer = dispatch_us if who in ("jit", "compiled", "jax.jit", "hlotk",
                                               "hlotk bare", "alloc", "recycle") else per_call_us
                # A launch queues 0.2 ms of device work: 200 of them stay within the queue.
                limit = {"max_calls": 200} if who.startswith("launch") else {}
                try:
                    t = timer(fn, **limit)
                except Exception as e:  # noqa: BLE001  (a step that does not run is a row)
                    print(f"{cname} {who}: {type(e).__name__}: {e}", flush=True)
                    t = float("nan")
                results.setdefault(cname, {}).setdefault(who, []).append(t)
                if "sync" in info and who.startswith("launch"):
                    info["sync"]()
        for who, fn in info.get("wall", {}).items():
            results.setdefault("Adam wall (idle GPU to result)", {}).setdefault(who, []).append(fn())
    med = {c: {w: statistics.median(v) for w, v in d.items()} for c, d in results.items()}
    whos = list(dict.fromkeys(w for d in med.values() for w in d))
    lines = ["# Host µs per call outside jax.jit's dispatch (issue 12, candidate 2)", "",
             f"jax {jax.__version__}; {'GPU: ' + str(jax.devices('gpu')[0].device_kind) if on_gpu else 'CPU only'}; "
             f"medians of {opts.rounds} rounds (module docstring: what each column is).", "",
             "| step | " + " | ".join(med) + " |", "|---|" + "---|" * len(med)]
    for w in whos:
        lines.append(f"| {w} | " + " | ".join(f"{med[c][w]:.1f}" if w in med[c] else "-"
                                             for c in med) + " |")
    a = med["Adam: 97 in, 73 out"]
    outs = {k: a[k] for k in ("alloc", "recycle", "dlpack", "dlpack (one handshake)") if k in a}
    if on_gpu and "launch (every address moved)" in a:
        best_out = min(outs, key=outs.get)
        extra = a.get("torch.empty", 0.0) if best_out.startswith("dlpack") else 0.0
        total = a["pointers"] + outs[best_out] + extra + a["launch (every address moved)"]
        lines += ["", f"Adam, outside jax.jit's dispatch, lower bound: pointers "
                  f"{a['pointers']:.1f} + outputs ({best_out}{' + torch.empty' if extra else ''}) "
                  f"{outs[best_out] + extra:.1f} + launch {a['launch (every address moved)']:.1f}"
                  f" = {total:.1f} µs, against the native path's dispatch {a.get('hlotk', float('nan')):.1f}"
                  f" µs (jax.jit's {a['jax.jit']:.1f}; the floor, jit of an empty FFI call, "
                  f"{a['jit']:.1f}; PJRT execute alone {a['pjrt']:.1f}). hlotk path: {info.get('path')}"]
    write_report("\n".join(lines), opts.out)


if __name__ == "__main__":
    main()
