"""dot, ragged-dot, convolution, fft, cholesky, triangular-solve."""
from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..errors import ShapeError
from ..shape import AnyShape, Shape
from ._common import array_operand, arity, attr, check_dims_in_range, infer, ints, \
    window_output_size


def result_dtype(op: str, a: dt.DType, b: dt.DType) -> dt.DType:
    """Same type, or the wider of two types of one kind (XLA: ignoring FP precision).

    A declared result type different from this is XLA's preferred_element_type, which the
    verifier accepts for dot-like ops."""
    if a == b:
        return a
    if a.kind == b.kind or (a.is_integer and b.is_integer):
        return a if a.bits >= b.bits else b
    raise ShapeError(f"{op}: lhs type {a} and rhs type {b} are not compatible")


def _dot_dims(op: str, lhs: Shape, rhs: Shape, attrs: dict[str, Any]):
    lb = ints(op, attrs, "lhs_batch_dims")
    rb = ints(op, attrs, "rhs_batch_dims")
    lc = ints(op, attrs, "lhs_contracting_dims")
    rc = ints(op, attrs, "rhs_contracting_dims")
    check_dims_in_range(op, lb + lc, lhs.rank, "lhs batch/contracting dim")
    check_dims_in_range(op, rb + rc, rhs.rank, "rhs batch/contracting dim")
    if len(lb) != len(rb):
        raise ShapeError(f"{op}: lhs_batch_dims {lb} and rhs_batch_dims {rb} differ in length")
    if len(lc) != len(rc):
        raise ShapeError(f"{op}: lhs_contracting_dims {lc} and rhs_contracting_dims {rc} "
                         "differ in length")
    for a, b in zip(lb, rb):
        if lhs.dims[a] != rhs.dims[b]:
            raise ShapeError(f"{op}: lhs batch dim {a} has size {lhs.dims[a]} but rhs batch "
                             f"dim {b} has size {rhs.dims[b]}")
    for a, b in zip(lc, rc):
        if lhs.dims[a] != rhs.dims[b]:
            raise ShapeError(f"{op}: lhs contracting dim {a} has size {lhs.dims[a]} but rhs "
                             f"contracting dim {b} has size {rhs.dims[b]}")
    return lb, rb, lc, rc


@infer("dot")
def infer_dot(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("dot", shapes, 2)
    lhs = array_operand("dot", shapes[0], "lhs")
    rhs = array_operand("dot", shapes[1], "rhs")
    lb, rb, lc, rc = _dot_dims("dot", lhs, rhs, attrs)
    batch = [lhs.dims[d] for d in lb]
    lfree = [n for i, n in enumerate(lhs.dims) if i not in lb and i not in lc]
    rfree = [n for i, n in enumerate(rhs.dims) if i not in rb and i not in rc]
    return Shape(result_dtype("dot", lhs.dtype, rhs.dtype), tuple(batch + lfree + rfree))


@infer("ragged-dot")
def infer_ragged_dot(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    """Three modes, by where lhs's ragged dimension is: a free (non-contracting) dim (rhs
    has a group dim, dropped from the result), a contracting dim (the result gains a
    leading group dim), or a batch dim (a plain dot)."""
    op = "ragged-dot"
    arity(op, shapes, 3)
    lhs = array_operand(op, shapes[0], "lhs")
    rhs = array_operand(op, shapes[1], "rhs")
    gs = array_operand(op, shapes[2], "group_sizes")
    ragged = ints(op, attrs, "lhs_ragged_dims")
    group = ints(op, attrs, "rhs_group_dims")
    if len(ragged) != 1:
        raise ShapeError(f"{op}: needs exactly one lhs_ragged_dims entry, got {ragged}")
    check_dims_in_range(op, ragged, lhs.rank, "lhs ragged dim")
    check_dims_in_range(op, group, rhs.rank, "rhs group dim")
    lb, rb, lc, rc = _dot_dims(op, lhs, rhs, attrs)
    if set(group) & set(rb + rc):
        raise ShapeError(f"{op}: rhs group dim {group} is also a batch or contracting dim")
    if not gs.dtype.is_integer or gs.rank < 1:
        raise ShapeError(f"{op}: group_sizes must be an integer array, got {gs}")
    r = ragged[0]
    g = gs.dims[-1]
    batch = [lhs.dims[d] for d in lb]
    lfree = [n for i, n in enumerate(lhs.dims) if i not in lb and i not in lc]
    rfree = [n for i, n in enumerate(rhs.dims) if i not in rb and i not in rc and i not in group]
    dtype = result_dtype(op, lhs.dtype, rhs.dtype)
    if r in lc:
        if group:
            raise ShapeError(f"{op}: ragged contracting mode takes no rhs_group_dims")
        return Shape(dtype, tuple([g] + batch + lfree + rfree))
    if r in lb:
        if group:
            raise ShapeError(f"{op}: ragged batch mode takes no rhs_group_dims")
        return Shape(dtype, tuple(batch + lfree + rfree))
    if len(group) != 1:
        raise ShapeError(f"{op}: ragged non-contracting mode needs one rhs_group_dims entry, "
                         f"got {group}")
    if rhs.dims[group[0]] != g:
        raise ShapeError(f"{op}: rhs group dim {group[0]} has size {rhs.dims[group[0]]} but "
                         f"group_sizes has {g} groups")
    return Shape(dtype, tuple(batch + lfree + rfree))


@infer("convolution")
def infer_convolution(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    op = "convolution"
    arity(op, shapes, 2)
    lhs = array_operand(op, shapes[0], "lhs")
    rhs = array_operand(op, shapes[1], "rhs")
    dn = attr(op, attrs, "dim_labels")
    fgc = attr(op, attrs, "feature_group_count", 1)
    bgc = attr(op, attrs, "batch_group_count", 1)
    nsp = len(dn.input_spatial)
    if not (lhs.rank == rhs.rank == nsp + 2):
        raise ShapeError(f"{op}: dim_labels {dn} need rank {nsp + 2} operands, got lhs "
                         f"{lhs.to_text(False)} and rhs {rhs.to_text(False)}")
    window = attrs.get("window")
    wdims = window.dims if window is not None else ()
    if len(wdims) != nsp:
        raise ShapeError(f"{op}: window has {len(wdims)} dimensions, dim_labels have {nsp} "
                         "spatial dimensions")
    if fgc < 1 or bgc < 1:
        raise ShapeError(f"{op}: feature_group_count {fgc} and batch_group_count {bgc} "
                         "must be positive")
    if fgc > 1 and bgc > 1:
        raise ShapeError(f"{op}: feature_group_count and batch_group_count cannot both "
                         "exceed 1")
    in_batch = lhs.dims[dn.input_batch]
    in_feat = lhs.dims[dn.input_feature]
    k_in = rhs.dims[dn.kernel_input_feature]
    k_out = rhs.dims[dn.kernel_output_feature]
    if in_feat % fgc or in_feat // fgc != k_in:
        raise ShapeError(f"{op}: input feature dimension ({in_feat}) divided by "
                         f"feature_group_count ({fgc}) must equal the kernel input feature "
                         f"dimension ({k_in})")
    if k_out % fgc:
        raise ShapeError(f"{op}: kernel output features ({k_out}) must be a multiple of "
                         f"feature_group_count ({fgc})")
    if in_batch % bgc or k_out % bgc:
        raise ShapeError(f"{op}: input batch ({in_batch}) and kernel output features "
                         f"({k_out}) must be multiples of batch_group_count ({bgc})")
    out = [0] * lhs.rank
    out[dn.output_batch] = in_batch // bgc
    out[dn.output_feature] = k_out
    for i, wd in enumerate(wdims):
        ks = rhs.dims[dn.kernel_spatial[i]]
        if wd.size != ks:
            raise ShapeError(f"{op}: window size {wd.size} in spatial dim {i} differs from "
                             f"the kernel's spatial size {ks}")
        out[dn.output_spatial[i]] = window_output_size(op, lhs.dims[dn.input_spatial[i]], wd, i)
    return Shape(result_dtype(op, lhs.dtype, rhs.dtype), tuple(out))


@infer("fft")
def infer_fft(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("fft", shapes, 1)
    x = array_operand("fft", shapes[0])
    kind = str(attr("fft", attrs, "fft_type")).upper()
    length = ints("fft", attrs, "fft_length", None)
    n = len(length)
    if not 1 <= n <= 3 or x.rank < n:
        raise ShapeError(f"fft: fft_length {length} needs 1 to 3 entries and an operand of "
                         f"at least that rank, operand is {x.to_text(False)}")
    tail = x.dims[x.rank - n:]
    if kind in ("FFT", "IFFT"):
        if not x.dtype.is_complex:
            raise ShapeError(f"fft: {kind} needs a complex operand, got {x.dtype}")
        if tail != length:
            raise ShapeError(f"fft: {kind} operand's last dims {list(tail)} must equal "
                             f"fft_length {list(length)}")
        return x.without_layout()
    if kind == "RFFT":
        if x.dtype not in (dt.F32, dt.F64):
            raise ShapeError(f"fft: RFFT needs an f32 or f64 operand, got {x.dtype}")
        if tail != length:
            raise ShapeError(f"fft: RFFT operand's last dims {list(tail)} must equal "
                             f"fft_length {list(length)}")
        out = x.dims[:-1] + (length[-1] // 2 + 1,)
        return Shape(dt.C64 if x.dtype == dt.F32 else dt.C128, out)
    if kind == "IRFFT":
        if not x.dtype.is_complex:
            raise ShapeError(f"fft: IRFFT needs a complex operand, got {x.dtype}")
        want = length[:-1] + (length[-1] // 2 + 1,)
        if tail != want:
            raise ShapeError(f"fft: IRFFT operand's last dims {list(tail)} must be "
                             f"{list(want)} for fft_length {list(length)}")
        return Shape(x.dtype.component, x.dims[:x.rank - n] + length)
    raise ShapeError(f"fft: unknown fft_type {kind}; expected FFT, IFFT, RFFT or IRFFT")


def _square_matrices(op: str, a: Shape, what: str) -> None:
    if a.rank < 2 or a.dims[-1] != a.dims[-2]:
        raise ShapeError(f"{op}: {what} must be a batch of square matrices, got "
                         f"{a.to_text(False)}")
    if not (a.dtype.is_float or a.dtype.is_complex):
        raise ShapeError(f"{op}: {what} must be floating point or complex, got {a.dtype}")


@infer("cholesky")
def infer_cholesky(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("cholesky", shapes, 1)
    a = array_operand("cholesky", shapes[0])
    _square_matrices("cholesky", a, "operand")
    return a.without_layout()


@infer("triangular-solve")
def infer_triangular_solve(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    op = "triangular-solve"
    arity(op, shapes, 2)
    a = array_operand(op, shapes[0], "a")
    b = array_operand(op, shapes[1], "b")
    _square_matrices(op, a, "a")
    if b.dtype != a.dtype or b.rank != a.rank or b.dims[:-2] != a.dims[:-2]:
        raise ShapeError(f"{op}: b {b.to_text(False)} must match a {a.to_text(False)} in "
                         "type, rank and batch dimensions")
    left = bool(attrs.get("left_side", False))
    k = b.dims[-2] if left else b.dims[-1]
    if k != a.dims[-1]:
        side = "rows" if left else "columns"
        raise ShapeError(f"{op}: with left_side={str(left).lower()} b's {side} ({k}) must "
                         f"equal a's size ({a.dims[-1]})")
    return b.without_layout()
