"""benchmarks/kernel_profile.py's reading of CUPTI records (no GPU: records made by hand)."""
from __future__ import annotations

import pytest

from benchmarks.kernel_profile import CALL_GAP_US, call_sequence, format_sequence, summarize


def _rec(name, ts, dur, cat="kernel"):
    return {"name": name, "ts": float(ts), "dur": float(dur), "cat": cat}


def _calls(starts):
    """Three kernels per call: a memset, then two kernels with a 40 µs and a 1 µs gap."""
    out = []
    for t in starts:
        out += [_rec("Memset", t, 1, "gpu_memset"), _rec("gemm", t + 41, 10),
                _rec("add", t + 52, 3)]
    return out


def test_call_sequence_takes_the_last_complete_call_with_gaps_before_each_record():
    recs = _calls([0, 1000, 2000]) + [_rec("gemm", 3000, 10)]     # a call cut short at the end
    seq = call_sequence(list(reversed(recs)))                     # any order in
    assert [r["name"] for r in seq] == ["Memset", "gemm", "add"]
    assert [r["start"] for r in seq] == [0.0, 41.0, 52.0]
    assert [r["gap"] for r in seq] == [0.0, 40.0, 1.0]
    assert seq[0]["cat"] == "gpu_memset"


def test_overlapping_records_leave_no_gap():
    recs = [_rec("a", 0, 10), _rec("b", 5, 2), _rec("c", 12, 1), _rec("d", 1000, 1)]
    seq = call_sequence(recs)
    assert [(r["name"], r["gap"]) for r in seq] == [("a", 0.0), ("b", 0.0), ("c", 2.0)]


def test_one_call_and_no_records():
    assert call_sequence([]) == []
    assert [r["name"] for r in call_sequence(_calls([0]))] == ["Memset", "gemm", "add"]
    assert CALL_GAP_US < 1000 - 55       # the calls above are apart by more than a call gap


def test_summarize_reports_the_sequence_and_format_names_thunks():
    res = summarize(_calls([0, 1000, 2000]), steps=3, names={"gemm": ["fusion.3[gemm]"]})
    assert res["span_us"] == pytest.approx(55.0)
    assert res["sum_us"] == pytest.approx(14.0)
    text = format_sequence(res["sequence"], {"gemm": ["fusion.3[gemm]"]})
    lines = text.splitlines()
    assert "fusion.3[gemm]" in lines[2] and lines[2].split()[0] == "40.00"
    assert lines[-1] == "gaps 41.0 us over 3 records; kernels 14.0 us"
