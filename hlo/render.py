"""Drawing HLO with graphviz: DOT text always, SVG (through the ``graphviz`` package) when
the ``dot`` binary is installed.

Nodes are coloured by op category, edges carry the operand's shape (plus layout and
sharding when set), fusions are clusters labelled with their kind, called computations
(while bodies, branches, calls) are drawn as their own clusters linked to the caller,
tooltips carry the JAX source location. A node budget keeps large graphs legible: the
instructions nearest the root are drawn and a visible "N more" node stands for the rest.
"""
from __future__ import annotations

import html
import shutil
from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

from .errors import HlotkError
from .ir import Computation, Instruction, Module
from . import ops as O

CATEGORY_COLORS = {
    O.ELEMENTWISE: "#dbeafe",     # blue
    O.REDUCTION: "#fed7aa",       # orange
    O.DOT_CONV: "#fecaca",        # red
    O.DATA_MOVEMENT: "#dcfce7",   # green
    O.CONTROL_FLOW: "#e9d5ff",    # purple
    O.COLLECTIVE: "#fef08a",      # yellow
    O.PARAM_CONST: "#e5e7eb",     # grey
    O.OTHER: "#ffffff",
}
FUSION_COLOR = "#f5f5f4"
DIFF_COLORS = {"added": "#16a34a", "removed": "#dc2626", "changed": "#ea580c"}
# Reducers and comparators are a handful of scalar ops; drawing them adds noise.
_SMALL_CALLEE_ATTRS = ("to_apply", "select", "scatter")


class RenderError(HlotkError):
    pass


@dataclass
class DiffMarks:
    """Instruction names to highlight: added/changed (drawn on "after"), removed (on "before")."""
    added: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    changed: set[str] = field(default_factory=set)

    def mark(self, name: str) -> Optional[str]:
        for kind in ("added", "removed", "changed"):
            if name in getattr(self, kind):
                return kind
        return None


@dataclass
class EdgeStyle:
    color: str
    tooltip: str = ""
    penwidth: float = 1.5


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def category(inst: Instruction) -> str:
    if inst.opcode == "fusion":
        return O.OTHER
    return inst.op.category


def _node_label(inst: Instruction) -> str:
    extra = ""
    if inst.opcode == "get-tuple-element":
        extra = f" [{inst.attrs.get('index')}]"
    elif inst.opcode == "parameter":
        extra = f" ({inst.parameter_number})"
    elif inst.opcode == "constant" and inst.shape.is_array and not inst.shape.dims \
            and inst.literal is not None:
        v = inst.literal.item() if hasattr(inst.literal, "item") else inst.literal
        extra = " " + (str(v).lower() if isinstance(v, bool) else str(v))
    elif inst.opcode == "custom-call":
        extra = f"\n{inst.attrs.get('custom_call_target', '')}"
    elif inst.opcode == "fusion":
        extra = f"\n{inst.attrs.get('kind', '')}"
    return f"{inst.name}\n{inst.opcode}{extra}"


def _tooltip(inst: Instruction) -> str:
    md = inst.metadata
    parts = [f"{inst.name} = {inst.shape} {inst.opcode}"]
    if md.get("op_name"):
        parts.append(f"op_name: {md.get('op_name')}")
    if md.get("source_file"):
        parts.append(f"source: {md.get('source_file')}:{md.get('source_line', '?')}")
    if inst.sharding is not None:
        parts.append(f"sharding: {inst.sharding}")
    return "\n".join(parts)


def _edge_label(src: Instruction, show_layouts: bool) -> str:
    label = src.shape.to_text(print_layout=show_layouts)
    if src.sharding is not None:
        label += f"\n{src.sharding}"
    return label


class _DotWriter:
    def __init__(self, *, collapse_fusions: bool, collapse_calls: bool, max_nodes: int,
                 diff: Optional[DiffMarks], edge_styles: dict[tuple[str, str], EdgeStyle],
                 show_layouts: bool):
        self.collapse_fusions = collapse_fusions
        self.collapse_calls = collapse_calls
        self.max_nodes = max_nodes
        self.diff = diff
        self.edge_styles = edge_styles
        self.show_layouts = show_layouts
        self.lines: list[str] = []
        self.drawn: set[int] = set()
        self.budget = max_nodes
        self.hidden = 0
        self.cluster_id = 0

    def node_id(self, inst: Instruction) -> str:
        return f"n{inst.uid}"

    def select(self, comp: Computation) -> list[Instruction]:
        """The instructions of ``comp`` to draw: nearest the root first, within budget."""
        if len(comp.instructions) <= self.budget:
            chosen = list(comp.instructions)
        else:
            order, seen = [], set()
            queue = [comp.root] if comp.root is not None else []
            while queue and len(order) < self.budget:
                i = queue.pop(0)
                if id(i) in seen:
                    continue
                seen.add(id(i))
                order.append(i)
                queue.extend(i.operands)
            keep = {id(i) for i in order}
            chosen = [i for i in comp.instructions if id(i) in keep]
            self.hidden += len(comp.instructions) - len(chosen)
        self.budget = max(0, self.budget - len(chosen))
        return chosen

    def computation(self, comp: Computation, indent: str = "  ") -> None:
        chosen = self.select(comp)
        for inst in chosen:
            self.instruction(inst, indent)
        for inst in chosen:
            for k, op in enumerate(inst.operands):
                if id(op) in self.drawn:
                    self.edge(op, inst, indent)
            if not self.collapse_calls and inst.opcode != "fusion":
                for attr, callee in _callees(inst):
                    if callee.root is not None and id(callee.root) in self.drawn:
                        self.lines.append(f"{indent}{self.node_id(callee.root)} -> {self.node_id(inst)} "
                                          f"[style=dashed, color=\"#7c3aed\", label={_q(attr)}, "
                                          f"fontsize=9, constraint=false];")

    def instruction(self, inst: Instruction, indent: str) -> None:
        if inst.opcode == "fusion" and not self.collapse_fusions:
            body: Computation = inst.attrs["calls"]
            self.cluster_id += 1
            kind = inst.attrs.get("kind", "")
            mark = self.diff.mark(inst.name) if self.diff else None
            border = DIFF_COLORS.get(mark, "#57534e") if mark else "#57534e"
            self.lines.append(f"{indent}subgraph cluster_{self.cluster_id} {{")
            self.lines.append(f"{indent}  label={_q(f'{inst.name} ({kind})')}; style=\"rounded,filled\"; "
                              f"fillcolor=\"{FUSION_COLOR}\"; color=\"{border}\"; "
                              f"penwidth={3 if mark else 1}; fontsize=10; tooltip={_q(_tooltip(inst))};")
            self.computation(body, indent + "  ")
            self.lines.append(f"{indent}}}")
            # The fusion node itself is its root inside the cluster; parameters stand for operands.
            self.drawn.add(id(inst))
            self.alias_fusion(inst, body)
            return
        self.drawn.add(id(inst))
        attrs = {
            "label": _q(_node_label(inst)),
            "fillcolor": _q(CATEGORY_COLORS.get(category(inst), "#ffffff")),
            "tooltip": _q(_tooltip(inst)),
        }
        mark = self.diff.mark(inst.name) if self.diff else None
        if mark:
            attrs["color"] = _q(DIFF_COLORS[mark])
            attrs["penwidth"] = "3"
            if mark == "removed":
                attrs["style"] = '"filled,dashed"'
        if inst.is_root:
            attrs["peripheries"] = "2"
        shape = "box" if inst.opcode != "parameter" else "ellipse"
        attrs["shape"] = shape
        body = ", ".join(f"{k}={v}" for k, v in attrs.items())
        self.lines.append(f"{indent}{self.node_id(inst)} [{body}];")
        if not self.collapse_calls and inst.opcode != "fusion":
            for attr, callee in _callees(inst):
                if callee.root is None:
                    continue
                self.cluster_id += 1
                self.lines.append(f"{indent}subgraph cluster_{self.cluster_id} {{")
                self.lines.append(f"{indent}  label={_q(f'{callee.name} ({inst.opcode} {attr})')}; "
                                  f"style=\"rounded,dashed\"; color=\"#7c3aed\"; fontsize=10;")
                self.computation(callee, indent + "  ")
                self.lines.append(f"{indent}}}")

    def alias_fusion(self, fusion: Instruction, body: Computation) -> None:
        """Edges into a fusion go to its parameters; edges out come from its root."""
        self._fusion_params = getattr(self, "_fusion_params", {})
        self._fusion_roots = getattr(self, "_fusion_roots", {})
        self._fusion_params[id(fusion)] = body.parameters
        self._fusion_roots[id(fusion)] = body.root

    def edge(self, src: Instruction, dst: Instruction, indent: str) -> None:
        roots = getattr(self, "_fusion_roots", {})
        params = getattr(self, "_fusion_params", {})
        tail = roots.get(id(src), src)
        heads = [dst]
        if id(dst) in params:
            heads = [params[id(dst)][k] for k, o in enumerate(dst.operands) if o is src
                     and k < len(params[id(dst)]) and params[id(dst)][k] is not None]
        for head in heads:
            if tail is None or id(tail) not in self.drawn and tail is not src:
                continue
            attrs = [f"label={_q(_edge_label(src, self.show_layouts))}", "fontsize=9"]
            style = self.edge_styles.get((src.name, dst.name))
            if style is not None:
                attrs += [f"color={_q(style.color)}", f"penwidth={style.penwidth}",
                          f"tooltip={_q(style.tooltip)}", f"labeltooltip={_q(style.tooltip)}"]
            self.lines.append(f"{indent}{self.node_id(tail)} -> {self.node_id(head)} [{', '.join(attrs)}];")


def _callees(inst: Instruction) -> Iterable[tuple[str, Computation]]:
    for attr in ("condition", "body", "true_computation", "false_computation", "to_apply",
                 "calls"):
        c = inst.attrs.get(attr)
        if isinstance(c, Computation):
            if attr in _SMALL_CALLEE_ATTRS and inst.opcode != "call":
                continue
            yield attr, c
    for k, c in enumerate(inst.attrs.get("branch_computations") or ()):
        yield f"branch {k}", c


def to_dot(obj: Union[Module, Computation], *, collapse_fusions: bool = False,
           collapse_calls: bool = False, max_nodes: int = 500, diff: Optional[DiffMarks] = None,
           edge_styles: Optional[dict[tuple[str, str], EdgeStyle]] = None,
           show_layouts: bool = True, title: Optional[str] = None) -> str:
    """DOT text for a module (its entry and what it calls) or one computation."""
    comp = obj.entry if isinstance(obj, Module) else obj
    if comp is None:
        raise RenderError("module has no entry computation to draw")
    w = _DotWriter(collapse_fusions=collapse_fusions, collapse_calls=collapse_calls,
                   max_nodes=max_nodes, diff=diff, edge_styles=edge_styles or {},
                   show_layouts=show_layouts)
    w.computation(comp)
    name = title or (obj.name if isinstance(obj, Module) else comp.name)
    head = [f"digraph {_q(name)} {{",
            "  rankdir=TB; newrank=true;",
            f"  label={_q(name)}; labelloc=t; fontname=\"Helvetica\";",
            "  node [style=filled, fontname=\"Helvetica\", fontsize=10];",
            "  edge [fontname=\"Helvetica\", color=\"#4b5563\"];"]
    tail = []
    if w.hidden:
        tail.append(f"  more [shape=note, style=filled, fillcolor=\"#fde68a\", "
                    f"label={_q(f'{w.hidden} more instructions not drawn (node budget {max_nodes})')}];")
    return "\n".join(head + w.lines + tail + ["}"]) + "\n"


def dot_available() -> bool:
    return shutil.which("dot") is not None


DOT_MISSING_HINT = ("graphviz's `dot` binary is not installed, so only .dot files were written; "
                    "install it (Debian/Ubuntu: apt-get install graphviz; macOS: brew install "
                    "graphviz) and render with: dot -Tsvg FILE.dot -o FILE.svg")


def dot_to_svg(dot_text: str) -> str:
    """SVG through the ``graphviz`` package (which runs graphviz's ``dot``). ``dot`` is
    superlinear: keep drawings within a node budget (``to_dot(max_nodes=...)``); the
    interactive viewer (``runtime.viewer``) lays out large graphs itself."""
    import graphviz
    if not dot_available():
        raise RenderError(DOT_MISSING_HINT)
    try:
        svg = graphviz.Source(dot_text).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        raise RenderError(DOT_MISSING_HINT) from None
    except graphviz.CalledProcessError as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else str(e.stderr)
        raise RenderError(f"graphviz failed: {err[:500]}") from None
    return svg


def render(obj: Union[Module, Computation], format: str = "svg", **options) -> str:
    """SVG (default) or DOT text for a module or computation; options as for ``to_dot``."""
    dot_text = to_dot(obj, **options)
    if format == "dot":
        return dot_text
    if format == "svg":
        return dot_to_svg(dot_text)
    raise RenderError(f"unknown format {format!r}; use 'svg' or 'dot'")


def repr_html(obj: Union[Module, Computation]) -> str:
    """What Jupyter shows: the SVG if graphviz is there, else the HLO text."""
    if dot_available():
        try:
            return render(obj, max_nodes=300)
        except RenderError:
            pass
    return "<pre>" + html.escape(obj.to_text()) + "</pre>"
