"""Where a captured graph holds its argument and result addresses: the capture diff.

The executable is captured four times: A and C with its arguments and results in one set of
staging buffers, B and D in another (the arena and the constants stay where they are). Every
node's parameters are read back from the graphs (``graph_launch.cc``: kernel parameters laid out
by ``cuFuncGetParamInfo``; memcpy/memset nodes as their parameter structs) and compared as
8-byte words:

- a word equal in A and B is not an I/O address (it may be a fixed address: arena,
  constants, workspaces; or a size, a stride, a scalar);
- a word that differs between A and C, or between B and D (a fourth capture over B's
  buffers), whose buffers are the same, is local to a capture,
  not an I/O address: padding or unset struct members a launch copies from the stack
  (torch's elementwise kernels pass such bytes), or a temporary the capture allocated in
  its own pool. Capture A's value is the one its graph needs; it is kept;
- a word that differs must be ``staging_a[i] + d`` in one capture and ``staging_b[i] + d``
  in the other, for one buffer ``i`` and the same ``d`` in ``[0, size_i]`` (or in
  ``[-skew, 0)``: the bytes of the buffer's own allocation before it, where a tensor's storage
  starts): it is then a patch site ``(node, byte offset, i, d)``, and each call writes
  ``address_i + d`` there;
- a word that differs between A and B, is in neither capture a place in an argument or
  result buffer, and in both captures either is a host address the CUDA driver manages no
  memory at (no kernel can read through it: struct padding holding a host pointer, as
  torch's sort and scatter/gather kernels pass) or points into a CUDA allocation that holds
  no staging buffer of that capture (the capture's own pool or a workspace: graph A keeps
  its memory) is capture-local too, kept as A has it (``allocation_of``; benchmarks/NOTES.md,
  issue 12). C and D run through new tensor objects, so that padding tied to the host
  objects (stack bytes torch's TensorIterator kernels copy into unused struct slots) differs
  within a pair as well;
- anything else (a differing word that is not such a pair, different kernels or launch
  geometry, a memcpy/memset node or another kind whose parameters the driver will not
  re-point at XLA's buffers: the launcher replaces those touching an argument or result by
  copy/fill kernels before the diff, graph_launch.cc's LowerCopies) makes the executable not
  patchable: ``NotPatchable`` says which node and why, and the executable keeps the Python
  path.
"""
from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

# CUgraphNodeType values (cuda.h) and what the launcher can do with each.
NODE_KINDS = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "child graph", 5: "empty",
              6: "event wait", 7: "event record", 8: "semaphore signal", 9: "semaphore wait",
              10: "memory alloc", 11: "memory free", 12: "batch memop", 13: "conditional"}
PATCHABLE = {"kernel"}                          # parameters rewritten per call
PASSIVE = {"empty"}                             # no parameters
# Read and compared, but never re-pointed: cuGraphExecMemcpyNodeSetParams accepted torch's
# buffers and refused XLA's (CUDA_ERROR_INVALID_VALUE on the H200 with jax 0.11.2,
# benchmarks/NOTES.md, issue 12 run 3). The launcher replaces the copies and fills that touch
# an argument or result by kernel nodes before the diff (graph_launch.cc, LowerCopies); one
# it could not express (a 2-D copy, host memory) keeps the executable on the Python path.
FIXED_ONLY = {"memcpy", "memset"}


class NotPatchable(Exception):
    """The capture diff found something a per-call address patch cannot reproduce."""


@dataclass(frozen=True)
class NodeInfo:
    """One node of a captured graph, as ``hk_graph_describe`` serializes it."""
    kind: str
    key: bytes      # must be equal between the captures
    blob: bytes     # the bytes whose 8-byte words are compared
    name: str = ""  # the kernel's name, for messages

    def label(self) -> str:
        return f"{self.kind} {self.name}".strip()


@dataclass(frozen=True)
class PatchSite:
    node: int       # index in the graph's node list
    offset: int     # byte offset of the 8-byte word in the node's parameter bytes
    buffer: int     # argument/result buffer number
    delta: int      # the word is the buffer's address + delta


def parse_nodes(raw: bytes) -> list[NodeInfo]:
    """The nodes serialized by ``hk_graph_describe`` (int32 type, three uint32 lengths,
    then key, blob and name bytes, per node)."""
    out: list[NodeInfo] = []
    pos = 0
    while pos < len(raw):
        kind, nk, nb, nn = struct.unpack_from("<iIII", raw, pos)
        pos += 16
        key = raw[pos:pos + nk]
        blob = raw[pos + nk:pos + nk + nb]
        name = raw[pos + nk + nb:pos + nk + nb + nn].decode("utf-8", "replace")
        pos += nk + nb + nn
        out.append(NodeInfo(NODE_KINDS.get(kind, f"type {kind}"), key, blob, name))
    return out


class _Ranges:
    """Staging buffers by start address, for finding which one holds a word."""

    def __init__(self, starts: Sequence[int], sizes: Sequence[int]):
        self.order = sorted(range(len(starts)), key=lambda i: starts[i])
        self.starts = [starts[i] for i in self.order]
        self.sizes = sizes
        for a, b in zip(self.order, self.order[1:]):
            if starts[a] + sizes[a] > starts[b]:
                raise ValueError(f"staging buffers {a} and {b} overlap")

    def find(self, word: int, before: int = 0) -> tuple[int, int] | None:
        """(buffer, offset) with start <= word <= start + size (one past the end counts),
        else with start - ``before`` <= word < start (a negative offset), or None."""
        k = bisect.bisect_right(self.starts, word) - 1
        if k >= 0:
            i = self.order[k]
            d = word - self.starts[k]
            if d <= self.sizes[i]:
                return i, d
        if k + 1 < len(self.starts) and self.starts[k + 1] - word <= before:
            return self.order[k + 1], word - self.starts[k + 1]
        return None


def patch_sites(nodes_a: Sequence[NodeInfo], nodes_b: Sequence[NodeInfo],
                staging_a: Sequence[int], staging_b: Sequence[int],
                sizes: Sequence[int],
                nodes_c: Optional[Sequence[NodeInfo]] = None,
                allocation_of: Optional[Callable[[list[int]], list[int]]] = None,
                kept: Optional[list[str]] = None,
                nodes_d: Optional[Sequence[NodeInfo]] = None,
                skew: int = 0) -> list[PatchSite]:
    """The patch sites of capture A (buffers at ``staging_a``) given capture B of the same
    executable (buffers at ``staging_b``) and, optionally, capture C (buffers at
    ``staging_a`` again: words that differ between A and C are capture-local, kept as A
    has them) and D (buffers at ``staging_b`` again: the same for B and D); raises
    NotPatchable. ``skew``: bytes before each staging buffer that belong to its allocation
    alone (launcher.STAGING_SKEW), where a word may point at the same negative offset in
    both captures (a kernel given its tensor's storage start and the offset apart).
    ``allocation_of(words)`` gives, per word, the start of
    the CUDA allocation holding it (0: none); with it, differing words that are no address
    of an argument or result (module docstring) are kept as A has them too, each described
    in ``kept``."""
    if not (len(staging_a) == len(staging_b) == len(sizes)):
        raise ValueError("one staging address and size per buffer in each capture")
    if set(staging_a) & set(staging_b):
        raise ValueError("the two captures must use different staging buffers")
    ranges_a, ranges_b = _Ranges(staging_a, sizes), _Ranges(staging_b, sizes)
    if nodes_c is None:
        nodes_c = nodes_a
    if nodes_d is None:
        nodes_d = nodes_b
    if not len(nodes_a) == len(nodes_b) == len(nodes_c) == len(nodes_d):
        raise NotPatchable(f"the captures have {len(nodes_a)}, {len(nodes_b)}, "
                           f"{len(nodes_c)} and {len(nodes_d)} nodes")
    sites: list[PatchSite] = []
    # (where, byte, word in A, word in B, device memory only: a copy or fill node's)
    others: list[tuple[str, int, int, int, bool]] = []
    for n, (a, b, c, d) in enumerate(zip(nodes_a, nodes_b, nodes_c, nodes_d)):
        where = f"node {n} ({a.label()})"
        if any(x.kind != a.kind or x.key != a.key or len(x.blob) != len(a.blob)
               for x in (b, c, d)):
            raise NotPatchable(f"{where}: the captures differ in kernel, launch geometry "
                               "or parameter layout")
        if a.kind in PASSIVE:
            continue
        if a.kind not in PATCHABLE | FIXED_ONLY:
            raise NotPatchable(f"{where}: a {a.kind} node (only kernel nodes can be "
                               "re-pointed)")
        if a.blob == b.blob:
            continue
        n_words = len(a.blob) // 8
        if a.blob[8 * n_words:] != b.blob[8 * n_words:]:
            raise NotPatchable(f"{where}: parameter bytes past the last whole word differ")
        words_a = struct.unpack_from(f"<{n_words}Q", a.blob)
        words_b = struct.unpack_from(f"<{n_words}Q", b.blob)
        words_c = struct.unpack_from(f"<{n_words}Q", c.blob)
        words_d = struct.unpack_from(f"<{n_words}Q", d.blob)
        for k, (wa, wb, wc, wd) in enumerate(zip(words_a, words_b, words_c, words_d)):
            if wa == wb or wa != wc or wb != wd:     # fixed, or local to a capture
                continue
            hit_a, hit_b = ranges_a.find(wa, skew), ranges_b.find(wb, skew)
            if a.kind in FIXED_ONLY:
                # A copy or fill of memory the capture allocated itself (a library op's
                # temporary in the graph's pool: torch's scatter-add zeroes one) is kept as
                # A has it, as a kernel's capture-local words are; one of an argument or
                # result cannot be re-pointed.
                if hit_a is None and hit_b is None and allocation_of is not None:
                    others.append((where, 8 * k, wa, wb, True))
                    continue
                raise NotPatchable(f"{where} reads or writes an argument or result (the "
                                   f"driver does not re-point {a.kind} nodes at XLA's "
                                   "buffers)")
            if hit_a is not None and hit_a == hit_b:
                sites.append(PatchSite(n, 8 * k, hit_a[0], hit_a[1]))
            elif hit_a is None and hit_b is None and allocation_of is not None:
                others.append((where, 8 * k, wa, wb, False))    # decided below, at once
            else:
                raise NotPatchable(_not_an_address_pair(where, 8 * k, wa, wb))
    if others:
        _keep_capture_local(others, staging_a, staging_b, allocation_of, kept)
    return sites


def _keep_capture_local(others: list[tuple[str, int, int, int, bool]],
                        staging_a: Sequence[int], staging_b: Sequence[int],
                        allocation_of: Callable[[list[int]], list[int]],
                        kept: Optional[list[str]]) -> None:
    """Keep each (where, byte, word in A, word in B, device only) that is a host word no
    kernel can read (not for a copy or fill node: ``device only``) or points into memory
    holding no staging buffer, in both captures; else NotPatchable."""
    words = [w for _, _, wa, wb, _ in others for w in (wa, wb)]
    allocations = allocation_of(words + list(staging_a) + list(staging_b))
    n = len(words)
    staged = set(allocations[n:]) - {0}      # allocations holding a staging buffer
    for i, (where, byte, wa, wb, device_only) in enumerate(others):
        alloc_a, alloc_b = allocations[2 * i], allocations[2 * i + 1]
        if alloc_a == 0 and alloc_b == 0 and _user_space(wa) and _user_space(wb) \
                and not device_only:
            what = "host word"
        elif alloc_a and alloc_b and not {alloc_a, alloc_b} & staged:
            what = "device word outside the arguments/results"
        else:
            why = ("it points into an argument or result's allocation" if
                   {alloc_a, alloc_b} & staged else "it is no address")
            raise NotPatchable(_not_an_address_pair(where, byte, wa, wb) + f"; {why}")
        if kept is not None:
            kept.append(f"{where} byte {byte} ({what})")


def _user_space(word: int) -> bool:
    """Could ``word`` be a host pointer (a user-space address, not a small number)?"""
    return 1 << 16 <= word < 1 << 47


def _not_an_address_pair(where: str, byte: int, wa: int, wb: int) -> str:
    return (f"{where}: the word at byte {byte} is {wa:#x} in one capture and {wb:#x} in the "
            "other, which is not the same place in one argument or result buffer (an address "
            "the launcher cannot re-point)")
