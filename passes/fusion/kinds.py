"""What kind of kernel a fusion instruction is, in one word.

XLA prints a ``kind`` (kLoop, kInput, kOutput, kCustom); codegen and drawing want a finer
answer: a multi-output loop/input fusion has a tuple root, a kCustom fusion says what it
is in its ``backend_config`` (``"kind":"__triton"`` for normalization,
``"kind":"__triton_gemm"`` for GEMM fusions, ``"kind":"__flash_attention"`` for attention).
"""
from __future__ import annotations

from typing import Literal

from hlo.ir import Instruction

FusionKind = Literal["loop", "input", "multi_output", "normalization", "gemm", "attention",
                     "attention_backward", "custom"]

TRITON_NORMALIZATION = '{"fusion_backend_config":{"kind":"__triton"}}'
TRITON_GEMM = '{"fusion_backend_config":{"kind":"__triton_gemm"}}'
FLASH_ATTENTION_CONFIG = '{"fusion_backend_config":{"kind":"__flash_attention"}}'


def backend_kind(inst: Instruction) -> str:
    """The ``fusion_backend_config.kind`` string of a kCustom fusion ('' if none)."""
    cfg = inst.attrs.get("backend_config")
    text = getattr(cfg, "text", cfg) or ""
    if '"__flash_attention"' in text:
        return "__flash_attention"
    if '"__flash_attention_backward"' in text:
        return "__flash_attention_backward"
    if '"__triton_gemm"' in text:
        return "__triton_gemm"
    if '"__triton"' in text:
        return "__triton"
    return ""


def fusion_kind(inst: Instruction) -> FusionKind:
    """loop | input | multi_output | normalization | gemm | attention | custom."""
    if inst.opcode != "fusion":
        raise ValueError(f"%{inst.name} is a {inst.opcode}, not a fusion")
    kind = str(inst.attrs.get("kind", "kLoop"))
    if kind == "kCustom":
        b = backend_kind(inst)
        if b == "__triton_gemm":
            return "gemm"
        if b == "__triton":
            return "normalization"
        if b == "__flash_attention":
            return "attention"
        if b == "__flash_attention_backward":
            return "attention_backward"
        return "custom"
    root = inst.attrs["calls"].root
    if root is not None and root.opcode == "tuple":
        return "multi_output"
    return "input" if kind == "kInput" else "loop"
