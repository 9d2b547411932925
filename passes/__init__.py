"""passes: HLO -> HLO rewrites and analyses, with XLA's ``run(module) -> bool`` contract."""
from .base import PASSES, Pass, PassError, make_pass, register_pass  # noqa: F401
from .pipeline import (FixedPoint, PassContext, PassRecord, Pipeline, parse_pipeline,  # noqa: F401
                       run_pipeline)
from . import registry  # noqa: F401
