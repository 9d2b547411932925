"""The GPU suite of issue 6: each program through hlotk (backend="cuda") and jax.jit, on the
same random inputs, in one process. Run ON the GPU machine from the repository root:

    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu python3 -m benchmarks.gpu_suite [--no-autotune]
        [--only NAME,...] [--out benchmarks/gpu_suite.md] [--heldout]

``--heldout`` runs the programs of ``benchmarks/heldout_programs.py`` (optimizer steps over
hundreds of arrays, a LLaMA-style decoder block, losses and gradients the suite does not
have) the same way.

For each program: results checked against jax.jit (relative norm error per output leaf);
hlotk ms and XLA ms are the median wall time of one call including waiting for its result
(``triton.testing.do_bench`` around ``f(*args)`` + ``block_until_ready``, as the issue's
XLA numbers); "device ms" is the time of hlotk's CUDA graph replays alone (events around
each captured segment, summed): what the kernels own, without Python. Compile seconds:
hlotk's lower + passes + codegen (``compile``) and its first call (Triton JIT compile,
autotuning, graph warm-up); XLA's ``lower().compile()``. Kernel counts: hlotk thunks by
kind; XLA's fusions + library custom calls in the optimized HLO. Temp bytes: hlotk's arena;
XLA's ``memory_analysis().temp_size_in_bytes``. Achieved: minimum bytes / device time
against the measured copy bandwidth, or FLOPs / device time against the measured matmul
rate of that element type.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback

sys.path.insert(0, ".")
os.environ.setdefault("HLOTK_CACHE_DIR", "/tmp/hlotk_cache")

import numpy as np  # noqa: E402

# XLA's issue numbers (H200, wall per call), in program order.
ISSUE_XLA_MS = {"softmax": 0.138, "layernorm": 0.112, "gelu_mlp": 2.03, "s8_gemm": 0.073,
                "giou": 0.056, "int8_matmul": 1.41, "transformer": 1.53, "mlp_train": 1.33}


# --- the programs -----------------------------------------------------------------------------
def adam_step(params, grads, m, v, step):
    """One Adam update over a pytree (optax.adam's arithmetic, bias-corrected): the
    optimizer step every training loop calls, many arrays of mixed sizes."""
    import jax
    import jax.numpy as jnp
    b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
    step = step + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    params = jax.tree.map(lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps),
                          params, m, v)
    return params, m, v, step


def programs():
    import jax
    import jax.numpy as jnp
    from jax import lax
    bf16 = jnp.bfloat16

    def softmax(x):
        return jax.nn.softmax(x, axis=-1)

    def layernorm(g, x, b):
        mu = jnp.mean(x.astype(jnp.float32), -1, keepdims=True).astype(x.dtype)
        d = x - mu
        var = jnp.mean((d * d).astype(jnp.float32), -1, keepdims=True).astype(x.dtype)
        return d * lax.rsqrt(var + bf16(1e-5)) * g + b

    def gelu_mlp(x, w1, w2):
        return jax.nn.gelu(x @ w1, approximate=True) @ w2

    def s8_gemm(a, b):
        return -((a.astype(bf16) @ b) * bf16(0.125))

    from tests.zoo import giou_boxes as giou  # the zoo's GIOU, at the benchmark's sizes

    def int8_matmul(a, b):
        return lax.dot(a, b, preferred_element_type=jnp.int32)

    H = 16

    def ln(x, g, b):
        xf = x.astype(jnp.float32)
        mu = xf.mean(-1, keepdims=True)
        var = ((xf - mu) ** 2).mean(-1, keepdims=True)
        return ((xf - mu) * lax.rsqrt(var + 1e-5) * g + b).astype(x.dtype)

    def transformer(p, x):
        B, S, D = x.shape
        h = ln(x, p["ln1_g"], p["ln1_b"])
        q, k, v = (h @ p["wq"], h @ p["wk"], h @ p["wv"])
        split = lambda z: z.reshape(B, S, H, D // H).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * bf16(1.0 / math.sqrt(D // H))
        causal = jnp.tril(jnp.ones((S, S), bool))
        s = jnp.where(causal, s, bf16(-1e9))
        a = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(bf16)
        o = jnp.einsum("bhqk,bhkd->bhqd", a, v).transpose(0, 2, 1, 3).reshape(B, S, D)
        x = x + o @ p["wo"]
        h = ln(x, p["ln2_g"], p["ln2_b"])
        return x + jax.nn.gelu(h @ p["w1"], approximate=True) @ p["w2"]

    def mlp_train(p, x, labels):
        def loss_fn(p):
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            h = jax.nn.relu(h @ p["w2"] + p["b2"])
            logits = h @ p["w3"] + p["b3"]
            logp = jax.nn.log_softmax(logits)
            # one-hot cross-entropy (no gather/scatter: hlotk has no GPU kernels for those
            # yet and would run them on the host)
            return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(labels, 1000, dtype=logp.dtype), -1))
        loss, g = jax.value_and_grad(loss_fn)(p)
        return jax.tree.map(lambda w, gw: w - 0.01 * gw, p, g), loss

    r = np.random.default_rng(0)

    def f32(*s, scale=1.0):
        return (r.standard_normal(s) * scale).astype(np.float32)

    def b16(*s, scale=1.0):
        return f32(*s, scale=scale).astype(bf16)

    def boxes(n, m):
        xy = np.abs(f32(n, m, 2)) * 5
        return np.concatenate([xy, xy + np.abs(f32(n, m, 2)) * 3 + 0.1], axis=-1)

    D = 1024
    tparams = {"ln1_g": 1 + f32(D, scale=0.1), "ln1_b": f32(D, scale=0.1),
               "wq": b16(D, D, scale=D ** -0.5), "wk": b16(D, D, scale=D ** -0.5),
               "wv": b16(D, D, scale=D ** -0.5), "wo": b16(D, D, scale=D ** -0.5),
               "ln2_g": 1 + f32(D, scale=0.1), "ln2_b": f32(D, scale=0.1),
               "w1": b16(D, 4 * D, scale=D ** -0.5), "w2": b16(4 * D, D, scale=(4 * D) ** -0.5)}
    mparams = {"w1": f32(1024, 4096, scale=1024 ** -0.5), "b1": f32(4096, scale=0.1),
               "w2": f32(4096, 4096, scale=4096 ** -0.5), "b2": f32(4096, scale=0.1),
               "w3": f32(4096, 1000, scale=4096 ** -0.5), "b3": f32(1000, scale=0.1)}
    adam_shapes = adam_param_shapes()
    adam_params = {k: f32(*s, scale=0.02) for k, s in adam_shapes.items()}
    adam_args = (adam_params, {k: f32(*s, scale=1e-3) for k, s in adam_shapes.items()},
                 {k: f32(*s, scale=1e-4) for k, s in adam_shapes.items()},
                 {k: np.abs(f32(*s, scale=1e-6)) for k, s in adam_shapes.items()},
                 np.float32(10.0))
    adam_elems = sum(int(np.prod(s)) for s in adam_shapes.values())
    mlp_flops = 3 * 2 * 2048 * (1024 * 4096 + 4096 * 4096 + 4096 * 1000)
    tf_flops = 8 * 1024 * (2 * D * D * 4 + 2 * 2 * D * 4 * D) * 2 + 8 * 16 * 2 * 2 * 1024 * 1024 * 64
    # (name, label, fn, args, min bytes, flops, flop kind, tolerance)
    return [
        ("softmax", "softmax f32 [8192,4096]", softmax, (f32(8192, 4096),),
         2 * 8192 * 4096 * 4, 0, "", 1e-5),
        ("layernorm", "layer norm bf16 [8192,4096]", layernorm,
         (b16(4096), b16(8192, 4096), b16(4096)), 2 * 8192 * 4096 * 2, 0, "", 2e-2),
        ("gelu_mlp", "gelu MLP bf16 x[4096,4096] w1[4096,16384] w2[16384,4096]", gelu_mlp,
         (b16(4096, 4096), b16(4096, 16384, scale=4096 ** -0.5), b16(16384, 4096, scale=16384 ** -0.5)),
         2 * (3 * 4096 * 4096 + 2 * 4096 * 16384), 2 * 2 * 4096 * 4096 * 16384, "bf16", 2e-2),
        ("s8_gemm", "-((a.astype(bf16) @ b) * 0.125) s8[1024,512] bf16[512,2048]", s8_gemm,
         (r.integers(-128, 128, (1024, 512)).astype(np.int8), b16(512, 2048)),
         1024 * 512 + 512 * 2048 * 2 + 1024 * 2048 * 2, 2 * 1024 * 512 * 2048, "bf16", 2e-2),
        ("giou", "GIOU f32[1024,256,4] x2", giou, (boxes(1024, 256), boxes(1024, 256)),
         2 * 1024 * 256 * 4 * 4 + 1024 * 256 * 4, 0, "", 1e-5),
        ("int8_matmul", "int8 matmul [8192,8192]^2 -> s32", int8_matmul,
         (r.integers(-128, 128, (8192, 8192)).astype(np.int8),
          r.integers(-128, 128, (8192, 8192)).astype(np.int8)),
         2 * 8192 * 8192 + 8192 * 8192 * 4, 2 * 8192 ** 3, "int8", 0.0),
        ("transformer", "transformer block bf16 B8 S1024 D1024 16 heads causal", transformer,
         (tparams, b16(8, 1024, D)), 2 * (2 * 8 * 1024 * D + 12 * D * D), tf_flops, "bf16", 3e-2),
        ("mlp_train", "MLP training step f32 1024-4096-4096-1000, batch 2048, SGD", mlp_train,
         (mparams, f32(2048, 1024), r.integers(0, 1000, (2048,)).astype(np.int32)),
         4 * 2 * sum(v.size for v in mparams.values()) + 2048 * 1024 * 4, mlp_flops, "tf32", 2e-2),
        ("adam_step", f"Adam step f32, {len(adam_shapes)} params ({adam_elems / 1e6:.1f}M) + "
         f"grads, m, v, step: {4 * len(adam_shapes) + 1} arrays in, "
         f"{3 * len(adam_shapes) + 1} out", adam_step, adam_args, 7 * 4 * adam_elems, 0, "",
         1e-5),
    ]


def adam_param_shapes() -> dict:
    """24 parameters of a small transformer-like model, 3 K to 2.4 M elements each."""
    shapes = {}
    for b in range(4):
        shapes.update({f"b{b}.qkv": (1536, 1536), f"b{b}.qkv_bias": (3072,),
                       f"b{b}.out": (1536, 768), f"b{b}.mlp": (768, 1536),
                       f"b{b}.mlp_bias": (6144,), f"b{b}.ln": (3072,)})
    return shapes


# --- measuring ------------------------------------------------------------------------------
def bench(fn, rep: int = 200) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def wall_ms(fn, reps: int = 100) -> float:
    """Median host-clock time of one call from an idle GPU with a flushed L2 to its result
    being ready. do_bench's L2 flush runs on torch's stream while its events bracket the
    call there, so work JAX launches on its own stream can start under the flush and go
    partly uncounted; here the flush is finished before the clock starts, for both."""
    import statistics
    import torch
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def ceilings() -> dict:
    import torch
    out = {}
    a = torch.empty(1 << 28, device="cuda").normal_()
    b = torch.empty_like(a)
    out["copy"] = 2 * a.numel() * 4 / (bench(lambda: b.copy_(a)) * 1e-3)
    del a, b
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out["bf16"] = 2 * n ** 3 / (bench(lambda: x @ y) * 1e-3)
    xf, yf = x.float(), y.float()
    torch.set_float32_matmul_precision("high")
    out["tf32"] = 2 * n ** 3 / (bench(lambda: xf @ yf) * 1e-3)
    torch.set_float32_matmul_precision("highest")
    xi = torch.randint(-128, 128, (n, n), device="cuda", dtype=torch.int8)
    # cuBLAS's int8 GEMM reads B K-major ("TN"); on a row-major B torch._int_mm measured
    # 128 TOPS on the H200, on the K-major one 894 (benchmarks/NOTES.md run 10).
    yi = torch.randint(-128, 128, (n, n), device="cuda", dtype=torch.int8).t().contiguous().t()
    out["int8"] = 2 * n ** 3 / (bench(lambda: torch._int_mm(xi, yi)) * 1e-3)
    return out


_COPY: list[float] = []


def ceilings_copy() -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), measured once
    per process as ``ceilings()`` does."""
    if not _COPY:
        import torch
        a = torch.empty(1 << 28, device="cuda").normal_()
        b = torch.empty_like(a)
        _COPY.append(2 * a.numel() * 4 / (bench(lambda: b.copy_(a)) * 1e-3))
        del a, b
    return _COPY[0]


def rel_err(got, want) -> float:
    g = np.asarray(got).astype(np.float64)
    w = np.asarray(want).astype(np.float64)
    if np.isnan(g).any() and not np.isnan(w).any():
        return float("nan")
    if g.dtype.kind in "iub" or np.asarray(want).dtype.kind in "iub":
        return float(np.abs(g - w).max()) if g.size else 0.0
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))


def xla_kernels(text: str) -> int:
    entry = text[text.find("ENTRY"):]
    return sum(1 for ln in entry.splitlines()
               if " fusion(" in ln or "custom-call(" in ln or " copy(" in ln)


def device_ms(exe, args=None) -> float:
    """The executable's device time: its native graph's replay (over staging buffers
    holding ``args``' leaves, the call's own data, where given; zeros otherwise), or the sum
    of the captured segments' replay times (the last graph of each segment, on the buffers
    of the call it captured)."""
    if getattr(exe, "native", None) is not None:
        import jax
        leaves = None if args is None else jax.tree_util.tree_leaves(args)
        return bench(exe.native.replay_on_staging(leaves), rep=100)
    total, missing = 0.0, 0
    for seg in exe.graph_segments():
        if not seg.graphs:
            missing += len(seg.thunks)
            continue
        g = next(reversed(seg.graphs.values()))
        total += bench(g.replay, rep=100)
    return total if missing == 0 else float("nan")


def run_one(prog, ceil, autotune: bool, pipeline: str = "") -> dict:
    """One program through hlotk and jax.jit (see the module doc); ``pipeline``: a spec
    for ``runtime.jit`` instead of the CUDA default (to compare two in one process)."""
    import jax
    import torch
    import runtime
    from runtime.cuda import executable_of
    name, label, fn, args, nbytes, flops, fkind, tol = prog
    dev_args = jax.device_put(args)
    jax.block_until_ready(dev_args)
    row = {"name": name, "label": label}
    t0 = time.perf_counter()
    jf = jax.jit(fn)
    xc = jf.lower(*dev_args).compile()
    row["xla_compile_s"] = time.perf_counter() - t0
    want = jax.block_until_ready(xc(*dev_args))
    row["xla_kernels"] = xla_kernels(xc.as_text())
    try:
        row["xla_temp"] = xc.memory_analysis().temp_size_in_bytes
    except Exception:  # noqa: BLE001
        row["xla_temp"] = float("nan")
    os.environ["HLOTK_AUTOTUNE"] = "1" if autotune else "0"
    t0 = time.perf_counter()
    kw = {"pipeline": pipeline} if pipeline else {}
    hc = runtime.jit(fn, backend="cuda", **kw).lower(*dev_args).compile()
    row["hlotk_compile_s"] = time.perf_counter() - t0
    exe = executable_of(hc)
    t0 = time.perf_counter()
    got = jax.block_until_ready(hc(*dev_args))
    row["hlotk_first_call_s"] = time.perf_counter() - t0
    errs = [rel_err(g, w) for g, w in zip(jax.tree_util.tree_leaves(got),
                                          jax.tree_util.tree_leaves(want))]
    row["err"] = max(errs) if errs else 0.0
    row["ok"] = all(e <= tol for e in errs) if tol else all(e == 0 for e in errs)
    del got
    for _ in range(3):       # capture the graphs, replay once
        jax.block_until_ready(hc(*dev_args))
    got = jax.block_until_ready(hc(*dev_args))   # a replayed result, checked again
    errs = [rel_err(g, w) for g, w in zip(jax.tree_util.tree_leaves(got),
                                          jax.tree_util.tree_leaves(want))]
    row["err_replay"] = max(errs) if errs else 0.0
    row["ok"] = row["ok"] and (all(e <= tol for e in errs) if tol else all(e == 0 for e in errs))
    del got, want
    row["xla_ms"] = bench(lambda: jax.block_until_ready(xc(*dev_args)))
    exe.stats.clear()
    row["hlotk_ms"] = bench(lambda: jax.block_until_ready(hc(*dev_args)))
    # Counters of the timed calls alone (graph replays vs eager runs, pooled outputs).
    row["timed_stats"] = {k: v for k, v in exe.stats.items() if not isinstance(v, list)}
    row["xla_wall"] = wall_ms(lambda: jax.block_until_ready(xc(*dev_args)))
    exe.stats.clear()
    row["hlotk_wall"] = wall_ms(lambda: jax.block_until_ready(hc(*dev_args)))
    row["cold_stats"] = {k: v for k, v in exe.stats.items() if not isinstance(v, list)}
    row["device_ms"] = device_ms(exe, dev_args)
    exe.graphs.enabled = False
    row["nograph_ms"] = bench(lambda: jax.block_until_ready(hc(*dev_args)), rep=100)
    exe.graphs.enabled = True
    row["host_path"] = "native" if exe.native is not None else f"python ({exe.native_reason})"
    row["kernels"] = exe.kernel_count()
    row["segments"] = len(exe.graph_segments())
    row["host_fallbacks"] = len(exe.host_fallbacks())
    row["temp"] = exe.assignment.temp_size
    t = row["device_ms"] if row["device_ms"] == row["device_ms"] else row["hlotk_ms"]
    if flops and fkind:
        row["achieved"] = (f"{flops / (t * 1e-3) / 1e12:.0f} TFLOP/s "
                           f"({flops / (t * 1e-3) / ceil[fkind]:.0%} of {fkind} mm)")
    else:
        row["achieved"] = (f"{nbytes / (t * 1e-3) / 1e9:.0f} GB/s "
                           f"({nbytes / (t * 1e-3) / ceil['copy']:.0%} of copy)")
    row["report"] = exe.report()
    try:
        prof = exe.profile(list(jax.tree_util.tree_leaves(dev_args)))
        row["profile"] = "\n".join(f"{ms:8.4f} ms  {what}" for what, ms in prof)
    except Exception as e:  # noqa: BLE001
        row["profile"] = f"profile failed: {type(e).__name__}: {e}"
    del hc, exe
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-autotune", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default="benchmarks/gpu_suite.md")
    ap.add_argument("--heldout", action="store_true",
                    help="the programs of benchmarks/heldout_programs.py instead of the suite's")
    opts = ap.parse_args()
    import jax
    import torch
    import triton
    dev = torch.cuda.get_device_name()
    print(f"device {dev}; torch {torch.__version__}, triton {triton.__version__}, "
          f"jax {jax.__version__} ({jax.devices()[0].platform})", flush=True)
    ceil = ceilings()
    print("ceilings: " + ", ".join(f"{k} {v / 1e9:.0f} GB/s" if k == "copy" else
                                   f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in ceil.items()),
          flush=True)
    only = set(filter(None, opts.only.split(",")))
    rows = []
    if opts.heldout:
        from benchmarks.heldout_programs import programs as heldout
    for prog in heldout() if opts.heldout else programs():
        if only and prog[0] not in only:
            continue
        t0 = time.time()
        try:
            row = run_one(prog, ceil, not opts.no_autotune)
        except Exception as e:  # noqa: BLE001  (one program failing must not hide the rest)
            traceback.print_exc()
            row = {"name": prog[0], "label": prog[1], "failed": f"{type(e).__name__}: {str(e)[:300]}"}
        rows.append(row)
        print(f"[{time.time() - t0:.0f}s] " + str({k: v for k, v in row.items()
                                                    if k not in ("report", "profile")}), flush=True)
    lines = [f"# GPU suite (issue 6): hlotk backend=cuda vs jax.jit", "",
             f"Device: {dev}. torch {torch.__version__}, triton {triton.__version__}, "
             f"jax {jax.__version__}. Autotune: {not opts.no_autotune}. Ceilings measured: "
             f"copy {ceil['copy'] / 1e9:.0f} GB/s, bf16 mm {ceil['bf16'] / 1e12:.0f}, "
             f"tf32 mm {ceil['tf32'] / 1e12:.0f}, int8 mm {ceil['int8'] / 1e12:.0f} TFLOP/s.", "",
             "ms = median wall per call incl. waiting for the result (do_bench); cold wall = "
             "median host-clock time of a call started on an idle GPU after a finished L2 flush "
             "(wall_ms); device ms = hlotk's CUDA-graph replays alone; no-graph ms = hlotk with "
             "cuda graphs off.", "",
             "| program | ok (max rel err) | hlotk ms | XLA ms | ratio | cold wall hlotk / XLA "
             "(ratio) | device ms | no-graph ms | "
             "XLA ms (issue) | compile s hlotk (+first call) / XLA | kernels hlotk / XLA | "
             "temp bytes hlotk / XLA | achieved | host path |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['label']} | FAILED: {r['failed']} |" + " |" * 12)
            continue
        k = r["kernels"]
        ks = "+".join(f"{v} {n}" for n, v in sorted(k.items()))
        lines.append(
            f"| {r['label']} | {'yes' if r['ok'] else 'NO'} ({r['err']:.1e}) | {r['hlotk_ms']:.3f} | "
            f"{r['xla_ms']:.3f} | {r['hlotk_ms'] / r['xla_ms']:.2f} | {r['hlotk_wall']:.3f} / "
            f"{r['xla_wall']:.3f} ({r['hlotk_wall'] / r['xla_wall']:.2f}) | {r['device_ms']:.3f} | "
            f"{r['nograph_ms']:.3f} | {ISSUE_XLA_MS.get(r['name'], float('nan')):.3f} | "
            f"{r['hlotk_compile_s']:.1f} (+{r['hlotk_first_call_s']:.1f}) / {r['xla_compile_s']:.1f} | "
            f"{ks} / {r['xla_kernels']} | {r['temp']} / {r['xla_temp']} | {r['achieved']} | "
            f"{r['host_path'][:90]} |")
    lines += ["", "Executable reports:", ""]
    for r in rows:
        if "report" in r:
            lines += ["```", r["report"], f"counters over the timed calls: {r['timed_stats']}; "
                      f"over the cold-wall calls: {r.get('cold_stats')}",
                      "per thunk (device ms, eager, each alone):",
                      r.get("profile", ""), "```"]
    table = "\n".join(lines)
    print(table)
    for path in (opts.out, os.path.join(os.environ.get("OUT", "/tmp"), "gpu_suite.md")):
        try:
            with open(path, "w") as f:
                f.write(table + "\n")
        except OSError:
            pass


if __name__ == "__main__":
    main()
