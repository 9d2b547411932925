"""Is networkx fast enough for hlotk's graph questions? Measured on the zoo.

    .venv/bin/python -m benchmarks.networkx_probe [--programs N] [--reps R]

1. Fusion's cycle check (``FusionState.path_via_outside``: may two groups fuse without a
   third node on another path between them?). Hand-written: a DFS over the current group
   graph that stops at nodes placed after the consumer. networkx: the same group graph as
   a ``DiGraph`` (built per query, since every merge changes it), the direct edge removed,
   ``nx.has_path``. Times the whole fusion pass both ways, and asks both versions every
   query of a third run to check they agree.
2. Critical path (longest chain of instructions) of each entry computation: a hand-written
   pass over the topological order vs ``nx.dag_longest_path_length(computation.to_networkx())``.

Prints a table; benchmarks/NOTES.md ("networkx") has the numbers and what was kept.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import networkx as nx  # noqa: E402

import hlo  # noqa: E402
from passes import run_pipeline  # noqa: E402
from passes.fusion.pass_ import Fusion  # noqa: E402
from passes.fusion.rewrite import FusionState  # noqa: E402
from passes.pipelines import SIMPLIFY  # noqa: E402

PREPARE = f"inline,{SIMPLIFY},layout-assignment{{target=cpu}}"


def path_via_outside_nx(self: FusionState, a, b):
    """The networkx version of ``FusionState.path_via_outside``."""
    g = nx.DiGraph()
    stack, seen = [a], {id(a)}
    while stack:               # the group graph reachable from a
        n = stack.pop()
        g.add_node(id(n), node=n)
        for s in self._successors(n):
            g.add_edge(id(n), id(s))
            if id(s) not in seen:
                seen.add(id(s))
                stack.append(s)
    if g.has_edge(id(a), id(b)):
        g.remove_edge(id(a), id(b))
    if id(b) not in g or not nx.has_path(g, id(a), id(b)):
        return None
    path = nx.shortest_path(g, id(a), id(b))
    return g.nodes[path[1]]["node"]


def critical_path_handwritten(comp) -> int:
    depth: dict[int, int] = {}
    for inst in comp.instructions:        # operands come before users
        depth[id(inst)] = 1 + max((depth[id(o)] for o in inst.operands), default=0)
    return max(depth.values(), default=0)


def critical_path_nx(comp) -> int:
    return nx.dag_longest_path_length(comp.to_networkx()) + 1


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def modules(limit: int):
    from tests.zoo import ZOO, x64_scope
    from examples.transformer_train_step import make_args, train_step
    out = []
    for prog in ZOO[:limit]:
        with x64_scope(prog):
            try:
                out.append((prog.name, hlo.from_jax(prog.fn, *prog.args())))
            except hlo.HlotkError:
                continue
    for layers in (1, 4):
        out.append((f"train_step_{layers}l", hlo.from_jax(train_step, *make_args(layers))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    original = FusionState.path_via_outside
    for name, m in modules(args.programs):
        run_pipeline(m, PREPARE)
        n = sum(len(c.instructions) for c in m.computations)

        def fuse(m=m):
            c = m.clone()
            Fusion().run(c)
            return c
        FusionState.path_via_outside = original
        t_hand = _best(fuse, args.reps)
        FusionState.path_via_outside = path_via_outside_nx
        try:
            t_nx = _best(fuse, args.reps)
        finally:
            FusionState.path_via_outside = original
        # Same answer to every query? (Comparing the fused texts says nothing: the fusion
        # pass is not deterministic run to run; see NOTES.md.)
        disagree = []

        def both(self, a, b):
            h, x = original(self, a, b), path_via_outside_nx(self, a, b)
            if (h is None) != (x is None):
                disagree.append((a, b))
            return h
        FusionState.path_via_outside = both
        try:
            fuse()
        finally:
            FusionState.path_via_outside = original
        same = not disagree
        c_hand = _best(lambda: critical_path_handwritten(m.entry), args.reps)
        c_nx = _best(lambda: critical_path_nx(m.entry), args.reps)
        assert critical_path_handwritten(m.entry) == critical_path_nx(m.entry)
        rows.append((name, n, t_hand, t_nx, c_hand, c_nx, same))
        print(f"{name:28} {n:5} fusion {t_hand * 1e3:8.1f} ms hand, {t_nx * 1e3:8.1f} ms nx "
              f"({t_nx / t_hand:5.2f}x); critical path {c_hand * 1e6:8.0f} us hand, "
              f"{c_nx * 1e6:8.0f} us nx ({c_nx / c_hand:5.1f}x)"
              + ("" if same else f"  {len(disagree)} DIFFERENT ANSWERS"), flush=True)
    th, tn = sum(r[2] for r in rows), sum(r[3] for r in rows)
    ch, cn = sum(r[4] for r in rows), sum(r[5] for r in rows)
    print(f"\n{len(rows)} programs: fusion pass total {th * 1e3:.0f} ms hand-written vs "
          f"{tn * 1e3:.0f} ms networkx ({tn / th:.2f}x); critical path {ch * 1e3:.1f} ms vs "
          f"{cn * 1e3:.1f} ms ({cn / ch:.1f}x); cycle-check answers differ in: "
          f"{[r[0] for r in rows if not r[6]] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
