"""Drawing modules, diffing them, and the per-pass dump directory."""
import re
from pathlib import Path

import pytest

import hlo
from hlo.diff import diff_modules
from hlo.render import DiffMarks, EdgeStyle, dot_available, render, to_dot
from runtime.dump import run_with_dump

from tests.paths import ANCHORS, requires_shared
from tests.test_simplify import CF  # a module with while, conditional and calls

FUSED = """HloModule f

%fused (p: f32[8], q: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %q = f32[8]{0} parameter(1)
  %m = f32[8]{0} multiply(%p, %q)
  ROOT %e = f32[8]{0} exponential(%m)
}

ENTRY %main (x: f32[8], y: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0), metadata={op_name="jit(f)/mul" source_file="model.py" source_line=12}
  %y = f32[8]{0} parameter(1)
  %f = f32[8]{0} fusion(%x, %y), kind=kLoop, calls=%fused
  ROOT %n = f32[8]{0} negate(%f)
}
"""


def nodes(dot: str) -> list[str]:
    return re.findall(r"^\s*(n\d+) \[", dot, re.M)


def test_colors_labels_tooltips_and_fusion_clusters():
    m = hlo.parse_hlo(FUSED)
    dot = to_dot(m)
    assert 'label="f (kLoop)"' in dot                      # fusion drawn as a cluster with its kind
    assert "subgraph cluster_" in dot
    assert 'fillcolor="#dbeafe"' in dot                   # elementwise colour
    assert 'fillcolor="#e5e7eb"' in dot                   # parameter colour
    assert "source: model.py:12" in dot                   # tooltip from metadata
    assert 'label="f32[8]{0}"' in dot                     # edge labelled with the shape
    assert len(nodes(dot)) == 7                           # x, y, p, q, m, e, n
    collapsed = to_dot(m, collapse_fusions=True)
    assert "subgraph cluster_" not in collapsed and len(nodes(collapsed)) == 4
    no_layout = to_dot(m, show_layouts=False)
    assert 'label="f32[8]"' in no_layout


def test_called_computations_are_drawn_and_can_be_collapsed():
    m = hlo.parse_hlo(CF)
    dot = to_dot(m)
    assert "body (while body)" in dot and "cond (while condition)" in dot
    assert "then (conditional true_computation)" in dot
    assert 'style=dashed, color="#7c3aed"' in dot
    assert "cluster_" not in to_dot(m, collapse_calls=True)


def test_node_budget_shows_how_many_are_hidden():
    b = hlo.Builder("chain")
    x = b.parameter(hlo.array("f32", (4,)))
    for _ in range(60):
        x = b.op("negate", x, shape=hlo.array("f32", (4,)))
    m = b.module(x)
    dot = to_dot(m, max_nodes=10)
    assert len(nodes(dot)) == 10
    assert "51 more instructions not drawn (node budget 10)" in dot


def test_diff_marks_and_edge_styles():
    m = hlo.parse_hlo(FUSED)
    dot = to_dot(m, diff=DiffMarks(added={"n"}, changed={"x"}),
                 edge_styles={("f", "n"): EdgeStyle("#ff0000", "not fused: expensive")})
    assert 'color="#16a34a", penwidth=3' in dot
    assert 'color="#ea580c", penwidth=3' in dot
    assert 'tooltip="not fused: expensive"' in dot


def test_diff_modules_by_name():
    before = hlo.parse_hlo(FUSED)
    after = hlo.parse_hlo(FUSED.replace("ROOT %n = f32[8]{0} negate(%f)",
                                        "%n = f32[8]{0} negate(%f)\n  ROOT %a = f32[8]{0} abs(%n)"))
    d = diff_modules(before, after)
    assert d.added == ["a"] and d.changed == ["n"] and d.removed == []   # n lost ROOT
    assert "+ %a = f32[8]{0} abs(%n)" in d.to_text()
    assert d.summary() == "1 added, 0 removed, 1 changed"
    assert "<table" in d.to_html()


@requires_shared
@pytest.mark.skipif(not dot_available(), reason="graphviz dot binary not installed")
def test_svg_of_an_xla_gpu_anchor():
    m = hlo.parse_hlo((ANCHORS / "xla_softmax_f32.hlo.txt").read_text())
    svg = render(m)
    assert svg.lstrip().startswith("<?xml") or "<svg" in svg[:500]
    assert "fusion" in svg
    assert "<svg" in m._repr_html_()


def test_dump_directory_and_index(tmp_path):
    m = hlo.parse_hlo(CF)
    records, index = run_with_dump(m, "control-flow-simplify,inline,cse,dce", tmp_path, verify=True)
    assert [r.name for r in records] == ["control-flow-simplify", "inline", "cse", "dce"]
    names = {p.name for p in tmp_path.iterdir()}
    for stem in ("01.control-flow-simplify", "02.inline", "03.cse", "04.dce"):
        assert f"{stem}.before.hlo.txt" in names and f"{stem}.after.hlo.txt" in names
    assert "01.control-flow-simplify.before.dot" in names
    assert "03.cse.before.dot" not in names            # unchanged passes are not drawn
    assert "index.html" in names and "99.final.hlo.txt" in names
    assert not any(n.endswith(".tmp") for n in names)
    page = index.read_text()
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page
    assert "control-flow-simplify" in page and "instructions (aligned by name)" in page
    if dot_available():
        assert page.count("<svg") >= 4
    else:
        assert "dot -Tsvg" in page
    # The after-text of each pass parses back to the same text.
    after = (tmp_path / "02.inline.after.hlo.txt").read_text()
    assert hlo.parse_hlo(after).to_text() == after
