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
]


def write(name: str, cells) -> None:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    write("01_visualize_passes.ipynb", VISUALIZE)
