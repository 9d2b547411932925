"""Run StableHLO's own ``testdata`` and ``tests/math`` suites through ``hlotk check``.

The suites are not in this repository (thousands of generated files); point the script at a
checkout of openxla/stablehlo:

    python benchmarks/stablehlo_suites.py /path/to/stablehlo [-j 2] [--only acos]

``testdata`` counts the top-level ``stablehlo/testdata/*.mlir`` files that are not
``RUN-DISABLED`` (one case each); ``tests/math`` counts ``stablehlo/tests/math/*.mlir``.
Each file runs in a worker process with a time limit, so one slow or crashing case cannot
stop the run. Writes ``benchmarks/stablehlo_suites.md``: pass counts and every remaining
failure with its reason.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import sys
import time
from pathlib import Path

REPORT = Path(__file__).with_name("stablehlo_suites.md")
FILE_TIMEOUT_S = 300


def suite_files(root: Path) -> dict[str, list[Path]]:
    """``{"testdata": [...], "tests/math": [...]}`` under a stablehlo checkout ``root``."""
    base = root / "stablehlo" if (root / "stablehlo" / "testdata").is_dir() else root
    testdata = [p for p in sorted((base / "testdata").glob("*.mlir"))
                if "RUN-DISABLED" not in p.read_text(errors="replace")]
    math = sorted((base / "tests" / "math").glob("*.mlir"))
    if not testdata and not math:
        raise SystemExit(f"{root}: no stablehlo/testdata or stablehlo/tests/math here")
    return {"testdata": testdata, "tests/math": math}


def _check_one(path: str) -> tuple[bool, str, float]:
    """(passed, first failure reason, seconds) for one file: every case in it must pass."""
    from runtime.conformance import run_check_files
    t0 = time.perf_counter()
    try:
        results, _, failed = run_check_files([path])
    except Exception as e:  # noqa: BLE001 - a crash is reported as this file's failure
        return False, f"crash: {type(e).__name__}: {e}", time.perf_counter() - t0
    reason = next((r.reason for r in results if not r.passed), "")
    return (failed == 0 and bool(results)), reason or ("no cases" if not results else ""), \
        time.perf_counter() - t0


def run_suite(files: list[Path], jobs: int) -> dict[str, tuple[bool, str, float]]:
    """``{file name: (passed, reason, seconds)}``; ``jobs <= 1`` runs in this process."""
    out: dict[str, tuple[bool, str, float]] = {}
    if jobs <= 1:
        return {p.name: _check_one(str(p)) for p in files}
    ctx = mp.get_context("spawn")
    # (No max_tasks_per_child: with it, CPython 3.11's executor can hang replacing workers.)
    with cf.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        futs = {pool.submit(_check_one, str(p)): p.name for p in files}
        for fut in cf.as_completed(futs):
            name = futs[fut]
            try:
                out[name] = fut.result(timeout=FILE_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001
                out[name] = (False, f"worker: {type(e).__name__}: {e}", 0.0)
    return out


def write_report(results: dict[str, dict[str, tuple[bool, str, float]]], source: str,
                 seconds: float) -> str:
    lines = ["# StableHLO testdata and math suites through `hlotk check`", "",
             f"Source: `{source}`. Produced by `python benchmarks/stablehlo_suites.py`; "
             f"wall time {seconds:.0f} s.", "",
             "| suite | files | passed | failed | pass rate |", "|---|---:|---:|---:|---:|"]
    for suite, res in results.items():
        n = len(res)
        ok = sum(r[0] for r in res.values())
        lines.append(f"| {suite} | {n} | {ok} | {n - ok} | {100.0 * ok / max(n, 1):.1f}% |")
    for suite, res in results.items():
        fails = sorted((k, v[1]) for k, v in res.items() if not v[0])
        lines += ["", f"## Remaining failures: {suite} ({len(fails)})", ""]
        lines += [f"- `{k}`: {reason[:300]}" for k, reason in fails] or ["(none)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="a checkout of openxla/stablehlo (or its stablehlo/)")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="run only files whose name contains this")
    ap.add_argument("--no-report", action="store_true", help="print, do not write the .md")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    results = {}
    for suite, files in suite_files(args.root).items():
        files = [p for p in files if args.only in p.name]
        results[suite] = run_suite(files, args.jobs)
        ok = sum(r[0] for r in results[suite].values())
        print(f"{suite}: {ok}/{len(files)} passed", flush=True)
    text = write_report(results, str(args.root), time.perf_counter() - t0)
    if args.no_report or args.only:
        print(text)
    else:
        REPORT.write_text(text)
        print(f"wrote {REPORT}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
