"""The GPU linear-algebra custom calls JAX emits (``cusolver_potrf_ffi`` ...) on the device
with ``torch.linalg`` (cuSOLVER / MAGMA underneath), instead of a host round trip.

The conventions (operands, results, attributes) are the interpreter's, documented in
``hlo/evaluator/gpu_linalg_calls.py``; every value is a logical (row-major) view here too.
Where cuSOLVER's result has more than torch's (the triangle potrf leaves alone), the torch
result is completed to the same values the interpreter gives.

These thunks are not captured in CUDA graphs: ``torch.linalg.eigh`` and ``svd`` check their
``info`` on the host. Targets not here (``sytrd``) keep the host fallback.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from hlo.evaluator.custom_calls import parse_mlir_dict
from hlo.ir import Instruction

from .torch_ops import Fn, Leaves, TorchOpThunk

_PLATFORMS = ("cu", "hip")


def _config(inst: Instruction) -> dict[str, Any]:
    return parse_mlir_dict(inst.attrs.get("backend_config", ""))


def _flag(inst: Instruction, name: str, default: bool) -> bool:
    v = _config(inst).get(name, default)
    return bool(v) if not isinstance(v, str) else v.lower() == "true"


def _info(a: Any) -> Any:
    import torch
    return torch.zeros(a.shape[:-2], dtype=torch.int32, device=a.device)


def _potrf(inst: Instruction) -> Fn:
    import torch
    lower = _flag(inst, "lower", True)

    def fn(a: Any) -> tuple:
        factor, info = torch.linalg.cholesky_ex(a, upper=not lower)
        # cuSOLVER leaves the other triangle as it was (the result aliases the operand).
        keep = torch.ones(a.shape[-2:], dtype=torch.bool, device=a.device)
        keep = torch.tril(keep) if lower else torch.triu(keep)
        return torch.where(keep, factor, a), info.to(torch.int32)
    return fn


def _getrf(inst: Instruction) -> Fn:
    import torch

    def fn(a: Any) -> tuple:
        lu, pivots, info = torch.linalg.lu_factor_ex(a)
        return lu, pivots.to(torch.int32), info.to(torch.int32)   # pivots 1-based, as cuSOLVER
    return fn


def _pivots_to_permutation(inst: Instruction) -> Fn:
    import torch
    size = inst.shape.dims[-1]

    def fn(pivots: Any) -> Any:
        batch = pivots.shape[:-1]
        perm = torch.arange(size, dtype=torch.int32, device=pivots.device).expand(
            *batch, size).clone()
        for i in range(pivots.shape[-1]):     # k swaps, in order; each is a few index ops
            p = pivots[..., i:i + 1].long().clamp(0, size - 1)
            inside = (pivots[..., i:i + 1] >= 0) & (pivots[..., i:i + 1] < size)
            at_i = perm[..., i:i + 1].clone()
            at_p = torch.gather(perm, -1, p)
            perm[..., i:i + 1] = torch.where(inside, at_p, at_i)
            perm.scatter_(-1, p, torch.where(inside, at_i, at_p))
        return perm
    return fn


def _geqrf(inst: Instruction) -> Fn:
    import torch
    return lambda a: tuple(torch.geqrf(a))


def _orgqr(inst: Instruction) -> Fn:
    import torch
    return lambda a, tau: torch.linalg.householder_product(a, tau)


def _syevd(inst: Instruction) -> Fn:
    import torch
    uplo = "L" if _flag(inst, "lower", True) else "U"

    def fn(a: Any) -> tuple:
        w, v = torch.linalg.eigh(a, UPLO=uplo)
        return v, w, _info(a)
    return fn


def _svd(returns_v: bool) -> Callable[[Instruction], Fn]:
    def build(inst: Instruction) -> Fn:
        import torch
        compute_uv = _flag(inst, "compute_uv", True)
        transposed = _flag(inst, "transposed", False)
        shapes = [e.dims for e in inst.shape.elements]

        def fn(a: Any) -> tuple:
            rows, cols = a.shape[-2:]
            third = torch.zeros(shapes[2], dtype=a.dtype, device=a.device)
            fourth = torch.zeros(shapes[3], dtype=a.dtype, device=a.device)
            if not compute_uv:
                return a, torch.linalg.svdvals(a), third, fourth, _info(a)
            u_like, v_like = (shapes[3], shapes[2]) if transposed and not returns_v \
                else (shapes[2], shapes[3])
            v_cols = v_like[-1] if returns_v else v_like[-2]
            full = u_like[-1] == rows and v_cols == cols
            u, s, vh = torch.linalg.svd(a, full_matrices=full)
            if returns_v:
                return a, s, u, vh.mH, _info(a)
            if transposed:
                return a, s, vh, u, _info(a)
            return a, s, u, vh, _info(a)
        return fn
    return build


BUILDERS: dict[str, Callable[[Instruction], Fn]] = {}
for _p in _PLATFORMS:
    BUILDERS.update({
        f"{_p}solver_potrf_ffi": _potrf, f"{_p}solver_getrf_ffi": _getrf,
        f"{_p}_lu_pivots_to_permutation": _pivots_to_permutation,
        f"{_p}solver_geqrf_ffi": _geqrf, f"{_p}solver_orgqr_ffi": _orgqr,
        f"{_p}solver_syevd_ffi": _syevd,
        f"{_p}solver_gesvdj_ffi": _svd(True), f"{_p}solver_gesvdp_ffi": _svd(True),
        f"{_p}solver_gesvd_ffi": _svd(False), f"{_p}solver_gesdd_ffi": _svd(False),
    })
_SOLVER_TYPES = {"f32", "f64", "c64", "c128"}


def linalg_call_fn(inst: Instruction) -> Optional[Fn]:
    """The torch function for a GPU linear-algebra custom call, or None."""
    build = BUILDERS.get(str(inst.attrs.get("custom_call_target", "")))
    if build is None or not inst.operands:
        return None
    if inst.operands[0].shape.is_tuple or inst.operands[0].shape.dtype.name not in _SOLVER_TYPES:
        if not str(inst.attrs["custom_call_target"]).endswith("pivots_to_permutation"):
            return None
    return build(inst)


class LinalgCallThunk(TorchOpThunk):
    kind = "torch-linalg"
    capturable = False     # eigh / svd read info on the host


def linalg_call_thunk(inst: Instruction, leaves: Leaves) -> Optional[LinalgCallThunk]:
    fn = linalg_call_fn(inst)
    if fn is None:
        return None
    out_leaves = leaves(inst)
    outputs = [out_leaves.get((k,)) for k in range(len(inst.shape.elements))] \
        if inst.shape.is_tuple else [out_leaves.get(())]
    inputs = [leaves(o).get(()) for o in inst.operands]
    if None in outputs or None in inputs:
        return None
    return LinalgCallThunk(inst, fn, inputs, outputs)
