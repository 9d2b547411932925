"""Array and tuple shapes with optional physical layouts, printed as XLA prints them.

``Shape(F32, (2, 3), Layout((1, 0)))`` prints ``f32[2,3]{1,0}``; a layout of ``None`` means
"not assigned yet" (layout assignment fixes it) and prints nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Union

from . import dtypes as dt
from .dtypes import DType


@dataclass(frozen=True)
class Layout:
    minor_to_major: tuple[int, ...]
    # Anything after ':' in XLA's layout syntax (tiles ``T(8,128)``, memory space ``S(1)``,
    # element size ``E(4)``): kept verbatim so the text round-trips; not interpreted yet.
    extra: str = ""

    def __str__(self) -> str:
        s = ",".join(str(d) for d in self.minor_to_major)
        if self.extra:
            s += ":" + self.extra
        return "{" + s + "}"

    @staticmethod
    def row_major(rank: int) -> "Layout":
        return Layout(tuple(range(rank - 1, -1, -1)))

    @property
    def is_row_major(self) -> bool:
        return self.minor_to_major == tuple(range(len(self.minor_to_major) - 1, -1, -1))


@dataclass(frozen=True)
class Shape:
    dtype: DType
    dims: tuple[int, ...] = ()
    layout: Layout | None = None

    def __post_init__(self):
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))
        if self.layout is not None and len(self.layout.minor_to_major) != len(self.dims):
            from .errors import ShapeError
            raise ShapeError(f"layout {self.layout} does not match rank {len(self.dims)} of {self}")

    # --- queries --------------------------------------------------------------------
    is_tuple = False

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def is_token(self) -> bool:
        return self.dtype.kind == "token"

    @property
    def is_array(self) -> bool:
        return self.dtype.is_array_type

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    @property
    def byte_size(self) -> int:
        # Made once (a shape is immutable): the fusion pass's cost model asks for the
        # bytes of every operand of every kernel it prices (issue 13).
        cached = self.__dict__.get("_bytes")
        if cached is None:
            cached = self.size * self.dtype.itemsize
            object.__setattr__(self, "_bytes", cached)
        return cached

    def with_dtype(self, dtype: DType) -> "Shape":
        return Shape(dtype, self.dims, self.layout)

    def with_dims(self, dims) -> "Shape":
        return Shape(self.dtype, tuple(dims), None)

    def with_layout(self, layout: Layout | None) -> "Shape":
        return Shape(self.dtype, self.dims, layout)

    def without_layout(self) -> "Shape":
        return Shape(self.dtype, self.dims, None)

    def compatible(self, other: "AnyShape") -> bool:
        """Equal ignoring layouts (XLA's ShapeUtil::Compatible)."""
        return (not other.is_tuple and self.dtype == other.dtype and self.dims == other.dims)

    def leaves(self) -> Iterator["Shape"]:
        yield self

    def to_text(self, print_layout: bool = True) -> str:
        # A shape is immutable and shared by many instructions (an imported module's values
        # of one type share one): its text is made once (issue 13: printing a module, the
        # compile cache's key, spent a fifth of its time here).
        cached = self.__dict__.get("_text")
        if cached is not None and print_layout:
            return cached
        s = f"{self.dtype.name}[{','.join(str(d) for d in self.dims)}]"
        if print_layout and self.layout is not None and self.dims and self.dtype.is_array_type:
            s += str(self.layout)
        elif print_layout and self.layout is not None and self.layout.extra and not self.dims:
            s += str(self.layout)
        if print_layout:
            object.__setattr__(self, "_text", s)
        return s

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"Shape({self.to_text()})"


@dataclass(frozen=True)
class TupleShape:
    elements: tuple["AnyShape", ...] = field(default_factory=tuple)

    def __post_init__(self):
        object.__setattr__(self, "elements", tuple(self.elements))

    is_tuple = True
    is_token = False
    is_array = False

    def leaves(self) -> Iterator[Shape]:
        for e in self.elements:
            yield from e.leaves()

    @property
    def byte_size(self) -> int:
        # A tuple's own buffer holds one pointer per element, as in XLA.
        return 8 * len(self.elements)

    def without_layout(self) -> "TupleShape":
        return TupleShape(tuple(e.without_layout() for e in self.elements))

    def compatible(self, other: "AnyShape") -> bool:
        return (other.is_tuple and len(other.elements) == len(self.elements)
                and all(a.compatible(b) for a, b in zip(self.elements, other.elements)))

    def to_text(self, print_layout: bool = True) -> str:
        return "(" + ", ".join(e.to_text(print_layout) for e in self.elements) + ")"

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"TupleShape({self.to_text()})"


AnyShape = Union[Shape, TupleShape]


def array(dtype: DType | str, dims=(), layout: tuple[int, ...] | Layout | None = None) -> Shape:
    """Convenience constructor: ``array('f32', (2, 3))``."""
    if isinstance(dtype, str):
        dtype = dt.by_name(dtype)
    if layout is not None and not isinstance(layout, Layout):
        layout = Layout(tuple(layout))
    return Shape(dtype, tuple(dims), layout)


def scalar(dtype: DType | str) -> Shape:
    return array(dtype, ())


def token() -> Shape:
    return Shape(dt.TOKEN, ())


def tuple_shape(*elements: AnyShape) -> TupleShape:
    return TupleShape(tuple(elements))


def subshape(shape: AnyShape, index: tuple[int, ...]) -> AnyShape:
    """The shape at a tuple index path, e.g. ``(1, 0)``."""
    for i in index:
        shape = shape.elements[i]  # type: ignore[union-attr]
    return shape


def leaf_paths(shape: AnyShape, prefix: tuple[int, ...] = ()) -> Iterator[tuple[tuple[int, ...], Shape]]:
    """(index path, array shape) for every non-tuple leaf, in order."""
    if shape.is_tuple:
        for i, e in enumerate(shape.elements):
            yield from leaf_paths(e, prefix + (i,))
    else:
        yield prefix, shape
