"""The decision log: every (producer, consumer) pair fusion looked at, and why.

A ``FusionReport`` is attached to the module after the ``fusion`` pass
(``report_for(module)``). ``decisions`` are chronological (a pair may be looked at several
times as its neighbours change); ``final_edges()`` gives one line per data edge of the
unfused graph: fused or not, and the last reason. ``table()`` prints it, ``edge_styles()``
colours a drawing of the unfused module with it.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Optional

from hlo.ir import Module


@dataclass(frozen=True)
class FusionDecision:
    producer: str            # instruction names in the unfused module
    consumer: str
    fused: bool
    action: str              # merge | duplicate | sibling | normalization | none | library-epilogue
    reason: str
    unfused_us: float = 0.0  # predicted time of the two kernels apart
    fused_us: float = 0.0    # predicted time of the one kernel
    computation: str = ""

    @property
    def benefit_us(self) -> float:
        return self.unfused_us - self.fused_us


@dataclass
class FusionReport:
    target: str
    policy: str
    decisions: list[FusionDecision] = field(default_factory=list)
    # (producer, consumer) edges of the unfused graph -> whether both ended in one kernel
    edges: dict[tuple[str, str], bool] = field(default_factory=dict)
    kernels_before: int = 0
    kernels_after: int = 0
    time_before_us: float = 0.0
    time_after_us: float = 0.0
    bytes_before: int = 0
    bytes_after: int = 0

    def record(self, d: FusionDecision) -> None:
        self.decisions.append(d)

    def final_edges(self) -> list[FusionDecision]:
        """One decision per edge: the last one recorded for it, or 'not considered'."""
        last: dict[tuple[str, str], FusionDecision] = {}
        for d in self.decisions:
            last[(d.producer, d.consumer)] = d
        out = []
        for (p, c), fused in self.edges.items():
            d = last.get((p, c))
            if d is None:
                reason = "fused" if fused else "not considered (not fusible or free)"
                d = FusionDecision(p, c, fused, "none", reason)
            elif d.fused != fused:
                reason = d.reason if fused else f"was fused, then split: {d.reason}"
                d = FusionDecision(p, c, fused, d.action,
                                   "fused with a neighbour" if fused and not d.fused else reason,
                                   d.unfused_us, d.fused_us, d.computation)
            out.append(d)
        return out

    def why(self, producer: str, consumer: str) -> Optional[FusionDecision]:
        for d in self.final_edges():
            if d.producer == producer and d.consumer == consumer:
                return d
        return None

    def summary(self) -> str:
        return (f"fusion on {self.target} with policy {self.policy}: "
                f"{self.kernels_before} -> {self.kernels_after} kernels, "
                f"{self.time_before_us:.1f} -> {self.time_after_us:.1f} us predicted, "
                f"{self.bytes_before / 1e6:.1f} -> {self.bytes_after / 1e6:.1f} MB moved")

    def table(self, only_unfused: bool = False) -> str:
        rows = [d for d in self.final_edges() if not (only_unfused and d.fused)]
        head = ("producer", "consumer", "fused", "unfused us", "fused us", "reason")
        body = [(d.producer, d.consumer, "yes" if d.fused else "no",
                 f"{d.unfused_us:.2f}" if d.unfused_us else "-",
                 f"{d.fused_us:.2f}" if d.fused_us else "-", d.reason) for d in rows]
        widths = [max(len(str(r[k])) for r in [head] + body) for k in range(5)]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5]
                 for r in [head] + body]
        return self.summary() + "\n" + "\n".join(lines + self.pattern_notes()
                                                  + self.library_notes())

    def library_notes(self) -> list[str]:
        """GEMM fusions a library runs with their epilogue (split_gemm.fusion_epilogue)."""
        notes = [f"%{d.producer}: {d.reason}" for d in self.decisions
                 if d.consumer == "-" and d.fused and d.action == "library-epilogue"]
        return ["", "library GEMMs with an epilogue:"] + notes if notes else []

    def pattern_notes(self) -> list[str]:
        """Pattern fusions (attention, normalization) tried at an instruction and not
        formed, with the reason: they belong to no single edge."""
        notes = {f"%{d.producer}: {d.reason}" for d in self.decisions
                 if d.consumer == "-" and not d.fused}
        return ["", "patterns not fused:"] + sorted(notes) if notes else []

    def edge_styles(self) -> dict:
        """For ``hlo.render.to_dot(unfused_module, edge_styles=...)``: green fused, red
        rejected by legality, grey not profitable or not considered."""
        from hlo.render import EdgeStyle
        styles = {}
        for d in self.final_edges():
            if d.fused:
                color = "#2e7d32"
            elif d.action == "none":
                color = "#9e9e9e"
            elif "profit" in d.reason or "benefit" in d.reason:
                color = "#f9a825"
            else:
                color = "#c62828"
            tip = (f"{d.producer} -> {d.consumer}: {'fused' if d.fused else 'not fused'}; "
                   f"{d.reason}")
            if d.unfused_us:
                tip += f" (unfused {d.unfused_us:.2f} us, fused {d.fused_us:.2f} us)"
            styles[(d.producer, d.consumer)] = EdgeStyle(color, tip, 2.5 if d.fused else 1.5)
        return styles

    def to_json(self) -> dict:
        """Plain data (the dump's ``fusion_report.json``); ``from_json`` reads it back."""
        from dataclasses import asdict
        out = {k: getattr(self, k) for k in ("target", "policy", "kernels_before",
                                              "kernels_after", "time_before_us", "time_after_us",
                                              "bytes_before", "bytes_after")}
        out["decisions"] = [asdict(d) for d in self.decisions]
        out["edges"] = [[p, c, fused] for (p, c), fused in self.edges.items()]
        return out

    @classmethod
    def from_json(cls, data: dict) -> "FusionReport":
        r = cls(**{k: v for k, v in data.items() if k not in ("decisions", "edges")})
        r.decisions = [FusionDecision(**d) for d in data.get("decisions", ())]
        r.edges = {(p, c): bool(f) for p, c, f in data.get("edges", ())}
        return r

    def html(self) -> str:
        """A section for the dump report."""
        import html as _h
        rows = "".join(
            f"<tr><td>{_h.escape(d.producer)}</td><td>{_h.escape(d.consumer)}</td>"
            f"<td>{'yes' if d.fused else 'no'}</td><td>{d.unfused_us:.2f}</td>"
            f"<td>{d.fused_us:.2f}</td><td>{_h.escape(d.reason)}</td></tr>"
            for d in self.final_edges())
        return (f"<h2>Fusion</h2><p>{_h.escape(self.summary())}</p>"
                "<table><tr><th>producer</th><th>consumer</th><th>fused</th>"
                "<th>unfused µs</th><th>fused µs</th><th>reason</th></tr>" + rows + "</table>")


_REPORTS: "weakref.WeakKeyDictionary[Module, FusionReport]" = weakref.WeakKeyDictionary()


def attach(module: Module, report: FusionReport) -> None:
    _REPORTS[module] = report


def report_for(module: Module) -> Optional[FusionReport]:
    """The report of the last fusion pass run on ``module`` (None if it never ran)."""
    return _REPORTS.get(module)


# The compile pipelines' simplification (passes/pipelines.py SIMPLIFY), so the fusion
# explained is the one compiled: without tuple-simplify a jnp.tril mask inlined from a call
# stays behind a tuple and no attention is matched.
EXPLAIN_PIPELINE = ("inline,fixpoint(simplify,tuple-simplify,control-flow-simplify,"
                    "constant-folding,cse,dce)")


def explain(module: Module, target: str = "h100", policy: object = "priority",
            prepare: str = EXPLAIN_PIPELINE, **options: object) -> tuple[Module, FusionReport]:
    """Simplify ``module`` (in place), then fuse a copy; returns (fused copy, report).
    The simplified, unfused module is what the report's names refer to. ``options``: more
    fields of the fusion pass (``library_dots``, ``split_gemms`` as the CUDA pipeline sets)."""
    from passes import run_pipeline
    from .pass_ import Fusion
    if prepare:
        run_pipeline(module, prepare)
    fused = module.clone()
    Fusion(policy=policy, target=target, **options).run(fused)  # type: ignore[arg-type]
    report = report_for(fused)
    assert report is not None
    return fused, report
