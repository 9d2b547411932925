"""Named pipelines. ``default`` grows as passes land (layout, fusion, scheduling ...)."""
from __future__ import annotations

from .base import PassError

SIMPLIFY = "fixpoint(simplify,tuple-simplify,control-flow-simplify,constant-folding,cse,dce)"

PIPELINES: dict[str, dict[str, str]] = {
    # backend -> spec of its full pipeline
    "default": {
        "cpu": f"inline,{SIMPLIFY},layout-assignment{{target=cpu}},schedule",
        "cuda": f"inline,{SIMPLIFY},layout-assignment{{target=gpu}},schedule",
    },
    "simplify": {"cpu": SIMPLIFY, "cuda": SIMPLIFY},
    "none": {"cpu": "", "cuda": ""},
}


def pipeline_spec(name_or_spec: str, backend: str = "cpu") -> str:
    """The spec for a named pipeline on ``backend``, or the spec itself if not a name."""
    table = PIPELINES.get(name_or_spec)
    if table is None:
        return name_or_spec
    try:
        return table[backend]
    except KeyError:
        raise PassError(f"pipeline {name_or_spec!r} has no variant for backend {backend!r}; "
                        f"known: {', '.join(table)}") from None
