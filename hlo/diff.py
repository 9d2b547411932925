"""Comparing two modules: which instructions were added, removed or changed, by name.

Instructions are matched by name within computations of the same name (passes keep names
of what they do not touch, as XLA's do), so a diff reads as "what this pass did".
``changed`` means same name, different text once metadata is ignored.
"""
from __future__ import annotations

import difflib
import html
from dataclasses import dataclass, field

from .ir import Instruction, Module
from .render import DiffMarks


def _key_text(inst: Instruction) -> str:
    return inst.to_text(print_metadata=False).replace("ROOT ", "").strip()


@dataclass
class ModuleDiff:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    computations_added: list[str] = field(default_factory=list)
    computations_removed: list[str] = field(default_factory=list)
    # Rows of the name-aligned text diff: (tag, before_line, after_line), tag in
    # {"same", "added", "removed", "changed", "header"}.
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.computations_added
                    or self.computations_removed)

    def marks_before(self) -> DiffMarks:
        return DiffMarks(removed=set(self.removed), changed=set(self.changed))

    def marks_after(self) -> DiffMarks:
        return DiffMarks(added=set(self.added), changed=set(self.changed))

    def summary(self) -> str:
        return (f"{len(self.added)} added, {len(self.removed)} removed, {len(self.changed)} changed"
                + (f"; computations +{len(self.computations_added)} -{len(self.computations_removed)}"
                   if self.computations_added or self.computations_removed else ""))

    def visible_rows(self, unchanged_computations: bool = False) -> list[tuple[str, str, str]]:
        """``rows``, without the computations in which nothing changed (unless asked)."""
        if unchanged_computations:
            return list(self.rows)
        rows: list[tuple[str, str, str]] = []
        block: list[tuple[str, str, str]] = []
        for row in self.rows + [("header", "", "")]:
            if row[0] != "header":
                block.append(row)
                continue
            if block and (any(t != "same" for t, _, _ in block[1:]) or "(" in block[0][1]):
                rows.extend(block)
            block = [row]
        return rows

    def to_text(self, unchanged_computations: bool = False) -> str:
        """The aligned diff as text with ``-``/``+`` prefixes, as a reviewer reads it.

        Computations without changes are left out unless ``unchanged_computations``.
        """
        out = []
        for tag, a, b in self.visible_rows(unchanged_computations):
            if tag == "header":
                out.append(a)
            elif tag == "same":
                out.append("  " + b)
            elif tag == "added":
                out.append("+ " + b)
            elif tag == "removed":
                out.append("- " + a)
            else:
                out.append("- " + a)
                out.append("+ " + b)
        return "\n".join(out) + "\n"

    def to_html(self, title: str = "diff") -> str:
        """A side-by-side table (self-contained HTML fragment)."""
        colors = {"added": "#dcfce7", "removed": "#fee2e2", "changed": "#ffedd5", "same": "#ffffff",
                  "header": "#e5e7eb"}
        rows = []
        for tag, a, b in self.visible_rows():
            if tag == "header":
                rows.append(f'<tr style="background:{colors[tag]}"><td colspan="2"><b>'
                            f"{html.escape(a)}</b></td></tr>")
                continue
            rows.append(f'<tr style="background:{colors[tag]}" class="{tag}"><td><code>{html.escape(a)}'
                        f'</code></td><td><code>{html.escape(b)}</code></td></tr>')
        return (f'<table class="hlodiff" style="border-collapse:collapse;font-size:12px;width:100%">'
                f'<caption>{html.escape(title)}: {html.escape(self.summary())}</caption>'
                f'<tr><th>before</th><th>after</th></tr>{"".join(rows)}</table>')


def diff_modules(before: Module, after: Module) -> ModuleDiff:
    d = ModuleDiff()
    comps_before = {c.name: c for c in before.computations}
    comps_after = {c.name: c for c in after.computations}
    d.computations_removed = [n for n in comps_before if n not in comps_after]
    d.computations_added = [n for n in comps_after if n not in comps_before]
    order = [c.name for c in after.computations] + d.computations_removed
    for cname in order:
        cb, ca = comps_before.get(cname), comps_after.get(cname)
        d.rows.append(("header", f"%{cname}" + ("" if cb and ca else " (added)" if ca else " (removed)"), ""))
        ib = {i.name: i for i in cb.instructions} if cb else {}
        ia = {i.name: i for i in ca.instructions} if ca else {}
        # After-order, with removed instructions placed where they were in "before".
        seq: list[str] = []
        before_names = list(ib)
        after_names = list(ia)
        pending = [n for n in before_names if n not in ia]
        for n in after_names:
            # Emit removed instructions that came before n's position in the old order.
            if n in ib:
                pos = before_names.index(n)
                while pending and before_names.index(pending[0]) < pos:
                    seq.append(pending.pop(0))
            seq.append(n)
        seq.extend(pending)
        for n in seq:
            a, b = ib.get(n), ia.get(n)
            if a is not None and b is None:
                d.removed.append(n)
                d.rows.append(("removed", _key_text(a), ""))
            elif a is None and b is not None:
                d.added.append(n)
                d.rows.append(("added", "", _key_text(b)))
            else:
                ta, tb = _key_text(a), _key_text(b)
                if ta != tb or a.is_root != b.is_root:
                    d.changed.append(n)
                    d.rows.append(("changed", ta, tb))
                else:
                    d.rows.append(("same", ta, tb))
    return d


def unified_text_diff(before: str, after: str, name_a: str = "before", name_b: str = "after") -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                        fromfile=name_a, tofile=name_b))
