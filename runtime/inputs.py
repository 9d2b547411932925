"""Loading a program file in any accepted format, and making seeded random inputs for it."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

import hlo
from hlo.errors import HlotkError, InvalidArgumentError
from hlo.shape import AnyShape, Shape

_HLO_SUFFIXES = (".hlo", ".txt")


class InputFileError(HlotkError):
    """A file given on the command line is missing or unreadable."""


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputFileError(f"{path}: is a directory, expected a file") from None
    except OSError as e:
        raise InputFileError(f"{path}: cannot read: {e.strerror}") from None


def load_module(path: str) -> hlo.Module:
    """An ``hlo.Module`` from HLO text (``.hlo``/``.txt``), ``.mlir`` (text or bytecode) or
    ``jax.export.Exported.serialize()`` bytes (any other name)."""
    data = _read(path)
    looks_like_hlo = data.lstrip().startswith(b"HloModule")
    if path.endswith(_HLO_SUFFIXES) or looks_like_hlo:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InputFileError(f"{path}: not UTF-8 text, so not HLO text") from None
        return hlo.parse_hlo(text, filename=path)
    if data.startswith(b"ML\xefR"):          # MLIR bytecode
        return hlo.from_stablehlo(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _load_exported(path, data)
    return hlo.from_stablehlo(text)


def _load_exported(path: str, data: bytes) -> hlo.Module:
    # A flatbuffer has no reliable magic number, so the only test is deserializing it.
    from jax import export
    try:
        exported = export.deserialize(bytearray(data))
    except ImportError as e:
        raise InputFileError(f"{path}: reading jax.export bytes needs an extra package: {e}") \
            from None
    except Exception:
        raise InputFileError(f"{path}: not HLO text, MLIR (text or bytecode) or "
                             "jax.export.Exported.serialize() bytes") from None
    return hlo.from_exported(exported)


def random_inputs(shapes: Sequence[AnyShape], seed: int = 0) -> list:
    """Seeded random values: floats ~ N(0, 1), integers in [0, 8), preds fair coins.

    Small non-negative integers keep index operands (gather, dynamic-slice) meaningful.
    """
    rng = np.random.default_rng(seed)
    return [_random_value(s, rng) for s in shapes]


def _random_value(shape: AnyShape, rng: np.random.Generator):
    if shape.is_tuple:
        return tuple(_random_value(e, rng) for e in shape.elements)
    assert isinstance(shape, Shape)
    if shape.is_token:
        raise InvalidArgumentError("cannot make a random value for a token parameter")
    d = shape.dtype
    if d.is_pred:
        v = rng.integers(0, 2, size=shape.dims).astype(bool)
    elif d.is_integer:
        v = rng.integers(0, 8, size=shape.dims)
    elif d.is_complex:
        v = rng.standard_normal(shape.dims) + 1j * rng.standard_normal(shape.dims)
    else:
        v = rng.standard_normal(shape.dims)
    return np.asarray(v).astype(d.np_dtype)


def load_npy(paths: Sequence[str]) -> list[np.ndarray]:
    out = []
    for p in paths:
        if not os.path.exists(p):
            raise InputFileError(f"{p}: no such file")
        try:
            out.append(np.load(p, allow_pickle=False))
        except (ValueError, OSError) as e:
            raise InputFileError(f"{p}: not a .npy array file ({e})") from None
    return out
