"""How fast the viewer opens: build time in Python, page size, first paint in headless
Chromium, for transformer training steps of 1, 4 and 14 layers (imported, unoptimized:
every instruction of the step in the entry computation).

    .venv/bin/python -m benchmarks.viewer_paint [--loads 5]

First paint is ``performance.now()`` after the first frame following layout and render
(from navigation start: includes unpacking the data). Median of ``--loads`` page loads.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import jax

    import hlo
    from examples.transformer_train_step import make_args, train_step
    from runtime.viewer import viewer_for_module, write_viewer
    from tests.browser import chromium, wait_ready
    ap = argparse.ArgumentParser()
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 4, 14])
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="hlotk-paint-"))
    rows = []
    with chromium() as driver:
        for layers in args.layers:
            specs = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                           make_args(layers))
            module = hlo.from_jax(train_step, *specs)
            n = sum(len(c.instructions) for c in module.computations)
            t = time.perf_counter()
            page = write_viewer(viewer_for_module(module), tmp / f"train{layers}.html")
            build = time.perf_counter() - t
            paints, layouts = [], []
            for _ in range(args.loads):
                driver.get(page.as_uri())
                timing = wait_ready(driver, timeout=120)
                paints.append(timing["first_paint_ms"])
                layouts.append(timing["layout_and_render_ms"])
            rows.append((layers, n, build, page.stat().st_size, statistics.median(paints),
                         min(paints), max(paints), statistics.median(layouts)))
            print(f"{layers:2} layers {n:5} instructions: build {build:.2f} s, page "
                  f"{page.stat().st_size / 1e3:.0f} kB, first paint median "
                  f"{statistics.median(paints):.0f} ms (min {min(paints):.0f}, max "
                  f"{max(paints):.0f}), layout+render {statistics.median(layouts):.0f} ms",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
