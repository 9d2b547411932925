"""Named pipelines: ``default`` is each backend's full pipeline, ``simplify`` and ``none``."""
from __future__ import annotations

from .base import PassError

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
        "cuda": f"inline,{SIMPLIFY},sink-gathers,layout-assignment{{target=gpu}},"
                f"fusion{{library_dots={CUDA_LIBRARY_DOTS}}},schedule",
    },
    "simplify": {"cpu": SIMPLIFY, "cuda": SIMPLIFY},
    "none": {"cpu": "", "cuda": ""},
}
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
