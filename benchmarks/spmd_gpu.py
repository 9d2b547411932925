"""Partitioned programs on several GPUs: hlotk (one process per GPU, NCCL) vs jax.jit (XLA).

    python -m benchmarks.spmd_gpu [--out benchmarks/spmd_gpu.md] [--devices 2]
    python -m benchmarks.spmd_gpu --small        # tiny shapes: a smoke run, also on the CPU
    bash benchmarks/spmd_gpu_run.sh              # one device call: this under a watchdog, a
                                                 # no-capture retry, the multi-process tests

Each program is compiled by ``runtime.jit(f, backend="cuda", in_shardings=, mesh=)`` and by
``jax.jit`` with the same shardings on the same GPUs, run on the same random inputs, checked
to agree, then timed: hlotk's per-call wall time with the arguments resident on each GPU (the
slowest worker's median, ``GpuMesh.time``) and XLA's per-call wall time of
``f(*sharded).block_until_ready()`` (median of 5 batches). "call ms" is hlotk's whole call
from this process with ``jax.Array`` arguments sharded over the mesh (their shards reach the
workers through shared device buffers, ``GpuMesh.run_shared``; results come back to the
host). Collective counts and bytes come from the partitioned modules
(``passes.spmd.collective_stats``; XLA's from its compiled HLO).

Then one step of the data-parallel step and of the 2-D transformer block is recorded with
torch.profiler on every worker (Chrome traces under ``--trace-dir``), and the markdown gets
its timeline: NCCL kernels (``=``) on their stream under the compute kernels (``#``), and
how much of the communication time had compute running beside it.
Needs as many GPUs as ``--devices``; JAX must see the GPUs (do not set JAX_PLATFORMS=cpu).
With ``--small`` and no GPU: set TRITON_INTERPRET=1 (gloo workers, host timeline).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import numpy as np

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # the workers share the GPUs


@dataclass
class Program:
    name: str
    make: Callable[[int, bool], tuple[Callable, dict, list]]   # (n, small) -> (fn, shardings, args)
    note: str
    trace: bool = False          # record one step's timeline


def _mesh(shape, names):
    import jax
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def _rand(shapes, dtype, seed=0, scale=0.5):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s, dtype=np.float32) * scale).astype(dtype) for s in shapes]


def megatron_mlp(n, small):
    import jax
    import ml_dtypes
    from jax.sharding import PartitionSpec as P

    def mlp(x, w1, w2):
        return jax.nn.relu(x @ w1) @ w2
    b, d, f = (16, 32, 64) if small else (4096, 8192, 16384)
    args = _rand([(b, d), (d, f), (f, d)], ml_dtypes.bfloat16, scale=0.02)
    return mlp, dict(in_shardings=(P(), P(None, "model"), P("model", None)), out_shardings=P(),
                     mesh=_mesh((n,), ("model",))), args


def dp_train_step(n, small):
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def step(w1, w2, w3, x, y):
        def loss(ws):
            h = jax.nn.relu(x @ ws[0])
            h = jax.nn.relu(h @ ws[1])
            return jnp.mean((h @ ws[2] - y) ** 2)
        g = jax.grad(loss)((w1, w2, w3))
        return tuple(w - 0.01 * gw for w, gw in zip((w1, w2, w3), g))
    d_in, d_h, d_out, b = (16, 32, 8, 32) if small else (1024, 4096, 1000, 4096)
    args = _rand([(d_in, d_h), (d_h, d_h), (d_h, d_out), (b, d_in), (b, d_out)],
                 np.float32, scale=0.02)
    rep = P()
    return step, dict(in_shardings=(rep, rep, rep, P("data"), P("data")),
                      out_shardings=(rep, rep, rep), mesh=_mesh((n,), ("data",))), args


def seq_sharded(n, small):
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def fn(x):
        y = jnp.tanh(x) * x + 1.0
        return jnp.sum(y, axis=1), jnp.max(y, axis=2)
    shape = (2, 64, 16) if small else (8, 8192, 1024)
    return fn, dict(in_shardings=(P(None, "seq"),), out_shardings=(P(), P(None, "seq")),
                    mesh=_mesh((n,), ("seq",))), _rand([shape], np.float32)


def transformer_block_2d(n, small):
    """Attention + MLP block on a 2-D mesh (data x model): batch split over "data", heads
    and the MLP's hidden dim over "model" (Megatron), layer norms on whole rows."""
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    from jax.sharding import PartitionSpec as P
    B, S, D, H = (4, 8, 32, 4) if small else (8, 1024, 4096, 32)
    data = n // 2 if n >= 4 else 1

    def norm(x):
        m = jnp.mean(x, -1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(jnp.mean((x - m) ** 2, -1, keepdims=True) + 1e-5)

    def block(x, wq, wk, wv, wo, w1, w2):
        h = norm(x)
        q, k, v = ((h @ w).reshape(B, S, H, D // H) for w in (wq, wk, wv))
        # A Python float keeps bf16 (a numpy scalar would promote the rest of the block
        # to f32: JAX types numpy scalars strongly).
        s = jnp.einsum("bshd,bthd->bhst", q, k) / float(np.sqrt(D // H))
        a = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(s, axis=-1), v).reshape(B, S, D)
        x = x + a @ wo
        return x + jax.nn.relu(norm(x) @ w1) @ w2
    dtype = np.float32 if small else ml_dtypes.bfloat16
    col, row = P(None, "model"), P("model", None)
    args = _rand([(B, S, D), (D, D), (D, D), (D, D), (D, D), (D, 4 * D), (4 * D, D)], dtype,
                 scale=0.02)
    return block, dict(in_shardings=(P("data"), col, col, col, row, col, row),
                       out_shardings=P("data"), mesh=_mesh((data, n // data), ("data", "model"))), args


PROGRAMS = [
    Program("megatron_mlp bf16", megatron_mlp,
            "x[4096,8192] @ w1[8192,16384] (columns) -> relu -> @ w2 (rows); one all-reduce"),
    Program("dp_train_step f32", dp_train_step,
            "MLP 1024-4096-4096-1000, batch 4096 split over devices, SGD; gradient all-reduces "
            "overlapped with the backward pass", trace=True),
    Program("seq_sharded_reduce f32", seq_sharded,
            "x[8,8192,1024] split along the sequence; sum over it (all-reduce) and max"),
    Program("transformer_block_2d bf16", transformer_block_2d,
            "attention + MLP, B=8 S=1024 D=4096 32 heads, mesh (data=n/2, model=2): batch over "
            "data, heads and MLP hidden over model", trace=True),
]


def _time_jax(f, args, reps):
    import jax
    for _ in range(3):
        jax.block_until_ready(f(*args))
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            out = f(*args)
        jax.block_until_ready(out)
        batches.append((time.perf_counter() - t0) * 1e3 / reps)
    return float(np.median(batches))


_COLLECTIVE_LINE = re.compile(r"= (\(.*?\)|[a-z0-9]+\[[\d,]*\]\S*) (all-reduce|all-gather|"
                              r"reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")


def _xla_collectives(compiled_text: str) -> dict[str, tuple[int, int]]:
    """Collective count and result bytes in XLA's compiled HLO, read off the text (XLA:GPU's
    compiled modules carry GPU-only attributes, so they are not parsed as modules here)."""
    from hlo.dtypes import by_name
    out: dict[str, tuple[int, int]] = {}
    for m in _COLLECTIVE_LINE.finditer(compiled_text):
        nbytes = 0
        for dt, dims in re.findall(r"([a-z0-9]+)\[([\d,]*)\]", m.group(1)):
            n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
            nbytes += n * by_name(dt).bits // 8
        c, b = out.get(m.group(2), (0, 0))
        out[m.group(2)] = (c + 1, b + nbytes)
    return out


def _fmt(stats: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{k} x{c} ({b} B)" for k, (c, b) in sorted(stats.items())) or "none"


def run(p: Program, n: int, reps: int, small: bool, trace_dir: str) -> dict:
    import jax
    from jax.sharding import NamedSharding
    import runtime
    from passes.spmd import collective_stats
    from passes.latency_hiding_scheduler import predicted_overlap
    fn, sh, args = p.make(n, small)
    mesh = sh["mesh"]
    t0 = time.perf_counter()
    g = runtime.jit(fn, backend="cuda", **sh)
    from jax.sharding import PartitionSpec

    def named(tree):
        return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), tree,
                                      is_leaf=lambda x: isinstance(x, PartitionSpec))
    dev_args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, sh["in_shardings"])]
    compiled_hl = g.lower(*dev_args).compile()
    spmd = compiled_hl.executable
    shared_error = ""
    try:
        got = compiled_hl(*dev_args)       # compiles the kernels on every worker
    except Exception as e:  # noqa: BLE001  (the shared-buffer path failed: say so, go on)
        shared_error = _last_line(e)
        print(f"{p.name}: sharded jax.Array call failed ({shared_error}); host arrays",
              file=sys.stderr, flush=True)
        got = compiled_hl(*args)
    hl_compile = time.perf_counter() - t0
    jf = jax.jit(fn, in_shardings=named(sh["in_shardings"]),
                 out_shardings=named(sh["out_shardings"]))
    t0 = time.perf_counter()
    compiled = jf.lower(*dev_args).compile()
    want = compiled(*dev_args)
    jax.block_until_ready(want)
    xla_compile = time.perf_counter() - t0
    err = 0.0
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        err = max(err, float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30)))
    from runtime.spmd import split_array
    per_device = [[] for _ in range(n)]
    for a, s in zip(args, spmd.parameter_shardings):
        for d, piece in enumerate(split_array(np.asarray(a), s, n)):
            per_device[d].append(piece)
    gpu_mesh, key = spmd.gpu_mesh()
    reports = list(gpu_mesh.reports)   # the captured executable's (load() below replaces them)
    # Collectives outside CUDA graphs first (the PR 17 baseline), then captured with them.
    plain = gpu_mesh.load(spmd.module, capture_collectives=False)
    hl_plain_ms = gpu_mesh.time(plain, per_device, reps=reps)
    hl_ms = gpu_mesh.time(key, per_device, reps=reps)
    xla_ms = _time_jax(compiled, dev_args, reps)
    call_ms = float("nan") if shared_error else _time_call(compiled_hl, dev_args,
                                                           max(reps // 4, 2))
    profile, extras_failed = [], []    # the per-thunk profile and the timeline are extras:
    if hl_ms > 1.2 * xla_ms:             # their failure is reported beside the timings
        try:
            profile = gpu_mesh.profile(key, per_device)[0]
        except Exception as e:  # noqa: BLE001
            extras_failed.append(f"profile failed ({_last_line(e)})")
    row = dict(name=p.name, note=p.note, hl_ms=hl_ms, xla_ms=xla_ms, call_ms=call_ms, err=err,
               hl_plain_ms=hl_plain_ms,
               profile=profile, hl_compile=hl_compile, xla_compile=xla_compile,
               hl_coll=_fmt(collective_stats(spmd.module)),
               xla_coll=_fmt(_xla_collectives(compiled.as_text())),
               report=reports[0].splitlines()[0],
               capture_failures=[ln.strip() for ln in reports[0].splitlines()
                                 if "graph capture failed" in ln],
               shared=spmd.transfers["sharded_arguments"], shared_error=shared_error)
    predicted = predicted_overlap(spmd.module.entry, "h200", n)
    row["predicted"] = predicted
    if p.trace:
        from runtime.cuda.timeline import events_from_trace, overlap, render
        try:
            files = gpu_mesh.trace(key, per_device, os.path.join(trace_dir, p.name.split()[0]))
            events = events_from_trace(files[0])
            row.update(timeline=render(events), overlap=overlap(events), trace_files=files)
        except Exception as e:  # noqa: BLE001
            extras_failed.append(f"timeline failed ({_last_line(e)})")
    row["extras_failed"] = extras_failed
    return row


def _last_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1][:160]}"


def _time_call(compiled, dev_args, reps: int) -> float:
    """hlotk's whole call from this process (jax.Array shards in, host arrays out)."""
    batches = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            compiled(*dev_args)
        batches.append((time.perf_counter() - t0) * 1e3 / reps)
    return float(np.median(batches))


def _wanted(only: str, name: str) -> bool:
    """``--only a,b``: the programs whose name contains any of the comma-separated texts."""
    keys = [k.strip() for k in only.split(",") if k.strip()]
    return not keys or any(k in name for k in keys)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "spmd_gpu.md"))
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--trace-dir", default=os.path.join(os.path.dirname(__file__),
                                                        "spmd_gpu_traces"))
    ap.add_argument("--only", default="",
                    help="comma-separated texts: run the programs whose name has one of them")
    a = ap.parse_args(argv)
    chosen = [p for p in PROGRAMS if _wanted(a.only, p.name)]
    if not chosen:
        ap.error(f"--only {a.only!r} matches none of: {', '.join(p.name for p in PROGRAMS)}")
    import jax
    import torch
    rows = []
    for p in chosen:
        try:
            rows.append(run(p, a.devices, a.reps, a.small, a.trace_dir))
            r = rows[-1]
            print(f"{p.name}: hlotk {r['hl_ms']:.3f} ms, XLA {r['xla_ms']:.3f} ms, "
                  f"err {r['err']:.2e}", flush=True)
        except Exception:   # noqa: BLE001  (one program's failure is reported, not fatal)
            rows.append(dict(name=p.name, note=p.note, error=traceback.format_exc()))
            print(rows[-1]["error"], file=sys.stderr, flush=True)
        # Written after every program: a run killed by a watchdog keeps what it measured.
        text = _report(rows, a, jax.__version__, torch)
        with open(a.out, "w") as f:
            f.write(text)
    print(text)


def _report(rows: list[dict], a: argparse.Namespace, jax_version: str, torch) -> str:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else \
        "CPU (gloo workers, Triton interpreter)"
    capture = os.environ.get("HLOTK_CAPTURE_COLLECTIVES", "")
    lines = [f"# Partitioned programs on {a.devices} devices: hlotk (NCCL) vs jax.jit\n",
             f"{device} x{a.devices}; jax {jax_version}, torch {torch.__version__}"
             f"{'; --small shapes' if a.small else ''}"
             f"{f'; HLOTK_CAPTURE_COLLECTIVES={capture}' if capture else ''}. "
             "ms = wall per call (median), arguments "
             "on the GPUs; collectives outside graphs = the same executable with "
             "capture_collectives=False; call ms = hlotk's whole call with sharded jax.Array "
             "arguments.\n",
             "| program | hlotk ms | XLA ms | ratio | collectives outside graphs ms | call ms | "
             "max rel err | compile s (hlotk / XLA) | hlotk collectives | XLA collectives |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            last = r["error"].strip().splitlines()[-1]
            lines.append(f"| {r['name']} | failed: {last} | | | | | | | | |")
            continue
        lines.append(f"| {r['name']} | {r['hl_ms']:.3f} | {r['xla_ms']:.3f} | "
                     f"{r['hl_ms'] / r['xla_ms']:.2f} | {r['hl_plain_ms']:.3f} | "
                     f"{r['call_ms']:.2f} | {r['err']:.1e} | "
                     f"{r['hl_compile']:.1f} / {r['xla_compile']:.1f} | {r['hl_coll']} | "
                     f"{r['xla_coll']} |")
    lines.append("")
    for r in rows:
        if "report" not in r:
            lines.append(f"- {r['name']}: {r['note']}")
            continue
        pred = r["predicted"]
        hidden = sum(h for _, h in pred.overlaps.values())
        total = sum(t for t, _ in pred.overlaps.values())
        lines.append(f"- {r['name']}: {r['note']}; worker 0: {r['report']}; latency-hiding "
                     f"schedule predicts {hidden:.0f} of {total:.0f} us of collectives hidden"
                     + (f"; sharded jax.Array call FAILED: {r['shared_error']}"
                        if r["shared_error"] else "")
                     + "".join(f"; worker 0: {f}" for f in r["capture_failures"])
                     + "".join(f"; {f}" for f in r["extras_failed"]))
    for r in rows:
        if r.get("timeline"):
            o = r["overlap"]
            lines += [f"\n## One step of {r['name']}, device 0 (torch.profiler)\n",
                      f"Communication {o['comm_us']:.0f} us, compute {o['compute_us']:.0f} us, "
                      f"communication with compute running beside it {o['overlapped_us']:.0f} us "
                      f"({100 * o['overlapped_us'] / max(o['comm_us'], 1e-9):.0f}%), step "
                      f"{o['span_us']:.0f} us. `#` compute kernels, `=` NCCL; traces: "
                      + ", ".join(os.path.relpath(f, os.path.dirname(os.path.abspath(a.out)))
                                  for f in r["trace_files"]) + "\n", "```", r["timeline"], "```"]
    for r in rows:
        if r.get("profile"):
            lines.append(f"\n{r['name']}, device 0, device ms per thunk (each run alone):\n")
            lines += [f"    {ms:8.3f}  {label}" for label, ms in r["profile"]]
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    main()
