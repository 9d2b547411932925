"""What ``hlotk compile`` and ``hlotk diff`` do, as functions the CLI and notebooks call."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, TextIO

import hlo
from passes.pipeline import PassRecord, run_pipeline
from passes.pipelines import pipeline_spec

# ``hlo.diff`` and ``runtime.dump`` (graph rendering) are imported where they are used: a
# compile without a dump imports this module for ``compile_module`` alone (issue 13).


def compile_module(module: hlo.Module, passes: str = "default", *, backend: str = "cpu",
                   dump_dir: Optional[str | Path] = None, verify: bool = False,
                   render_svg: bool = True, verified: bool = False,
                   replay: Optional[Callable[[], hlo.Module]] = None,
                   ) -> tuple[list[PassRecord], Optional[Path]]:
    """Run a pipeline (a name such as ``default`` or a spec) in place, optionally dumping.
    ``verified``: the caller has just verified ``module``; ``replay``: a fresh copy of it
    on demand, to verify once after the pipeline (``run_pipeline``)."""
    spec = pipeline_spec(passes, backend)
    if dump_dir is None:
        return run_pipeline(module, spec, verify=verify, verified=verified, replay=replay), None
    from .dump import PassDumper
    dumper = PassDumper(Path(dump_dir), render_svg=render_svg,
                        title=f"hlotk: {module.name} through {spec or 'no passes'}")
    records = run_pipeline(module, spec, verify=verify, hooks=[dumper], verified=verified)
    return records, dumper.finish(module)


def format_records(records: list[PassRecord]) -> str:
    lines = [f"{'#':>3}  {'pass':<40} {'ms':>8} {'before':>7} {'after':>7}  changed"]
    for k, r in enumerate(records, 1):
        it = "" if r.iteration is None else f" [{r.iteration}]"
        it += " (mandatory)" if r.mandatory else ""
        lines.append(f"{k:>3}  {(r.name + it):<40} {r.seconds * 1e3:>8.2f} "
                     f"{r.instructions_before:>7} {r.instructions_after:>7}  {'yes' if r.changed else 'no'}")
    return "\n".join(lines)


def diff_texts(text_a: str, text_b: str, *, name_a: str = "a", name_b: str = "b",
               html_out: Optional[str | Path] = None, out: Optional[TextIO] = None) -> int:
    """Diff two HLO texts by instruction name; returns 0 if equal, 1 if they differ."""
    from hlo.diff import diff_modules

    from .atomic import atomic_write
    a = hlo.parse_hlo(text_a, filename=name_a)
    b = hlo.parse_hlo(text_b, filename=name_b)
    d = diff_modules(a, b)
    if out is not None:
        out.write(f"--- {name_a}\n+++ {name_b}\n")
        out.write(d.to_text())
        out.write(d.summary() + "\n")
    if html_out is not None:
        page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{name_a} vs {name_b}"
                f"</title></head><body style='font-family:Helvetica,Arial,sans-serif'>"
                f"<h1>{name_a} → {name_b}</h1>{d.to_html(f'{name_a} → {name_b}')}</body></html>")
        atomic_write(Path(html_out), page)
    return 0 if d.empty else 1
