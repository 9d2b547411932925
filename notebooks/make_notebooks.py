"""Writes the notebooks from the cell sources below (so they diff well in review).

    .venv/bin/python notebooks/make_notebooks.py
"""
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

VISUALIZE = [
    new_markdown_cell("""# Visualizing HLO before and after passes

This notebook exports a JAX function, imports it as an HLO module, runs hlotk's default
pipeline and shows, pass by pass, what changed: as XLA's `--xla_dump_to`, but drawn.
Graph colours: blue elementwise, orange reductions, red dot/conv, green data movement,
purple control flow, grey parameters/constants. Borders: green added, orange changed,
red removed."""),
    new_code_cell("""import os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.abspath(".."))
import jax, jax.numpy as jnp, numpy as np
from IPython.display import HTML, SVG, display

import hlo
from hlo.diff import diff_modules
from hlo.render import dot_available, render
from passes import run_pipeline
from passes.pipelines import pipeline_spec"""),
    new_code_cell("""def model(x, w, b):
    # Written the way traced code often looks: a double transpose, a multiply by one,
    # the same subexpression twice and a branch on a constant.
    h = jnp.transpose(jnp.transpose(x)) @ w * 1.0 + b
    a = jax.nn.relu(h)
    y = jnp.tanh(a) + jnp.tanh(a)
    return jax.lax.cond(True, lambda v: v.sum(axis=1), lambda v: v.max(axis=1), y)

x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
w = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
b = np.zeros(16, np.float32)
module = hlo.from_jax(model, x, w, b)
print(module.to_text(print_metadata=False))"""),
    new_markdown_cell("A module shows itself as a graph in Jupyter (its text if graphviz is missing):"),
    new_code_cell("module"),
    new_markdown_cell("Run the default CPU pipeline, keeping a copy of the module before each pass:"),
    new_code_cell("""snapshots = []
def keep_before(event, p, m, record):
    if event == "before":
        snapshots.append(m.clone())

original = module.clone()
print("pipeline:", pipeline_spec("default", "cpu"))
records = run_pipeline(module, pipeline_spec("default", "cpu"), verify=True,
                       hooks=[keep_before])
for k, r in enumerate(records, 1):
    print(f"{k:2d} {r.name:24s} {r.seconds*1e3:7.2f} ms  {r.instructions_before:4d} -> "
          f"{r.instructions_after:4d}  {'changed' if r.changed else ''}")"""),
    new_markdown_cell("The passes that changed something, before and after, with the differences marked:"),
    new_code_cell("""changed = [(k, r) for k, r in enumerate(records) if r.changed]
for k, r in changed[:3]:
    before = snapshots[k]
    after = snapshots[k + 1] if k + 1 < len(snapshots) else module
    d = diff_modules(before, after)
    display(HTML(f"<h3>{r.name}: {d.summary()}</h3>"))
    if dot_available():
        display(HTML('<div style="display:flex;gap:1em">'
                     f'<div>{render(before, diff=d.marks_before(), collapse_calls=True)}</div>'
                     f'<div>{render(after, diff=d.marks_after(), collapse_calls=True)}</div></div>'))
    print(d.to_text())"""),
    new_markdown_cell("The optimized module computes what `jax.jit` computes:"),
    new_code_cell("""got = hlo.evaluate(module, [x, w, b])
want = np.asarray(jax.jit(model)(x, w, b))
np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
print("max abs difference vs jax.jit:", float(np.abs(got - want).max()))
print("instructions:", sum(len(c.instructions) for c in original.computations), "->",
      sum(len(c.instructions) for c in module.computations))"""),
    new_markdown_cell("""The same, as a dump directory with a self-contained `index.html` (what
`hlotk compile FILE --dump DIR` writes):"""),
    new_code_cell("""import tempfile
from runtime.dump import run_with_dump
dump_dir = tempfile.mkdtemp(prefix="hlotk-dump-")
_, index = run_with_dump(original.clone(), pipeline_spec("default", "cpu"), dump_dir)
print(index)
print(sorted(os.listdir(dump_dir))[:8], "...")"""),
    new_markdown_cell("""The dump also holds `viewer.html`, the interactive viewer (`hlotk view DIR` rebuilds
it): pan and zoom, search by name, opcode or op_name, expand fusions and called
computations, click an instruction for its HLO line, source line and fusion decisions,
every pass's before/after side by side, and the memory timeline. One module at a time:
`runtime.viewer.viewer_for_module`. For graph algorithms, a module is also a networkx graph:"""),
    new_code_cell("""import networkx as nx
from runtime.viewer import viewer_for_module, write_viewer
print(write_viewer(viewer_for_module(module), os.path.join(dump_dir, "final.view.html")))
g = module.entry.to_networkx()
print(g.number_of_nodes(), "instructions; longest chain:", nx.dag_longest_path_length(g) + 1)
print(max(g.nodes(data=True), key=lambda n: n[1]["bytes"]))"""),
]


SPMD = [
    new_markdown_cell("""# SPMD: shard a program, partition it, run it on 8 simulated devices

A Megatron-style MLP (column-parallel then row-parallel) on a mesh of 2 (data) x 4
(model) devices, with `jax.sharding` annotations. hlotk imports the Shardy shardings,
propagates them to every instruction, partitions the module into the program one device
runs (local shapes, collectives where shardings meet) and runs it on 8 simulated CPU
devices, next to `jax.jit` on 8 host devices. Edges carry shardings; collectives are
yellow."""),
    new_code_cell("""import os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
sys.path.insert(0, os.path.abspath(".."))
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from IPython.display import HTML, display

import hlo, runtime
from hlo.render import dot_available, render
from passes import run_pipeline
from passes.spmd import collective_stats

mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)

def mlp(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2

shardings = dict(in_shardings=(P("data"), P(None, "model"), P("model", None)),
                 out_shardings=P("data"))
rng = np.random.default_rng(0)
x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 32), (32, 16)])
sharded = jax.jit(mlp, **{k: jax.tree_util.tree_map(lambda p: NamedSharding(mesh, p), v)
                          for k, v in shardings.items()})
module = hlo.from_jax(sharded, x, w1, w2)
print(module.to_text(print_metadata=False))"""),
    new_markdown_cell("Sharding propagation fills in every instruction; the graph shows them on the edges:"),
    new_code_cell("""propagated = module.clone()
run_pipeline(propagated, "sharding-propagation", verify=True)
for inst in propagated.entry.instructions:
    print(f"{inst.name:22s} {inst.sharding}")
if dot_available():
    display(HTML(render(propagated)))"""),
    new_markdown_cell("""The partitioner: local shapes, and exactly one all-reduce (the row-parallel dot's
partial sums), as XLA's SPMD partitioner does:"""),
    new_code_cell("""partitioned = propagated.clone()
run_pipeline(partitioned, "spmd-partitioner", verify=True)
print(partitioned.to_text(print_metadata=False))
print(collective_stats(partitioned))
if dot_available():
    display(HTML(render(partitioned)))"""),
    new_markdown_cell("Run on 8 simulated devices with `runtime.jit`, the same annotations as `jax.jit`:"),
    new_code_cell("""f = runtime.jit(mlp, mesh=mesh, **shardings)
got = f(x, w1, w2)
want = np.asarray(sharded(x, w1, w2))
np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
print("max abs difference vs jax.jit on 8 devices:", float(np.abs(got - want).max()))"""),
    new_markdown_cell("""## A vocabulary that does not divide by the mesh

30 words over the 4 devices of `model`: every device holds ceil(30/4) = 8 columns, the
last one 6 real ones and 2 of padding (GSPMD's rule). The log-softmax reduces over the
vocabulary, so the partitioner masks the padding first (`iota < valid columns of this
device`, a `select` with the reduction's init value):"""),
    new_code_cell("""def loss(x, w, labels):
    logits = jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P(None, "model")))
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, 30) * logp, -1))

import jax.numpy as jnp
w_vocab = rng.standard_normal((16, 30)).astype(np.float32)
labels = rng.integers(0, 30, 8).astype(np.int32)
f = runtime.jit(loss, mesh=mesh, in_shardings=(P(), P(), P()), out_shardings=P())
compiled = f.lower(x, w_vocab, labels).compile()
for inst in compiled.module.entry.instructions:
    if inst.opcode in ("iota", "compare", "select", "dot") or inst.opcode.endswith("-start"):
        print(inst.to_text()[:110])
print("hlotk", f(x, w_vocab, labels), " jax.jit", jax.jit(loss)(x, w_vocab, labels))"""),
    new_markdown_cell("""## shard_map: a per-device program kept as it is

The body of a `shard_map` is already the program of one device, with its own collectives
(`psum` an all-reduce, `ppermute` a collective-permute over device ids). The partitioner
copies it unchanged and only splits its input and declares its output split:"""),
    new_code_cell("""from jax import shard_map

def ring(v):
    def body(b):
        r = jax.lax.ppermute(b, "model", [(i, (i + 1) % 4) for i in range(4)])
        return jax.lax.psum(b * r, "model")
    return shard_map(body, mesh=mesh, in_specs=P("data", "model"), out_specs=P("data"))(v)

f = runtime.jit(ring, mesh=mesh, in_shardings=(P("data", "model"),), out_shardings=P("data"))
v = rng.standard_normal((4, 8)).astype(np.float32)
print(f.lower(v).compile().as_text().split("ENTRY")[1])
np.testing.assert_allclose(f(v), jax.jit(ring)(v), rtol=1e-6)"""),
    new_markdown_cell("""## Collectives as start/done pairs, overlapped with compute

`async-collective-creator` turns every collective into a start/done pair (as XLA prints
them) and `latency-hiding-scheduler` moves independent work between the two, from a cost
model of the collective's time (bytes over the link bandwidth plus a latency, from the
device spec) and of each kernel's. Here the row-parallel dot's all-reduce starts, the
unrelated `a @ b` runs while it travels, and only then the sum waits for it:"""),
    new_code_cell("""from passes.latency_hiding_scheduler import predicted_overlap

def overlap(x, w1, a, b):
    return jnp.concatenate([x @ w1] * 2, axis=1) + jnp.tanh(a @ b)

args = [rng.standard_normal(s).astype(np.float32) for s in [(64, 128), (128, 64), (64, 128), (128, 128)]]
f = runtime.jit(overlap, mesh=mesh, in_shardings=(P(None, "model"), P("model", None), P(), P()),
                out_shardings=P())
entry = f.lower(*args).compile().module.entry
for inst in entry.instructions:
    if inst.opcode not in ("parameter", "constant"):
        print(f"{inst.opcode:20s} {inst.name}")
report = predicted_overlap(entry, "h100", 8)
print({k: f"{hidden:.1f} of {total:.1f} us hidden" for k, (total, hidden) in report.overlaps.items()})
np.testing.assert_allclose(f(*args), jax.jit(overlap)(*args), rtol=1e-4, atol=1e-4)"""),
]


FUSION = [
    new_markdown_cell("""# Fusion heuristics: write your own policy, compare it with priority fusion

hlotk keeps fusion *legality* (may these be one kernel?) apart from *profitability* (should
they?). A policy is a small class: which candidates to consider, their priority, and
whether to fuse. Here we write one in ~30 lines and compare it with the default
`priority` policy on a transformer block (bf16, B=8, S=1024, D=1024, 16 heads), compiled
deviceless for an H100: kernel count, predicted time and bytes moved."""),
    new_code_cell("""import os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.abspath(".."))
from IPython.display import SVG, display

import hlo
from hlo.render import dot_available, dot_to_svg, to_dot
from passes import run_pipeline
from passes.fusion import Decision, count_kernels, predict, report_for
from passes.fusion.policy import benefit_us, producer_consumer_candidates
from benchmarks.fusion_programs import PROGRAMS

fn, args, _, _ = PROGRAMS["transformer_block"]
unfused = hlo.from_jax(fn, *args)
run_pipeline(unfused, "inline,fixpoint(simplify,cse,dce)")
print(count_kernels(unfused), "kernels before fusion;", predict(unfused, "h100"))"""),
    new_markdown_cell("""A new policy: fuse only when the intermediate is big (at least 4 MB saved), and never
make multi-output fusions. Candidates come from a helper; `benefit_us` asks the cost model
for (time apart) - (time fused)."""),
    new_code_cell("""class BigIntermediatesOnly:
    name = "big-intermediates"
    min_bytes = 4 << 20

    def candidates(self, state):
        for c in producer_consumer_candidates(state, multi_output=False):
            out_bytes = sum(m.shape.byte_size for m in c.producer.members
                            if not m.shape.is_tuple)
            if out_bytes >= self.min_bytes or c.action == "duplicate":
                yield c

    def priority(self, c, state):
        return benefit_us(c, state)

    def should_fuse(self, c, state):
        b = benefit_us(c, state)
        return Decision(b > 0, f"benefit {b:.2f} us" if b > 0 else "not profitable")


results = {}
for name, policy in [("priority", "priority"), ("big-intermediates", BigIntermediatesOnly())]:
    from passes.fusion import Fusion
    m = unfused.clone()
    Fusion(policy=policy, target="h100").run(m)
    e = predict(m, "h100")
    results[name] = (m, report_for(m))
    print(f"{name:18s} {count_kernels(m):3d} kernels  {e.time_us:8.1f} us  "
          f"{e.bytes_moved / 1e6:8.1f} MB moved")"""),
    new_markdown_cell("""Why did pairs stay apart under the new policy? The decision log has every pair with its
reason and predicted times:"""),
    new_code_cell("""print(results["big-intermediates"][1].table(only_unfused=True)[:3000])"""),
    new_markdown_cell("""Both results drawn (fusions collapsed to one node each), and the unfused graph with
edges coloured by the priority policy's decisions (green fused, red illegal, amber not
profitable; hover for the reason):"""),
    new_code_cell("""for name, (m, report) in results.items():
    if dot_available():
        display(SVG(dot_to_svg(to_dot(m, collapse_fusions=True, title=name))))
    else:
        print(name, count_kernels(m), "kernels (graphviz not installed)")
styles = results["priority"][1].edge_styles()
if dot_available():
    display(SVG(dot_to_svg(to_dot(unfused, edge_styles=styles, title="priority decisions"))))
print(len(styles), "edges coloured")"""),
    new_markdown_cell("""## The same policy, on a cost model calibrated on a GPU

A threshold in microseconds means something only if the model's microseconds do. Here the
H200 spec is calibrated on kernels measured on an H200 (`benchmarks/data`: what autotuning
and `exe.profile` recorded; `hlotk calibrate --target h200` does the same on your GPU), and
priority fusion with a 3 µs minimum benefit decides for both specs. The measured launch
cost (≈6 µs between eager launches, against the datasheet model's 2) makes saving one
kernel worth fusing under the calibrated model."""),
    new_code_cell("""import tempfile
from passes.fusion import calibration as cal
from passes.fusion.cost_model import get_device
from passes.fusion.priority import PriorityPolicy

base = get_device("h200")
records = cal.load_records([os.path.join("..", "benchmarks", "data", "h200_kernel_records.jsonl")])
fit = cal.fit(cal.kernel_points(records, base), base)
calibrated = os.path.join(tempfile.mkdtemp(), "h200-calibrated.json")
with open(calibrated, "w") as f:
    f.write(cal.device_file_text(fit))
print(f"launch {base.kernel_launch_us} -> {fit.launch_us:.2f} us, memory efficiency "
      f"{base.memory_efficiency} -> {fit.spec.memory_efficiency:.3f}; error (median |log|) "
      f"{fit.before['median']:.2f} -> {fit.after['median']:.2f}")

edges = {}
for label, target in [("datasheet", "h200"), ("calibrated", calibrated)]:
    m = unfused.clone()
    Fusion(policy=PriorityPolicy(min_benefit_us=3.0), target=target).run(m)
    edges[label] = {(d.producer, d.consumer): d for d in report_for(m).final_edges()}
    print(f"{label:10s} {count_kernels(m):3d} kernels")
changed = [k for k in edges["datasheet"]
           if edges["datasheet"][k].fused != edges["calibrated"][k].fused]
print(len(changed), "decisions changed, e.g.")
for k in changed[:4]:
    a, b = edges["datasheet"][k], edges["calibrated"][k]
    print(f"  {k[0]} -> {k[1]}: datasheet '{a.reason}', calibrated '{b.reason}' "
          f"(benefit {b.benefit_us:.2f} us)")"""),
]


def write(name: str, cells) -> None:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    write("01_visualize_passes.ipynb", VISUALIZE)
    write("03_spmd.ipynb", SPMD)
    write("02_fusion_heuristics.ipynb", FUSION)
