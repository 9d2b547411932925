"""Every reduction kernel of the GPU suite, the zoo and issue 14's programs, timed alone
against copy bandwidth (issue 14: >= 70% of copy bandwidth for its minimal bytes, or why not).

On the GPU machine, from the repository root:

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.reductions \\
        [--only suite,zoo,issue14] [--out benchmarks/reductions.md] [--jsonl rows.jsonl]

Each program is compiled with ``runtime.jit(fn, backend="cuda")`` (autotuning off: the
templates' own configs); every kernel whose fusion has a reduce is launched alone on fresh
random inputs laid out as the executable's slots (a split reduction: its partials and
finishing kernels together) captured in a CUDA graph and timed as its replay with
``triton.testing.do_bench`` (median; it clears the L2 before each run): the executable
replays graphs too, and eager launches would add Python's launch cost between the two
kernels of a split. Minimal bytes: every input read once plus every output written
once. Beside it the same fusion through the legacy templates
(``HLOTK_REDUCTION_TEMPLATES=legacy``), in the same process.

Without a GPU, ``--list`` (with ``TRITON_INTERPRET=1``) lists the kernels and templates.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from typing import Any, Iterator

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")
os.environ.setdefault("HLOTK_AUTOTUNE", "0")

import numpy as np  # noqa: E402

HEADER = "# Reduction kernels against copy bandwidth (`python -m benchmarks.reductions`)\n\n"
TARGET = 0.70
SMALL = 4 << 20      # below this many bytes a kernel is launch/ramp bound on an H100/H200


# --- the programs ---------------------------------------------------------------------------
def programs(only: set) -> Iterator[tuple[str, str, Any, tuple, Any]]:
    """(group, name, fn, args, context manager factory) for every program asked for."""
    import contextlib
    none = contextlib.nullcontext
    if "suite" in only:
        from benchmarks.gpu_suite import programs as suite
        for name, _label, fn, args, *_ in suite():
            yield "suite", name, fn, args, none
    if "issue14" in only:
        import jax
        import jax.numpy as jnp
        from benchmarks.attention import (cross_entropy, masked_mean_nll, transformer_train_args,
                                          transformer_train_step)
        key = jax.random.PRNGKey(0)
        x16 = np.asarray(jax.random.normal(key, (8192, 32000), jnp.bfloat16))
        labels = np.asarray(jax.random.randint(key, (8192,), 0, 32000))
        masked = labels.copy()
        masked[::7] = -100
        yield "issue14", "xent_nll_bf16", cross_entropy, (x16, labels), none
        yield "issue14", "xent_nll_f32", cross_entropy, (x16.astype(np.float32), labels), none
        yield "issue14", "xent_masked_mean_bf16", masked_mean_nll, (x16, masked), none
        yield ("issue14", "transformer_train", transformer_train_step(16),
               transformer_train_args(4, 2048, 1024), none)
    if "zoo" in only:
        from tests.zoo import ZOO, x64_scope
        for prog in ZOO:
            yield "zoo", prog.name, prog.fn, None, (lambda p=prog: x64_scope(p))


# --- kernels of an executable ---------------------------------------------------------------
def reduction_groups(exe) -> list[list]:
    """Kernel thunks whose fusion reduces, grouped per HLO instruction (a split reduction
    is two kernels of one instruction)."""
    groups: list[list] = []
    for t in exe.thunks():
        k = getattr(t, "kernel", None)
        if k is None or not hasattr(k, "plan"):
            continue
        inst = t.inst
        fusion = inst if inst.opcode == "fusion" else None
        comp = fusion.attrs["calls"] if fusion is not None else None
        reduces = comp is not None and any(i.opcode == "reduce" for i in comp.instructions)
        if not reduces and inst.opcode != "reduce":
            continue
        if groups and groups[-1][0].inst is inst:
            groups[-1].append(t)
        else:
            groups.append([t])
    return groups


def _tensor(shape, rng: np.random.Generator, device: str):
    """A random tensor of ``shape``'s logical dims with its layout's strides."""
    import torch
    from runtime.cuda.arena import logical_strides, torch_dtype
    td = torch_dtype(shape.dtype)
    n = max(1, math.prod(shape.dims))
    if shape.dtype.is_float:
        flat = torch.randn(n, device=device, dtype=torch.float32).to(td)
    elif shape.dtype.is_pred:
        flat = torch.rand(n, device=device) < 0.5
    else:
        flat = torch.randint(0, 64, (n,), device=device, dtype=torch.int64).to(td)
    return flat.as_strided(tuple(shape.dims), logical_strides(shape))


def _nbytes(shape) -> int:
    return math.prod(shape.dims) * max(1, shape.dtype.bits // 8)


def time_group(group: list, ceil: float, legacy_cmp: bool) -> dict:
    import torch
    from benchmarks.gpu_suite import bench
    rng = np.random.default_rng(0)
    first, last = group[0], group[-1]
    tensors: dict = {}

    def get(slot):
        key = (slot.allocation, slot.offset, tuple(slot.shape.dims), slot.shape.dtype.name)
        if key not in tensors:
            tensors[key] = _tensor(slot.shape, rng, "cuda")
        return tensors[key]
    ins = [get(s) for s in first.inputs]
    outs = [get(s) for s in last.outputs]
    launches = [(t.kernel, [get(s) for s in t.outputs], [get(s) for s in t.inputs]) for t in group]

    def run():
        for k, o, i in launches:
            k.launch(o, i)
    # Timed as a CUDA graph replay, as the executable runs them: Python's launch cost
    # (tens of us per Triton launch) would otherwise sit between the two kernels of a
    # split reduction (run 2 measured such gaps, not kernels).
    from benchmarks.kernel_profile import capture_graph
    graph = capture_graph(run)
    nbytes = minimal_bytes(group)
    us = bench(graph.replay, rep=100) * 1e3
    copy_us = same_size_copy_us(nbytes)
    k0 = first.kernel
    row = {"kernel": " + ".join(t.kernel.name for t in group),
           "template": " + ".join(t.kernel.template for t in group),
           "config": {k: v for k, v in k0.config.items()},
           "grid": [list(t.kernel.grid) for t in group],
           "inputs": [f"{s.shape.dtype.name}{list(s.shape.dims)}" for s in first.inputs],
           "outputs": [f"{s.shape.dtype.name}{list(s.shape.dims)}" for s in last.outputs],
           "bytes": nbytes, "us": us, "bw": nbytes / (us * 1e-6) / ceil,
           "copy_us": copy_us, "vs_copy": copy_us / us, "timing": "graph",
           "passes": passes_of(k0.source),
           "clamped": "cols_c = tl.minimum(cols" in k0.source and "normalization" in k0.template,
           "copy_gbs": ceil / 1e9, "device": torch.cuda.get_device_name()}
    if legacy_cmp and nbytes >= SMALL:     # small kernels: launch bound either way
        row["legacy_us"], row["legacy_template"] = _legacy(first, ins, outs)
        row["legacy_bw"] = nbytes / (row["legacy_us"] * 1e-6) / ceil
    row["why"] = why_not(row)
    return row


def minimal_bytes(group: list) -> int:
    """Every input of the group read once, every output written once: a split's partials
    (written by its first kernel, read by the second) are not counted, the full-shape
    outputs its first kernel stores are (mlp_train's ReLU gradient beside its bias
    gradient: counting only the last kernel's outputs left 32 MiB out)."""
    def key(s):
        return (s.allocation, s.offset)
    scratch = {key(s) for t in group[1:] for s in t.inputs}
    inputs = {key(s): s for s in group[0].inputs}
    outputs = {key(s): s for t in group for s in t.outputs if key(s) not in scratch}
    return (sum(_nbytes(s.shape) for s in inputs.values())
            + sum(_nbytes(s.shape) for s in outputs.values()))


def passes_of(source: str) -> int:
    """Passes over the reduced range: the emitter's "pass N over" comments, counted once
    each (a column kernel's aligned and plain copies of one loop are one pass)."""
    import re
    return len(set(re.findall(r"# pass (\d+) over the reduced range", source))) or 1


_COPY_US: dict = {}


def same_size_copy_us(nbytes: int) -> float:
    """do_bench of a device copy moving the same bytes (half read, half written): what
    launch, ramp-up and the L2 flush leave of copy bandwidth at this size."""
    import torch
    from benchmarks.gpu_suite import bench
    n = max(1, nbytes // 2)
    if n not in _COPY_US:
        a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
        b = torch.empty_like(a)
        b.copy_(a)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                b.copy_(a)
        torch.cuda.synchronize()
        _COPY_US[n] = bench(graph.replay, rep=100) * 1e3
        del a, b
    return _COPY_US[n]


def _legacy(first, ins, outs) -> tuple[float, str]:
    """The same fusion through the legacy templates, same inputs."""
    from benchmarks.gpu_suite import bench
    from codegen.triton import compile_fusion
    from runtime.cuda.thunks import one_instruction_fusion
    inst = first.inst
    fusion = inst if inst.opcode == "fusion" else one_instruction_fusion(inst)
    old = os.environ.get("HLOTK_REDUCTION_TEMPLATES")
    os.environ["HLOTK_REDUCTION_TEMPLATES"] = "legacy"
    try:
        k = compile_fusion(fusion, target=first.kernel.target, autotune=0)
    finally:
        if old is None:
            os.environ.pop("HLOTK_REDUCTION_TEMPLATES", None)
        else:
            os.environ["HLOTK_REDUCTION_TEMPLATES"] = old
    try:
        import torch
        k.launch(outs, ins)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                k.launch(outs, ins)
        torch.cuda.synchronize()
        return bench(graph.replay, rep=100) * 1e3, k.template
    except Exception as e:  # noqa: BLE001  (the legacy kernel may not run at all)
        return float("nan"), f"{k.template} (failed: {type(e).__name__})"


def why_not(row: dict) -> str:
    """Why a kernel is under TARGET of copy bandwidth, as far as the numbers say (and a
    row's own ``note``, from the notes file of the run it came from)."""
    if row["bw"] >= TARGET:
        return row.get("note", "")
    floor_us = row["us"] * row["bw"]       # the time at copy bandwidth
    reasons = []
    vs = row.get("vs_copy")
    if vs is not None:
        copy_bw = row["bw"] / vs          # a same-size copy's share of peak
        if copy_bw < TARGET / 0.9:
            reasons.append(f"size: a copy of the same bytes takes {row['copy_us']:.1f} us "
                           f"({copy_bw:.0%} of peak); this kernel is {vs:.0%} of that copy")
    if row["bytes"] < SMALL:
        reasons.append(f"small: {row['bytes'] / 2**20:.2f} MiB is {floor_us:.1f} us at copy "
                       "bandwidth; launch and ramp-up (~3-5 us) dominate")
    if "generic" in row["template"]:
        reasons.append("no template fits: generic serial kernel")
    if row["passes"] > 1:
        reasons.append(f"{row['passes']} passes over the row (reductions that read other "
                       "reductions, or outputs after them)")
    if row.get("clamped"):
        reasons.append("ragged row width (not a multiple of 16): the clamped column index "
                       "hides contiguity, Triton loads one element per thread")
    if "+" in row["template"]:
        if row.get("timing") != "graph":
            reasons.append("timed as eager launches (runs 1-2): Python's launch of the "
                           "finishing kernel (tens of us) sits between the two kernels; an "
                           "upper bound, not the kernels")
        else:
            reasons.append("split: two launches")
    programs = math.prod(row["grid"][0])
    if programs < 132:
        reasons.append(f"{programs} programs for 132 SMs")
    if row.get("note"):
        reasons.append(row["note"])
    return "; ".join(reasons) or "not explained"


# --- driver ----------------------------------------------------------------------------------
def measure(only: set, legacy_cmp: bool, jsonl: str = "", list_only: bool = False) -> list[dict]:
    import runtime
    from runtime.cuda import executable_of
    ceil = 0.0
    if not list_only:
        from benchmarks.gpu_suite import ceilings_copy
        ceil = ceilings_copy()
        print(f"copy bandwidth: {ceil / 1e9:.0f} GB/s", flush=True)
    rows: list[dict] = []
    seen: set = set()
    for group, name, fn, args, scope in programs(only):
        t0 = time.perf_counter()
        try:
            with scope():
                if args is None:
                    from tests.zoo import by_name
                    args = by_name(name).args()
                exe = executable_of(runtime.jit(fn, backend="cuda").lower(*args).compile())
                for g in reduction_groups(exe):
                    key = tuple(t.kernel.key for t in g)   # source hash: shapes included
                    if key in seen:
                        continue
                    seen.add(key)
                    if list_only:
                        row = {"kernel": " + ".join(t.kernel.name for t in g),
                               "template": " + ".join(t.kernel.template for t in g),
                               "inputs": [f"{s.shape.dtype.name}{list(s.shape.dims)}"
                                          for s in g[0].inputs],
                               "bytes": minimal_bytes(g)}
                    else:
                        row = time_group(g, ceil, legacy_cmp)
                    row.update(group=group, program=name)
                    rows.append(row)
                    print(json.dumps(row, default=str), flush=True)
                    if jsonl:
                        with open(jsonl, "a") as fh:
                            fh.write(json.dumps(row, default=str) + "\n")
            del exe
        except Exception as e:  # noqa: BLE001  (one program's failure is a line)
            traceback.print_exc()
            print(f"{group} {name}: {type(e).__name__}: {e}"[:300], flush=True)
        print(f"# {group} {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return rows


def table(rows: list[dict], ceil_gbs: float = 0.0, device: str = "") -> str:
    timed = [r for r in rows if "us" in r]
    big = [r for r in timed if r["bytes"] >= SMALL]
    ok = [r for r in timed if r["bw"] >= TARGET]
    ok_big = [r for r in big if r["bw"] >= TARGET]
    leg_ok = [r for r in timed if r.get("legacy_bw", 0) >= TARGET]   # NaN compares False
    leg_big = [r for r in leg_ok if r["bytes"] >= SMALL]
    has_legacy = any("legacy_us" in r for r in timed)
    lines = [f"{len(timed)} reduction kernels{' on ' + device if device else ''}"
             f"{f', copy bandwidth {ceil_gbs:.0f} GB/s' if ceil_gbs else ''}: "
             f"{len(ok)} at >= {TARGET:.0%} of copy bandwidth"
             f"{f' (legacy templates: {len(leg_ok)})' if has_legacy else ''}; "
             f">= 4 MiB: {len(ok_big)} of {len(big)}"
             f"{f' (legacy: {len(leg_big)})' if has_legacy else ''}.", "",
             f"Against a copy of the same bytes (launch and ramp-up included): "
             f"{sum(1 for r in timed if r.get('vs_copy', 0) >= TARGET)} at >= {TARGET:.0%}.", "",
             "| group | program | kernel | template | inputs | MiB | us | % copy BW | same-size copy us "
             "| legacy us (template, % BW) | why not >= 70% |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(timed, key=lambda r: (r["group"], r["program"], -r["bytes"])):
        r["why"] = why_not(r)       # with this version's reasons (rows may be older)
        legacy = (f"{r['legacy_us']:.1f} ({r['legacy_template']}, {r['legacy_bw']:.0%})"
                  if "legacy_us" in r else "")
        lines.append(f"| {r['group']} | {r['program']} | {r['kernel']} | {r['template']} | "
                     f"{', '.join(r['inputs'])[:80]} | {r['bytes'] / 2**20:.2f} | {r['us']:.1f} | "
                     f"{r['bw']:.0%} | {r.get('copy_us', float('nan')):.1f} | {legacy} | {r['why']} |")
    return "\n".join(lines)


def carried_rows(path: str, groups: set) -> list[dict]:
    """Rows of ``groups`` read back from an earlier table (``table``'s format), for a merge
    that did not re-run them: bytes from the MiB column, the grid from the why-not text."""
    import re
    rows = []
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 11 or cells[0] not in groups:
            continue
        group, program, kernel, template, inputs, mib, us, pct, copy_us, _legacy, why = cells
        programs = re.search(r"(\d+) programs for", why)
        rows.append({"group": group, "program": program, "kernel": kernel, "template": template,
                     "inputs": [inputs], "bytes": float(mib) * 2**20, "us": float(us),
                     "bw": float(pct.rstrip("%")) / 100, "copy_us": float(copy_us),
                     "grid": [[int(programs.group(1)) if programs else 132]], "passes": 1,
                     "timing": "carried"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="suite,zoo,issue14")
    ap.add_argument("--no-legacy", action="store_true", help="skip the legacy-template column")
    ap.add_argument("--list", action="store_true", help="no timing: kernels and templates only")
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--merge", nargs="*", help="make the table from these JSON-lines files")
    ap.add_argument("--device", default="", help="with --merge: the device the rows came from")
    ap.add_argument("--copy-gbs", type=float, default=0.0, help="with --merge: copy bandwidth")
    ap.add_argument("--carry", default="", help="with --merge: OLD.md:group[,group] keeps those "
                    "groups' rows of an earlier table (groups not re-run)")
    opts = ap.parse_args()
    if opts.merge is not None:
        rows = [json.loads(line) for path in opts.merge if os.path.exists(path)
                for line in open(path) if line.strip()]
        if opts.carry:
            path, _, groups = opts.carry.rpartition(":")
            rows += carried_rows(path, set(groups.split(",")))
        first = next((r for r in rows if "copy_gbs" in r), {})
        text = table(rows, opts.copy_gbs or first.get("copy_gbs", 0.0),
                     opts.device or first.get("device", ""))
        print(text)
        if opts.out:
            with open(opts.out, "w") as fh:
                fh.write(HEADER + text + "\n")
        return
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    rows = measure(set(opts.only.split(",")), not opts.no_legacy, opts.jsonl, opts.list)
    if opts.list:
        for r in rows:
            print(f"{r['group']:8s} {r['program']:24s} {r['template']:34s} "
                  f"{r['bytes'] / 2**20:9.2f} MiB {r['kernel']}")
        return
    import torch
    from benchmarks.gpu_suite import ceilings_copy
    text = table(rows, ceilings_copy() / 1e9, torch.cuda.get_device_name())
    print(text)
    if opts.out:
        with open(opts.out, "w") as fh:
            fh.write(HEADER + text + "\n")


if __name__ == "__main__":
    main()
