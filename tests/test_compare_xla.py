"""``hlotk compare-xla``: XLA's kernels aligned with hlotk's, deviceless from the saved
XLA:GPU dumps (shared/anchors) and with XLA:CPU compiling here."""
from __future__ import annotations

import shutil
import textwrap

import pytest

from passes.fusion.cost_model import get_device
from runtime import compare_xla as cx
from runtime.cli import main

from tests.paths import ANCHORS, requires_shared
from tests.test_viewer import unpack

# The anchors' programs (their op_names are jit(_softmax)/..., jit(_mlp)/...; the source
# lines differ from the file XLA saw, so alignment falls back to op_name alone).
SUITE = textwrap.dedent("""\
    import jax

    def _softmax(x):
        return jax.nn.softmax(x, axis=-1)

    def _mlp(x, w1, w2):
        return jax.nn.gelu(x @ w1) @ w2
    """)
MLP_ARGS = ["bf16[4096,4096]", "bf16[4096,16384]", "bf16[16384,4096]"]


@pytest.fixture
def suite(tmp_path):
    p = tmp_path / "suite.py"
    p.write_text(SUITE)
    return str(p)


@requires_shared
def test_softmax_is_one_kernel_on_both_sides(suite):
    xla = cx.read_xla_dump(str(ANCHORS / "xla_softmax_f32.hlo.txt"))
    ours, _, _ = cx.hlotk_module_for(suite + ":_softmax", ["f32[8192,4096]"], "h200")
    c = cx.compare(xla, ours, "h200")
    assert [g.verdict for g in c.groups] == ["same"]
    (g,) = c.groups
    assert g.xla[0].name == "triton_softmax.2"
    # read 128 MiB, write 128 MiB on both sides
    assert g.xla[0].bytes_moved == g.hlotk[0].bytes_moved == 2 * 8192 * 4096 * 4
    assert not c.use_lines


@requires_shared
def test_mlp_hlotk_fuses_the_gelu_into_the_first_gemm(suite):
    """hlotk runs the GELU as the first GEMM's cuBLASLt epilogue (gemm_epilogue.py); XLA
    (this dump) runs it as a loop fusion between the two cuBLAS calls."""
    xla = cx.read_xla_dump(str(ANCHORS / "xla_mlp_bf16.hlo.txt"))
    ours, _, _ = cx.hlotk_module_for(suite + ":_mlp", MLP_ARGS, "h200")
    c = cx.compare(xla, ours, "h200")
    assert sorted(g.verdict for g in c.groups) == ["hlotk fused, XLA split", "same"]
    same = next(g for g in c.groups if g.verdict == "same")
    split = next(g for g in c.groups if g.verdict != "same")
    assert same.xla[0].name == "custom-call.1"
    assert sorted(k.name for k in split.xla) == ["custom-call.0", "loop_multiply_fusion"]
    # gelu(...) @ w2 on cuBLAS: reads the GELU (128 MiB) and w2 (128 MiB), writes 32 MiB;
    # its 32 MiB workspace is not data moved. Time: 2*M*N*K flops at the bf16 tensor rate.
    gemm = same.xla[0]
    assert gemm.bytes_moved == (4096 * 4096 + 2 * 4096 * 16384) * 2
    spec = get_device("h200")
    flops = 2.0 * 4096 * 16384 * 4096
    assert gemm.predicted_us == pytest.approx(spec.kernel_launch_us + flops / spec.tensor_rate("bf16"))
    assert c.totals("xla")[0] == 3 and c.totals("hlotk")[0] == 2
    report = c.report()
    assert "[hlotk fused, XLA split]" in report and "%loop_multiply_fusion (kLoop)" in report


@requires_shared
def test_cli_reads_an_xla_dump_directory_and_writes_the_side_by_side_viewer(suite, tmp_path, capsys):
    dump = tmp_path / "xla_dump"
    dump.mkdir()
    shutil.copy(ANCHORS / "xla_mlp_bf16.hlo.txt",
                dump / "module_0001.jit__mlp.sm_9.0_gpu_after_optimizations.txt")
    (dump / "module_0001.jit__mlp.before_optimizations.txt").write_text("HloModule ignored\n")
    html = tmp_path / "cmp.html"
    assert main(["compare-xla", suite + ":_mlp", "--args", *MLP_ARGS, "--xla-dump", str(dump),
                 "--target", "h200", "--html", str(html), "--no-open"]) == 0
    out = capsys.readouterr().out
    assert "groups: 1 same, 1 hlotk fused, XLA split" in out or \
        "groups: 1 hlotk fused, XLA split, 1 same" in out
    data = unpack(html.read_text())
    (pair,) = data["pairs"]
    # the XLA GEMM and the hlotk fusion it went into are in one group: selecting one
    # selects the other
    assert pair["groupsL"]["custom-call.0"] == pair["groupsR"]["fusion"]
    assert pair["marksL"]["loop_multiply_fusion"] == "changed"


def test_against_xla_cpu_compiled_here(tmp_path, capsys):
    prog = tmp_path / "f.py"
    prog.write_text("import jax\n\ndef softmax(x):\n    return jax.nn.softmax(x, axis=-1)\n")
    assert main(["compare-xla", f"{prog}:softmax", "--args", "f32[64,128]"]) == 0
    out = capsys.readouterr().out
    # hlotk makes one kernel; whatever XLA:CPU made computes the same operations, so the
    # kernels of both sides form one group, aligned with source lines (same file).
    assert "aligned by op_name and source line" in out
    assert out.splitlines()[3].split()[:2] == ["hlotk", "1"]
    assert out.count("\n[") == 1


def test_errors_name_the_argument(tmp_path, capsys):
    prog = tmp_path / "f.py"
    prog.write_text("def f(x):\n    return x\n")
    assert main(["compare-xla", f"{prog}:f", "--args", "f32[8]", "f32[2,"]) == 2
    assert "--args[1] 'f32[2,'" in capsys.readouterr().err
    assert main(["compare-xla", f"{prog}:g", "--args", "f32[8]"]) == 2
    assert "has no function 'g'" in capsys.readouterr().err
    assert main(["compare-xla", f"{prog}:f", "--args", "f32[8]", "--xla-dump",
                 str(tmp_path)]) == 2
    assert "no *after_optimizations.txt" in capsys.readouterr().err
