"""``Tiling``: which tile of an array each device holds, the working form of a sharding.

An HLO sharding is a tile assignment (a grid of device ids). Propagation and the
partitioner mostly ask per-device questions (which tile does device d hold? which devices
hold the pieces of one tile?), so a ``Tiling`` stores, for every device 0..N-1, its tile
index: one integer per array dimension. A tiling is valid when every tile is held by the
same number of devices (the replication factor). ``partial`` marks a value whose tile is
the sum (the ``reducer``) of the local pieces of several devices, as after a dot whose
contracting dimension is sharded: ``partial[d]`` is device d's piece number.

A dimension of size n split into t tiles gives every device ceil(n / t) elements: the
array is padded at the end to t * ceil(n / t), as GSPMD does. What the padding holds is
undefined (an elementwise op computes on it too); whoever mixes elements along a padded
dimension (a reduction, a contracting dot, a gather) masks it first, and gathering the
dimension back whole slices it off.

``to_sharding`` goes back to XLA's spelling, in iota form when the grid is one
(``{devices=[2,1,4]<=[8] last_tile_dim_replicate}``), as XLA prints it.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional, Sequence

import numpy as np

from hlo.attrs import IotaReplicaGroups, ReplicaGroups
from hlo.errors import HlotkError
from hlo.sharding import Sharding


class SpmdError(HlotkError):
    """A sharding that cannot be partitioned as asked (mesh mismatch, uneven split ...)."""


Index = tuple[int, ...]


@dataclass(frozen=True)
class Tiling:
    tiles: tuple[int, ...]                      # tile count per array dimension
    index: tuple[Index, ...]                    # index[d]: tile index of device d
    partial: Optional[tuple[int, ...]] = None   # partial[d]: device d's piece of a sum
    reducer: Any = None                         # the Computation summing pieces

    @property
    def num_devices(self) -> int:
        return len(self.index)

    @property
    def rank(self) -> int:
        return len(self.tiles)

    @property
    def is_replicated(self) -> bool:
        return all(t == 1 for t in self.tiles) and self.partial is None

    @staticmethod
    def replicated(rank: int, n: int) -> "Tiling":
        return Tiling((1,) * rank, ((0,) * rank,) * n)

    @staticmethod
    def from_index(tiles: Sequence[int], index: Sequence[Index]) -> Optional["Tiling"]:
        """A tiling from per-device indices; None when tiles are held unevenly."""
        t = Tiling(tuple(tiles), tuple(tuple(i) for i in index))
        return t if t.is_uniform() else None

    def is_uniform(self) -> bool:
        counts: dict[Index, int] = {}
        for i in self.index:
            counts[i] = counts.get(i, 0) + 1
        return len(counts) == math.prod(self.tiles) and len(set(counts.values())) == 1

    def same_as(self, other: "Tiling") -> bool:
        """Device-wise equal placement (and the same partial pieces)."""
        return (self.tiles == other.tiles and self.index == other.index
                and self.partial == other.partial)

    def without_partial(self) -> "Tiling":
        return Tiling(self.tiles, self.index)

    def replicate_dims(self, dims: Sequence[int]) -> "Tiling":
        """The same placement with ``dims`` no longer split."""
        dims = set(dims)
        tiles = tuple(1 if i in dims else t for i, t in enumerate(self.tiles))
        index = tuple(tuple(0 if i in dims else x for i, x in enumerate(ix))
                      for ix in self.index)
        return Tiling(tiles, index, self.partial, self.reducer)

    def local_dims(self, dims: Sequence[int], what: str = "array") -> tuple[int, ...]:
        """The shape of one device's piece: each dim split into ``tiles`` pieces rounded
        up, so a dim that does not divide evenly is padded at the end (GSPMD's rule: the
        last tiles hold fewer real elements, or none)."""
        return tuple(-(-n // t) for n, t in zip(dims, self.tiles))

    def padded_dims(self, dims: Sequence[int]) -> list[int]:
        """Dims whose pieces carry padding (size not a multiple of the tile count)."""
        return [i for i, (n, t) in enumerate(zip(dims, self.tiles)) if n % t]

    def valid_counts(self, dims: Sequence[int], i: int) -> list[int]:
        """Per device: how many elements of its piece along dim ``i`` are real data (the
        rest is padding)."""
        loc = -(-dims[i] // self.tiles[i])
        return [min(max(dims[i] - ix[i] * loc, 0), loc) for ix in self.index]

    # --- conversion to and from HLO shardings -------------------------------------------
    @staticmethod
    def from_sharding(s: Any, rank: int, n: int) -> "Tiling":
        if s is None or not isinstance(s, Sharding) or s.kind in ("replicated", "unknown"):
            return Tiling.replicated(rank, n)
        if s.is_tuple:
            raise SpmdError("a tuple sharding on an array value")
        if s.kind == "maximal":
            raise SpmdError(f"sharding {s}: maximal (single-device) shardings are not "
                            "partitioned by hlotk")
        if s.kind == "manual":
            raise SpmdError(f"sharding {s}: manual values outside a manual computation")
        if s.kind != "tiled":
            raise SpmdError(f"cannot partition sharding {s}")
        if s.num_devices != n:
            raise SpmdError(f"sharding {s} uses {s.num_devices} devices but the program is "
                            f"partitioned over {n}")
        ta = s.tile_assignment
        data = s.data_tile_dims
        if len(data) != rank:
            raise SpmdError(f"sharding {s} has {len(data)} tiled dims for a rank-{rank} array")
        ta = ta.reshape(tuple(data) + (-1,))
        index: list[Optional[Index]] = [None] * n
        for pos in itertools.product(*(range(t) for t in ta.shape)):
            d = int(ta[pos])
            if not 0 <= d < n or index[d] is not None:
                raise SpmdError(f"sharding {s} names device {d} twice or out of range 0..{n - 1}")
            index[d] = tuple(pos[:-1])
        return Tiling(tuple(data), tuple(index))  # type: ignore[arg-type]

    def tile_assignment(self) -> np.ndarray:
        """Grid of device ids: tiles + (replication,), devices of one tile ascending."""
        rep = self.num_devices // math.prod(self.tiles)
        ta = np.full(self.tiles + (rep,), -1, dtype=np.int64)
        seen: dict[Index, int] = {}
        for d, ix in enumerate(self.index):
            r = seen.get(ix, 0)
            seen[ix] = r + 1
            ta[ix + (r,)] = d
        return ta

    def to_sharding(self) -> Sharding:
        if self.partial is not None:
            raise SpmdError("a partial (pending reduction) value has no HLO sharding")
        if all(t == 1 for t in self.tiles):
            return Sharding.replicated()
        ta = self.tile_assignment()
        rep = ta.shape[-1]
        dims = ta.shape if rep > 1 else ta.shape[:-1]
        iota = find_iota(tuple(ta.reshape(-1).tolist()))
        if iota is not None:
            return Sharding.iota(dims, iota[0], iota[1], last_tile_dim_replicate=rep > 1)
        return Sharding.tiled(ta.reshape(dims), last_tile_dim_replicate=rep > 1)


# --- iota forms ----------------------------------------------------------------------------
def _ordered_factorizations(n: int, max_len: int = 4) -> list[tuple[int, ...]]:
    """Every way to write n as an ordered product of factors > 1, at most max_len of them."""
    if n == 1:
        return [()]
    if max_len == 0:
        return []
    return [(f,) + rest for f in range(2, n + 1) if n % f == 0
            for rest in _ordered_factorizations(n // f, max_len - 1)]


@lru_cache(maxsize=4096)
def find_iota(ids: tuple[int, ...]) -> Optional[tuple[tuple[int, ...], Optional[tuple[int, ...]]]]:
    """(reshape, transpose) with ``iota(reshape).transpose(transpose).flatten() == ids``,
    fewest reshape dims first; None when the list is no transposed iota."""
    n = len(ids)
    if sorted(ids) != list(range(n)):
        return None
    target = np.asarray(ids)
    if (target == np.arange(n)).all():
        return (n,), None
    cands = sorted(set(_ordered_factorizations(n)), key=len)
    for shape in cands:
        if len(shape) < 2:
            continue
        base = np.arange(n).reshape(shape)
        for perm in itertools.permutations(range(len(shape))):
            if perm == tuple(range(len(shape))):
                continue
            if (base.transpose(perm).reshape(-1) == target).all():
                return shape, perm
    return None


def replica_groups(groups: Sequence[Sequence[int]]) -> Any:
    """XLA's replica groups value: the iota form ``[2,4]<=[4,2]T(1,0)`` when there is one."""
    groups = [list(g) for g in groups]
    flat = tuple(i for g in groups for i in g)
    iota = find_iota(flat) if len({len(g) for g in groups}) == 1 else None
    if iota is not None:
        return IotaReplicaGroups((len(groups), len(groups[0])), iota[0], iota[1])
    return ReplicaGroups(tuple(tuple(g) for g in groups))


def layered_groups(keys: Sequence[Any], order: Sequence[int]) -> list[list[int]]:
    """Devices with equal ``keys[d]`` form a group ordered by ``order[d]``; when several
    devices share one (key, order) — replicated copies — they are split into layers, one
    group per layer, so every group holds each order position exactly once."""
    buckets: dict[Any, dict[int, list[int]]] = {}
    for d, (k, o) in enumerate(zip(keys, order)):
        buckets.setdefault(k, {}).setdefault(o, []).append(d)
    groups = []
    for k in sorted(buckets, key=lambda k: min(d for ds in buckets[k].values() for d in ds)):
        by_pos = buckets[k]
        positions = sorted(by_pos)
        layers = len(by_pos[positions[0]])
        for r in range(layers):
            groups.append([by_pos[p][r] for p in positions])
    groups.sort(key=lambda g: g[0])
    return groups
