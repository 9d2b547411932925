"""``hlotk compile --passes --dump`` and ``hlotk diff``."""
import hlo
from runtime.cli import main
from tests.test_simplify import CF


def test_compile_with_dump(tmp_path, capsys):
    src = tmp_path / "cf.hlo"
    src.write_text(CF)
    dump = tmp_path / "dump"
    rc = main(["compile", str(src), "--passes", "control-flow-simplify,inline,dce", "--dump",
               str(dump), "--verify"])
    captured = capsys.readouterr()
    assert rc == 0
    final = hlo.parse_hlo(captured.out)
    assert not any(i.opcode == "conditional" for i in final.entry.instructions)
    assert "control-flow-simplify" in captured.err and "changed" in captured.err
    assert (dump / "index.html").exists() and (dump / "01.control-flow-simplify.after.hlo.txt").exists()


def test_compile_rejects_unknown_pass(tmp_path, capsys):
    src = tmp_path / "cf.hlo"
    src.write_text(CF)
    rc = main(["compile", str(src), "--passes", "simplify,frobnicate"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("hlotk: error: unknown pass 'frobnicate'; known passes:")
    assert "Traceback" not in err


def test_diff_exit_codes_and_html(tmp_path, capsys):
    a = tmp_path / "a.hlo"
    b = tmp_path / "b.hlo"
    a.write_text(CF)
    b.write_text(CF.replace("%acc2 = f32[4]{0} add(%acc, %acc)", "%acc2 = f32[4]{0} multiply(%acc, %acc)"))
    assert main(["diff", str(a), str(a)]) == 0
    capsys.readouterr()
    html = tmp_path / "d.html"
    assert main(["diff", str(a), str(b), "--html", str(html)]) == 1
    out = capsys.readouterr().out
    assert "- %acc2 = f32[4]{0} add(%acc, %acc)" in out
    assert "+ %acc2 = f32[4]{0} multiply(%acc, %acc)" in out
    assert "0 added, 0 removed, 1 changed" in out
    assert "<table" in html.read_text()


SOFTMAX = """HloModule softmax

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%sum (c: f32[], d: f32[]) -> f32[] {
  %c = f32[] parameter(0)
  %d = f32[] parameter(1)
  ROOT %s = f32[] add(%c, %d)
}

ENTRY %main (x: f32[64,128]) -> f32[64,128] {
  %x = f32[64,128]{1,0} parameter(0)
  %ninf = f32[] constant(-inf)
  %mx = f32[64]{0} reduce(%x, %ninf), dimensions={1}, to_apply=%max
  %bmx = f32[64,128]{1,0} broadcast(%mx), dimensions={0}
  %sh = f32[64,128]{1,0} subtract(%x, %bmx)
  %e = f32[64,128]{1,0} exponential(%sh)
  %zero = f32[] constant(0)
  %den = f32[64]{0} reduce(%e, %zero), dimensions={1}, to_apply=%sum
  %bden = f32[64,128]{1,0} broadcast(%den), dimensions={0}
  ROOT %y = f32[64,128]{1,0} divide(%e, %bden)
}
"""


def test_explain_fusion_prints_decisions_and_draws(tmp_path, capsys):
    src = tmp_path / "softmax.hlo"
    src.write_text(SOFTMAX)
    dot = tmp_path / "decisions.dot"
    assert main(["explain-fusion", str(src), "--target", "h100", "--dot", str(dot)]) == 0
    out = capsys.readouterr().out
    assert "7 -> 1 kernels" in out              # the whole softmax becomes one kernel
    rows = {tuple(line.split()[:3]) for line in out.splitlines()[2:]}
    assert ("sh", "e", "yes") in rows and ("e", "y", "yes") in rows
    assert ("x", "mx", "no") in rows            # parameters are inputs, with the reason given
    assert "digraph" in dot.read_text() and "tooltip=" in dot.read_text()
    assert main(["explain-fusion", str(src), "--policy", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
