"""The ``hlotk`` command line, run in-process through ``runtime.cli.main``."""
from __future__ import annotations

import os

import numpy as np
import pytest

from runtime.cli import main

SMALL_HLO = """\
HloModule small

ENTRY main {
  x = f32[2,3] parameter(0)
  y = f32[2,3] parameter(1)
  s = f32[2,3] add(x, y)
  ROOT t = (f32[2,3], f32[2,3]) tuple(s, x)
}
"""


@pytest.fixture
def hlo_file(tmp_path):
    p = tmp_path / "small.hlo"
    p.write_text(SMALL_HLO)
    return str(p)


def _jax_fn(x, y):
    import jax.numpy as jnp
    return jnp.sin(x) * y


def _args():
    return (np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3),
            np.full((2, 3), 2.0, np.float32))


def test_import_hlo_to_stdout(hlo_file, capsys):
    assert main(["import", hlo_file]) == 0
    out = capsys.readouterr().out
    assert out.startswith("HloModule small")
    assert "add(%x, %y)" in out


def test_import_exported_bytes(tmp_path, capsys):
    import jax
    exp = jax.export.export(jax.jit(_jax_fn))(*_args())
    p = tmp_path / "prog.exported"
    p.write_bytes(exp.serialize())
    assert main(["import", str(p)]) == 0
    out = capsys.readouterr().out
    assert "HloModule" in out and "sine(" in out and "multiply(" in out


def test_import_mlir_text_to_file(tmp_path, capsys):
    import jax
    text = jax.jit(_jax_fn).lower(*_args()).as_text()
    p = tmp_path / "prog.mlir"
    p.write_text(text)
    out_path = tmp_path / "prog.hlo"
    assert main(["import", str(p), "-o", str(out_path)]) == 0
    assert capsys.readouterr().out == ""
    written = out_path.read_text()
    assert "sine(" in written
    # Written via a temp file and a rename: nothing else is left in the directory.
    assert sorted(os.listdir(tmp_path)) == ["prog.hlo", "prog.mlir"]


def test_run_with_inputs_and_save(hlo_file, tmp_path, capsys):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.full((2, 3), 10.0, np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    outdir = tmp_path / "outs"
    code = main(["run", hlo_file, "--inputs", str(tmp_path / "x.npy"), str(tmp_path / "y.npy"),
                 "--save-outputs", str(outdir)])
    assert code == 0
    out = capsys.readouterr().out
    assert "output 0: f32[2,3]  min=10  max=15  mean=12.5" in out
    assert "output 1: f32[2,3]  min=0  max=5  mean=2.5" in out
    np.testing.assert_array_equal(np.load(outdir / "output_0.npy"), x + y)
    np.testing.assert_array_equal(np.load(outdir / "output_1.npy"), x)


def test_run_random_inputs_seeded(hlo_file, capsys):
    assert main(["run", hlo_file, "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert "inputs: 2 random (seed 3)" in first
    assert main(["run", hlo_file, "--seed", "3"]) == 0
    assert capsys.readouterr().out == first          # same seed, same numbers
    assert main(["run", hlo_file, "--seed", "4"]) == 0
    assert capsys.readouterr().out != first


def test_run_wrong_input_shape(hlo_file, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((3, 2), np.float32))
    code = main(["run", hlo_file, "--inputs", str(tmp_path / "x.npy"), str(tmp_path / "x.npy")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("hlotk: error: argument 0: expected f32[2,3], got f32[3,2]")


def test_malformed_hlo_reports_file_line_col(tmp_path, capsys):
    p = tmp_path / "bad.hlo"
    p.write_text("HloModule bad\n\nENTRY main {\n  x = f32[2] parameter(0)\n"
                 "  ROOT y = f32[2] frobnicate(x)\n}\n")
    assert main(["import", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hlotk: error: {p}:5:")
    assert "frobnicate" in err
    assert "Traceback" not in err


def test_missing_file(tmp_path, capsys):
    missing = str(tmp_path / "nope.hlo")
    assert main(["run", missing]) == 2
    assert capsys.readouterr().err.strip() == f"hlotk: error: {missing}: no such file"
    assert main(["check", missing]) == 2
    assert "no such file" in capsys.readouterr().err


def test_usage_error_exits_2(capsys):
    assert main([]) == 2
    assert "usage: hlotk" in capsys.readouterr().err
