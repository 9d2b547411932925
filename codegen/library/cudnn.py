"""cuDNN convolutions through PyTorch: the ``convolution`` library call of target ``cuda``.

An HLO convolution runs as one ``torch.nn.functional.conv{1,2,3}d`` (or ``conv_transpose``)
on the runtime's strided logical views. The operands are permuted (views, no copy) into
torch's [N, C, spatial...] / [O, I, spatial...] order named by ``dim_labels``; the layouts
layout assignment picks for GPU convs (NHWC for 16-bit types, NCHW otherwise) then reach
cuDNN as channels-last or contiguous strides, its native formats.

What does not map one-to-one onto torch's arguments:
- asymmetric or negative padding: the negative part crops the input (a view), the
  positive excess over the symmetric part is written out as zeros around a copy of the
  input in its own layout;
- lhs (base) dilation, which XLA writes for the input gradient of strided convs: a
  ``conv_transpose`` (cuDNN's backward-data kernel) when the window maps onto one
  exactly, else zeros inserted between input elements and a plain conv;
- window reversal: the kernel flipped on those dims;
- batch_group_count (weight-gradient convs of grouped convs): the batch groups folded into
  feature groups, [G*Nb, C] -> [Nb, G*C] with ``groups=G``;
- no spatial dims: a 1-d conv over a length-1 axis;
- weight gradients (a window as large as the image, a kernel-sized output): cuDNN's
  backward-filter (``aten.convolution_backward``), as XLA:GPU's conv rewriter does.

Numerics follow XLA:GPU: f32 convs at DEFAULT precision may use TF32 tensor cores,
``operand_precision={highest,...}`` keeps full f32; bf16/f16 convs accumulate in f32 inside
cuDNN; a 16-bit conv with an f32 result (preferred_element_type) runs on operands upcast
to f32, where every 16-bit value and product is exact, so only the summation order differs.
Integer and complex convs are not taken (``supports`` says no); they run on the host.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

from hlo.attrs import WindowDim
from hlo.dtypes import by_name
from hlo.ir import Instruction

from . import register
from .cublas import _fp32_precision, _highest

_FLOATS = ("f16", "bf16", "f32", "f64")


@dataclass(frozen=True)
class ConvPlan:
    """How torch runs one HLO convolution (geometry per spatial dim, in spatial order)."""
    lhs_perm: tuple[int, ...]       # logical lhs dims -> [N, C, spatial...]
    rhs_perm: tuple[int, ...]       # logical rhs dims -> [O, I, spatial...]
    out_perm: tuple[int, ...]       # logical out dims -> [N, O, spatial...]
    nsp: int                        # spatial dims as given (0 runs as a 1-d conv)
    stride: tuple[int, ...]         # (stride .. rhs_dilation: one entry even when nsp is 0)
    pad: tuple[tuple[int, int], ...]
    lhs_dilation: tuple[int, ...]
    rhs_dilation: tuple[int, ...]
    reversed_dims: tuple[int, ...]  # spatial indices whose kernel is flipped
    groups: int                     # feature_group_count
    batch_groups: int               # batch_group_count
    compute: str                    # the dtype torch convolves in (f16 | bf16 | f32 | f64)
    tf32: bool
    # conv | transposed (lhs dilation as conv_transpose, see _transposed_fits) |
    # filter_grad (a weight gradient as cuDNN's backward-filter, see _filter_grad_fits)
    kind: str = "conv"

    @property
    def transposed(self) -> bool:
        return self.kind == "transposed"

    @property
    def name(self) -> str:
        what = {"transposed": "conv_transpose", "filter_grad": "conv_backward_filter"}.get(
            self.kind, "conv")
        extra = [f"g={self.groups}"] if self.groups > 1 else []
        extra += [f"bg={self.batch_groups}"] if self.batch_groups > 1 else []
        return f"cudnn.{what}{max(self.nsp, 1)}d {self.compute}" + \
            ("" if not extra else " " + " ".join(extra))


_PLANS: "weakref.WeakKeyDictionary[Instruction, ConvPlan]" = weakref.WeakKeyDictionary()


def _compute_dtype(lt: str, rt: str, ot: str) -> Optional[str]:
    """The dtype to convolve in, or None for types this call does not take."""
    if lt not in _FLOATS or rt not in _FLOATS or ot not in _FLOATS:
        return None
    if lt == rt == ot:
        return lt
    # Mixed or widened (preferred_element_type): the widest type, at least f32, so that
    # the result is rounded once, from the f32 (or f64) accumulator, as XLA does.
    return "f64" if "f64" in (lt, rt, ot) else "f32"


def plan(inst: Instruction) -> Optional[ConvPlan]:
    """How torch runs this convolution, or None when this call does not take it."""
    cached = _PLANS.get(inst)
    if cached is not None:
        return cached
    if inst.opcode != "convolution" or len(inst.operands) != 2 or inst.shape.is_tuple:
        return None
    lhs, rhs = inst.operands
    if lhs.shape.is_tuple or rhs.shape.is_tuple:
        return None
    a = inst.attrs
    dl = a.get("dim_labels")
    window = a.get("window")
    dims = window.dims if window is not None else ()
    if dl is None or len(dims) != len(dl.input_spatial) or len(dims) > 3:
        return None
    if any(d.size < 1 or d.stride < 1 or d.window_dilation < 1 or d.base_dilation < 1
           for d in dims):
        return None
    compute = _compute_dtype(lhs.shape.dtype.name, rhs.shape.dtype.name, inst.shape.dtype.name)
    fgc, bgc = int(a.get("feature_group_count", 1)), int(a.get("batch_group_count", 1))
    if compute is None or fgc < 1 or bgc < 1 or (fgc > 1 and bgc > 1):
        return None
    # No spatial dims: one of length 1 under a window of 1 (a dot, as a 1-d conv).
    geom = dims or (WindowDim(1),)
    p = ConvPlan(
        lhs_perm=(dl.input_batch, dl.input_feature, *dl.input_spatial),
        rhs_perm=(dl.kernel_output_feature, dl.kernel_input_feature, *dl.kernel_spatial),
        out_perm=(dl.output_batch, dl.output_feature, *dl.output_spatial),
        nsp=len(dims),
        stride=tuple(d.stride for d in geom),
        pad=tuple((d.padding_low, d.padding_high) for d in geom),
        lhs_dilation=tuple(d.base_dilation for d in geom),
        rhs_dilation=tuple(d.window_dilation for d in geom),
        reversed_dims=tuple(i for i, d in enumerate(dims) if d.window_reversal),
        groups=fgc, batch_groups=bgc, compute=compute,
        tf32=compute == "f32" and not _highest(inst))
    sizes = [d.size for d in geom]
    if _transposed_fits(p, sizes):
        p = _replace(p, kind="transposed")
    elif dims and _filter_grad_fits(p, sizes, [lhs.shape.dims[d] for d in dl.input_spatial],
                                    [inst.shape.dims[d] for d in dl.output_spatial]):
        p = _replace(p, kind="filter_grad")
    _PLANS[inst] = p
    return p


def _replace(p: ConvPlan, **kw: Any) -> ConvPlan:
    return dataclasses.replace(p, **kw)


def supports(inst: Instruction) -> bool:
    return plan(inst) is not None


# --- lhs dilation as a transposed conv ---------------------------------------------------------
# A conv over the input dilated by d (zeros between elements), padded (lo, hi), with window
# K dilated by r and stride 1 reads x[i] into output o = i*d + k*r - lo for kernel tap k.
# conv_transpose(stride=d, dilation=r, padding=p) writes x[i]*W[k'] to o = i*d + k'*r - p:
# the same sum with the kernel flipped (k' = K-1-k) and p = r*(K-1) - lo. Its length is
# ours plus (lo - hi) - output_padding, so output_padding = hi - lo when torch allows it
# (0 <= it < max(d, r)); when hi < lo the surplus lies past our end and is cropped.
def _transposed_fits(p: ConvPlan, sizes: Sequence[int]) -> bool:
    if not any(d > 1 for d in p.lhs_dilation) or any(s != 1 for s in p.stride):
        return False
    if p.batch_groups > 1:
        return False
    for (lo, hi), d, r, k in zip(p.pad, p.lhs_dilation, p.rhs_dilation, sizes):
        if r * (k - 1) - lo < 0 or hi - lo >= max(d, r):
            return False
    return True


def _conv_transpose(x: Any, w: Any, p: ConvPlan, out_sp: Sequence[int]) -> Any:
    import torch.nn.functional as F
    nsp = w.dim() - 2
    G = p.groups
    O, I = w.shape[:2]
    ks = w.shape[2:]
    w = w.flip(list(range(2, 2 + nsp)))
    # conv_transpose's weight is [C_in, O/G, k...]: group g's input channels g*I..(g+1)*I.
    wt = w.reshape(G, O // G, I, *ks).transpose(1, 2).reshape(G * I, O // G, *ks)
    pad = [r * (k - 1) - lo for (lo, _), r, k in zip(p.pad, p.rhs_dilation, ks)]
    opad = [max(hi - lo, 0) for lo, hi in p.pad]
    fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nsp - 1]
    y = fn(x, wt, stride=p.lhs_dilation, padding=pad, output_padding=opad, groups=G,
           dilation=p.rhs_dilation)
    if tuple(y.shape[2:]) != tuple(out_sp):
        y = y[(slice(None), slice(None)) + tuple(slice(0, n) for n in out_sp)]
    return y


# --- weight gradients as backward-filter ------------------------------------------------------
# The weight gradient of a conv reaches HLO as a conv whose window is the forward output
# (large) and whose output is the forward kernel (small): out[c, o, k] = sum over n and
# window w of X[c, n, k*stride + w*r] * DY[o, n, w]. That is torch's (cuDNN's) weight
# gradient dW[o, c, k] of a forward conv with stride r and dilation ``stride`` over input
# X^T and output gradient DY^T, which cuDNN runs far faster than a forward conv with a
# window of the whole image. Taken only where torch's size formula gives back the window.
def _filter_grad_fits(p: ConvPlan, sizes: Sequence[int], in_sp: Sequence[int],
                      out_sp: Sequence[int]) -> bool:
    if p.groups > 1 or p.batch_groups > 1 or p.reversed_dims or \
            any(d > 1 for d in p.lhs_dilation):
        return False
    if math.prod(sizes) <= math.prod(out_sp) or 0 in out_sp:
        return False
    for n, (lo, hi), w, s, r, k in zip(in_sp, p.pad, sizes, p.stride, p.rhs_dilation, out_sp):
        padded = n + lo + hi
        if padded - s * (k - 1) - 1 < 0 or (padded - s * (k - 1) - 1) // r + 1 != w:
            return False
    return True


def _filter_grad(x: Any, dy: Any, p: ConvPlan, out_sp: Sequence[int]) -> Any:
    import torch
    x, sym = _pad(x, p.pad)
    xt, dyt = x.transpose(0, 1), dy.transpose(0, 1)     # [n, c, sp], [n, o, window]
    weight = x.new_empty((dy.shape[0], x.shape[0], *out_sp))
    _, dw, _ = torch.ops.aten.convolution_backward(
        dyt, xt, weight, None, list(p.rhs_dilation), sym, list(p.stride), False,
        [0] * len(sym), 1, [False, True, False])
    return dw.transpose(0, 1)                           # [c, o, k]


# --- the general path -------------------------------------------------------------------------
def _zeros_like_layout(x: Any, shape: Sequence[int]) -> Any:
    """Zeros of ``shape`` with ``x``'s order of strides (channels-last stays channels-last,
    which cuDNN's fast 16-bit kernels want)."""
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    z = x.new_zeros([shape[d] for d in order])
    return z.permute(*sorted(range(x.dim()), key=lambda d: order[d]))


def _dilate(x: Any, lhs_dilation: Sequence[int]) -> Any:
    """Zeros inserted between input elements along each spatial dim (XLA's base dilation)."""
    if all(d == 1 for d in lhs_dilation):
        return x
    sp = x.shape[2:]
    big = [(n - 1) * d + 1 if n else 0 for n, d in zip(sp, lhs_dilation)]
    y = _zeros_like_layout(x, (*x.shape[:2], *big))
    y[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in lhs_dilation)] = x
    return y


def _pad(x: Any, pads: Sequence[tuple[int, int]]) -> tuple[Any, list[int]]:
    """``x`` cropped by the negative pads (a view) and padded by the positive ones beyond
    their symmetric part; returns it with the symmetric part, which torch pads itself."""
    crop = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(x.shape[2:], pads))
    x = x[(slice(None), slice(None)) + crop]
    sym = [min(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    before = [max(lo, 0) - s for (lo, _), s in zip(pads, sym)]
    after = [max(hi, 0) - s for (_, hi), s in zip(pads, sym)]
    if any(before) or any(after):
        # by hand, not F.pad: F.pad's result is contiguous whatever x's layout was
        sp = [n + b + a for n, b, a in zip(x.shape[2:], before, after)]
        y = _zeros_like_layout(x, (*x.shape[:2], *sp))
        y[(slice(None), slice(None)) + tuple(slice(b, b + n) for b, n in
                                             zip(before, x.shape[2:]))] = x
        x = y
    return x, sym


def _conv(x: Any, w: Any, p: ConvPlan) -> Any:
    import torch.nn.functional as F
    nsp = w.dim() - 2
    x = _dilate(x, p.lhs_dilation)
    x, sym = _pad(x, p.pad)
    groups = p.groups
    if p.batch_groups > 1:
        # Batch group g (input batch rows g*Nb..) meets output features g*O/G..: the same
        # pairing as feature groups once the batch groups sit side by side as channels.
        G = p.batch_groups
        N, C = x.shape[:2]
        x = x.reshape(G, N // G, C, *x.shape[2:]).transpose(0, 1).reshape(
            N // G, G * C, *x.shape[2:])
        groups = G
    fn = (F.conv1d, F.conv2d, F.conv3d)[nsp - 1]
    return fn(x, w, stride=p.stride, padding=sym, dilation=p.rhs_dilation, groups=groups)


@contextlib.contextmanager
def _conv_fp32_precision(tf32: bool) -> Iterator[None]:
    """TF32 on or off for cuDNN convs (``torch.backends.cudnn.conv``, read at each call,
    so a CUDA graph captures it) and for the GEMMs torch lowers some convs to (cuBLAS's
    switch, ``cublas._fp32_precision``)."""
    import torch
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is None or not hasattr(conv, "fp32_precision"):
        conv = torch.backends.cudnn               # torch before 2.9: the legacy switch
        old, want, attr = conv.allow_tf32, tf32, "allow_tf32"
    else:
        old, want, attr = conv.fp32_precision, "tf32" if tf32 else "ieee", "fp32_precision"
    with _fp32_precision(tf32):
        if old == want:
            yield
            return
        setattr(conv, attr, want)
        try:
            yield
        finally:
            setattr(conv, attr, old)


@register("cuda", "convolution")
def cudnn_convolution(inst: Instruction, operands: Sequence[Any],
                      out: Optional[Any] = None) -> Any:
    """``inst``'s convolution on torch tensors (logical dims, any strides) through cuDNN;
    writes ``out`` when given (a view of the arena) and returns the result (logical dims)."""
    import torch
    from runtime.cuda.arena import torch_dtype
    p = plan(inst)
    if p is None:
        raise ValueError(f"cudnn: convolution %{inst.name} is not one this call takes "
                         "(see supports)")
    lhs, rhs = operands
    cdt = torch_dtype(by_name(p.compute))
    x = lhs.permute(*p.lhs_perm).to(cdt)
    w = rhs.permute(*p.rhs_perm).to(cdt)
    if p.nsp == 0:
        x, w = x.unsqueeze(-1), w.unsqueeze(-1)
    if p.reversed_dims:
        w = w.flip([2 + i for i in p.reversed_dims])
    if out is None:
        out = torch.empty(tuple(inst.shape.dims), dtype=torch_dtype(inst.shape.dtype),
                          device=lhs.device)
    target = out.permute(*p.out_perm)
    if target.numel() == 0:
        return out
    if x.numel() == 0 or w.numel() == 0:     # nothing to sum over: XLA gives zeros
        target.zero_()
        return out
    with _conv_fp32_precision(p.tf32):
        if p.kind == "transposed":
            y = _conv_transpose(x, w, p, target.shape[2:])
        elif p.kind == "filter_grad":
            y = _filter_grad(x, w, p, target.shape[2:])
        else:
            y = _conv(x, w, p)
    if p.nsp == 0:
        y = y.squeeze(-1)
    target.copy_(y)
    return out


cudnn_convolution.supports = supports  # type: ignore[attr-defined]
cudnn_convolution.plan = plan          # type: ignore[attr-defined]
# Writes nothing but ``out``: the first run may call it once early, on a scratch output,
# to set up cuDNN while the Triton compiles run (runtime/cuda/library_warm.py).
cudnn_convolution.pure = True          # type: ignore[attr-defined]
