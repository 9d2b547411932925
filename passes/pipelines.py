"""Named pipelines: ``default`` is each backend's full pipeline, ``simplify`` and ``none``;
and each backend's mandatory lowering, run after whatever pipeline was chosen."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .base import PassError

if TYPE_CHECKING:
    from hlo.ir import Module

    from .pipeline import PassRecord

SIMPLIFY = "fixpoint(simplify,tuple-simplify,control-flow-simplify,constant-folding,cse,dce)"

CUDA_LIBRARY_DOTS = "f32+f64+c64+c128"

PIPELINES: dict[str, dict[str, str]] = {
    # backend -> spec of its full pipeline
    # The CPU backend fuses with the GPU cost model too (its kernels are numpy functions, so
    # the decisions are the ones a GPU would get, runnable and testable without one); the
    # target spec is chosen with runtime.jit(target=...) / hlotk compile --target.
    "default": {
        "cpu": f"inline,{SIMPLIFY},sink-gathers,layout-assignment{{target=cpu}},fusion,schedule",
        # f32/f64/complex dots are cuBLAS calls on the GPU (Triton's TF32 GEMM measured at a
        # fraction of cuBLAS's rate on the H200, benchmarks/NOTES.md), so they fuse with
        # nothing and their neighbours fuse with each other, as after XLA's gemm rewriter.
        # GEMM fusions the Triton template cannot tile run as prologue kernels + cuBLAS +
        # an epilogue (runtime/cuda/split.py); split_gemms prices them that way, so cheap
        # producers (layer norms, bf16 casts of weights) are computed once, not per GEMM.
        # Reductions to a few values (a loss summed to a scalar) become a row reduction +
        # a small one (split-reductions): the row template gets rows to spread.
        # Not in it: dot-merger (q, k, v projections as one GEMM over their weights
        # concatenated). Measured on the H200 it does not pay yet: torch.mm's cuBLAS
        # heuristic runs the merged 8192x1024x3072 GEMM in 72.6 us (XLA's autotuned one
        # 65.3), the concatenate takes 6.1 us and a memset + gaps ~5 us come with the
        # GEMM: the transformer's kernel span went 406 -> 412 us (benchmarks/NOTES.md,
        # i14-qkv). ``with_dot_merger`` gives a spec with it.
        "cuda": f"inline,{SIMPLIFY},sink-gathers,layout-assignment{{target=gpu}},"
                f"split-reductions,fusion{{library_dots={CUDA_LIBRARY_DOTS},split_gemms=true}},schedule",
    },
    "simplify": {"cpu": SIMPLIFY, "cuda": SIMPLIFY},
    "none": {"cpu": "", "cuda": ""},
}


def with_dot_merger(spec: str) -> str:
    """``spec`` (a default pipeline) with ``dot-merger`` after its simplification, before
    layout assignment lays out the slices it leaves."""
    if "dot-merger" in spec:
        return spec
    head = f"inline,{SIMPLIFY},"
    if not spec.startswith(head):
        raise PassError(f"with_dot_merger expects a spec starting with {head!r}")
    return head + "dot-merger," + spec[len(head):]


# Backends that compile like another one (the reference-interpreter backend runs what the
# CPU backend would).
BACKEND_ALIASES = {"interpreter": "cpu"}


def pipeline_spec(name_or_spec: str, backend: str = "cpu") -> str:
    """The spec for a named pipeline on ``backend``, or the spec itself if not a name."""
    table = PIPELINES.get(name_or_spec)
    if table is None:
        return name_or_spec
    try:
        return table[BACKEND_ALIASES.get(backend, backend)]
    except KeyError:
        raise PassError(f"pipeline {name_or_spec!r} has no variant for backend {backend!r}; "
                        f"known: {', '.join(table)}") from None


# --- mandatory lowering ------------------------------------------------------------------
# What a backend's executor needs for a correct answer, run after any pipeline spec (XLA's
# backends run their own lowering passes whatever optimization pipeline was chosen).
# ``schedule`` is flatten-call-graph (two call sites of one loop body must not share its
# state buffers), copy insertion (loop state, branch and call results, entry outputs own
# their buffers) and a schedule; buffer assignment over one arena needs all three. The
# interpreter evaluates the graph as it is and needs nothing.
MANDATORY_LOWERING: dict[str, str] = {"cpu": "schedule", "cuda": "schedule", "interpreter": ""}
_SCHEDULERS = ("schedule", "latency-hiding-scheduler")


def mandatory_lowering(backend: str, records: Sequence[PassRecord] = ()) -> str:
    """The spec of the passes ``backend`` still needs after a pipeline that left ``records``.

    A pipeline whose last change was its own scheduler (``schedule{algorithm=dfs}``, the
    latency-hiding scheduler) keeps that schedule; anything else is scheduled again.
    """
    spec = MANDATORY_LOWERING.get(backend, "")
    if spec == "schedule":
        last = next((k for k in range(len(records) - 1, -1, -1)
                     if records[k].name.split("{")[0] in _SCHEDULERS), None)
        if last is not None and not any(r.changed for r in records[last + 1:]):
            return ""
    return spec


def run_mandatory_lowering(module: Module, backend: str, records: Sequence[PassRecord] = (),
                           verify: bool = False) -> list[PassRecord]:
    """Run what ``mandatory_lowering`` says, in place; its records say ``mandatory=True``."""
    from .pipeline import run_pipeline
    spec = mandatory_lowering(backend, records)
    if not spec:
        return []
    ran = run_pipeline(module, spec, verify=verify)
    for k, r in enumerate(ran):
        r.mandatory = True
        r.index = len(records) + k
    return ran
