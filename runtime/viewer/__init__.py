"""The interactive HLO viewer: one offline HTML file (``hlotk view FILE_OR_DUMP_DIR``).

    data = viewer_for_module(module)            # one module (+ memory timeline if scheduled)
    data = viewer_from_dump("out/dump")         # every pass of a ``--dump`` directory
    write_viewer(data, "view.html")

The page lays graphs out itself (a layered layout in our own JavaScript, ranks and order
once per computation, coordinates again when a fusion or called computation is expanded),
so it stays responsive at thousands of instructions where graphviz's ``dot`` takes
minutes. See ``model.py`` for the data and ``viewer.js`` for the page.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping, Optional

import hlo

from .model import Pair, ViewerData, diff_pair, profile_by_name
from .page import to_html

__all__ = ["Pair", "ViewerData", "diff_pair", "profile_by_name", "to_html", "write_viewer",
           "viewer_for_module", "viewer_from_dump", "load_profile", "add_memory"]


def write_viewer(data: ViewerData, path: str | Path) -> Path:
    """Write the page (atomically: never a partial file); returns its path."""
    from runtime.dump import atomic_write
    from ..inputs import InputFileError
    path = Path(path)
    try:
        atomic_write(path, to_html(data))
    except OSError as e:
        raise InputFileError(f"{path}: cannot write the viewer: {e.strerror}") from None
    return path


def add_memory(data: ViewerData, snapshot: int, module: hlo.Module) -> Optional[str]:
    """The memory timeline of a scheduled module; returns why not, when there is none."""
    from hlo.errors import HlotkError
    from passes.buffer_assignment import assign_buffers
    if not module.is_scheduled:
        return "no memory timeline: the module is not scheduled"
    try:
        data.set_memory(snapshot, assign_buffers(module))
    except HlotkError as e:
        return f"no memory timeline: {e}"
    return None


def viewer_for_module(module: hlo.Module, *, title: Optional[str] = None, label: str = "module",
                      profile: Any = None, target: Optional[str] = None) -> ViewerData:
    """A viewer of one module; ``profile``: measured times (see ``load_profile``)."""
    data = ViewerData(title or f"hlotk: {module.name}")
    k = data.add_module(module, label, profile_us=profile_by_name(profile) if profile else None,
                        target=target)
    note = add_memory(data, k, module)
    if note:
        data.notes.append(note)
    return data


def load_profile(path: str | Path) -> dict[str, float]:
    """A profile file: JSON ``{"instruction name": µs}``, or the ``[[description, ms], ...]``
    list ``CudaExecutable.profile`` returns."""
    from .. import inputs as inputs_mod
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise inputs_mod.InputFileError(f"{path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise inputs_mod.InputFileError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
    try:
        return profile_by_name(raw)
    except (TypeError, ValueError) as e:
        raise inputs_mod.InputFileError(
            f"{path}: expected {{name: microseconds}} or [[thunk, ms], ...]: {e}") from None


def _progress(items: list, desc: str) -> Any:
    """One tqdm bar on a terminal; nothing when stderr is not one (CI, pipes, tests)."""
    import sys
    from tqdm import tqdm
    return tqdm(items, desc=desc, unit="pass", leave=False, disable=not sys.stderr.isatty())


_PASS_FILE = re.compile(r"^(\d+)\.(.+)\.(before|after)\.hlo\.txt$")


def viewer_from_dump(directory: str | Path, profile: Any = None) -> ViewerData:
    """Rebuild the viewer of a ``--dump`` directory from its HLO files (and its
    ``fusion_report.json`` for fusion decisions)."""
    from hlo.diff import diff_modules
    from passes.fusion.explain import FusionReport
    from .. import inputs as inputs_mod
    d = Path(directory)
    if not (d / "00.input.hlo.txt").is_file():
        raise inputs_mod.InputFileError(f"{d}: not a dump directory (no 00.input.hlo.txt; "
                                        "write one with `hlotk compile FILE --dump DIR`)")
    report = None
    if (d / "fusion_report.json").is_file():
        report = FusionReport.from_json(json.loads((d / "fusion_report.json").read_text()))
    prof = profile_by_name(profile) if profile else None
    data = ViewerData(f"hlotk dump: {d.name}")

    def parse(p: Path) -> hlo.Module:
        return hlo.parse_hlo(p.read_text(), filename=str(p))
    current = parse(d / "00.input.hlo.txt")
    k_cur = data.add_module(current, "00 input", profile_us=prof)
    passes = sorted({(int(m.group(1)), m.group(2)) for f in d.iterdir()
                     if (m := _PASS_FILE.match(f.name))})
    fused = False
    for n, name in _progress(passes, "viewer"):
        after_path = d / f"{n:02d}.{name}.after.hlo.txt"
        before_text = (d / f"{n:02d}.{name}.before.hlo.txt").read_text()
        after_text = after_path.read_text()
        if after_text == before_text:
            continue
        after = parse(after_path)
        fused = fused or name.startswith("fusion")
        k = data.add_module(after, f"{n:02d} after {name}", report=report if fused else None,
                            profile_us=prof)
        data.add_pair(diff_pair(f"{n:02d}. {name}: before | after", k_cur, k,
                                diff_modules(current, after)))
        current, k_cur = after, k
    note = add_memory(data, k_cur, current)
    if note:
        data.notes.append(note)
    return data
