"""Fusion: legality, an analytical GPU cost model, pluggable policies, explained decisions.

- ``legality``: may these be one kernel? (every "no" has a reason)
- ``cost_model``: ``predict(instruction | fusion | module, target) -> Estimate``; device
  specs in ``devices.json``
- ``policy``: the ``FusionPolicy`` protocol; ``priority`` (default), ``greedy``, ``none``
- ``normalization``: softmax / layer norm as one Triton kernel; ``gemm``: dot fusions
- ``rewrite``: groups and the IR rewrite; ``explain``: the decision log
- ``kinds.fusion_kind(inst)``: loop | input | multi_output | normalization | gemm | custom
"""
from .cost_model import (DeviceSpec, Estimate, count_kernels, devices, get_device,  # noqa: F401
                         predict, register_device)
from .explain import FusionDecision, FusionReport, report_for  # noqa: F401
from .kinds import fusion_kind  # noqa: F401
from .legality import Decision  # noqa: F401
from .policy import Candidate, FusionPolicy, register_policy, resolve_policy  # noqa: F401
from .pass_ import Fusion  # noqa: F401
from .rewrite import FusionState, Group  # noqa: F401
