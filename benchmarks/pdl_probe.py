"""Programmatic dependent launch for split reductions, and a one-launch alternative
(issue 14, i14-pdl), on the GPU.

``--pairs``: transformer_train's two split layer-norm gradients (the programs of
``ln_split_probe.py``: same kernels as the step). For each ``--modes`` value of
``HLOTK_PDL`` (compiled one after another in this process, timed in alternation): the pair (partials + finish) as a CUDA-graph
replay (do_bench with its L2 flush, as benchmarks/reductions.md), the partials kernel
alone, the same-size copy; the captured graph's edges (a programmatic edge or not); and a
race check: new input values written in place before each of several replays, every
replayed result bitwise equal to the same pair run with a device sync between its kernels.

``--ticket``: the same partials kernel with a finishing tail instead of a second kernel
(hand-made from the generated source, not a template): every program takes a ticket from
an atomic counter after storing its partials; the last ``T`` to arrive wait until all
partials are stored, then each reduces ``kept / T`` columns of the partials and stores the
outputs; the last of them resets the counters. Timed and race-checked like the pair.

``--sweep``: configs of the pair's two kernels under the last mode (the finish's tile and
warps, the partials' rows a step and warps).

``--programs a,b``: many-kernel programs of the suite (``gpu_suite.programs``) under each
mode: the executable's device time (its graph replay) and the call (do_bench), results
against jax.jit.

    PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu python3 benchmarks/pdl_probe.py --pairs --ticket --modes off,split --jsonl out.jsonl
    ... benchmarks/pdl_probe.py --programs adam_step,mlp_train --modes off,all,split
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
import traceback

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")
os.environ.setdefault("HLOTK_AUTOTUNE", "0")


from benchmarks.ln_split_probe import _emit, _fill  # noqa: E402  (the same row format)


def replay_us(run) -> float:
    from benchmarks.ln_split_probe import replay_us as r
    return r(run)


# --- the graph's edges ------------------------------------------------------------------------
def graph_edges(run) -> dict:
    """{"(type, from_port)": count} over the edges of ``run`` captured in a graph
    (cuGraphGetEdges_v2; type 1 / port 1: programmatic)."""
    import torch
    lib = ctypes.CDLL("libcuda.so.1")
    g = torch.cuda.CUDAGraph(keep_graph=True)
    run()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            run()
    torch.cuda.synchronize()
    raw = ctypes.c_void_p(g.raw_cuda_graph())
    n = ctypes.c_size_t(0)
    fn = lib.cuGraphGetEdges_v2
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_size_t)]
    r = fn(raw, None, None, None, ctypes.byref(n))
    if r != 0:
        return {"error": f"cuGraphGetEdges_v2 -> {r}"}
    k = n.value
    frm, to = (ctypes.c_void_p * max(k, 1))(), (ctypes.c_void_p * max(k, 1))()
    data = (ctypes.c_uint8 * (8 * max(k, 1)))()
    r = fn(raw, frm, to, data, ctypes.byref(n))
    if r != 0:
        return {"error": f"cuGraphGetEdges_v2 -> {r}"}
    out: dict = {}
    for e in range(k):
        key = f"type {data[8 * e + 2]} port {data[8 * e]}"
        out[key] = out.get(key, 0) + 1
    return out


# --- the split pair ---------------------------------------------------------------------------
def _group(fn, args):
    import runtime
    from benchmarks.reductions import reduction_groups
    from runtime.cuda import executable_of
    exe = executable_of(runtime.jit(fn, backend="cuda").lower(*args).compile())
    group = [g for g in reduction_groups(exe) if "split_partials" in g[0].kernel.template][0]
    return exe, group


def _refill(ins, gen) -> None:
    """New values in place (same addresses: a captured graph reads them)."""
    import torch
    for t in ins:
        if t.dtype.is_floating_point:
            t.copy_(torch.randn(t.shape, device=t.device, generator=gen).to(t.dtype))


def race_check(run, ins, outs, reference, trials: int = 4, exact: bool = True) -> float:
    """Replay ``run``'s graph after writing new inputs ``trials`` times; compare each
    result with ``reference()`` (the same work with a sync between kernels). Returns the
    largest relative error (0.0: bitwise equal every time)."""
    import torch
    from benchmarks.kernel_profile import capture_graph
    g = capture_graph(run)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    worst = 0.0
    for _ in range(trials):
        _refill(ins, gen)
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        got = [o.clone() for o in outs]
        want = reference()
        for a, b in zip(got, want):
            if exact and not torch.equal(a, b):
                err = float((a.double() - b.double()).abs().max()
                            / max(float(b.double().abs().max()), 1e-30))
                worst = max(worst, err if err == err else float("inf"))
            elif not exact:
                err = float((a.double() - b.double()).norm() / max(float(b.double().norm()), 1e-30))
                worst = max(worst, err if err == err else float("inf"))
    return worst


class Pair:
    """The split group of ``fn`` compiled under ``HLOTK_PDL=mode``, with its tensors."""

    def __init__(self, fn, args, mode: str) -> None:
        from benchmarks.column_split_sweep import _tensors
        os.environ["HLOTK_PDL"] = mode        # read by compile_fusion while the executable builds
        self.mode = mode
        self.exe, self.group = _group(fn, args)
        get = _tensors(self.group)
        self.ins = [get(s) for s in self.group[0].inputs]
        self.launches = [(t.kernel, [get(s) for s in t.outputs], [get(s) for s in t.inputs])
                         for t in self.group]
        self.outs = self.launches[-1][1]

    def run(self) -> None:
        for k, o, i in self.launches:
            k.launch(o, i)

    def partials(self) -> None:
        k, o, i = self.launches[0]
        k.launch(o, i)

    def synced(self) -> list:
        import torch
        for k, o, i in self.launches:
            k.launch(o, i)
            torch.cuda.synchronize()
        return [o.clone() for o in self.outs]


def pair(name: str, fn, args, jsonl: str, ticket: bool, modes: list[str],
         configs: bool = False) -> None:
    """The pair under each of ``modes`` (compiled in this process, one after another),
    timed in alternation: mode A, mode B, ..., then again."""
    import torch
    from benchmarks.ln_split_probe import copy_run
    from benchmarks.reductions import minimal_bytes
    pairs = [Pair(fn, args, m) for m in modes]
    nbytes = minimal_bytes(pairs[0].group)
    rows = []
    for p in pairs:
        ks = [k for k, _, _ in p.launches]
        row = {"case": name, "what": "pair", "pdl_mode": p.mode, "bytes": nbytes,
               "device": torch.cuda.get_device_name(), "kernels": [k.name for k in ks],
               "launch_pdl": [bool(k.config.get("launch_pdl")) for k in ks],
               "gdc": [[w for w in ("gdc_wait()", "gdc_launch_dependents()") if w in k.source]
                       for k in ks]}
        _fill(row, "race_max_rel_err", lambda: race_check(p.run, p.ins, p.outs, p.synced))
        _fill(row, "edges", lambda: graph_edges(p.run))
        rows.append(row)
    copy_us = []
    for key in ("us", "us_again"):
        for p, row in zip(pairs, rows):
            _fill(row, key, lambda: replay_us(p.run))
        copy_us.append(replay_us(copy_run(nbytes)))
    for p, row in zip(pairs, rows):
        _fill(row, "partials_only_us", lambda: replay_us(p.partials))
        row["copy_us"] = min(copy_us)
        row["copy_us_all"] = copy_us
        _fill(row, "vs_copy", lambda: row["copy_us"] / min(row["us"], row["us_again"]))
        _emit(row, jsonl)
    if ticket:
        p = pairs[0]
        k0, o0, i0 = p.launches[0]
        for T, pb in TICKETS:
            r = {"case": name, "what": "ticket", "T": T, "PB": pb, "bytes": nbytes,
                 "base_mode": p.mode}
            try:
                tk = TicketKernel(k0, T, pb)
                fin = [torch.empty_like(o) for o in p.outs]

                def trun():
                    tk.launch(o0, i0, fin)
                r["race_max_rel_err"] = race_check(trun, p.ins, fin, p.synced, exact=False)
                r["us"] = replay_us(trun)
                r["pair_us"] = replay_us(p.run)
                r["us_again"] = replay_us(trun)
                r["vs_copy"] = min(copy_us) / min(r["us"], r["us_again"])
                r["counters_after"] = tk.cnt.tolist()
            except Exception as e:  # noqa: BLE001
                r["error"] = f"{type(e).__name__}: {e}"[:400]
                traceback.print_exc()
            _emit(r, jsonl)
    if configs:
        sweep(name, pairs[-1], min(copy_us), jsonl, time.perf_counter() + SWEEP_S)
    del pairs


SWEEP_S = 15.0
# (BLOCK_M kept columns, BLOCK_N partial rows a step, warps) of the finishing kernel; the
# default is (8, 256, 4): 128 programs, one step over the 256 partial rows
FINISH_CONFIGS = [(4, 256, 4), (16, 256, 4), (32, 256, 8), (8, 128, 4), (16, 64, 4)]
# (BLOCK_N rows a step, warps) of the partials kernel (default (8, 8); chunks of 32 rows)
PARTIALS_CONFIGS = [(16, 8), (16, 16), (8, 4), (8, 16), (4, 4)]


def sweep(name: str, p: Pair, copy_us: float, jsonl: str, deadline: float) -> None:
    """Configs of the pair's two kernels (same sources, Triton compiles each config),
    the pair timed with the other kernel at its default; results bitwise equal to the
    default's for finish configs (the same partials, another summation tree: compared
    within 1e-6)."""
    (k0, o0, i0), (k1, o1, i1) = p.launches
    want = p.synced()
    for what, configs in (("finish", FINISH_CONFIGS), ("partials", PARTIALS_CONFIGS)):
        for c in configs:
            if time.perf_counter() > deadline:
                print(f"# {name}: sweep budget spent", flush=True)
                return
            k = k1 if what == "finish" else k0
            cfg = dict(k.config, num_warps=c[-1])
            if what == "finish":
                cfg.update(BLOCK_M=c[0], BLOCK_N=c[1])
            else:
                cfg.update(BLOCK_N=c[0])
            r = {"case": name, "what": f"{what}_config", "pdl_mode": p.mode, "config": cfg}

            def run():
                k0.launch(o0, i0, config=cfg if what == "partials" else None)
                k1.launch(o1, i1, config=cfg if what == "finish" else None)
            try:
                run()
                import torch
                torch.cuda.synchronize()
                r["max_rel_err"] = max(float((a.double() - b.double()).abs().max()
                                             / max(float(b.double().abs().max()), 1e-30))
                                       for a, b in zip(p.outs, want))
                r["us"] = replay_us(run)
                if what == "partials":
                    r["partials_only_us"] = replay_us(lambda: k0.launch(o0, i0, config=cfg))
                r["vs_copy"] = copy_us / r["us"]
            except Exception as e:  # noqa: BLE001
                r["error"] = f"{type(e).__name__}: {e}"[:300]
            _emit(r, jsonl)


# (T finishers, PB partial rows a step). i14-pdl's call ran PB=64 (4 dependent L2 round
# trips per finisher; slower than the two-kernel pair at every T); PB=256 reads them in one.
TICKETS = [(16, 64), (32, 64), (64, 64), (64, 256), (32, 256)]


# --- the ticketed tail (hand-made from the generated partials kernel) -------------------------
TAIL = '''
    # ticketed tail (benchmarks/pdl_probe.py): the last T programs to store their partials
    # reduce them, KEPT // T kept elements each, once every program has stored
    W: tl.constexpr = KEPT // T
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if ticket >= NPARTS - T:
        while tl.atomic_add(cnt, 0, sem="acquire", scope="gpu") < NPARTS:
            pass
        tk_c = (ticket - (NPARTS - T)) * W + tl.arange(0, W)[None, :]
        tk_p = tl.arange(0, PB)[:, None]
{sums}
        done = tl.atomic_add(cnt + 1, 1, sem="acq_rel", scope="gpu")
        if done == T - 1:
            tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(cnt + 1, 0, sem="relaxed", scope="gpu")
'''
SUM = '''        acc{k} = tl.zeros([PB, W], tl.float32)
        for tk_q in range(0, NPARTS, PB):
            acc{k} += tl.load(out{k} + (tk_q + tk_p) * so{k}_0 + tk_c * so{k}_1, cache_modifier=".cg")
        tl.store(fin{k} + tk_c * sf{k}, tl.sum(acc{k}, axis=0)[None, :])
'''


def ticket_source(k) -> tuple[str, str]:
    """(name, source) of the partials kernel ``k`` with the ticketed tail."""
    import re
    src = k.source
    n_out = len(k.output_shapes)
    sums = "".join(SUM.format(k=j) for j in range(n_out))
    extra = ", ".join([f"fin{j}" for j in range(n_out)] + [f"sf{j}" for j in range(n_out)]
                      + ["cnt", "NPARTS: tl.constexpr", "T: tl.constexpr",
                         "KEPT: tl.constexpr", "PB: tl.constexpr"])
    src, n = re.subn(r", BLOCK_M: tl.constexpr", ", " + extra + ", BLOCK_M: tl.constexpr", src, 1)
    if n != 1:
        raise RuntimeError("no BLOCK_M parameter in the partials kernel")
    src = src.rstrip("\n") + "\n" + TAIL.format(sums=sums.rstrip("\n"))
    name = k.name + "_ticket"
    return name, src.replace(f"def {k.name}(", f"def {name}(", 1)


class TicketKernel:
    """The generated partials kernel ``k`` (sum reducers into f32, one kept dim, whole
    rows per program) with the ticketed tail; outputs f32 [kept]."""

    def __init__(self, k, T: int, pb: int = 64) -> None:
        import importlib.util
        import tempfile
        import torch
        name, src = ticket_source(k)
        d = tempfile.mkdtemp(prefix="hlotk_ticket_")
        path = os.path.join(d, f"{name}.py")
        with open(path, "w") as fh:
            fh.write(src)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        self.fn = getattr(mod, name)
        self.k, self.T, self.pb = k, T, pb
        self.parts = int(k.output_shapes[0].dims[0])
        self.kept = int(k.output_shapes[0].dims[1])
        self.cnt = torch.zeros(2, dtype=torch.int32, device="cuda")

    def launch(self, partials, inputs, fin) -> None:
        from codegen.triton import direct_launch
        k = self.k
        args = k._args(partials, inputs)
        cfg = dict(k.config)
        warps, stages = cfg.pop("num_warps", 4), cfg.pop("num_stages", 1)
        cfg.pop("launch_pdl", None)
        grid = k.plan.grid(dict(cfg))
        kw = dict(cfg, num_warps=warps, num_stages=stages, cnt=self.cnt, NPARTS=self.parts,
                  T=self.T, KEPT=self.kept, PB=min(self.pb, self.parts))
        for j, f in enumerate(fin):
            kw[f"fin{j}"] = f
            kw[f"sf{j}"] = int(f.stride(0))
        direct_launch.launch(self.fn, grid, args, kw)


# --- many-kernel programs ---------------------------------------------------------------------
def programs(names: list[str], modes: list[str], jsonl: str) -> None:
    """Each program compiled under each of ``modes`` in turn (this process), checked
    against jax.jit over four calls (eager, capture, replays), then timed: the
    executable's graph replay (device ms) and the call, all modes in alternation."""
    import jax
    import torch
    import runtime
    from benchmarks.gpu_suite import bench, device_ms, programs as suite, rel_err
    from runtime.cuda import executable_of
    for prog in suite():
        name, label, fn, args, nbytes, flops, fkind, tol = prog
        if name not in names:
            continue
        built = []
        dev_args = jax.device_put(args)
        want = jax.block_until_ready(jax.jit(fn)(*dev_args))
        for mode in modes:
            row = {"case": name, "what": "program", "pdl_mode": mode,
                   "device": torch.cuda.get_device_name()}
            try:
                os.environ["HLOTK_PDL"] = mode
                hc = runtime.jit(fn, backend="cuda").lower(*dev_args).compile()
                exe = executable_of(hc)
                worst = 0.0
                for _ in range(4):      # eager, capture, replays
                    got = jax.block_until_ready(hc(*dev_args))
                    errs = [rel_err(g, w) for g, w in zip(jax.tree_util.tree_leaves(got),
                                                          jax.tree_util.tree_leaves(want))]
                    worst = max([worst] + errs)
                    del got
                row["max_rel_err"], row["tol"] = worst, tol
                row["ok"] = worst <= tol if tol else worst == 0
                row["pdl_kernels"] = sum(
                    1 for t in exe.thunks()
                    if (getattr(getattr(t, "kernel", None), "config", None) or {}).get("launch_pdl"))
                row["kernels"] = sum(exe.kernel_count().values())
                row["host_path"] = "native" if exe.native is not None else "python"
                built.append((row, hc, exe))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                _emit(row, jsonl)
        for key in ("device_ms", "device_ms_again"):
            for row, hc, exe in built:
                _fill(row, key, lambda: device_ms(exe))
        for row, hc, exe in built:
            _fill(row, "call_ms", lambda: bench(lambda: jax.block_until_ready(hc(*dev_args)), rep=100))
            _emit(row, jsonl)
        del built
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--pairs", action="store_true")
    ap.add_argument("--ticket", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="configs of the pair's two kernels")
    ap.add_argument("--cases", default="resid_grad,ln_wgrad")
    ap.add_argument("--programs", default="")
    ap.add_argument("--modes", default="off,split", help="HLOTK_PDL modes, compared in one process")
    opts = ap.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if opts.pairs or opts.ticket:
        from benchmarks.ln_split_probe import cases
        want = opts.cases.split(",")
        for name, fn, args in cases():
            if name not in want:
                continue
            t0 = time.perf_counter()
            try:
                pair(name, fn, args, opts.jsonl, opts.ticket, opts.modes.split(","), opts.sweep)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                print(f"{name}: {type(e).__name__}: {e}"[:300], flush=True)
            print(f"# {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    if opts.programs:
        programs(opts.programs.split(","), opts.modes.split(","), opts.jsonl)


if __name__ == "__main__":
    main()
