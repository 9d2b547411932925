"""Issue 13: the CUDA pipeline's decisions, hashed per program, so a compile-time change to
the passes can be shown to change nothing (same optimized HLO text, same buffer assignment).

    PYTHONPATH=/work/main python /path/to/benchmarks/passes_identity.py --record before.json
    PYTHONPATH=$PWD python benchmarks/passes_identity.py --check before.json [--only a,b]
    PYTHONPATH=$PWD python benchmarks/passes_identity.py --time 3 --only adam_step
    PYTHONPATH=$PWD python benchmarks/passes_identity.py --check before.json --client

Deviceless, as ``benchmarks.compile_time --deviceless`` compiles: the program lowered with no
passes, then the default CUDA pipeline for target h200 (no module cache). Programs: the GPU
suite (benchmarks/gpu_suite.py), issue 14's attention programs (benchmarks/attention.py,
at smaller shapes: only the graph matters here, and the decisions depend on the shapes, so
before and after use the same ones) and every zoo program (tests/zoo.py). Hashed per
program: the optimized module's text ("hlo": the fusion decisions, as kernels), the buffer
assignment ("buffers"), and the fusion decision log ("log": every pair looked at, in order,
with its reason and predicted times); source paths in metadata are taken relative to the
checkout. ``--check`` compares "hlo" and "buffers"; a log that differs is reported, not
counted (chains.py merges elementwise chains before the ranked loop and logs them with its
own reason: the loop then looks at other pairs in another order). Before i13-fusion-cpu the
"hlo" hash held the log too; benchmarks/passes_identity_before.json was recorded again
from main 65c040d with this version of the script.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time

os.environ.setdefault("HLOTK_COMPILE_CACHE", "0")


def _attention_programs() -> list[tuple]:
    """attn_fwd, attn_grad and transformer_train at small shapes (the suite's are slow to
    build on this CPU; the graph is the same up to its dimensions)."""
    import ml_dtypes
    import numpy as np

    from benchmarks.attention import (attention_grad, causal_attention, transformer_train_args,
                                      transformer_train_step)
    b, h, s, d = 2, 4, 256, 64
    r = np.random.default_rng(0)
    qkv = tuple(r.standard_normal((b, s, h, d)).astype(ml_dtypes.bfloat16) for _ in range(3))
    return [("attn_fwd", causal_attention, qkv), ("attn_grad", attention_grad, qkv),
            ("transformer_train", transformer_train_step(4), transformer_train_args(2, 128, 256))]


def _heldout_programs() -> list[tuple]:
    """The held-out decoder block (K/V heads repeated with jnp.repeat, read in place) and
    RMSNorm + SwiGLU (gate/up GEMMs priced as cuBLAS + epilogue), at sizes whose decisions
    are the full programs' (contracting 2048: the split rule applies)."""
    import ml_dtypes
    import numpy as np

    from benchmarks.heldout_programs import llama_args, llama_block, rmsnorm_swiglu
    r = np.random.default_rng(0)

    def w(*shape, scale=1.0):
        return (r.standard_normal(shape) * scale).astype(ml_dtypes.bfloat16)
    t, d, f = 4096, 2048, 5632
    mlp = (w(d), w(d, f, scale=d ** -0.5), w(d, f, scale=d ** -0.5), w(f, d, scale=f ** -0.5),
           w(t, d))
    from benchmarks.heldout_programs import programs as heldout
    # The other held-out programs at their own sizes (session 9: the optimizer steps over
    # 200 arrays are where the passes' time grows faster than the program).
    more = [("heldout:" + p[0], p[2], p[3]) for p in heldout() if p[0] in FULL_SIZE_HELDOUT]
    return [("heldout:llama_block", llama_block, llama_args(r, 1, 256, 2048, 5632)),
            ("heldout:rmsnorm_swiglu", rmsnorm_swiglu, mlp)] + more


FULL_SIZE_HELDOUT = ("adamw_200", "lion_200", "lion_step", "gpt_train_step", "kv_decode",
                     "moe_grad", "conv_bn_grad", "lstm_grad", "xent_32k", "dpa_grad")


def programs(only: set[str]) -> list[tuple]:
    """(name, fn, args, x64) for every program, filtered by ``only`` when given."""
    from benchmarks.gpu_suite import programs as suite
    sys.path.insert(0, "tests")
    from zoo import ZOO
    out = [(p[0], p[2], p[3], False) for p in suite()]
    out += [(n, f, a, False) for n, f, a in _attention_programs()]
    out += [(n, f, a, False) for n, f, a in _heldout_programs()]
    out += [("zoo:" + p.name, p.fn, p.args(), "x64" in p.tags) for p in ZOO]
    return [p for p in out if not only or p[0] in only]


def compile_one(fn, args, x64: bool, client: bool = False) -> tuple[str, str, float, str]:
    """(optimized module text, buffer assignment text, seconds in the
    passes). ``client``: the way ``Client.compile`` runs the passes (the input verified, a
    copy of it through the module cache, the pipeline verifying, the mandatory lowering),
    with an empty cache directory, instead of the pipeline on the lowered module itself;
    fusion decision log)."""
    import contextlib

    import jax

    import runtime
    from passes.buffer_assignment import assign_buffers
    from passes.fusion.explain import report_for
    from passes.fusion.pass_ import with_target
    from passes.pipelines import pipeline_spec
    from runtime.tools import compile_module
    with jax.enable_x64(True) if x64 else contextlib.nullcontext():
        module = runtime.jit(fn, pipeline="none").lower(*args).module
    spec = with_target(pipeline_spec("default", "cuda"), "h200")
    t0 = time.perf_counter()
    if client:
        module = _client_passes(module, spec)
    else:
        compile_module(module, spec, backend="cuda")
    seconds = time.perf_counter() - t0
    report = report_for(module)
    # The fusion decision log too (every pair looked at, its reason and predicted times).
    log = "" if report is None else "\n".join(map(repr, report.decisions))
    return module.to_text(), assign_buffers(module).to_text(), seconds, log


def _client_passes(module, spec: str):
    """``Client.compile``'s passes on ``module`` (runtime/client.py), through an empty
    module cache: the optimized copy."""
    import tempfile

    import hlo
    from passes.pipelines import run_mandatory_lowering
    from runtime import compile_cache
    from runtime.tools import compile_module
    import inspect
    # (``verified`` is newer than the before-checkout this may run against.)
    kw = {"verified": True} if "verified" in inspect.signature(compile_module).parameters \
        else {}
    old = {k: os.environ.get(k) for k in ("HLOTK_CACHE_DIR", "HLOTK_COMPILE_CACHE")}
    with tempfile.TemporaryDirectory(prefix="hlotk_identity_") as cache:
        os.environ.update(HLOTK_CACHE_DIR=cache, HLOTK_COMPILE_CACHE="1")
        try:
            out, records, _ = compile_cache.compiled(
                module, spec, "cuda",
                lambda m: compile_module(m, spec, backend="cuda", verify=True, **kw)[0],
                check=hlo.verify)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    run_mandatory_lowering(out, "cuda", records, verify=True)
    return out


def _same(want, got: dict) -> bool:
    """The decisions (kernels and buffers) are the same; the log may differ."""
    if want is None or "error" in want or "error" in got:
        return want == got
    return all(want.get(k) == got.get(k) for k in ("hlo", "buffers"))


def digest(text: str) -> str:
    """A short hash of ``text`` with the checkout's path taken out of source metadata (the
    before-run reads the programs from another checkout)."""
    text = re.sub(r'source_file="[^"]*/(benchmarks|tests|hlo|passes|runtime|codegen)/',
                  r'source_file="\1/', text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", default="")
    ap.add_argument("--check", default="")
    ap.add_argument("--only", default="")
    ap.add_argument("--dump", default="", help="write each program's texts into this folder")
    ap.add_argument("--time", type=int, default=0, help="median seconds of the passes over N runs")
    ap.add_argument("--client", action="store_true", help="the passes as Client.compile runs "
                    "them (verified input, its copy through an empty module cache, verifying)")
    opts = ap.parse_args()
    only = {s for s in opts.only.split(",") if s}
    want = json.load(open(opts.check)) if opts.check else {}
    got: dict[str, dict] = {}
    bad = 0
    for name, fn, args, x64 in programs(only):
        try:
            text, ba, sec, log = compile_one(fn, args, x64, opts.client)
        except Exception as e:  # noqa: BLE001  (a program the pipeline refuses: record that)
            got[name] = {"error": type(e).__name__ + ": " + str(e)[:200]}
            bad += bool(want) and want.get(name) != got[name]
            print(f"{name}: error {got[name]['error']}", flush=True)
            continue
        if opts.dump:
            os.makedirs(opts.dump, exist_ok=True)
            with open(os.path.join(opts.dump, name.replace(":", "_") + ".txt"), "w") as f:
                f.write(text + "\n" + log + "\n" + ba)
        times = [sec] + [compile_one(fn, args, x64, opts.client)[2]
                         for _ in range(max(opts.time - 1, 0))]
        got[name] = {"hlo": digest(text), "buffers": digest(ba), "log": digest(log)}
        line = f"{name}: hlo {got[name]['hlo']} buffers {got[name]['buffers']}"
        if opts.time:
            median = sorted(times)[len(times) // 2]
            line += f" passes median {median:.3f} s {[round(t, 3) for t in times]}"
        if want:
            ok = _same(want.get(name), got[name])
            bad += not ok
            line += "  OK" if ok else f"  DIFFERS (was {want.get(name)})"
            if ok and (want.get(name) or {}).get("log") not in (None, got[name]["log"]):
                line += " (log differs)"
        print(line, flush=True)
    if opts.record:
        with open(opts.record, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
    if want:
        missing = [n for n in want if n not in got and (not only or n in only)]
        print(f"{len(got) - bad}/{len(got)} identical"
              + (f"; missing {missing}" if missing else ""))
        sys.exit(1 if bad or missing else 0)


if __name__ == "__main__":
    main()
