"""custom-call: a registry of targets, and the ones JAX emits on the CPU.

``CUSTOM_CALLS[target] = fn(inst, operands, ctx) -> value``. A host may add its own through
``EvalContext.custom_calls`` (checked first). Unknown targets raise EvaluationError naming
the target.

JAX lowers linear algebra on the CPU to typed-FFI LAPACK calls (``lapack_spotrf_ffi`` ...)
whose attributes are an MLIR dictionary in ``backend_config`` (``{uplo = 76 : ui8}``: ASCII
codes of LAPACK's character flags). jaxlib gets its LAPACK from scipy, so calling the same
scipy LAPACK routines here gives the same bits, including the sign conventions of QR,
eigenvectors and singular vectors. Batch dimensions lead; the matrix is the last two dims.
Layouts ({0,1} column-major operands) are physical and do not change logical values.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from ..attrs import Raw
from ..errors import EvaluationError
from ..ir import Instruction
from ..ops import rule
from .core import EvalContext
from .reductions import stable_argsort, total_order_key

CustomCallFn = Callable[[Instruction, list, EvalContext], Any]
CUSTOM_CALLS: dict[str, CustomCallFn] = {}


def register(*targets: str) -> Callable[[CustomCallFn], CustomCallFn]:
    def deco(fn: CustomCallFn) -> CustomCallFn:
        for t in targets:
            CUSTOM_CALLS[t] = fn
        return fn
    return deco


@rule("evaluate", "custom-call")
def _custom_call(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    target = inst.attrs.get("custom_call_target")
    fn = ctx.custom_calls.get(target) or CUSTOM_CALLS.get(target)
    if fn is None:
        raise EvaluationError(f"custom-call target {target!r} is not known to the interpreter "
                              "(register it in hlo.evaluator.custom_calls.CUSTOM_CALLS or "
                              "EvalContext.custom_calls)")
    return fn(inst, operands, ctx)


# ---------------------------------------------------------------------------------------
# backend_config: MLIR dictionary attribute text
# ---------------------------------------------------------------------------------------
_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<punct>[{}\[\]<>=,:])|'
                    r'(?P<word>[^\s{}\[\]<>=,:"]+))')


def parse_mlir_dict(text: Any) -> dict[str, Any]:
    """Parse ``{mode = 86 : ui8, uplo = 76 : ui8, name = "x", flag = true}``.

    Integers (with or without ``: type``) become int, floats float, ``true``/``false``
    bool, strings str, ``[a, b]`` and ``array<i64: 1, 2>`` tuples; anything else is kept
    as its text. Empty text and ``""`` give ``{}``.
    """
    s = str(text.text if isinstance(text, Raw) else text or "").strip()
    if s.startswith('"') and s.endswith('"'):
        s = bytes(s[1:-1], "utf-8").decode("unicode_escape").strip()
    if not s:
        return {}
    toks: list[tuple[str, str]] = []
    pos = 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None or m.end() == pos:
            if s[pos:].strip() == "":
                break
            raise EvaluationError(f"cannot parse backend_config {s!r} at {pos}")
        kind = m.lastgroup or "word"
        toks.append((kind, m.group(kind)))
        pos = m.end()
    i = 0

    def peek() -> str:
        return toks[i][1] if i < len(toks) else ""

    def take(expected: str | None = None) -> str:
        nonlocal i
        if i >= len(toks):
            raise EvaluationError(f"backend_config {s!r} ends early")
        v = toks[i][1]
        if expected is not None and v != expected:
            raise EvaluationError(f"backend_config {s!r}: expected {expected!r}, got {v!r}")
        i += 1
        return v

    def scalar(word: str) -> Any:
        if word.startswith('"'):
            return bytes(word[1:-1], "utf-8").decode("unicode_escape")
        if word in ("true", "false"):
            return word == "true"
        try:
            return int(word, 0)
        except ValueError:
            pass
        try:
            return float(word)
        except ValueError:
            return word

    def value() -> Any:
        w = take()
        if w == "[":
            items = []
            while peek() != "]":
                items.append(value())
                if peek() == ",":
                    take(",")
            take("]")
            return tuple(items)
        if w == "{":
            nonlocal i
            i -= 1
            return dictionary()
        if w == "array" and peek() == "<":
            take("<")
            take()                      # element type
            items = []
            if peek() == ":":
                take(":")
                while peek() != ">":
                    items.append(scalar(take()))
                    if peek() == ",":
                        take(",")
            take(">")
            return tuple(items)
        v = scalar(w)
        if peek() == ":":               # ``86 : ui8`` - drop the type
            take(":")
            take()
        return v

    def dictionary() -> dict[str, Any]:
        take("{")
        out: dict[str, Any] = {}
        while peek() != "}":
            key = take()
            if key.startswith('"'):
                key = key[1:-1]
            if peek() == "=":
                take("=")
                out[key] = value()
            else:
                out[key] = True         # a unit attribute
            if peek() == ",":
                take(",")
        take("}")
        return out

    if peek() != "{":
        raise EvaluationError(f"backend_config {s!r} is not an MLIR dictionary")
    return dictionary()


def _flag(cfg: dict[str, Any], name: str, default: str) -> str:
    """A LAPACK character flag stored as its ASCII code (``uplo = 76`` is 'L')."""
    v = cfg.get(name, ord(default))
    return chr(v) if isinstance(v, int) else str(v)


def _config(inst: Instruction) -> dict[str, Any]:
    return parse_mlir_dict(inst.attrs.get("backend_config", ""))


# ---------------------------------------------------------------------------------------
# Identity targets (sharding annotations and placement on one device)
# ---------------------------------------------------------------------------------------
@register("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
          "annotate_device_placement", "MoveToHost", "MoveToDevice", "LayoutConstraint")
def _identity(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    if len(operands) == 1:
        x = operands[0]
        if isinstance(x, np.ndarray) and not inst.shape.is_tuple and x.shape != inst.shape.dims:
            raise EvaluationError(f"{inst.attrs.get('custom_call_target')}: operand shape "
                                  f"{x.shape} differs from result {inst.shape} (only one "
                                  "device is simulated: shard and full shapes must agree)")
        return x
    return tuple(operands)


@register("TopK")
def _topk_target(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
    x = operands[0]
    k = inst.shape.elements[0].dims[-1]
    perm = stable_argsort(total_order_key(x), descending=True)[..., :k]
    return (np.take_along_axis(x, perm, axis=-1),
            perm.astype(inst.shape.elements[1].dtype.np_dtype))


# ---------------------------------------------------------------------------------------
# LAPACK targets
# ---------------------------------------------------------------------------------------
def _lapack(prefix: str, name: str):
    from scipy.linalg import lapack
    return getattr(lapack, prefix + name)


def _batched(a: np.ndarray):
    """Yield (batch index, matrix) over all leading dims."""
    for idx in np.ndindex(*a.shape[:-2]):
        yield idx, a[idx]


def _out_shapes(inst: Instruction):
    return list(inst.shape.elements) if inst.shape.is_tuple else [inst.shape]


def _alloc(inst: Instruction) -> list[np.ndarray]:
    return [np.zeros(s.dims, s.dtype.np_dtype) for s in _out_shapes(inst)]


def _potrf(prefix: str) -> CustomCallFn:
    def fn(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
        lower = _flag(_config(inst), "uplo", "L") == "L"
        factor, info = _alloc(inst)
        for idx, m in _batched(operands[0]):
            # clean=0: LAPACK leaves the other triangle as it was (the buffer aliases a).
            c, inf = _lapack(prefix, "potrf")(m, lower=lower, clean=0)
            factor[idx] = c
            info[idx] = inf
        return factor, info
    return fn


def _getrf(prefix: str) -> CustomCallFn:
    def fn(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
        lu, piv, info = _alloc(inst)
        for idx, m in _batched(operands[0]):
            r, p, inf = _lapack(prefix, "getrf")(m)
            lu[idx] = r
            piv[idx] = p + 1             # scipy returns 0-based; LAPACK's are 1-based
            info[idx] = inf
        return lu, piv, info
    return fn


def _geqrf(prefix: str) -> CustomCallFn:
    def fn(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
        qr, tau = _alloc(inst)[:2]
        for idx, m in _batched(operands[0]):
            r, t, _, _ = _lapack(prefix, "geqrf")(m)
            qr[idx] = r
            tau[idx] = t
        return qr, tau
    return fn


def _orgqr(prefix: str, name: str) -> CustomCallFn:
    def fn(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
        (q,) = _alloc(inst)
        a, tau = operands
        for idx, m in _batched(a):
            if tau.shape[-1] == 0:
                q[idx] = np.eye(*m.shape, dtype=q.dtype)
                continue
            r, _, _ = _lapack(prefix, name)(m, tau[idx])
            q[idx] = r
        return q
    return fn


def _syevd(prefix: str, name: str) -> CustomCallFn:
    def fn(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
        cfg = _config(inst)
        vectors = _flag(cfg, "mode", "V") == "V"
        lower = _flag(cfg, "uplo", "L") == "L"
        v_out, w_out, info = _alloc(inst)
        for idx, m in _batched(operands[0]):
            w, v, inf = _lapack(prefix, name)(m, compute_v=int(vectors), lower=int(lower))
            w_out[idx] = w
            v_out[idx] = v if vectors else m
            info[idx] = inf
        return v_out, w_out, info
    return fn


def _gesdd(prefix: str) -> CustomCallFn:
    def fn(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
        mode = _flag(_config(inst), "mode", "A")
        a_out, s_out, u_out, vt_out, info = _alloc(inst)
        for idx, m in _batched(operands[0]):
            if mode == "N":
                _, s, _, inf = _lapack(prefix, "gesdd")(m, compute_uv=0)
            else:
                u, s, vt, inf = _lapack(prefix, "gesdd")(m, compute_uv=1,
                                                          full_matrices=int(mode == "A"))
                u_out[idx] = u
                vt_out[idx] = vt
            a_out[idx] = m                  # LAPACK overwrites a; its content is unspecified
            s_out[idx] = s
            info[idx] = inf
        return a_out, s_out, u_out, vt_out, info
    return fn


def _trsm(prefix: str) -> CustomCallFn:
    def fn(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
        from scipy.linalg import blas
        cfg = _config(inst)
        if len(operands) == 3:
            alpha, a, b = operands
            alpha = np.asarray(alpha).item()
        else:
            (a, b), alpha = operands, 1.0
        side = 0 if _flag(cfg, "side", "L") == "L" else 1
        lower = int(_flag(cfg, "uplo", "L") == "L")
        trans = {"N": 0, "T": 1, "C": 2}[_flag(cfg, "trans_x", "N")]
        diag = int(_flag(cfg, "diag", "N") == "U")
        (x,) = _alloc(inst)
        for idx in np.ndindex(*b.shape[:-2]):
            x[idx] = getattr(blas, prefix + "trsm")(alpha, a[idx], b[idx], side=side,
                                                    lower=lower, trans_a=trans, diag=diag)
        return x
    return fn


def _unpack_real_eigvecs(v: np.ndarray, wi: np.ndarray, cdt) -> np.ndarray:
    """LAPACK packs a complex pair's vectors as (re, im) columns; unpack to complex."""
    out = v.astype(cdt)
    j = 0
    n = len(wi)
    while j < n:
        if wi[j] != 0 and j + 1 < n:
            re, im = v[:, j], v[:, j + 1]
            out[:, j] = re + 1j * im
            out[:, j + 1] = re - 1j * im
            j += 2
        else:
            j += 1
    return out


def _geev(prefix: str) -> CustomCallFn:
    def fn(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
        cfg = _config(inst)
        left = _flag(cfg, "compute_left", "N") == "V"
        right = _flag(cfg, "compute_right", "V") == "V"
        outs = _alloc(inst)
        real = prefix in "sd"
        for idx, m in _batched(operands[0]):
            res = _lapack(prefix, "geev")(m, compute_vl=int(left), compute_vr=int(right))
            if real:
                wr, wi, vl, vr, inf = res
                outs[0][idx], outs[1][idx] = wr, wi
                cdt = outs[2].dtype
                if left:
                    outs[2][idx] = _unpack_real_eigvecs(vl, wi, cdt)
                if right:
                    outs[3][idx] = _unpack_real_eigvecs(vr, wi, cdt)
                outs[4][idx] = inf
            else:
                w, vl, vr, inf = res
                outs[0][idx] = w
                if left:
                    outs[1][idx] = vl
                if right:
                    outs[2][idx] = vr
                outs[3][idx] = inf
        return tuple(outs)
    return fn


for _p in "sdcz":
    register(f"lapack_{_p}potrf_ffi")(_potrf(_p))
    register(f"lapack_{_p}getrf_ffi")(_getrf(_p))
    register(f"lapack_{_p}geqrf_ffi")(_geqrf(_p))
    register(f"lapack_{_p}gesdd_ffi")(_gesdd(_p))
    register(f"lapack_{_p}trsm_ffi")(_trsm(_p))
    register(f"lapack_{_p}geev_ffi")(_geev(_p))
for _p in "sd":
    register(f"lapack_{_p}orgqr_ffi")(_orgqr(_p, "orgqr"))
    register(f"lapack_{_p}syevd_ffi")(_syevd(_p, "syevd"))
for _p in "cz":
    register(f"lapack_{_p}ungqr_ffi")(_orgqr(_p, "ungqr"))
    register(f"lapack_{_p}heevd_ffi")(_syevd(_p, "heevd"))
