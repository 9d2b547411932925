"""HLO element types: names as XLA prints them, their numpy dtypes and MLIR spellings.

numpy has no bf16, f8 or sub-byte ints; ``ml_dtypes`` supplies them. ``token`` has no
numpy dtype (it carries ordering, not data).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .errors import HlotkError


@dataclass(frozen=True)
class DType:
    name: str          # XLA spelling: f32, bf16, s8, pred, ...
    kind: str          # 'pred' | 'sint' | 'uint' | 'float' | 'complex' | 'token' | 'opaque'
    bits: int          # storage width in bits (0 for token/opaque)
    np_dtype: Any      # numpy dtype, or None for token/opaque
    mlir: str          # MLIR element type spelling: f32, bf16, i8, ui8, i1, complex<f32>

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_complex(self) -> bool:
        return self.kind == "complex"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("sint", "uint")

    @property
    def is_signed(self) -> bool:
        return self.kind in ("sint", "float", "complex")

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "uint"

    @property
    def is_pred(self) -> bool:
        return self.kind == "pred"

    @property
    def is_array_type(self) -> bool:
        return self.kind not in ("token", "opaque")

    @property
    def itemsize(self) -> int:
        """Bytes one element occupies in a dense (unpacked) buffer."""
        return max(1, (self.bits + 7) // 8) if self.bits else 0

    @property
    def component(self) -> "DType":
        """For complex types, the type of the real/imaginary part; else itself."""
        if self.name == "c64":
            return F32
        if self.name == "c128":
            return F64
        return self


def _d(name, kind, bits, np_dtype, mlir):
    return DType(name, kind, bits, np.dtype(np_dtype) if np_dtype is not None else None, mlir)


PRED = _d("pred", "pred", 8, np.bool_, "i1")
S2 = _d("s2", "sint", 2, ml_dtypes.int2, "i2")
S4 = _d("s4", "sint", 4, ml_dtypes.int4, "i4")
S8 = _d("s8", "sint", 8, np.int8, "i8")
S16 = _d("s16", "sint", 16, np.int16, "i16")
S32 = _d("s32", "sint", 32, np.int32, "i32")
S64 = _d("s64", "sint", 64, np.int64, "i64")
U2 = _d("u2", "uint", 2, ml_dtypes.uint2, "ui2")
U4 = _d("u4", "uint", 4, ml_dtypes.uint4, "ui4")
U8 = _d("u8", "uint", 8, np.uint8, "ui8")
U16 = _d("u16", "uint", 16, np.uint16, "ui16")
U32 = _d("u32", "uint", 32, np.uint32, "ui32")
U64 = _d("u64", "uint", 64, np.uint64, "ui64")
F16 = _d("f16", "float", 16, np.float16, "f16")
BF16 = _d("bf16", "float", 16, ml_dtypes.bfloat16, "bf16")
F32 = _d("f32", "float", 32, np.float32, "f32")
F64 = _d("f64", "float", 64, np.float64, "f64")
F8E5M2 = _d("f8e5m2", "float", 8, ml_dtypes.float8_e5m2, "f8E5M2")
F8E4M3FN = _d("f8e4m3fn", "float", 8, ml_dtypes.float8_e4m3fn, "f8E4M3FN")
F8E4M3B11FNUZ = _d("f8e4m3b11fnuz", "float", 8, ml_dtypes.float8_e4m3b11fnuz, "f8E4M3B11FNUZ")
F8E5M2FNUZ = _d("f8e5m2fnuz", "float", 8, ml_dtypes.float8_e5m2fnuz, "f8E5M2FNUZ")
F8E4M3FNUZ = _d("f8e4m3fnuz", "float", 8, ml_dtypes.float8_e4m3fnuz, "f8E4M3FNUZ")
C64 = _d("c64", "complex", 64, np.complex64, "complex<f32>")
C128 = _d("c128", "complex", 128, np.complex128, "complex<f64>")
TOKEN = DType("token", "token", 0, None, "!stablehlo.token")
OPAQUE = DType("opaque", "opaque", 0, None, "opaque")

_ALL = [PRED, S2, S4, S8, S16, S32, S64, U2, U4, U8, U16, U32, U64, F16, BF16, F32, F64,
        F8E5M2, F8E4M3FN, F8E4M3B11FNUZ, F8E5M2FNUZ, F8E4M3FNUZ, C64, C128, TOKEN, OPAQUE]

# Newer float formats exist only in recent ml_dtypes; register them when present.
for _name, _attr, _mlir in [("f8e4m3", "float8_e4m3", "f8E4M3"),
                            ("f8e3m4", "float8_e3m4", "f8E3M4"),
                            ("f8e8m0fnu", "float8_e8m0fnu", "f8E8M0FNU"),
                            ("f4e2m1fn", "float4_e2m1fn", "f4E2M1FN"),
                            ("f6e2m3fn", "float6_e2m3fn", "f6E2M3FN"),
                            ("f6e3m2fn", "float6_e3m2fn", "f6E3M2FN")]:
    if hasattr(ml_dtypes, _attr):
        _bits = 4 if _name.startswith("f4") else 6 if _name.startswith("f6") else 8
        _ALL.append(_d(_name, "float", _bits, getattr(ml_dtypes, _attr), _mlir))

BY_NAME: dict[str, DType] = {d.name: d for d in _ALL}
BY_MLIR: dict[str, DType] = {d.mlir: d for d in _ALL}
BY_MLIR["i1"] = PRED
_BY_NP: dict[np.dtype, DType] = {}
for _dt in _ALL:
    if _dt.np_dtype is not None:
        _BY_NP.setdefault(_dt.np_dtype, _dt)


class DTypeError(HlotkError):
    pass


def by_name(name: str) -> DType:
    try:
        return BY_NAME[name]
    except KeyError:
        raise DTypeError(f"unknown element type {name!r}; known: {', '.join(BY_NAME)}") from None


def from_mlir(name: str) -> DType:
    try:
        return BY_MLIR[name]
    except KeyError:
        raise DTypeError(f"unsupported MLIR element type {name!r}") from None


def from_numpy(dtype: Any) -> DType:
    """The HLO type of a numpy dtype (or anything ``np.dtype`` accepts)."""
    nd = np.dtype(dtype)
    try:
        return _BY_NP[nd]
    except KeyError:
        raise DTypeError(f"numpy dtype {nd} has no HLO element type") from None


def all_dtypes() -> list[DType]:
    return list(_ALL)
