"""``--dump DIR``: every pass's HLO before/after, drawn graphs, and one ``index.html``.

Used as a pass hook (see ``passes.pipeline``). For pass number N it writes
``NN.<pass>.before.hlo.txt`` / ``.after.hlo.txt``, ``.dot`` files and, when graphviz is
installed and the pass changed something, ``.svg`` files with added/removed/changed
instructions highlighted. ``finish`` writes ``index.html``: self-contained (SVGs inline, no
network fetches), with the pass list (time, instruction counts, changed) and, per pass, the
before/after graphs side by side with the name-aligned diff and the text diff, and links
``viewer.html``, the interactive viewer of every pass (``runtime.viewer``).
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import hlo
from hlo.diff import ModuleDiff, diff_modules, unified_text_diff
from hlo.render import DOT_MISSING_HINT, RenderError, dot_available, dot_to_svg, to_dot
from passes.pipeline import PassRecord

from .atomic import atomic_write  # noqa: F401  (its home before issue 13; callers import it here)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60]


def buffer_assignment_section(module: hlo.Module, directory: Optional[Path] = None) -> str:
    """The buffer-assignment report and memory timeline of a scheduled module, as HTML
    (also written as ``buffer_assignment.txt`` / ``memory_timeline.svg``)."""
    from hlo.errors import HlotkError
    from passes.buffer_assignment import assign_buffers
    try:
        ba = assign_buffers(module)
    except HlotkError as e:
        return f"<h2>Buffer assignment</h2><p>not available: {html.escape(str(e))}</p>"
    if directory is not None:
        atomic_write(Path(directory) / "buffer_assignment.txt", ba.to_text())
        atomic_write(Path(directory) / "memory_timeline.svg", ba.memory_timeline_svg())
    return ba.html_section()


@dataclass
class _PassEntry:
    record: PassRecord
    stem: str
    diff: Optional[ModuleDiff]
    svg_before: Optional[str] = None
    svg_after: Optional[str] = None
    text_diff: str = ""
    render_note: str = ""


@dataclass
class PassDumper:
    """A pass hook that writes the dump directory; call ``finish()`` after the pipeline."""
    directory: Path
    render_svg: bool = True
    max_nodes: int = 400
    # graphviz's dot takes ~20 s for a 400-node drawing with clusters (and minutes past
    # that): bigger modules get no static SVG, only the interactive viewer.html.
    max_static_svg_instructions: int = 150
    title: str = "hlotk pass dump"
    entries: list[_PassEntry] = field(default_factory=list)
    _before_text: str = ""
    _first_text: Optional[str] = None
    viewer: Any = None            # runtime.viewer.ViewerData, filled as passes run
    _viewer_current: int = 0      # the snapshot the next pass's "before" is

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._svg = self.render_svg and dot_available()
        from .viewer import ViewerData
        self.viewer = ViewerData(self.title)

    def __call__(self, event: str, p: Any, module: hlo.Module, record: Optional[PassRecord]) -> None:
        if event == "before":
            self._before_text = module.to_text()
            if self._first_text is None:
                self._first_text = self._before_text
                atomic_write(self.directory / "00.input.hlo.txt", self._before_text)
                self._viewer_current = self.viewer.add_module(module, "00 input")
            return
        assert record is not None
        after_text = module.to_text()
        n = len(self.entries) + 1
        stem = f"{n:02d}.{_slug(record.name)}"
        atomic_write(self.directory / f"{stem}.before.hlo.txt", self._before_text)
        atomic_write(self.directory / f"{stem}.after.hlo.txt", after_text)
        entry = _PassEntry(record, stem, None)
        if after_text != self._before_text:
            before_module = hlo.parse_hlo(self._before_text)
            entry.diff = diff_modules(before_module, module)
            entry.text_diff = unified_text_diff(self._before_text, after_text,
                                                f"{stem}.before", f"{stem}.after")
            atomic_write(self.directory / f"{stem}.diff.txt", entry.diff.to_text())
            self._add_viewer_step(n, record, module, entry.diff)
            dot_b = to_dot(before_module, diff=entry.diff.marks_before(), max_nodes=self.max_nodes,
                           title=f"{record.name}: before",
                           edge_styles=_fusion_edge_styles(module, record.name))
            dot_a = to_dot(module, diff=entry.diff.marks_after(), max_nodes=self.max_nodes,
                           title=f"{record.name}: after")
            atomic_write(self.directory / f"{stem}.before.dot", dot_b)
            atomic_write(self.directory / f"{stem}.after.dot", dot_a)
            too_big = self._too_big_for_svg(before_module, module)
            if too_big:
                entry.render_note = too_big
            elif self._svg:
                try:
                    entry.svg_before = dot_to_svg(dot_b)
                    entry.svg_after = dot_to_svg(dot_a)
                    atomic_write(self.directory / f"{stem}.before.svg", entry.svg_before)
                    atomic_write(self.directory / f"{stem}.after.svg", entry.svg_after)
                except RenderError as e:
                    entry.render_note = str(e)
        self.entries.append(entry)

    def _too_big_for_svg(self, *modules: hlo.Module) -> str:
        n = max(sum(len(c.instructions) for c in m.computations) for m in modules)
        if n <= self.max_static_svg_instructions:
            return ""
        return (f"{n} instructions: more than max_static_svg_instructions="
                f"{self.max_static_svg_instructions} for a static graphviz drawing (dot takes "
                "minutes at that size); open viewer.html, the interactive viewer")

    def _add_viewer_step(self, n: int, record: PassRecord, module: hlo.Module,
                         diff: ModuleDiff) -> None:
        """A snapshot after a pass that changed something, and its before/after pair."""
        from .viewer import diff_pair
        from passes.fusion.explain import report_for
        report = report_for(module)
        if record.name.startswith("fusion") and report is not None:
            import json
            atomic_write(self.directory / "fusion_report.json", json.dumps(report.to_json()))
        k = self.viewer.add_module(module, f"{n:02d} after {record.name}")
        self.viewer.add_pair(diff_pair(f"{n:02d}. {record.name}: before | after",
                                       self._viewer_current, k, diff, record.seconds))
        self._viewer_current = k

    def _write_viewer(self, final: Optional[hlo.Module]) -> Path:
        from .viewer import add_memory, write_viewer
        if not self.viewer.snapshots and final is not None:
            self._viewer_current = self.viewer.add_module(final, "final")
        if final is not None:
            note = add_memory(self.viewer, self._viewer_current, final)
            if note:
                self.viewer.notes.append(note)
        return write_viewer(self.viewer, self.directory / "viewer.html")

    def finish(self, final: Optional[hlo.Module] = None, extra_sections: str = "") -> Path:
        """Write ``index.html`` (and the final module's text); returns the index path."""
        if final is not None:
            extra_sections += _fusion_section(final)
            atomic_write(self.directory / "99.final.hlo.txt", final.to_text())
            dot_final = to_dot(final, max_nodes=self.max_nodes, title="final")
            atomic_write(self.directory / "99.final.dot", dot_final)
            final_svg = None
            if self._svg and not self._too_big_for_svg(final):
                try:
                    final_svg = dot_to_svg(dot_final)
                    atomic_write(self.directory / "99.final.svg", final_svg)
                except RenderError:
                    final_svg = None
        else:
            final_svg = None
        if final is not None and final.is_scheduled:
            extra_sections += buffer_assignment_section(final, self.directory)
        self._write_viewer(final)
        index = self.directory / "index.html"
        atomic_write(index, self._html(final, final_svg, extra_sections))
        return index

    # --- HTML ---------------------------------------------------------------------------
    def _html(self, final: Optional[hlo.Module], final_svg: Optional[str], extra: str) -> str:
        total = sum(e.record.seconds for e in self.entries)
        rows = []
        for k, e in enumerate(self.entries, 1):
            r = e.record
            it = "" if r.iteration is None else f" (iteration {r.iteration})"
            link = f'<a href="#pass{k}">{html.escape(r.name)}</a>' if r.changed else html.escape(r.name)
            summary = e.diff.summary() if e.diff else ""
            rows.append(f"<tr class=\"{'changed' if r.changed else 'same'}\"><td>{k}</td><td>{link}{it}</td>"
                        f"<td>{r.seconds * 1e3:.2f}</td><td>{r.instructions_before}</td>"
                        f"<td>{r.instructions_after}</td><td>{'yes' if r.changed else 'no'}</td>"
                        f"<td>{html.escape(summary)}</td></tr>")
        sections = []
        for k, e in enumerate(self.entries, 1):
            if e.diff is None:
                continue
            graphs = ""
            if e.svg_before and e.svg_after:
                graphs = (f'<div class="pair"><div class="g"><h4>before</h4>{_strip_xml(e.svg_before)}</div>'
                          f'<div class="g"><h4>after</h4>{_strip_xml(e.svg_after)}</div></div>')
            else:
                note = e.render_note or DOT_MISSING_HINT
                graphs = (f'<p class="note">{html.escape(note)}<br>DOT files: '
                          f'<code>{e.stem}.before.dot</code>, <code>{e.stem}.after.dot</code></p>')
            sections.append(
                f'<section id="pass{k}"><h2>{k}. {html.escape(e.record.name)}</h2>'
                f'<p>{html.escape(e.diff.summary())} · {e.record.seconds * 1e3:.2f} ms · '
                f'files: <code>{e.stem}.before.hlo.txt</code>, <code>{e.stem}.after.hlo.txt</code></p>'
                f'{graphs}<details open><summary>instructions (aligned by name)</summary>'
                f'{e.diff.to_html(e.record.name)}</details>'
                f'<details><summary>text diff</summary><pre>{html.escape(e.text_diff)}</pre></details>'
                f'</section>')
        final_html = ""
        if final is not None:
            why = self._too_big_for_svg(final) or DOT_MISSING_HINT
            pic = _strip_xml(final_svg) if final_svg else f'<p class="note">{html.escape(why)}</p>'
            final_html = (f'<section id="final"><h2>Final module</h2>{pic}<details><summary>HLO text'
                          f'</summary><pre>{html.escape(final.to_text())}</pre></details></section>')
        legend = ("<p class=legend>Graph colours: <span style='background:#dbeafe'>elementwise</span> "
                  "<span style='background:#fed7aa'>reduction</span> <span style='background:#fecaca'>"
                  "dot/conv</span> <span style='background:#dcfce7'>data movement</span> "
                  "<span style='background:#e9d5ff'>control flow</span> <span style='background:#fef08a'>"
                  "collective</span> <span style='background:#e5e7eb'>parameter/constant</span>; "
                  "borders: <b style='color:#16a34a'>added</b> <b style='color:#ea580c'>changed</b> "
                  "<b style='color:#dc2626'>removed</b>.</p>")
        return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(self.title)}</title>
<style>
body {{ font-family: Helvetica, Arial, sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #d1d5db; padding: 2px 6px; }}
tr.same td {{ color: #6b7280; }} .pair {{ display: flex; gap: 1em; align-items: flex-start; }}
.g {{ flex: 1; overflow: auto; max-height: 900px; border: 1px solid #e5e7eb; }}
.g svg {{ max-width: 100%; height: auto; }} .note {{ background: #fef9c3; padding: .5em; }}
pre {{ background: #f9fafb; padding: .5em; overflow: auto; font-size: 12px; }}
section {{ margin-top: 2em; border-top: 2px solid #e5e7eb; }}
</style></head><body>
<h1>{html.escape(self.title)}</h1>
<p>{len(self.entries)} passes, {total * 1e3:.1f} ms in total. Input: <code>00.input.hlo.txt</code>.</p>
<p class="viewer"><a href="viewer.html"><b>Open the interactive viewer</b></a> (<code>viewer.html</code>):
pan, zoom, search, expand fusions, click an instruction for its details, every pass before and
after side by side, the memory timeline.</p>
{legend}
<table><tr><th>#</th><th>pass</th><th>ms</th><th>instructions before</th><th>after</th>
<th>changed</th><th>diff</th></tr>{''.join(rows)}</table>
{extra}
{''.join(sections)}
{final_html}
</body></html>
"""


def _strip_xml(svg: str) -> str:
    """Inline SVG: drop the XML prolog and DOCTYPE graphviz puts before ``<svg``."""
    i = svg.find("<svg")
    return svg[i:] if i >= 0 else svg


def run_with_dump(module: hlo.Module, pipeline: Any, directory: str | Path, *, verify: bool = False,
                  render_svg: bool = True, title: str | None = None) -> tuple[list[PassRecord], Path]:
    """Run ``pipeline`` on ``module`` in place, dumping every pass; returns (records, index)."""
    from passes.pipeline import run_pipeline
    dumper = PassDumper(Path(directory), render_svg=render_svg,
                        title=title or f"hlotk passes on {module.name}")
    records = run_pipeline(module, pipeline, verify=verify, hooks=[dumper])
    index = dumper.finish(module)
    return records, index


def _fusion_edge_styles(module: hlo.Module, pass_name: str) -> dict:
    """After a fusion pass: the unfused graph's edges coloured by its decisions."""
    if not pass_name.startswith("fusion"):
        return {}
    from passes.fusion.explain import report_for
    report = report_for(module)
    return report.edge_styles() if report is not None else {}


def _fusion_section(final: hlo.Module) -> str:
    from passes.fusion.explain import report_for
    report = report_for(final)
    return report.html() if report is not None else ""
