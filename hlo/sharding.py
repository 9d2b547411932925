"""Shardings: how an array is split over devices, in every spelling XLA's text format has.

    {replicated}                         every device holds the whole array
    {maximal device=0}                   one device holds it
    {manual}   {unknown}   {unreduced}   special markers (SPMD manual regions, ...)
    {devices=[2,1]0,1}                   tiled: tile grid [2,1], explicit device per tile
    {devices=[2,2]<=[4]}                 tiled, device ids given as an iota ...
    {devices=[2,2]<=[2,2]T(1,0)}         ... reshaped and transposed
    {devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}
    {devices=[2,1,2,2]<=[8] last_tile_dims={manual, replicated}}
    {{replicated}, {devices=[2]0,1}}     one sharding per tuple element
    {devices=[2]0,1 shard_as 1}          sharding groups (kept verbatim)
    {replicated metadata={op_name="a"}}  metadata kept verbatim (``attrs.Raw``)

``parse_sharding(text)`` reads any of these; ``str(sharding)`` prints XLA's spelling back.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .attrs import Raw
from .errors import ParseError

REPLICATED = "replicated"
MAXIMAL = "maximal"
MANUAL = "manual"
UNKNOWN = "unknown"
UNREDUCED = "unreduced"
TILED = "tiled"
TUPLE = "tuple"

# Markers that are a whole sharding on their own: ``{replicated}`` etc.
_MARKERS = (REPLICATED, MANUAL, UNKNOWN, UNREDUCED)
# Subgroup kinds allowed in ``last_tile_dims={...}``.
_SUBGROUP_KINDS = (MANUAL, REPLICATED, UNREDUCED, "maximal")


@dataclass(frozen=True)
class Sharding:
    kind: str
    # tiled: the tile grid, one entry per array dim (+ trailing subgroup dims).
    tile_dims: tuple[int, ...] = ()
    # tiled: explicit device ids in row-major tile order, or None when given as an iota.
    devices: Optional[tuple[int, ...]] = None
    # tiled with iota device ids: ``<=[reshape]T(transpose)``.
    iota_reshape: Optional[tuple[int, ...]] = None
    iota_transpose: Optional[tuple[int, ...]] = None
    last_tile_dim_replicate: bool = False
    last_tile_dims: tuple[str, ...] = ()       # subgroup kinds of the trailing tile dims
    device: Optional[int] = None               # maximal
    elements: tuple["Sharding", ...] = ()      # tuple
    shard_group: str = ""                      # ``shard_as 1`` / ``shard_like 2``, verbatim
    metadata: Optional[Raw] = None             # ``{op_name=...}`` or ``{{...}, {...}}``

    # --- constructors -----------------------------------------------------------------
    @staticmethod
    def replicated() -> "Sharding":
        return Sharding(REPLICATED)

    @staticmethod
    def manual() -> "Sharding":
        return Sharding(MANUAL)

    @staticmethod
    def unknown() -> "Sharding":
        return Sharding(UNKNOWN)

    @staticmethod
    def maximal(device: int) -> "Sharding":
        return Sharding(MAXIMAL, device=int(device))

    @staticmethod
    def tiled(tile_assignment, last_tile_dim_replicate: bool = False,
              last_tile_dims: tuple[str, ...] = ()) -> "Sharding":
        """From a numpy array of device ids whose shape is the tile grid."""
        arr = np.asarray(tile_assignment)
        return Sharding(TILED, tuple(arr.shape), tuple(int(d) for d in arr.reshape(-1)),
                        last_tile_dim_replicate=last_tile_dim_replicate,
                        last_tile_dims=tuple(last_tile_dims))

    @staticmethod
    def iota(tile_dims, reshape=None, transpose=None, last_tile_dim_replicate: bool = False,
             last_tile_dims: tuple[str, ...] = ()) -> "Sharding":
        """``devices=[tile_dims]<=[reshape]T(transpose)``; reshape defaults to [num devices]."""
        tile_dims = tuple(int(d) for d in tile_dims)
        if reshape is None:
            reshape = (math.prod(tile_dims),)
        return Sharding(TILED, tile_dims, None, tuple(int(d) for d in reshape),
                        None if transpose is None else tuple(int(d) for d in transpose),
                        last_tile_dim_replicate, tuple(last_tile_dims))

    @staticmethod
    def tuple(elements) -> "Sharding":
        return Sharding(TUPLE, elements=tuple(elements))

    # --- queries ------------------------------------------------------------------------
    @property
    def is_tuple(self) -> bool:
        return self.kind == TUPLE

    @property
    def is_replicated(self) -> bool:
        """Every device holds all data (XLA's IsReplicated; a tuple if all elements are)."""
        if self.kind == TUPLE:
            return all(e.is_replicated for e in self.elements)
        if self.kind == TILED:
            # A tiled sharding whose only tiling is replication is replicated too.
            return self.num_tiles == 1 and not self.last_tile_dims
        return self.kind == REPLICATED

    @property
    def is_maximal(self) -> bool:
        return self.kind == MAXIMAL

    @property
    def is_manual(self) -> bool:
        return self.kind == MANUAL

    @property
    def is_tiled(self) -> bool:
        return self.kind == TILED

    @property
    def is_iota(self) -> bool:
        return self.kind == TILED and self.devices is None

    @property
    def tile_assignment(self) -> np.ndarray:
        """Device ids as an int64 array shaped like the tile grid.

        Replicated/manual/unknown/tuple shardings have no grid and raise ValueError;
        maximal gives its single device as a 1-element array.
        """
        if self.kind == TILED:
            if self.devices is not None:
                return np.asarray(self.devices, dtype=np.int64).reshape(self.tile_dims)
            ids = np.arange(math.prod(self.iota_reshape), dtype=np.int64).reshape(self.iota_reshape)
            if self.iota_transpose is not None:
                ids = ids.transpose(self.iota_transpose)
            return ids.reshape(self.tile_dims)
        if self.kind == MAXIMAL:
            return np.asarray([self.device], dtype=np.int64)
        raise ValueError(f"sharding {self} has no tile assignment")

    @property
    def num_subgroup_dims(self) -> int:
        if self.kind != TILED:
            return 0
        if self.last_tile_dims:
            return len(self.last_tile_dims)
        return 1 if self.last_tile_dim_replicate else 0

    @property
    def data_tile_dims(self) -> tuple[int, ...]:
        """The tile grid over the array's own dims (without trailing subgroup dims)."""
        n = self.num_subgroup_dims
        return self.tile_dims[:len(self.tile_dims) - n] if n else self.tile_dims

    @property
    def num_tiles(self) -> int:
        """How many distinct pieces the data is cut into (XLA's NumTiles)."""
        if self.kind == TILED:
            return math.prod(self.data_tile_dims)
        if self.kind == TUPLE:
            raise ValueError("num_tiles of a tuple sharding; ask an element")
        return 1

    @property
    def num_devices(self) -> int:
        if self.kind == TILED:
            return math.prod(self.tile_dims)
        return 1

    # --- printing -------------------------------------------------------------------------
    def to_text(self, include_metadata: bool = True) -> str:
        if self.kind == TUPLE:
            if not self.elements:
                return "{}"
            parts = []
            for i, e in enumerate(self.elements):
                # XLA marks every fifth element of a long tuple with its index.
                sep = "" if i == 0 else (f", /*index={i}*/" if i % 5 == 0 else ", ")
                parts.append(sep + e.to_text(include_metadata))
            return "{" + "".join(parts) + "}"
        if self.kind in _MARKERS:
            body = self.kind
        elif self.kind == MAXIMAL:
            body = f"maximal device={self.device}"
        elif self.kind == TILED:
            body = "devices=[" + ",".join(map(str, self.tile_dims)) + "]"
            if self.devices is not None:
                body += ",".join(map(str, self.devices))
            else:
                body += "<=[" + ",".join(map(str, self.iota_reshape or ())) + "]"
                if self.iota_transpose is not None:
                    body += "T(" + ",".join(map(str, self.iota_transpose)) + ")"
            if self.last_tile_dim_replicate:
                body += " last_tile_dim_replicate"
            if self.last_tile_dims:
                body += " last_tile_dims={" + ", ".join(self.last_tile_dims) + "}"
        else:  # pragma: no cover - kinds are closed
            raise ValueError(self.kind)
        if self.shard_group:
            body += " " + self.shard_group
        if include_metadata and self.metadata is not None:
            body += " metadata=" + self.metadata.text
        return "{" + body + "}"

    def __str__(self) -> str:
        return self.to_text()


# --- parsing ------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(/\*.*?\*/)|(-?\d+)|([A-Za-z_][A-Za-z0-9_]*)|(<=)|(.))", re.S)


class _Reader:
    """A tiny cursor over sharding text; errors carry 1-based line:column in ``text``."""

    def __init__(self, text: str, filename: Optional[str], line: int, column: int):
        self.text = text
        self.pos = 0
        self.filename = filename
        self.line0 = line
        self.col0 = column

    def error(self, expected: str, pos: Optional[int] = None) -> ParseError:
        pos = self.pos if pos is None else pos
        # Report the start of the offending token, not the whitespace before it.
        while pos < len(self.text) and self.text[pos].isspace():
            pos += 1
        found = self._describe(pos)
        before = self.text[:pos]
        line = self.line0 + before.count("\n")
        col = (pos - before.rfind("\n")) if "\n" in before else self.col0 + pos
        return ParseError(f"expected {expected} but found {found} in sharding",
                          line, col, self.filename)

    def _describe(self, pos: int) -> str:
        if pos >= len(self.text):
            return "end of text"
        m = _TOKEN.match(self.text, pos)
        tok = next(g for g in m.groups() if g is not None) if m else self.text[pos]
        return repr(tok)

    def peek(self) -> str:
        """The next token (comments skipped), without consuming it; '' at the end."""
        pos = self.pos
        while True:
            m = _TOKEN.match(self.text, pos)
            if m is None:
                return ""
            if m.group(1) is None:
                return next(g for g in m.groups() if g is not None)
            pos = m.end()

    def next(self) -> str:
        while True:
            m = _TOKEN.match(self.text, self.pos)
            if m is None:
                return ""
            self.pos = m.end()
            if m.group(1) is None:
                return next(g for g in m.groups() if g is not None)

    def expect(self, tok: str) -> None:
        start = self.pos
        if self.next() != tok:
            raise self.error(repr(tok), start)

    def integer(self) -> int:
        start = self.pos
        tok = self.next()
        try:
            return int(tok)
        except ValueError:
            raise self.error("an integer", start) from None

    def int_list(self, close: str) -> tuple[int, ...]:
        """Integers separated by commas up to ``close`` (consumed)."""
        out: list[int] = []
        if self.peek() == close:
            self.next()
            return ()
        while True:
            out.append(self.integer())
            start = self.pos
            tok = self.next()
            if tok == close:
                return tuple(out)
            if tok != ",":
                raise self.error(f"',' or {close!r}", start)

    def balanced(self) -> str:
        """Verbatim text of a ``{...}`` group (braces and quoted strings balanced)."""
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        start = self.pos
        if self.pos >= len(self.text) or self.text[self.pos] != "{":
            raise self.error("'{'")
        depth = 0
        i = self.pos
        while i < len(self.text):
            ch = self.text[i]
            if ch == '"':
                i += 1
                while i < len(self.text) and self.text[i] != '"':
                    i += 2 if self.text[i] == "\\" else 1
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    self.pos = i + 1
                    return self.text[start:i + 1]
            i += 1
        raise self.error("'}' closing the group", len(self.text))


def parse_sharding(text: str, filename: Optional[str] = None, line: int = 1,
                   column: int = 1) -> Sharding:
    """Parse XLA's sharding spelling (the ``{...}`` after ``sharding=``).

    ``line``/``column`` say where ``text`` starts in a larger file, so errors point there.
    """
    r = _Reader(text, filename, line, column)
    s = _parse_one(r)
    if r.peek() != "":
        raise r.error("end of sharding")
    return s


def _parse_one(r: _Reader) -> Sharding:
    r.expect("{")
    tok = r.peek()
    if tok == "}":           # the empty tuple sharding
        r.next()
        return Sharding.tuple(())
    if tok == "{":           # a tuple of element shardings
        elements = [_parse_one(r)]
        while r.peek() == ",":
            r.next()
            elements.append(_parse_one(r))
        r.expect("}")
        return Sharding.tuple(elements)

    start = r.pos
    word = r.next()
    if word in _MARKERS:
        kind, fields = word, {}
    elif word == "maximal":
        r.expect("device")
        r.expect("=")
        kind, fields = MAXIMAL, {"device": r.integer()}
    elif word == "devices":
        kind, fields = TILED, _parse_tile_assignment(r)
    else:
        raise r.error("'replicated', 'maximal', 'manual', 'unknown' or 'devices='", start)

    # Trailing options, in any order.
    shard_group = ""
    metadata: Optional[Raw] = None
    while True:
        start = r.pos
        tok = r.next()
        if tok == "}":
            break
        if tok == "last_tile_dim_replicate" and kind == TILED:
            fields["last_tile_dim_replicate"] = True
        elif tok == "last_tile_dims" and kind == TILED:
            r.expect("=")
            r.expect("{")
            kinds = []
            while True:
                kstart = r.pos
                k = r.next()
                if k not in _SUBGROUP_KINDS:
                    raise r.error("'manual' or 'replicated'", kstart)
                kinds.append(k)
                sep_start = r.pos
                sep = r.next()
                if sep == "}":
                    break
                if sep != ",":
                    raise r.error("',' or '}'", sep_start)
            fields["last_tile_dims"] = tuple(kinds)
        elif tok in ("shard_as", "shard_like"):
            shard_group = f"{tok} {r.integer()}"
        elif tok == "metadata":
            r.expect("=")
            metadata = Raw(r.balanced())
        else:
            raise r.error("'}' or a sharding option", start)
    return Sharding(kind, shard_group=shard_group, metadata=metadata, **fields)


def _parse_tile_assignment(r: _Reader) -> dict:
    r.expect("=")
    r.expect("[")
    tile_dims = r.int_list("]")
    n = math.prod(tile_dims)
    if r.peek() == "<=":
        r.next()
        r.expect("[")
        start = r.pos
        reshape = r.int_list("]")
        if math.prod(reshape) != n:
            raise r.error(f"iota dims with {n} devices", start)
        transpose = None
        if r.peek() == "T":
            r.next()
            r.expect("(")
            tstart = r.pos
            transpose = r.int_list(")")
            if sorted(transpose) != list(range(len(reshape))):
                raise r.error(f"a permutation of {len(reshape)} dims", tstart)
        return {"tile_dims": tile_dims, "iota_reshape": reshape, "iota_transpose": transpose}
    start = r.pos
    devices = [r.integer()]
    while r.peek() == ",":
        r.next()
        devices.append(r.integer())
    if len(devices) != n:
        err = r.error("x", start)
        grid = ",".join(map(str, tile_dims))
        raise ParseError(f"tile grid [{grid}] needs {n} device ids but found {len(devices)} "
                         "in sharding", err.line, err.column, r.filename)
    return {"tile_dims": tile_dims, "devices": tuple(devices)}
