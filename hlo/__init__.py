"""hlo: the IR, its text format, import from JAX/StableHLO, verification and evaluation.

Public API (see README):
    parse_hlo(text) -> Module            module.to_text() / str(module)
    from_jax(fn, *args) -> Module        from_exported(exp), from_stablehlo(text_or_bytes)
    verify(module)                       evaluate(module, args)
    Builder, Module, Computation, Instruction, Shape, TupleShape, Layout, dtypes
Errors: HlotkError, ParseError, VerifierError, ImportError (hlo.ImportError), ShapeError.
"""
from __future__ import annotations

from . import dtypes  # noqa: F401
from .attrs import (ConvDimLabels, FrontendAttributes, IotaReplicaGroups, Metadata,  # noqa: F401
                    PaddingConfig, PadDim, Raw, ReplicaGroups, SliceDim, SliceSpec, Window,
                    WindowDim)
from .builder import Builder, infer_shape  # noqa: F401
from .dtypes import DType  # noqa: F401
from .errors import (EvaluationError, HlotkError, HloImportError, InvalidArgumentError,  # noqa: F401
                     ParseError, ShapeError, UnimplementedError, VerifierError)
from .errors import HloImportError as ImportError  # noqa: A001  (hlo.ImportError, by design)
from .ir import Computation, Instruction, IRError, Module  # noqa: F401
from .limits import ResourceLimitError, resource_limits  # noqa: F401
from .ops import OPS, OpDef, get_op  # noqa: F401
from .shape import AnyShape, Layout, Shape, TupleShape, array, scalar, token, tuple_shape  # noqa: F401
from . import shape_inference  # noqa: F401  (registers OpDef.infer)
from .text.parser import parse_hlo, parse_shape  # noqa: F401
from .verifier import verify  # noqa: F401
from . import layout_verify  # noqa: F401  (registers the bitcast verify rule)


def evaluate(module, args, **options):
    """Run ``module``'s entry on numpy arguments with the reference interpreter."""
    from .evaluator import evaluate as _evaluate
    return _evaluate(module, args, **options)


def __getattr__(name: str):
    # JAX/MLIR imports are heavy: load the importer only when asked for.
    if name in ("from_jax", "from_exported", "from_stablehlo"):
        from .stablehlo import importer
        return getattr(importer, name)
    if name == "render":
        from .render import render
        return render
    raise AttributeError(f"module 'hlo' has no attribute {name!r}")
