"""Which zoo programs take the native launcher's path, and why the others do not (issue 12).

On the GPU machine (shards run in parallel, then merged):

    JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.native_coverage --shard 0/4 --jsonl /tmp/c0.jsonl
    python3 -m benchmarks.native_coverage --merge /tmp/c*.jsonl --out benchmarks/native_coverage.md

Per program of ``tests/zoo.py``: compiled with ``runtime.jit(fn, backend="cuda")``, called on
its arguments, on a second argument set (new addresses, the first results still held) and on
the first again; every result compared with ``jax.jit``'s under the zoo test's tolerances
(``tests/test_cuda_runtime.py``). Recorded: the host path (``native`` or ``python``) and
``exe.native_reason``; for native graphs the nodes by kind, how many copies/fills of
arguments or results became copy kernels and how many differing words were kept as
captured (host words, device words outside the arguments/results:
``runtime/cuda/native/patch.py``). "before": Python wherever the graph needed either (the
path before them, issue 12 runs 1-3).

Without a GPU (``--static``, any machine): each program's CPU-mode CUDA executable and the
reason its program alone keeps it off the native path (``launcher.program_reason``: host
control flow, tuples, host fallbacks), or "capturable" (the captures decide on a GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")


def on_gpu(name: str) -> dict:
    import jax
    import runtime
    from runtime.cuda import executable_of
    from tests.test_cuda_runtime import _zoo_tolerance, check_close
    from tests.zoo import by_name, x64_scope
    prog = by_name(name)
    row: dict = {"program": name}
    t0 = time.perf_counter()
    dev = jax.devices("gpu")[0]
    with x64_scope(prog), jax.default_matmul_precision("highest"):
        first = jax.device_put(prog.args(), dev)
        second = jax.device_put(prog.args(seed=1), dev)
        c = runtime.jit(prog.fn, backend="cuda").lower(*first).compile()
        rtol, atol = _zoo_tolerance(prog)
        try:
            held = [(a, c(*a)) for a in (first, second, first)]
            for a, got in held:
                check_close(got, jax.jit(prog.fn)(*a), rtol, atol)
            row["equal"] = "yes"
        except Exception as e:  # noqa: BLE001  (recorded: the table says which and why)
            row["equal"] = f"NO: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    exe = executable_of(c)
    if exe is None:
        row.update(path="python", reason="no CUDA executable")
        return row
    graph = exe.native
    row["path"] = "native" if graph is not None else "python"
    row["reason"] = "" if graph is not None else exe.native_reason
    if graph is not None:
        kinds: dict = {}
        for n in graph.nodes:
            kinds[n.kind] = kinds.get(n.kind, 0) + 1
        row.update(nodes=kinds, lowered=graph.lowered_copies, kept_words=len(graph.kept_words),
                   kept=graph.kept_words[:3])
    row["before"] = "native" if graph is not None and not row.get("lowered") and \
        not row.get("kept_words") else "python"
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def static(name: str) -> dict:
    import runtime
    from runtime.cuda import executable_of
    from runtime.cuda.native import launcher
    from tests.zoo import by_name, x64_scope
    prog = by_name(name)
    with x64_scope(prog):
        exe = executable_of(runtime.jit(prog.fn, backend="cuda").lower(*prog.args()).compile())
    reason = launcher.program_reason(exe) if exe is not None else "no CUDA executable"
    return {"program": name, "path": "python" if reason else "capturable",
            "reason": reason or ""}


def table(rows: list[dict]) -> str:
    rows = sorted(rows, key=lambda r: (r.get("path") != "native", r["program"]))
    gpu = any("equal" in r for r in rows)
    if not gpu:
        lines = ["| program | program alone allows the native path? | why not |", "|---|---|---|"]
        lines += [f"| {r['program']} | {r['path']} | {r['reason']} |" for r in rows]
        return "\n".join(lines)
    native = sum(r.get("path") == "native" for r in rows)
    before = sum(r.get("before") == "native" for r in rows)
    unequal = [r["program"] for r in rows if r.get("equal") != "yes"]
    lines = [f"{len(rows)} zoo programs: {native} native, {len(rows) - native} on the Python "
             f"path (without copy kernels and kept words: {before} native, "
             f"{len(rows) - before} Python). Equal to jax.jit on every call: "
             f"{len(rows) - len(unequal)}" + (f" (not: {', '.join(unequal)})" if unequal else ""),
             "", "| program | path | before | equal to jax.jit | graph nodes | copy kernels | "
             "words kept | why the Python path |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nodes = ", ".join(f"{v} {k}" for k, v in sorted(r.get("nodes", {}).items()))
        lines.append(f"| {r['program']} | {r.get('path', '?')} | {r.get('before', '?')} | "
                     f"{r.get('equal', '?')} | {nodes} | {r.get('lowered', '')} | "
                     f"{r.get('kept_words', '')} | {r.get('reason', '')[:300]} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shard", default="0/1", help="i/k: every k-th program from the i-th")
    ap.add_argument("--jsonl", help="append one JSON line per program here")
    ap.add_argument("--static", action="store_true", help="no GPU: program reasons only")
    ap.add_argument("--merge", nargs="*", help="JSON-lines files to merge into the table")
    ap.add_argument("--out", help="write the markdown table here")
    opts = ap.parse_args()
    if opts.merge:
        rows = [json.loads(line) for path in opts.merge if os.path.exists(path)
                for line in open(path) if line.strip()]
    else:
        if not opts.static:
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        from tests.zoo import ZOO
        i, k = (int(v) for v in opts.shard.split("/"))
        rows = []
        for prog in ZOO[i::k]:
            try:
                row = static(prog.name) if opts.static else on_gpu(prog.name)
            except Exception as e:  # noqa: BLE001  (one program's failure is a row)
                traceback.print_exc()
                row = {"program": prog.name, "path": "error",
                       "reason": f"{type(e).__name__}: {e}"[:300], "equal": "error"}
            print(json.dumps(row), flush=True)
            rows.append(row)
            if opts.jsonl:
                with open(opts.jsonl, "a") as f:
                    f.write(json.dumps(row) + "\n")
    text = table(rows)
    print(text)
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
