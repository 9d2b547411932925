"""cuBLAS GEMMs through PyTorch: the ``dot`` library call of target ``cuda``.

A dot the fusion pass left unfused runs as one ``torch.mm`` / ``torch.bmm`` (or
``torch._int_mm`` for int8 x int8 -> s32) writing straight into its output's arena view
(``out=``). Operands are the runtime's strided logical views, so a transposed operand (a
layout, or contracting dims that are not the minor ones) reaches cuBLAS as a transposed
stride pattern, not as a copy, whenever its dims group into [batch, rows, cols].

The HLO dot is first put in the canonical [B, M, K] x [B, K, N] -> [B, M, N] form: lhs dims
permuted to (batch, free, contracting), rhs to (batch, contracting, free), each group
flattened (a view when the strides allow, else torch copies).

Numerics follow XLA:GPU: f32 dots at DEFAULT precision use TF32 tensor cores (XLA's
default on Ampere and later), ``operand_precision={highest,...}`` keeps full f32;
bf16/f16 dots accumulate in f32; a bf16 x bf16 -> f32 dot (preferred_element_type) keeps the
f32 result (``out_dtype``); int8 x int8 -> s32 (``torch._int_mm``, opt-in: see ``plan``) is
exact (wrapping, as XLA). Dots cuBLAS
cannot take (other integer types, int8 shapes ``_int_mm`` refuses) are not supported here:
the runtime generates a Triton GEMM for them instead.
"""
from __future__ import annotations

import contextlib
import math
import os
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

from hlo.dots import dot_dims
from hlo.ir import Instruction

from . import register

_FLOATS = ("f16", "bf16", "f32", "f64", "c64", "c128")


@dataclass
class DotPlan:
    lhs_perm: tuple[int, ...]
    rhs_perm: tuple[int, ...]
    B: int
    M: int
    K: int
    N: int
    mode: str          # mm | out_dtype | upcast | int_mm
    tf32: bool         # f32 dot at DEFAULT precision: TF32 allowed, as XLA:GPU does

    @property
    def name(self) -> str:
        fn = {"int_mm": "_int_mm", "out_dtype": "mm(out_dtype)", "upcast": "mm(upcast)"}.get(
            self.mode, "bmm" if self.B > 1 else "mm")
        return f"cublas.{fn} [{self.B}x]{self.M}x{self.K}x{self.N}" if self.B > 1 else \
            f"cublas.{fn} {self.M}x{self.K}x{self.N}"


_PLANS: "weakref.WeakKeyDictionary[Instruction, DotPlan]" = weakref.WeakKeyDictionary()


def _highest(inst: Instruction) -> bool:
    return any(str(p).lower() == "highest" for p in inst.attrs.get("operand_precision") or ())


def plan(inst: Instruction) -> Optional[DotPlan]:
    """How cuBLAS runs this dot, or None when it cannot."""
    cached = _PLANS.get(inst)
    if cached is not None:
        return cached
    if inst.opcode != "dot" or len(inst.operands) != 2:
        return None
    lhs, rhs = inst.operands
    lt, rt, ot = lhs.shape.dtype.name, rhs.shape.dtype.name, inst.shape.dtype.name
    lb, rb, lc, rc, lf, rf = dot_dims(inst)
    ld, rd = lhs.shape.dims, rhs.shape.dims
    B = math.prod(ld[d] for d in lb)
    M = math.prod(ld[d] for d in lf)
    K = math.prod(ld[d] for d in lc)
    N = math.prod(rd[d] for d in rf)
    if lt == rt == "s8" and ot == "s32":
        # torch._int_mm: 2-D, more than 16 rows, K and N multiples of 8. Off by default:
        # measured 128 TOPS on the H200 for 8192^3 (XLA: ~790), so the runtime's Triton
        # int8 GEMM (tl.dot on s8, s32 accumulator) takes int8 dots; HLOTK_INT8_CUBLAS=1
        # turns this path back on.
        if os.environ.get("HLOTK_INT8_CUBLAS", "0") in ("", "0") or \
                B != 1 or M <= 16 or K % 8 or N % 8 or K == 0:
            return None
        mode = "int_mm"
    elif lt in _FLOATS and rt in _FLOATS and ot in _FLOATS:
        if lt == rt == ot:
            mode = "mm"
        elif lt == rt and lt in ("bf16", "f16") and ot == "f32":
            mode = "out_dtype"
        else:
            mode = "upcast"
    else:
        return None
    p = DotPlan(tuple(lb + lf + lc), tuple(rb + rc + rf), B, M, K, N, mode,
                tf32=(ot == "f32" or "f32" in (lt, rt)) and not _highest(inst))
    _PLANS[inst] = p
    return p


def supports(inst: Instruction) -> bool:
    return plan(inst) is not None


@contextlib.contextmanager
def _fp32_precision(tf32: bool) -> Iterator[None]:
    """TF32 on or off for the calls inside (read by cuBLAS at each call, so this is also
    what a CUDA graph captures)."""
    import torch
    old = torch.get_float32_matmul_precision()
    want = "high" if tf32 else "highest"
    if old == want:
        yield
        return
    torch.set_float32_matmul_precision(want)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def _as_bmk(t: Any, perm: Sequence[int], shape: tuple[int, int, int]) -> Any:
    return t.permute(*perm).reshape(shape)


def _out_view(out: Any, B: int, M: int, N: int) -> Optional[Any]:
    try:
        return out.view(B, M, N)
    except RuntimeError:    # strides that do not group into [B, M, N]
        return None


@register("cuda", "dot")
def cublas_dot(inst: Instruction, operands: Sequence[Any], out: Optional[Any] = None) -> Any:
    """``inst``'s dot on torch tensors (logical dims, any strides) through cuBLAS; writes
    ``out`` when given (a view of the arena) and returns the result."""
    import torch
    p = plan(inst)
    if p is None:
        raise ValueError(f"cublas: dot %{inst.name} is not a dot cuBLAS takes (see supports)")
    lhs, rhs = operands
    a = _as_bmk(lhs, p.lhs_perm, (p.B, p.M, p.K))
    b = _as_bmk(rhs, p.rhs_perm, (p.B, p.K, p.N))
    from runtime.cuda.arena import torch_dtype
    odt = torch_dtype(inst.shape.dtype)
    if out is None:
        out = torch.empty(tuple(inst.shape.dims), dtype=odt, device=lhs.device)
    o3 = _out_view(out, p.B, p.M, p.N)
    direct = o3 is not None and (p.mode != "int_mm" or o3.is_contiguous())
    target = o3 if direct else torch.empty((p.B, p.M, p.N), dtype=odt, device=lhs.device)
    with _fp32_precision(p.tf32):
        _run(p, a, b, target)
    if not direct:
        out.copy_(target.view(out.shape))
    return out


def _run(p: DotPlan, a: Any, b: Any, o: Any) -> None:
    import torch
    mode = p.mode
    if mode == "int_mm":
        try:
            torch._int_mm(a[0], b[0], out=o[0])
            return
        except RuntimeError:
            # A shape or layout this torch build's _int_mm refuses: exact in f64 (|sums| <
            # 2**53 for any K < 2**38), wrapped to 32 bits as XLA's s32 result.
            p.mode = "int_mm_f64"
            mode = p.mode
    if mode == "int_mm_f64":
        o.copy_(torch.bmm(a.double(), b.double()).to(torch.int64).to(torch.int32))
        return
    if mode == "out_dtype":
        try:
            if p.B == 1:
                torch.mm(a[0], b[0], out_dtype=o.dtype, out=o[0])
            else:
                torch.bmm(a, b, out_dtype=o.dtype, out=o)
            return
        except (RuntimeError, TypeError, NotImplementedError):
            p.mode = mode = "upcast"     # this torch has no out_dtype matmul here
    if mode == "upcast":
        ct = torch.promote_types(torch.promote_types(a.dtype, b.dtype), o.dtype)
        if ct in (torch.bfloat16, torch.float16):
            ct = torch.float32
        res = torch.bmm(a.to(ct), b.to(ct))
        o.copy_(res)
        return
    if p.B == 1:
        torch.mm(a[0], b[0], out=o[0])
    else:
        torch.bmm(a, b, out=o)


cublas_dot.supports = supports  # type: ignore[attr-defined]
cublas_dot.plan = plan          # type: ignore[attr-defined]
# Writes nothing but ``out`` (runtime/cuda/library_warm.py may call it early on a scratch
# output; a mode it falls back from, ``DotPlan.mode``, is the launch's fallback too).
cublas_dot.pure = True          # type: ignore[attr-defined]


# --- GEMM + bias + activation in one cuBLASLt call -----------------------------------------
_ZERO_BIAS: dict[tuple, Any] = {}


def epilogue_supports(inst: Instruction) -> bool:
    """A 2-D product (after flattening) of one float type: what cuBLASLt's epilogues take
    through ``torch.addmm`` / ``torch._addmm_activation``."""
    p = plan(inst)
    return p is not None and p.mode == "mm" and p.B == 1 and \
        inst.shape.dtype.name in ("bf16", "f16", "f32")


def _zero_bias(n: int, dtype: Any, device: Any) -> Any:
    """A zero bias of n elements (the epilogues with an activation add one), made once per
    (n, type, device) on its first (eager) call, so captured graphs read one fixed buffer."""
    import torch
    key = (n, dtype, str(device))
    t = _ZERO_BIAS.get(key)
    if t is None:
        t = _ZERO_BIAS[key] = torch.zeros(n, dtype=dtype, device=device)
    return t


def _residual_gemm(a: Any, b: Any, addend: Any, target: Any, m: int, n: int) -> None:
    """``target = a @ b + addend`` as one cuBLAS GEMM with beta = 1. When buffer assignment
    gave the result the residual's buffer (the same bytes; LibraryThunk then passes that
    view as the output, ``in_place_operand``), the GEMM reads and writes C in place
    (``addmm_``); otherwise torch copies the residual into the result first."""
    import torch
    c = addend.reshape(m, n) if addend.is_contiguous() else addend.contiguous().view(m, n)
    if c.data_ptr() == target.data_ptr() and c.stride() == target.stride():
        c.addmm_(a, b)
    else:
        torch.addmm(c, a, b, out=target)


def cublas_epilogue_call(epilogue: Any) -> Any:
    """The library call for a dot with ``epilogue`` (a ``LibraryEpilogue``:
    passes/fusion/gemm_epilogue.py): ``call(inst, [lhs, rhs(, bias or residual)], out=)``."""

    def call(inst: Instruction, operands: Sequence[Any], out: Optional[Any] = None) -> Any:
        import torch
        p = plan(inst)
        if p is None or not epilogue_supports(inst):
            raise ValueError(f"cublas: dot %{inst.name} is not a 2-D float GEMM for a "
                             "cuBLASLt epilogue (see epilogue_supports)")
        lhs, rhs = operands[0], operands[1]
        a = _as_bmk(lhs, p.lhs_perm, (1, p.M, p.K))[0]
        b = _as_bmk(rhs, p.rhs_perm, (1, p.K, p.N))[0]
        from runtime.cuda.arena import torch_dtype
        odt = torch_dtype(inst.shape.dtype)
        if out is None:
            out = torch.empty(tuple(inst.shape.dims), dtype=odt, device=lhs.device)
        o3 = _out_view(out, 1, p.M, p.N)
        target = o3[0] if o3 is not None else torch.empty((p.M, p.N), dtype=odt,
                                                          device=lhs.device)
        if epilogue.addend is not None:
            with _fp32_precision(p.tf32):
                _residual_gemm(a, b, operands[2], target, p.M, p.N)
            if o3 is None:
                out.copy_(target.view(out.shape))
            return out
        bias = operands[2].contiguous() if len(operands) > 2 else \
            _zero_bias(p.N, odt, lhs.device)
        with _fp32_precision(p.tf32):
            # torch runs these on CUDA tensors as cuBLASLt's BIAS / RELU_BIAS / GELU_BIAS
            # epilogues; where cuBLASLt cannot (a layout it refuses) it runs the GEMM, then
            # its own ReLU or tanh-form GELU: the same function. (On CPU tensors torch's
            # use_gelu is the erf form: this call is for CUDA tensors only.)
            if epilogue.activation == "none":
                torch.addmm(bias, a, b, out=target)
            else:
                torch._addmm_activation(bias, a, b, use_gelu=epilogue.activation == "gelu_tanh",
                                        out=target)
        if o3 is None:
            out.copy_(target.view(out.shape))
        return out

    call.supports = epilogue_supports      # type: ignore[attr-defined]
    call.plan = plan                       # type: ignore[attr-defined]
    call.label_suffix = f" + {epilogue.label} epilogue"  # type: ignore[attr-defined]
    # The residual is read at the index each output element is written: in place is safe.
    call.in_place_operand = 2 if epilogue.addend is not None else None  # type: ignore[attr-defined]
    call.pure = True                       # type: ignore[attr-defined]  (writes only out)
    call.__name__ = "cublas_epilogue"
    return call
