"""Calibrating the cost model on kernels measured on an H200 (benchmarks/data, recorded by
autotuning and exe.profile in the issue-13 GPU run): the fit, the device file --target
takes, ``hlotk calibrate --no-run`` and ``explain-fusion --measured``."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from passes.fusion import calibration as cal
from passes.fusion.cost_model import get_device
from passes.fusion.pass_ import with_target
from runtime.cli import main

RECORDS = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h200_kernel_records.jsonl"


def _points():
    return cal.kernel_points(cal.load_records([RECORDS]), get_device("h200"), "NVIDIA H200")


def test_one_point_per_kernel_at_its_fastest_config():
    records = cal.load_records([RECORDS])
    points = _points()
    assert len(points) == len({r["key"] for r in records}) == 43
    fastest = min(r["measured_us"] for r in records if r["key"] == points[0].key)
    assert points[0].measured_us == fastest


def test_fit_recovers_known_coefficients():
    # Points made by the model itself with launch 6 us and 0.8x the bandwidth: the fit
    # must find those and leave no error.
    base = get_device("h200")
    points = [cal.KernelPoint(str(k), "loop", 0.0, mem, comp)
              for k, (mem, comp) in enumerate([(1, 0), (10, 0), (100, 0), (1000, 0), (3, 40)])]
    points = [cal.KernelPoint(p.key, p.kind, cal.predict(p, 6.0, 1.25, 1.0), p.memory_us,
                              p.compute_us) for p in points]
    fit = cal.fit(points, base)
    assert fit.launch_us == pytest.approx(6.0, rel=1e-3)
    assert fit.memory_scale == pytest.approx(1.25, rel=1e-3)
    assert fit.after["worst"] < 1e-3
    assert fit.spec.memory_efficiency == pytest.approx(base.memory_efficiency / 1.25, rel=1e-3)


def test_fit_on_h200_measurements_beats_the_datasheet_model_out_of_sample():
    points = _points()
    train, test = points[0::2], points[1::2]
    fit = cal.fit(train, get_device("h200"))
    before = cal.summary(cal.errors(test, get_device("h200").kernel_launch_us))
    after = cal.summary(cal.errors(test, fit.launch_us, fit.memory_scale, fit.compute_scale))
    assert after["median"] < 0.5 * before["median"]
    assert after["worst"] < before["worst"]


def test_calibrate_writes_a_device_file_target_accepts(tmp_path, capsys):
    path = tmp_path / "h200-cal.json"
    assert main(["calibrate", "--target", "h200", "--no-run", "--records", str(RECORDS),
                 "-o", str(path)]) == 0
    assert "43 kernels" in capsys.readouterr().out
    entry = json.loads(path.read_text())["h200-calibrated"]
    spec = get_device(str(path))
    assert spec.key == "h200-calibrated"
    assert spec.kernel_launch_us == entry["kernel_launch_us"] > 2.0
    assert spec.sm_count == get_device("h200").sm_count
    assert "target=h200-calibrated" in with_target("fusion", str(path))
    c = entry["_calibration"]
    assert c["after"]["median"] < c["before"]["median"]
    assert math.isclose(c["before"]["median"], 0.6931, abs_tol=1e-3)


def test_calibrate_without_records_says_what_to_do(tmp_path, capsys):
    empty = tmp_path / "none.jsonl"
    empty.write_text("")
    assert main(["calibrate", "--no-run", "--records", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "0 measured kernels" in err and "HLOTK_AUTOTUNE=1" in err


def test_explain_fusion_measured_joins_records_by_kernel_source(tmp_path, capsys,
                                                                monkeypatch):
    import jax.numpy as jnp
    import numpy as np

    import hlo
    from codegen.triton import compile_fusion
    from passes.fusion.explain import explain
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path / "cache"))
    x = np.ones((256, 512), np.float32)
    module = hlo.from_jax(lambda x: jnp.exp(x - x.max(-1, keepdims=True)) * 2, x)
    prog = tmp_path / "p.hlo"
    prog.write_text(module.to_text())
    fused, _ = explain(module, "h200")
    (fusion,) = [i for i in fused.entry.instructions if i.opcode == "fusion"]
    key = compile_fusion(fusion, target="h200").key
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"key": key, "measured_us": 7.5}) + "\n")
    assert main(["explain-fusion", str(prog), "--target", "h200", "--measured",
                 "--records", str(records)]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(f"| {fusion.name} |")]
    assert len(row) == 1 and "| 7.50 |" in row[0]
