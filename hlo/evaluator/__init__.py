"""The reference interpreter: numpy, XLA's semantics, one rule per opcode in the op table.

Importing this package registers every rule (``OpDef.evaluate``).
"""
from .core import TOKEN, EvalContext, Evaluator, evaluate, to_value  # noqa: F401
from . import rules  # noqa: F401  (registers the rules)
from . import gpu_linalg_calls  # noqa: F401,E402  (cusolver_* / hipsolver_* custom calls)
