"""Triton kernels for fusions: ``compile_fusion(fusion_inst) -> TritonKernel``.

- ``elemental``: the value-at-index emitter (one source line per HLO instruction);
- ``templates``: loop/generic, row+column reduction and normalization, GEMM tilings;
- ``kernel``: source assembly, the on-disk cache (``codegen.cache``), loading, launching,
  autotuning with a persisted tuning table.
"""
from .elemental import TritonCodegenError  # noqa: F401
from .kernel import TritonKernel, compile_fusion, kernel_name  # noqa: F401
