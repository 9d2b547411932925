"""The fusion cost model against kernels measured on a GPU (issue 13): error before and
after calibration, in sample and held out (2-fold by kernel), per fusion kind.

    python -m benchmarks.cost_model [--records benchmarks/data/h200_kernel_records.jsonl]
        [--target h200] [--out benchmarks/cost_model.md]

Error = |log(predicted / measured)| per kernel (0.69 is a factor of 2), one point per
kernel at its fastest measured config.
"""
from __future__ import annotations

import argparse
import statistics
import sys

sys.path.insert(0, ".")


def main() -> None:
    from passes.fusion import calibration as cal
    from passes.fusion.cost_model import get_device
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", default="benchmarks/data/h200_kernel_records.jsonl")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--out", default="benchmarks/cost_model.md")
    opts = ap.parse_args()
    base = get_device(opts.target)
    records = cal.load_records([opts.records])
    points = cal.kernel_points(records, base)
    full = cal.fit(points, base)
    folds = []
    for k in range(2):
        train, test = points[k::2], points[1 - k::2]
        f = cal.fit(train, base)
        folds.append((cal.summary(cal.errors(test, base.kernel_launch_us)),
                      cal.summary(cal.errors(test, f.launch_us, f.memory_scale, f.compute_scale))))
    kinds = sorted({p.kind for p in points})
    devices = sorted({r.get("device", "?") for r in records})
    lines = ["# The fusion cost model against measured kernels (issue 13)", "",
             f"{len(records)} measurements of {len(points)} Triton kernels on {', '.join(devices)} "
             f"(`{opts.records}`: every config autotuning timed and every kernel `exe.profile` "
             "timed, in the cold runs of `python -m benchmarks.compile_time --autotune 1 "
             "--profile`: transformer block, MLP train step, Adam step, softmax). One point per "
             "kernel, its fastest config. Error = |log(predicted/measured)| (0.69 = 2x).", "",
             "| model | median error | worst error |", "|---|---|---|",
             f"| datasheet `{base.key}` (launch {base.kernel_launch_us} us, memory efficiency "
             f"{base.memory_efficiency}) | {full.before['median']:.3f} | {full.before['worst']:.3f} |",
             f"| calibrated, in sample (launch {full.launch_us:.2f} us, memory efficiency "
             f"{full.spec.memory_efficiency:.3f}, compute rates / {full.compute_scale:.2f}) | "
             f"{full.after['median']:.3f} | {full.after['worst']:.3f} |"]
    for k, (b, a) in enumerate(folds):
        lines.append(f"| held out, fold {k + 1} ({a['kernels']} kernels; datasheet "
                     f"{b['median']:.3f} / {b['worst']:.3f}) | {a['median']:.3f} | {a['worst']:.3f} |")
    lines += ["", "Per fusion kind, median log(measured / predicted) (positive: slower than "
              "predicted):", "", "| kind | kernels | datasheet | calibrated |", "|---|---|---|---|"]
    import math
    for kind in kinds:
        ps = [p for p in points if p.kind == kind]
        b = statistics.median(math.log(p.measured_us / cal.predict(p, base.kernel_launch_us, 1, 1))
                              for p in ps)
        lines.append(f"| {kind} | {len(ps)} | {b:+.2f} | {full.kind_residuals[kind]:+.2f} |")
    lines += ["", "Caveats: the times are CUDA-event times of eager launches (autotuning's "
              "`do_bench`, `exe.profile`), so the fitted launch cost includes Python's launch "
              "gap between back-to-back launches; inside a CUDA graph a launch costs ~1-2 us "
              "(DESIGN.md), so the calibrated launch term overstates what fusing saves in a "
              "replayed graph. No kernel here was predicted compute-bound, so the compute "
              "scale stays at its start (1.0). cuBLAS calls are not recorded.", "",
              "Decisions: with the default priority policy (fuse whenever the benefit is "
              "positive) the calibrated file changes no decision on the suite programs or the "
              "1-layer training step (a larger launch term and a lower bandwidth scale benefits "
              "without flipping their sign; most rejections there are legality), and on the "
              "zoo only near-ties flip (which GEMM takes an epilogue in `mlp_forward`, "
              "`transformer_block`, `checkpoint_remat`). A policy with a threshold in "
              "microseconds does change: priority fusion with `min_benefit_us=3` on "
              "notebook 02's transformer block gives 19 kernels on the datasheet spec and 9 on "
              "the calibrated one (14 edges; e.g. `convert.52 -> broadcast.1`: 'not "
              "profitable: benefit 2.00 us' against fused, 5.96 us)."]
    text = "\n".join(lines) + "\n"
    with open(opts.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
