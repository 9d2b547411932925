"""The viewer's data (runtime/viewer), ``hlotk view``, and ``to_networkx``; the page itself
is driven in a real browser by tests/test_viewer_browser.py."""
from __future__ import annotations

import base64
import gzip
import json
import re

import pytest

import hlo
from hlo.graph import source_location
from passes.fusion.cost_model import predict
from passes.fusion.explain import FusionReport, explain
from runtime.cli import main
from runtime.viewer import profile_by_name, viewer_for_module, write_viewer

from tests.paths import ANCHORS, requires_shared

TWICE = """HloModule twice

%fused (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %sq = f32[8]{0} multiply(%p, %p)
  ROOT %e = f32[8]{0} exponential(%sq)
}

ENTRY %main (x: f32[8], y: f32[2,4]) -> (f32[8], f32[2,4]) {
  %x = f32[8]{0} parameter(0), sharding={replicated}
  %y = f32[2,4]{1,0} parameter(1)
  %f = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused, metadata={op_name="jit(g)/exp" source_file="g.py" source_line=7}
  %n = f32[2,4]{1,0} negate(%y)
  ROOT %t = (f32[8]{0}, f32[2,4]{1,0}) tuple(%f, %n)
}
"""

# exp(x) - exp(x)**2, summed and multiplied: fusions with a multi-use producer, a temp.
PROGRAM = """HloModule prog

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[64,32], w: f32[32,16]) -> (f32[64], f32[64,16]) {
  %x = f32[64,32]{1,0} parameter(0)
  %w = f32[32,16]{1,0} parameter(1)
  %e = f32[64,32]{1,0} exponential(%x), metadata={op_name="jit(f)/exp" source_file="f.py" source_line=3}
  %m = f32[64,32]{1,0} multiply(%e, %e), metadata={op_name="jit(f)/mul" source_file="f.py" source_line=4}
  %d = f32[64,32]{1,0} subtract(%e, %m), metadata={op_name="jit(f)/sub" source_file="f.py" source_line=4}
  %z = f32[] constant(0)
  %r = f32[64]{0} reduce(%d, %z), dimensions={1}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum" source_file="f.py" source_line=5}
  %p = f32[64,16]{1,0} dot(%d, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/dot_general" source_file="f.py" source_line=6}
  %q = f32[64,16]{1,0} tanh(%p), metadata={op_name="jit(f)/tanh" source_file="f.py" source_line=6}
  ROOT %t = (f32[64]{0}, f32[64,16]{1,0}) tuple(%r, %q)
}
"""


def unpack(page: str) -> dict:
    """The JSON a viewer page carries (gzip'd, base64, in #hlotk-data)."""
    m = re.search(r'<script id="hlotk-data" type="application/octet-stream">([^<]*)</script>', page)
    assert m, "no data block in the page"
    return json.loads(gzip.decompress(base64.b64decode(m.group(1))))


def nodes_by_name(snapshot: dict) -> dict[str, dict]:
    return {n["n"]: n for c in snapshot["comps"] for n in c["nodes"]}


# --- networkx -----------------------------------------------------------------------------
def test_computation_to_networkx_nodes_and_operand_edges():
    m = hlo.parse_hlo(TWICE)
    g = m.entry.to_networkx()
    assert set(g.nodes) == {"x", "y", "f", "n", "t"}
    assert g.nodes["f"] == {"opcode": "fusion", "shape": "f32[8]{0}", "bytes": 32,
                            "fusion_kind": "kLoop", "sharding": None, "computation": "main",
                            "calls": ["fused"], "op_name": "jit(g)/exp", "source": "g.py:7",
                            "is_root": False}
    assert g.nodes["x"]["sharding"] == "{replicated}"
    assert g.nodes["t"]["is_root"] and g.nodes["t"]["bytes"] == 32 + 32
    assert sorted((u, v, d["operand_index"]) for u, v, d in g.in_edges("t", data=True)) == \
        [("f", "t", 0), ("n", "t", 1)]
    body = m.computation("fused").to_networkx()
    # multiply(%p, %p): two edges, operand 0 and operand 1
    assert sorted(d["operand_index"] for _, _, d in body.in_edges("sq", data=True)) == [0, 1]


def test_module_to_networkx_has_every_computation_and_call_edges():
    import networkx as nx
    m = hlo.parse_hlo(TWICE)
    g = m.to_networkx()
    assert g.number_of_nodes() == 5 + 3
    assert g.nodes["sq"]["computation"] == "fused"
    calls = [(u, v, d["calls"]) for u, v, d in g.edges(data=True) if "calls" in d]
    assert calls == [("e", "f", "calls")]
    assert nx.is_directed_acyclic_graph(g)
    assert nx.has_path(g, "p", "t")        # through the call edge


@requires_shared
def test_source_location_resolves_xla_stack_frames():
    m = hlo.parse_hlo((ANCHORS / "xla_layernorm_bf16.hlo.txt").read_text())
    # fusion.5: stack_frame_id=3 -> FileLocations 3 (file 2, line 16)
    assert source_location(m.entry.get("fusion.5")) == "/work/steering/anchors/suite.py:16"
    # integer_pow.6: stack_frame_id=7 -> FileLocations 7 (line 15)
    assert source_location(m.computation("fused_computation.1").get("integer_pow.6")).endswith(
        "suite.py:15")
    assert source_location(m.entry.get("x.1")) is None


# --- the data a page carries ----------------------------------------------------------------
def test_fused_module_carries_decisions_predictions_and_profile():
    m = hlo.parse_hlo(PROGRAM)
    fused, report = explain(m, "h100")
    fusions = [i for i in fused.entry.instructions if i.opcode == "fusion"]
    assert fusions
    f = fusions[0]
    data = viewer_for_module(fused, profile={f.name: 12.5})
    snap = data.snapshots[0]
    node = nodes_by_name(snap)[f.name]
    assert node["t"] == f.to_text().strip()
    assert node["pred"] == round(predict(f, "h100").time_us, 3)
    assert node["us"] == 12.5
    # body names are the unfused names; a cloned small constant gets a ".N" suffix
    body = {re.sub(r"\.\d+$", "", i.name) for i in f.attrs["calls"].instructions}
    fd = node["fd"]
    assert fd["policy"] == report.policy and fd["target"] == "h100"
    # every "fused" edge has both ends in this fusion's body; exp -> mul was fused
    assert fd["fused"] and all(p in body and c in body for p, c, *_ in fd["fused"])
    assert any(p == "e" and c == "m" for p, c, *_ in fd["fused"])
    assert nodes_by_name(snap)["e"]["src"] == "f.py:3"
    assert nodes_by_name(snap)["e"]["on"] == "jit(f)/exp"


def test_profile_by_name_reads_both_formats():
    thunks = [("kernel %fusion.3 (fused_exp)", 0.25), ("library-call %dot.1 (gemm)", 1.5),
              ("copy %copy.2", 0.001)]
    assert profile_by_name(thunks) == {"fusion.3": 250.0, "dot.1": 1500.0, "copy.2": 1.0}
    assert profile_by_name({"%fusion.3": 7}) == {"fusion.3": 7.0}


def test_fusion_report_round_trips_through_json():
    m = hlo.parse_hlo(PROGRAM)
    _, report = explain(m, "h200")
    back = FusionReport.from_json(json.loads(json.dumps(report.to_json())))
    assert back.final_edges() == report.final_edges()
    assert back.summary() == report.summary()


def test_dump_writes_viewer_with_every_changed_pass_and_memory(tmp_path):
    src = tmp_path / "prog.hlo"
    src.write_text(PROGRAM)
    dump = tmp_path / "dump"
    assert main(["compile", str(src), "--dump", str(dump), "-q", "--no-svg"]) == 0
    index = (dump / "index.html").read_text()
    assert 'href="viewer.html"' in index
    data = unpack((dump / "viewer.html").read_text())
    changed = [p for p in sorted(dump.glob("*.after.hlo.txt"))
               if p.read_text() != p.with_name(p.name.replace(".after.", ".before.")).read_text()]
    assert len(data["pairs"]) == len(changed) and len(data["snapshots"]) == len(changed) + 1
    # the fusion pair: the fused instructions are marked removed on the left
    fusion_pair = next(p for p in data["pairs"] if ". fusion:" in p["label"])
    assert fusion_pair["marksL"].get("e") == "removed"
    assert any(v == "added" for v in fusion_pair["marksR"].values())
    # the memory timeline: buffers produced by instructions of the last snapshot, in the arena
    mem = data["memory"]
    final = nodes_by_name(data["snapshots"][mem["snapshot"]])
    assert mem["buffers"]
    for name, producer, size, offset, start, end in mem["buffers"]:
        assert producer in final and offset + size <= mem["arena"] and start <= end
    assert len(mem["live"]) == len(mem["steps"])
    assert (dump / "fusion_report.json").is_file()


def test_cli_view_of_a_file_and_of_a_dump(tmp_path, capsys):
    src = tmp_path / "prog.hlo"
    src.write_text(PROGRAM)
    assert main(["view", str(src), "--no-open"]) == 0
    page = tmp_path / "prog.hlo.view.html"
    assert f"viewer: {page}" in capsys.readouterr().out
    data = unpack(page.read_text())
    assert set(nodes_by_name(data["snapshots"][0])) >= {"x", "e", "m", "d", "r"}
    assert "http://" not in page.read_text().replace("http://www.w3.org/2000/svg", "")
    # --passes: every pass side by side; a profile adds measured µs
    prof = tmp_path / "prof.json"
    prof.write_text(json.dumps({"r": 3.0}))
    assert main(["view", str(src), "--passes", "default", "--profile", str(prof),
                 "-o", str(tmp_path / "p.html"), "--no-open"]) == 0
    data = unpack((tmp_path / "p.html").read_text())
    assert len(data["pairs"]) >= 2 and data["memory"] is not None
    assert nodes_by_name(data["snapshots"][0])["r"]["us"] == 3.0


def test_cli_view_errors_name_the_problem(tmp_path, capsys):
    assert main(["view", str(tmp_path), "--no-open"]) == 2
    assert "not a dump directory" in capsys.readouterr().err
    src = tmp_path / "prog.hlo"
    src.write_text(PROGRAM)
    bad = tmp_path / "bad.json"
    bad.write_text('{"r": 3.0,,}')
    assert main(["view", str(src), "--profile", str(bad), "--no-open"]) == 2
    assert f"{bad}:1:11: not JSON" in capsys.readouterr().err
    assert not (tmp_path / "prog.hlo.view.html").exists()


def test_page_is_self_contained(tmp_path):
    page = write_viewer(viewer_for_module(hlo.parse_hlo(TWICE)), tmp_path / "v.html").read_text()
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert page.count("<script") == 2        # the data and our code


def test_unwritable_output_is_a_clear_error(tmp_path, capsys):
    src = tmp_path / "prog.hlo"
    src.write_text(PROGRAM)
    target = tmp_path / "missing" / "file.html"
    (tmp_path / "missing").write_text("a file, not a directory")
    assert main(["view", str(src), "-o", str(target), "--no-open"]) == 2
    assert f"{target}: cannot write the viewer" in capsys.readouterr().err
