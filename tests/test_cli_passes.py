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
