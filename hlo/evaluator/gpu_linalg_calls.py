"""The linear-algebra custom calls JAX emits when it lowers for an NVIDIA (``cu``) or AMD
(``hip``) GPU, evaluated on the host with LAPACK (scipy), as the ``lapack_*_ffi`` ones are.

The conventions are those of JAX's GPU lowering rules (``jax/_src/lax/linalg.py``, target
prefix ``cu``/``hip``): the element type is not in the name, attributes are an MLIR
dictionary in ``backend_config``, and every value is read here in its logical (row-major)
shape whatever layout the call asked for:

==============================  ===================  ===========================================
target                          attributes           operands -> results
==============================  ===================  ===========================================
``cusolver_potrf_ffi``          ``lower``            a -> (factor, info); the other triangle
                                                     keeps a's values
``cusolver_getrf_ffi``          (none)               a -> (lu, pivots 1-based s32, info)
``cu_lu_pivots_to_permutation`` (none)               pivots 0-based -> permutation (its length
                                                     is the result's last dimension)
``cusolver_geqrf_ffi``          (none)               a -> (a with R and reflectors, tau)
``cusolver_orgqr_ffi``          (none)               (a, tau) -> q
``cusolver_syevd_ffi``          ``lower``,           a -> (eigenvectors, eigenvalues ascending,
                                ``algorithm``        info); algorithm 0/1/2 = default/QR/Jacobi
``cusolver_gesvdj_ffi``,        ``full_matrices``,   a -> (a, s, u, v, info): V itself, not
``cusolver_gesvdp_ffi``         ``compute_uv``       V^H; u is m x m (k when economical), v n x n
``cusolver_gesvd_ffi``,         + ``transposed``     a -> (a, s, u, vt, info); transposed (m < n):
``cusolver_gesdd_ffi``                               (a, s, vt, u, info)
``cusolver_sytrd_ffi``          ``lower``            a -> (a, d, e, tau, info)
==============================  ===================  ===========================================

``info`` is 0 where the factorization succeeded (LAPACK's value otherwise). XLA's own GPU
calls in compiled HLO (``__cusolver$cholesky``, ``__cublas$triangularSolve``) are not here:
they appear only after XLA's GPU passes, not in what JAX exports.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import EvaluationError
from ..ir import Instruction
from .core import EvalContext
from .custom_calls import _alloc, _batched, _config, _lapack, register

_PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d",
           np.dtype(np.complex64): "c", np.dtype(np.complex128): "z"}
GPU_PLATFORMS = ("cu", "hip")


def _prefix(inst: Instruction, a: np.ndarray) -> str:
    p = _PREFIX.get(np.dtype(a.dtype))
    if p is None:
        raise EvaluationError(f"{inst.attrs.get('custom_call_target')}: element type "
                              f"{a.dtype} is not one of f32, f64, c64, c128")
    return p


def _bool(cfg: dict[str, Any], name: str, default: bool) -> bool:
    v = cfg.get(name, default)
    return bool(v) if not isinstance(v, str) else v.lower() == "true"


def _potrf(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
    a = operands[0]
    lower = _bool(_config(inst), "lower", True)
    factor, info = _alloc(inst)
    potrf = _lapack(_prefix(inst, a), "potrf")
    for idx, m in _batched(a):
        c, inf = potrf(m, lower=lower, clean=0)
        factor[idx] = c
        info[idx] = inf
    return factor, info


def _getrf(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
    a = operands[0]
    lu, piv, info = _alloc(inst)
    getrf = _lapack(_prefix(inst, a), "getrf")
    for idx, m in _batched(a):
        r, p, inf = getrf(m)
        lu[idx] = r
        piv[idx] = p + 1             # cuSOLVER's pivots are 1-based, as LAPACK's
        info[idx] = inf
    return lu, piv, info


def _pivots_to_permutation(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
    pivots = np.asarray(operands[0])
    size = inst.shape.dims[-1]
    perm = np.broadcast_to(np.arange(size, dtype=inst.shape.dtype.np_dtype),
                           inst.shape.dims).copy()
    for idx in np.ndindex(*pivots.shape[:-1]):
        row = perm[idx]
        for i, p in enumerate(pivots[idx]):
            if not 0 <= p < size:    # the GPU kernel ignores a swap that leaves the vector
                continue
            row[i], row[p] = row[p], row[i]
    return perm


def _geqrf(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
    a = operands[0]
    qr, tau = _alloc(inst)[:2]
    geqrf = _lapack(_prefix(inst, a), "geqrf")
    for idx, m in _batched(a):
        r, t, _, _ = geqrf(m)
        qr[idx] = r
        tau[idx] = t
    return qr, tau


def _orgqr(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
    a, tau = operands
    p = _prefix(inst, a)
    orgqr = _lapack(p, "orgqr" if p in "sd" else "ungqr")
    (q,) = _alloc(inst)
    for idx, m in _batched(a):
        if tau.shape[-1] == 0:
            q[idx] = np.eye(*m.shape, dtype=q.dtype)
            continue
        r, _, _ = orgqr(m, tau[idx])
        q[idx] = r
    return q


def _syevd(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
    a = operands[0]
    cfg = _config(inst)
    lower = _bool(cfg, "lower", True)
    p = _prefix(inst, a)
    evd = _lapack(p, "syevd" if p in "sd" else "heevd")
    v_out, w_out, info = _alloc(inst)
    for idx, m in _batched(a):
        # QR and Jacobi (algorithm 1, 2) give the same decomposition up to rounding and
        # each eigenvector's sign, which no caller may depend on.
        w, v, inf = evd(m, compute_v=1, lower=int(lower))
        w_out[idx] = w
        v_out[idx] = v
        info[idx] = inf
    return v_out, w_out, info


def _svd(returns_v: bool):
    def fn(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
        a = operands[0]
        cfg = _config(inst)
        compute_uv = _bool(cfg, "compute_uv", True)
        transposed = _bool(cfg, "transposed", False)
        outs = _alloc(inst)
        a_out, s_out, third, fourth, info = outs
        gesdd = _lapack(_prefix(inst, a), "gesdd")
        for idx, m in _batched(a):
            a_out[idx] = m               # the solver overwrites a; its content is unspecified
            if not compute_uv:
                _, s, _, inf = gesdd(m, compute_uv=0)
                s_out[idx], info[idx] = s, inf
                continue
            # The result shapes say full or economical: u is rows x rows, V is cols x cols.
            rows, cols = m.shape
            u_like, v_like = (fourth, third) if transposed and not returns_v else (third, fourth)
            v_cols = v_like.shape[-1] if returns_v else v_like.shape[-2]
            full = u_like.shape[-1] == rows and v_cols == cols
            u, s, vt, inf = gesdd(m, compute_uv=1, full_matrices=int(full))
            s_out[idx], info[idx] = s, inf
            if returns_v:
                third[idx], fourth[idx] = u, vt.conj().T
            elif transposed:
                third[idx], fourth[idx] = vt, u
            else:
                third[idx], fourth[idx] = u, vt
        return tuple(outs)
    return fn


def _sytrd(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
    a = operands[0]
    lower = _bool(_config(inst), "lower", True)
    p = _prefix(inst, a)
    trd = _lapack(p, "sytrd" if p in "sd" else "hetrd")
    a_out, d_out, e_out, tau_out, info = _alloc(inst)
    for idx, m in _batched(a):
        c, d, e, tau, inf = trd(m, lower=int(lower))
        a_out[idx], d_out[idx], e_out[idx], tau_out[idx], info[idx] = c, d, e, tau, inf
    return a_out, d_out, e_out, tau_out, info


for _platform in GPU_PLATFORMS:
    register(f"{_platform}solver_potrf_ffi")(_potrf)
    register(f"{_platform}solver_getrf_ffi")(_getrf)
    register(f"{_platform}_lu_pivots_to_permutation")(_pivots_to_permutation)
    register(f"{_platform}solver_geqrf_ffi")(_geqrf)
    register(f"{_platform}solver_orgqr_ffi")(_orgqr)
    register(f"{_platform}solver_syevd_ffi")(_syevd)
    register(f"{_platform}solver_gesvdj_ffi", f"{_platform}solver_gesvdp_ffi")(_svd(True))
    register(f"{_platform}solver_gesvd_ffi", f"{_platform}solver_gesdd_ffi")(_svd(False))
    register(f"{_platform}solver_sytrd_ffi")(_sytrd)
