"""The native launcher (runtime/cuda/native): capture diff, build, FFI argument mapping.

On any machine: the capture diff on synthetic parameter blobs (patch.py), the build of
graph_launch.cc with the system compiler, and the FFI handler's argument/result mapping and
patching through ``jax.jit`` on the CPU (the dry-run target: the same code without CUDA).
With torch and Triton's interpreter: which programs may take the native path. On a GPU
(``gpu`` marks): results against jax.jit and the Python path, donation, held outputs, the
fallback, the ``runtime.jit`` front.
"""
from __future__ import annotations

import ctypes
import os
import struct

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from runtime.cuda.native import patch
from runtime.cuda.native.patch import NodeInfo, NotPatchable, PatchSite, patch_sites

A = [0x7F00_0000_0000, 0x7F00_0010_0000]      # capture A's staging buffers
B = [0x7E00_0000_0000, 0x7E00_0020_0000]      # capture B's
SIZES = [4096, 256]
FIXED = 0x7D00_0000_1000                       # an arena address: the same in both


def words(*ws: int) -> bytes:
    return struct.pack(f"<{len(ws)}Q", *ws)


def kernel(blob: bytes, key: bytes = b"k", name: str = "fusion_1") -> NodeInfo:
    return NodeInfo("kernel", key, blob, name)


# --- the capture diff ------------------------------------------------------------------------
def test_diff_finds_each_address_word_with_its_offset_into_the_buffer():
    copy = NodeInfo("memcpy", b"", words(0, 0, FIXED + 64, FIXED, 64))   # arena to arena
    a = [kernel(words(A[0], 16, A[1] + 128, FIXED)), NodeInfo("empty", b"", b""), copy,
         kernel(words(A[1] + 256), name="k2")]
    b = [kernel(words(B[0], 16, B[1] + 128, FIXED)), NodeInfo("empty", b"", b""), copy,
         kernel(words(B[1] + 256), name="k2")]
    sites = patch_sites(a, b, A, B, SIZES)
    # one past the end of buffer 1 (256 bytes) is still buffer 1: a loop's end pointer
    assert sites == [PatchSite(0, 0, 0, 0), PatchSite(0, 16, 1, 128), PatchSite(3, 0, 1, 256)]


def test_a_copy_or_fill_touching_an_argument_or_result_is_not_patchable():
    for kind in ("memcpy", "memset"):
        a = [NodeInfo(kind, b"", words(0, A[0] + 8, 64))]
        b = [NodeInfo(kind, b"", words(0, B[0] + 8, 64))]
        with pytest.raises(NotPatchable, match=f"node 0 \\({kind}\\) reads or writes an argument"):
            patch_sites(a, b, A, B, SIZES)


def test_words_that_differ_between_captures_over_the_same_buffers_are_kept_as_captured():
    # Word 1: stack garbage in a struct a launch copies (torch's elementwise kernels): it
    # differs between A and C although their buffers are the same. Word 2: a temporary of
    # the capture's pool, at a new address in every capture. Neither is an I/O address.
    a = [kernel(words(A[0], 0x7F86_7228_0100, 0x3000_0000))]
    b = [kernel(words(B[0], 0x100, 0x3100_0000))]
    c = [kernel(words(A[0], 0x7F86_7230_0100, 0x3200_0000))]
    assert patch_sites(a, b, A, B, SIZES, c) == [PatchSite(0, 0, 0, 0)]
    # Without C, or where A and C agree, such a word stops the executable.
    with pytest.raises(NotPatchable, match="the word at byte 8"):
        patch_sites(a, b, A, B, SIZES)
    with pytest.raises(NotPatchable, match="the word at byte 16"):
        patch_sites(a, b, A, B, SIZES, [kernel(words(A[0], 0x7F86_7230_0100, 0x3000_0000))])
    with pytest.raises(NotPatchable, match="captures differ in kernel"):
        patch_sites(a, b, A, B, SIZES, [kernel(words(A[0]))])
    # Stack bytes that differ only in B (the odd capture) are caught by D, over B's buffers
    # again: a word differing within either pair is capture-local.
    a = [kernel(words(A[0], 0x101, 0x3000_0000))]
    b = [kernel(words(B[0], 0xDD00_0101, 0x3000_0000))]
    d = [kernel(words(B[0], 0x101, 0x3000_0000))]
    assert patch_sites(a, b, A, B, SIZES, a, nodes_d=d) == [PatchSite(0, 0, 0, 0)]
    with pytest.raises(NotPatchable, match="the word at byte 8"):
        patch_sites(a, b, A, B, SIZES, a, nodes_d=b)
    with pytest.raises(NotPatchable, match="1, 1, 1 and 2 nodes"):
        patch_sites(a, b, A, B, SIZES, a, nodes_d=d + d)


def test_words_that_differ_per_staging_set_are_kept_only_where_no_io_address_can_be():
    # torch's sort/scatter kernels pass struct padding holding a host heap pointer, and some
    # kernels a temporary of the capture's own pool, that are the same in A and C and differ
    # in B. Kept as A has them only where the driver says no memory lies there (host) or the
    # memory is an allocation holding no staging buffer (the graph's own).
    heap_a, heap_b = 0x5600_1234_5670, 0x5600_1234_9990
    pool_a, pool_b = 0x7C00_0000_1200, 0x7C00_0000_2200
    segment = {A[0]: 0x7F00_0000_0000, A[1]: 0x7F00_0000_0000, B[0]: 0x7E00_0000_0000,
               B[1]: 0x7E00_0000_0000, pool_a: 0x7C00_0000_0000, pool_b: 0x7C00_0000_0000,
               A[0] + 8192: 0x7F00_0000_0000}
    asked: list[list[int]] = []

    def allocation_of(ws):
        asked.append(list(ws))
        return [segment.get(w, 0) for w in ws]

    def diff(wa, wb, **kw):
        a, b = [kernel(words(A[0], wa, 7))], [kernel(words(B[0], wb, 7))]
        return patch_sites(a, b, A, B, SIZES, a, **kw)
    kept: list[str] = []
    assert diff(heap_a, heap_b, allocation_of=allocation_of, kept=kept) == [PatchSite(0, 0, 0, 0)]
    assert diff(pool_a, pool_b, allocation_of=allocation_of, kept=kept) == [PatchSite(0, 0, 0, 0)]
    assert kept == ["node 0 (kernel fusion_1) byte 8 (host word)",
                    "node 0 (kernel fusion_1) byte 8 (device word outside the arguments/results)"]
    assert asked[0] == [heap_a, heap_b] + A + B       # one question for all words
    with pytest.raises(NotPatchable, match="byte 8 .*points into an argument or result's allocation"):
        diff(A[0] + 8192, pool_b, allocation_of=allocation_of)    # past buffer 0's end
    for wa, wb in ((5, 6), (heap_a, pool_b)):                      # a number; host vs device
        with pytest.raises(NotPatchable, match="byte 8 .*it is no address"):
            diff(wa, wb, allocation_of=allocation_of)
    with pytest.raises(NotPatchable, match="the word at byte 8"):  # no driver to ask
        diff(heap_a, heap_b)


def test_a_fill_of_the_captures_own_memory_is_kept_and_one_of_an_argument_is_not():
    """A memset node whose destination is a temporary of the capture's pool (torch's
    scatter-add zeroes one: the held-out GPT step kept the Python path for it) is kept as
    capture A has it; one of an argument or result, or at a host word, is refused."""
    pool_a, pool_b, heap_a, heap_b = 0x7C00_0000_1200, 0x7C00_0000_2200, 0x5600_0000_10, \
        0x5600_0000_90
    segment = {A[0]: 0x7F00_0000_0000, A[1]: 0x7F00_0000_0000, B[0]: 0x7E00_0000_0000,
               B[1]: 0x7E00_0000_0000, pool_a: 0x7C00_0000_0000, pool_b: 0x7C00_0000_0000}

    def allocation_of(ws):
        return [segment.get(w, 0) for w in ws]

    def diff(wa, wb):
        a = [kernel(words(A[0], 7)), NodeInfo("memset", b"", words(wa, 0, 4, 64))]
        b = [kernel(words(B[0], 7)), NodeInfo("memset", b"", words(wb, 0, 4, 64))]
        kept: list[str] = []
        return patch_sites(a, b, A, B, SIZES, a, allocation_of=allocation_of, kept=kept), kept
    assert diff(pool_a, pool_b) == ([PatchSite(0, 0, 0, 0)],
                                    ["node 1 (memset) byte 0 (device word outside the "
                                     "arguments/results)"])
    with pytest.raises(NotPatchable, match="node 1 \\(memset\\) reads or writes an argument"):
        diff(A[1] + 64, B[1] + 64)
    with pytest.raises(NotPatchable, match="byte 0 .*it is no address"):
        diff(heap_a, heap_b)


def test_a_word_before_a_buffer_is_a_site_only_within_its_own_allocation_skew():
    # A kernel given a tensor's storage start (the staging buffer's allocation, SKEW bytes
    # before the buffer) and the offset apart: the same negative offset in both captures.
    a, b = [kernel(words(A[1] - 64, A[0] - 8))], [kernel(words(B[1] - 64, B[0] - 8))]
    assert patch_sites(a, b, A, B, SIZES, skew=64) == [PatchSite(0, 0, 1, -64),
                                                        PatchSite(0, 8, 0, -8)]
    for wa, wb in ((A[1] - 72, B[1] - 72), (A[1] - 64, B[1] - 56)):   # past the skew; offsets differ
        with pytest.raises(NotPatchable, match="the word at byte 0"):
            patch_sites([kernel(words(wa))], [kernel(words(wb))], A, B, SIZES, skew=64)
    with pytest.raises(NotPatchable, match="the word at byte 0"):      # no skew: not a site
        patch_sites([kernel(words(A[1] - 64))], [kernel(words(B[1] - 64))], A, B, SIZES)


def test_identical_captures_need_no_patching():
    n = [kernel(words(FIXED, 3, 4))]
    assert patch_sites(n, n, A, B, SIZES) == []


@pytest.mark.parametrize("wa, wb, why", [
    (A[0] + 8, B[1] + 8, "not the same place"),          # buffer 0 in A, buffer 1 in B
    (A[0] + 8, B[0] + 16, "not the same place"),         # different offsets
    (A[1] + 300, B[1] + 300, "not the same place"),      # past the end of buffer 1
    (5, 6, "not the same place"),                        # a scalar that changed
])
def test_a_differing_word_that_is_no_address_pair_is_not_patchable(wa, wb, why):
    with pytest.raises(NotPatchable, match=rf"node 0 \(kernel fusion_1\): the word at byte 8 .*{why}"):
        patch_sites([kernel(words(FIXED, wa))], [kernel(words(FIXED, wb))], A, B, SIZES)


def test_different_kernels_node_counts_and_node_kinds_are_not_patchable():
    with pytest.raises(NotPatchable, match="captures differ in kernel, launch geometry"):
        patch_sites([kernel(words(A[0]), key=b"f1")], [kernel(words(B[0]), key=b"f2")], A, B, SIZES)
    with pytest.raises(NotPatchable, match="2, 1, 2 and 1 nodes"):
        patch_sites([kernel(b""), kernel(b"")], [kernel(b"")], A, B, SIZES)
    host = NodeInfo("host", b"", b"")
    with pytest.raises(NotPatchable, match="a host node"):
        patch_sites([host], [host], A, B, SIZES)
    with pytest.raises(NotPatchable, match="past the last whole word"):
        patch_sites([kernel(words(1) + b"\x01")], [kernel(words(1) + b"\x02")], A, B, SIZES)


def test_staging_sets_must_be_disjoint_and_not_overlap():
    with pytest.raises(ValueError, match="different staging"):
        patch_sites([], [], A, A, SIZES)
    with pytest.raises(ValueError, match="overlap"):
        patch_sites([], [], [0x1000, 0x1800], B, SIZES)


def test_parse_nodes_reads_what_the_library_serializes():
    raw = (struct.pack("<iIII", 0, 2, 8, 3) + b"ky" + words(7) + b"abc"
           + struct.pack("<iIII", 2, 0, 0, 0) + struct.pack("<iIII", 99, 0, 0, 0))
    nodes = patch.parse_nodes(raw)
    assert nodes == [NodeInfo("kernel", b"ky", words(7), "abc"), NodeInfo("memset", b"", b""),
                     NodeInfo("type 99", b"", b"")]


# --- the library -------------------------------------------------------------------------------
def _gpu_present() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except ImportError:
        return False


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    # The library is built (a C++ compile, ~5 s) where it is used: on a GPU machine, or
    # where HLOTK_NATIVE_TESTS=1 asks for it. CI (no GPU) compiles nothing.
    from runtime.cuda import native
    if not (_gpu_present() or os.environ.get("HLOTK_NATIVE_TESTS") == "1"):
        pytest.skip("builds the native launcher: only on a GPU machine or with "
                    "HLOTK_NATIVE_TESTS=1")
    if native.compiler() is None:
        pytest.skip("no C++ compiler on this machine (the Python path is used)")
    os.environ.setdefault("HLOTK_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    return native.library()


def test_library_builds_and_says_clearly_when_the_driver_is_missing(lib):
    from runtime.cuda import native
    assert lib.hk_version() == 1
    err = ctypes.create_string_buffer(512)
    status = lib.hk_init(err, 512)
    if status != 0:              # no GPU driver here: the message names the library
        assert b"libcuda.so.1" in err.value or b"cuInit" in err.value
    assert native.build() == native.build()      # cached: the same file, not rebuilt


def test_a_failing_build_names_the_compiler_and_leaves_no_file(tmp_path, monkeypatch):
    from runtime.cuda import native
    from runtime.cuda.errors import NativeLauncherError
    monkeypatch.setenv("CXX", "false")           # a "compiler" that always fails
    with pytest.raises(NativeLauncherError, match="false .* failed"):
        native.build(tmp_path)
    assert [p for p in (tmp_path / "native").iterdir() if p.suffix == ".so"] == []
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(NativeLauncherError, match="no-such-compiler"):
        native.build(tmp_path)


def _dry_exec(lib, blobs, sites, n_buffers, n_args, ret_buffer):
    from runtime.cuda.native import int_array
    c = ctypes
    bufs = [c.create_string_buffer(b, len(b)) for b in blobs]
    ptrs = (c.c_void_p * len(bufs))(*[c.cast(b, c.c_void_p) for b in bufs])
    err = c.create_string_buffer(512)
    exe_id = lib.hk_exec_create_dry(
        len(blobs), int_array([0] * len(blobs), c.c_int32), ptrs,
        int_array([len(b) for b in blobs], c.c_uint64), n_buffers, n_args, len(ret_buffer),
        int_array(ret_buffer, c.c_int32), len(sites), int_array([s.node for s in sites], c.c_int32),
        int_array([s.offset for s in sites], c.c_int64), int_array([s.buffer for s in sites], c.c_int32),
        int_array([s.delta for s in sites], c.c_int64), err, 512)
    assert exe_id > 0, err.value
    return exe_id


def _blob_words(lib, exe_id, node, n):
    out = ctypes.create_string_buffer(8 * n)
    size = ctypes.c_uint64(8 * n)
    assert lib.hk_exec_blob(exe_id, node, out, ctypes.byref(size)) == 0
    return struct.unpack(f"<{n}Q", out.raw[:8 * n])


def _stats(lib, exe_id):
    raw = (ctypes.c_uint64 * 6)()
    assert lib.hk_exec_stats(exe_id, raw) == 0
    return list(raw)


def test_ffi_handler_patches_jax_buffer_addresses_through_jax_jit(lib):
    """Three buffers: arguments x, p (donated, aliased to result 1) and result 0. Node 0
    reads x and p, node 1 writes result 0 at an offset; the dry-run handler (the real
    handler's mapping and patching, no CUDA) writes XLA's addresses into the blobs."""
    from runtime.cuda.native import DRY_RUN_TARGET
    sites = [PatchSite(0, 0, 0, 0), PatchSite(0, 16, 1, 0), PatchSite(1, 8, 2, 64)]
    exe_id = _dry_exec(lib, [words(0, 7, 0), words(9, 0)], sites, n_buffers=3, n_args=2,
                       ret_buffer=[2, -1])
    out_types = [jax.ShapeDtypeStruct((64,), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.float32)]
    call = jax.ffi.ffi_call(DRY_RUN_TARGET, out_types, input_output_aliases={1: 1})
    f = jax.jit(lambda x, p: call(x, p, exe=np.int64(exe_id)), donate_argnums=(1,))
    x = jnp.arange(16, dtype=jnp.float32) + 1
    p = jnp.zeros(8, jnp.float32) + 2
    x_addr, p_addr = x.unsafe_buffer_pointer(), p.unsafe_buffer_pointer()
    r0, r1 = f(x, p)
    assert p.is_deleted()                        # donated
    assert r1.unsafe_buffer_pointer() == p_addr  # the result is the donated buffer
    assert _blob_words(lib, exe_id, 0, 3) == (x_addr, 7, p_addr)
    assert _blob_words(lib, exe_id, 1, 2) == (9, r0.unsafe_buffer_pointer() + 64)
    calls, patched, changes = _stats(lib, exe_id)[:3]
    assert (calls, patched, changes) == (1, 2, 3)
    # Same x, another p: node 0 is patched again (p moved), x's word written unchanged.
    p2 = jnp.zeros(8, jnp.float32) + 3
    p2_addr = p2.unsafe_buffer_pointer()
    r0b, _ = f(x, p2)
    assert _blob_words(lib, exe_id, 0, 3) == (x_addr, 7, p2_addr)
    assert _blob_words(lib, exe_id, 1, 2) == (9, r0b.unsafe_buffer_pointer() + 64)
    assert _stats(lib, exe_id)[0] == 2
    lib.hk_exec_destroy(exe_id)
    with pytest.raises(Exception, match="executable .* is gone"):
        jax.block_until_ready(f(x, jnp.zeros(8, jnp.float32)))


def _launch(lib, exe_id, addresses):
    """hk_exec_launch of a dry-run plan (patches, launches nothing): the message or None."""
    from runtime.cuda.native import int_array
    err = ctypes.create_string_buffer(512)
    status = lib.hk_exec_launch(exe_id, int_array(addresses, ctypes.c_uint64), len(addresses),
                                0, err, 512)
    return None if status == 0 else err.value.decode()


def test_slots_keep_alternating_address_sets_patched(lib):
    """Two slots (instantiations): calls alternating between two result buffers patch
    nothing once both are filled; a third set overwrites the least recently used slot,
    patching only the nodes of the buffer that differs; a refused (unaligned) call leaves
    the slots as they were."""
    sites = [PatchSite(0, 0, 0, 0), PatchSite(1, 8, 1, 64)]   # node 0: x, node 1: result
    exe_id = _dry_exec(lib, [words(0), words(5, 0)], sites, n_buffers=2, n_args=1,
                       ret_buffer=[1])
    err = ctypes.create_string_buffer(512)
    assert lib.hk_exec_add_slots(exe_id, 0, 1, err, 512) == 2
    x, r1, r2, r3 = 0x10000, 0x20000, 0x30000, 0x40000

    def patched(addresses):
        before = _stats(lib, exe_id)[1]
        assert _launch(lib, exe_id, addresses) is None
        return _stats(lib, exe_id)[1] - before
    assert patched([x, r1]) == 2          # slot 0, first use: every node
    assert patched([x, r2]) == 2          # slot 1, first use: every node (slot 0 kept)
    assert _blob_words(lib, exe_id, 1, 2) == (5, r2 + 64)
    assert [patched([x, r1]), patched([x, r2]), patched([x, r1])] == [0, 0, 0]
    assert patched([x, r3]) == 1          # least recently used (r2's) slot, node 1 only
    assert _blob_words(lib, exe_id, 1, 2) == (5, r3 + 64)
    assert patched([x, r1]) == 0          # r1's slot was kept
    message = _launch(lib, exe_id, [x, r2 + 8])
    assert message is not None and "not 64-byte aligned" in message
    assert patched([x, r3]) == 0 and patched([x, r1]) == 0
    lib.hk_exec_destroy(exe_id)


def test_one_slot_patches_every_moved_buffer(lib):
    exe_id = _dry_exec(lib, [words(0), words(5, 0)], [PatchSite(0, 0, 0, 0),
                                                      PatchSite(1, 8, 1, 64)],
                       n_buffers=2, n_args=1, ret_buffer=[1])
    for addresses, nodes in [([0x1000, 0x2000], 2), ([0x1000, 0x3000], 1),
                             ([0x1000, 0x2000], 1), ([0x1000, 0x2000], 0)]:
        before = _stats(lib, exe_id)[1]
        assert _launch(lib, exe_id, addresses) is None
        assert _stats(lib, exe_id)[1] - before == nodes
    assert _blob_words(lib, exe_id, 1, 2) == (5, 0x2000 + 64)
    lib.hk_exec_destroy(exe_id)


def test_ffi_handler_rejects_a_call_with_the_wrong_number_of_operands(lib):
    from runtime.cuda.native import DRY_RUN_TARGET
    exe_id = _dry_exec(lib, [words(0)], [PatchSite(0, 0, 0, 0)], n_buffers=2, n_args=1,
                       ret_buffer=[1])
    call = jax.ffi.ffi_call(DRY_RUN_TARGET, [jax.ShapeDtypeStruct((4,), jnp.float32)])
    x = jnp.ones(4)
    with pytest.raises(Exception, match="called with 2 operands and 1 results; compiled for 1 and 1"):
        jax.block_until_ready(jax.jit(lambda a, b: call(a, b, exe=np.int64(exe_id)))(x, x))
    lib.hk_exec_destroy(exe_id)


def test_bad_patch_plans_are_refused_by_the_library(lib):
    from runtime.cuda.native import int_array
    c = ctypes
    err = c.create_string_buffer(512)
    blob = c.create_string_buffer(8)
    ptrs = (c.c_void_p * 1)(c.cast(blob, c.c_void_p))
    one = int_array([0], c.c_int32)

    def create(site_offset, site_buffer, ret_buffer):
        return lib.hk_exec_create_dry(1, one, ptrs, int_array([8], c.c_uint64), 2, 1, 1,
                                      int_array([ret_buffer], c.c_int32), 1, one,
                                      int_array([site_offset], c.c_int64),
                                      int_array([site_buffer], c.c_int32),
                                      int_array([0], c.c_int64), err, 512)
    assert create(8, 0, 1) == -1 and b"outside" in err.value       # past the blob
    assert create(0, 5, 1) == -1 and b"out of range" in err.value  # no such buffer
    assert create(0, 0, 0) == -1 and b"result 0 maps to buffer 0" in err.value


# --- falling back to the Python path ------------------------------------------------------------
@pytest.fixture
def fresh_warnings(monkeypatch):
    from runtime.cuda import native
    monkeypatch.setattr(native, "_WARNED", set())


def _guarded_run(fast, slow_result=None, slow_error=None):
    from runtime.cuda.native import front
    log = {"slow": 0, "disabled": 0, "declined": 0}

    def slow(args, kwargs):
        log["slow"] += 1
        if slow_error is not None:
            raise slow_error
        return slow_result

    def count(key):
        return lambda: log.__setitem__(key, log[key] + 1)
    return front._guarded(fast, slow, [0, 0.0], "step", count("disabled"),
                          on_decline=count("declined")), log


def _raise(e):
    def fast(*args, **kwargs):
        raise e
    return fast


def test_a_failing_native_call_warns_turns_itself_off_and_returns_the_python_result(
        fresh_warnings):
    from runtime.cuda import NativeLauncherWarning
    run, log = _guarded_run(_raise(RuntimeError("XLA refused the custom call")), slow_result=42)
    with pytest.warns(NativeLauncherWarning, match=r"step: the native call failed \(RuntimeError: "
                      r"XLA refused the custom call\); calls take the Python path"):
        assert run((1,), {}) == 42
    assert log == {"slow": 1, "disabled": 1, "declined": 0}   # later calls skip ``fast``


def test_bad_arguments_raise_the_checked_paths_error_and_keep_the_native_path(fresh_warnings):
    from hlo.errors import InvalidArgumentError
    run, log = _guarded_run(_raise(TypeError("str is not a valid JAX type")),
                            slow_error=InvalidArgumentError("argument 0: a str"))
    with pytest.raises(InvalidArgumentError, match="argument 0"):
        run(("x",), {})
    assert log["disabled"] == 0


def test_a_declined_signature_takes_the_python_path_silently():
    import warnings
    from runtime.cuda.native.front import Declined
    run, log = _guarded_run(_raise(Declined()), slow_result=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run((), {}) == 7
    assert log == {"slow": 1, "disabled": 0, "declined": 1}


def test_a_handler_failure_reruns_on_the_python_path_unless_arguments_were_donated(
        fresh_warnings):
    from runtime.cuda import NativeLauncherError, NativeLauncherWarning
    failure = RuntimeError("INTERNAL: hlotk native graph: buffer 0's device address 0x8 is "
                           "not 64-byte aligned")
    x = jnp.ones(3)
    run, log = _guarded_run(_raise(failure), slow_result="python")
    with pytest.warns(NativeLauncherWarning, match="not 64-byte aligned"):
        assert run((x,), {}) == "python"
    donated = jnp.ones(3)
    donated.delete()
    run, log = _guarded_run(_raise(failure), slow_result="python")
    with pytest.raises(NativeLauncherError, match="hlotk native graph: buffer 0"):
        run((donated,), {})
    assert log == {"slow": 0, "disabled": 1, "declined": 0}


# --- which programs may take the native path (the CUDA executable, built on any machine) -----
try:
    import torch
    HAS_CUDA = bool(torch.cuda.is_available())
except ImportError:
    torch, HAS_CUDA = None, False
if torch is not None and not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton is imported
needs_torch = pytest.mark.skipif(torch is None, reason="the CUDA executable needs torch")


def _exe(fn, *args, **kw):
    pytest.importorskip("triton")
    import runtime
    from runtime.cuda import executable_of
    return executable_of(runtime.jit(fn, backend="cuda", **kw).lower(*args).compile())


@needs_torch
def test_straight_line_programs_qualify_and_their_buffers_are_numbered():
    from runtime.cuda.native import launcher
    x = np.ones((4, 8), np.float32)
    exe = _exe(lambda a, b: (jnp.sin(a) * 2, a + b), x, x)
    assert launcher.program_reason(exe) is None
    buffers, ret_buffer, aliases = launcher.io_plan(exe)
    params = [exe.table[p.uid][()].allocation for p in exe.module.entry.parameters]
    assert buffers[:2] == params and len(buffers) == 4
    assert ret_buffer == [2, 3] and aliases == {}
    assert [exe.output_slots[j].allocation for j in (0, 1)] == buffers[2:]
    if not HAS_CUDA:
        assert launcher.eligibility(exe) == "not on a GPU"


@needs_torch
def test_donated_parameter_is_its_result_buffer():
    from runtime.cuda.native import launcher
    x = np.ones(64, np.float32)
    exe = _exe(lambda p, g: (p - 0.1 * g, g * 2), x, x, donate_argnums=(0,))
    buffers, ret_buffer, aliases = launcher.io_plan(exe)
    assert aliases == {0: 0} and ret_buffer == [-1, 2] and len(buffers) == 3


@needs_torch
def test_host_control_flow_keeps_the_python_path():
    from jax import lax
    from runtime.cuda.native import launcher
    x = np.ones(8, np.float32)
    # The trip count depends on the data: the predicate is read back every iteration.
    exe = _exe(lambda v: lax.while_loop(lambda c: c[1][0] < 40.0, lambda c: (c[0] + 1, c[1] * 2),
                                        (0, v))[1], x)
    assert "host control flow" in launcher.program_reason(exe)
    assert "while" in launcher.program_reason(exe)
    # Counting from a constant to a constant: the body runs 3 times, no predicate read,
    # nothing keeps the program off one graph (hlo/trip_count.py).
    exe = _exe(lambda v: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2),
                                        (0, v))[1], x)
    assert launcher.program_reason(exe) is None


@needs_torch
def test_build_and_capture_failures_warn_and_keep_the_python_path(monkeypatch, fresh_warnings):
    from runtime.cuda import NativeLauncherError, NativeLauncherWarning, native
    from runtime.cuda.native import front, launcher
    monkeypatch.setattr(launcher, "eligibility", lambda exe: None)   # as on a GPU
    monkeypatch.setattr(front, "jax_sees", lambda device: None)

    def no_library():
        raise NativeLauncherError("no C++ compiler found")
    monkeypatch.setattr(native, "driver_library", no_library)
    x = np.ones(8, np.float32)
    exes = [_exe(lambda a: a * k, x) for k in (2.0, 3.0)]
    with pytest.warns(NativeLauncherWarning, match="unavailable: no C\\+\\+ compiler found"):
        assert exes[0].native_graph() is None
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # the library's failure is said once per process
        assert exes[1].native_graph() is None
    assert "no C++ compiler" in exes[1].native_reason
    assert "host path: python (the native launcher is unavailable" in exes[1].report()

    def not_patchable(exe):
        raise launcher.NotPatchable("node 3 (kernel k): the word at byte 8 differs")
    monkeypatch.setattr(native, "driver_library", lambda: None)
    monkeypatch.setattr(launcher, "NativeGraph", not_patchable)
    exe = _exe(lambda a: a - 1.0, x)
    with pytest.warns(NativeLauncherWarning, match="cannot run this executable "
                      "\\(NotPatchable: node 3"):
        assert exe.native_graph() is None


def test_which_first_calls_take_the_python_path(monkeypatch):
    from runtime.jit import first_call_python
    monkeypatch.delenv("HLOTK_NATIVE_FIRST_CALL", raising=False)
    assert first_call_python("cuda", ())
    assert first_call_python("cuda", frozenset())
    assert not first_call_python("cpu", ())              # no native graph there at all
    assert not first_call_python("cuda", (0,))           # donated: the native call aliases
    assert not first_call_python("cuda", frozenset({1}))
    monkeypatch.setenv("HLOTK_NATIVE_FIRST_CALL", "1")
    assert not first_call_python("cuda", ())


# --- on a GPU ------------------------------------------------------------------------------------
gpu = pytest.mark.gpu


def _jax_gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here (set JAX_PLATFORMS=cuda,cpu)")


def _close(got, want, tol):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert isinstance(g, jax.Array) and g.shape == np.shape(w) and g.dtype == np.asarray(w).dtype
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.dtype == jnp.bfloat16:       # one rounding apart anywhere: compare norms
            assert np.linalg.norm(g64 - w64) <= 2e-2 * np.linalg.norm(w64)
        else:
            np.testing.assert_allclose(g64, w64, rtol=tol, atol=tol)


@gpu
@pytest.mark.parametrize("name", ["giou_boxes", "softmax_f32", "layer_norm_bf16",
                                  "mlp_train_step", "transformer_block", "bf16_matmul_f32_acc",
                                  "bf16_matmul_bf16_out"])
def test_native_path_equals_jax_jit_and_the_python_path_bitwise(name):
    from runtime.cuda import executable_of
    from tests.zoo import by_name
    import runtime
    prog = by_name(name)
    dev = _jax_gpu()
    with jax.default_matmul_precision("highest"):
        args = jax.device_put(prog.args(), dev)
        c = runtime.jit(prog.fn, backend="cuda").lower(*args).compile()
        want = jax.jit(prog.fn)(*args)
        got = [c(*args) for _ in range(3)]
    exe = executable_of(c)
    if exe.native is None:
        pytest.skip(f"{name} keeps the Python path: {exe.native_reason}")
    for g in got:
        _close(g, want, max(prog.rtol, prog.atol, 1e-4))
    python = exe.run(jax.tree_util.tree_leaves(args), output="numpy")
    for a, b in zip(jax.tree_util.tree_leaves(got[-1]), python):
        np.testing.assert_array_equal(np.asarray(a), b)     # the same kernels, bit for bit
    assert "host path: native" in exe.report()


@gpu
def test_donation_reuses_the_buffers_and_held_results_are_never_overwritten():
    import runtime
    from runtime.cuda import executable_of
    dev = _jax_gpu()

    def step(p, m, g):      # momentum SGD: new p and new m from one multi-output fusion
        m2 = jax.tree.map(lambda a, b: 0.9 * a + b, m, g)
        return jax.tree.map(lambda a, b: a - 0.5 * b, p, m2), m2
    f = runtime.jit(step, backend="cuda", donate_argnums=(0, 1))
    r = np.random.default_rng(0)
    shapes = {"w": (64, 32), "b": (32,)}
    p = jax.device_put({k: r.standard_normal(s).astype(np.float32) for k, s in shapes.items()}, dev)
    m = jax.device_put({k: r.standard_normal(s).astype(np.float32) for k, s in shapes.items()}, dev)
    g = jax.device_put({k: np.ones(s, np.float32) for k, s in shapes.items()}, dev)
    want = jax.jit(step)(p, m, g)
    addrs = (p["w"].unsafe_buffer_pointer(), m["w"].unsafe_buffer_pointer())
    out = f(p, m, g)
    assert p["w"].is_deleted() and m["w"].is_deleted()
    assert (out[0]["w"].unsafe_buffer_pointer(), out[1]["w"].unsafe_buffer_pointer()) == addrs
    _close(out, want, 1e-6)
    state = out
    for _ in range(3):                 # a training loop: results fed back, donated again
        want = jax.jit(step)(*jax.tree.map(jnp.copy, state), g)
        state = f(*state, g)
        _close(state, want, 1e-5)
    exe = executable_of(f._cache[next(iter(f._cache))])
    assert exe.native is not None and exe.native.aliases, exe.native_reason
    assert f._front, "runtime.jit's call is the jitted native front"
    text = f._front_jit.lower(*state, g).compile().as_text()
    assert " copy(" not in text, "XLA copied donated buffers around the FFI call"
    keep = runtime.jit(step, backend="cuda")        # no donation: every result is kept
    held, ref = [keep(*state, g)], [jax.jit(step)(*state, g)]
    for _ in range(3):          # each call's inputs are the previous, still held, results
        held.append(keep(*held[-1], g))
        ref.append(jax.jit(step)(*ref[-1], g))
    for h, w in zip(held, ref):  # checked after all calls: none was written over
        _close(h, w, 1e-5)


@gpu
def test_results_written_by_copies_follow_the_output_addresses():
    # The same value returned twice: the second result is a copy, captured as a kernel (a
    # memcpy node could not be re-pointed), re-pointed every call while earlier results
    # stay alive.
    import runtime
    from runtime.cuda import executable_of
    dev = _jax_gpu()
    fn = lambda x: (x * 3.0, x * 3.0 + 0.0, x[::-1] - 1.0)  # noqa: E731
    c = runtime.jit(fn, backend="cuda").lower(jax.ShapeDtypeStruct((4096,), jnp.float32)).compile()
    xs = [jax.device_put(np.arange(4096, dtype=np.float32) * k, dev) for k in range(1, 6)]
    held = [c(x) for x in xs]
    exe = executable_of(c)
    for x, h in zip(xs, held):
        _close(h, jax.jit(fn)(x), 1e-5)
    assert exe.native is not None, exe.native_reason
    assert {n.kind for n in exe.native.nodes} == {"kernel"}, exe.report()


@gpu
def test_results_are_right_on_every_slot_as_address_sets_come_back():
    # More address sets than slots (4): calls whose results are held (every call a new set,
    # slots reused least recently used first), then calls over a few argument sets with the
    # results dropped (sets recur: slots launched as they were patched, nothing re-pointed).
    import runtime
    from runtime.cuda import executable_of
    dev = _jax_gpu()
    fn = lambda x, y: (x * 2.0 + y, y - x)  # noqa: E731
    spec = jax.ShapeDtypeStruct((2048,), jnp.float32)
    c = runtime.jit(fn, backend="cuda").lower(spec, spec).compile()
    rng = np.random.default_rng(3)
    sets = [[jax.device_put(rng.standard_normal(2048).astype(np.float32), dev) for _ in "xy"]
            for _ in range(6)]
    want = [tuple(np.asarray(w) for w in jax.jit(fn)(*a)) for a in sets]
    order = [0, 1, 2, 3, 4, 5, 0, 2, 5, 1, 3, 4]
    held = [c(*sets[i]) for i in order]
    for i, h in zip(order, held):
        _close(h, want[i], 1e-6)
    del held
    for i in [0, 1, 0, 1, 2, 0, 1, 2, 3, 4, 5, 5, 0, 1, 0, 1]:
        _close(c(*sets[i]), want[i], 1e-6)
    exe = executable_of(c)
    assert exe.native is not None and exe.native.slots == 4, exe.report()


@gpu
def test_copy_and_fill_nodes_on_staged_buffers_become_kernels_with_the_drivers_results():
    # Memcpy/memset nodes recorded from the driver API (what cudaMemcpyAsync/cudaMemsetAsync
    # capture as) over staging tensors: those touching the given ranges are replaced by the
    # launcher's PTX copy/fill kernels; the graph then computes what the driver calls would.
    import ctypes
    import torch
    from runtime.cuda.native import driver_library, int_array
    lib = driver_library()
    cu = ctypes.CDLL("libcuda.so.1")
    u64 = ctypes.c_uint64
    src = torch.arange(4096, dtype=torch.uint8, device="cuda").add_(7)
    dst = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    other = torch.zeros(4096, dtype=torch.uint8, device="cuda")   # not in any range
    p_src, p_dst, p_other = src.data_ptr(), dst.data_ptr(), other.data_ptr()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        h = ctypes.c_void_p(stream.cuda_stream)
        ops = [  # (driver call, arguments): wide (16-byte) path, byte path, fills, untouched
            (cu.cuMemcpyDtoDAsync_v2, (u64(p_dst), u64(p_src), ctypes.c_size_t(1000), h)),
            (cu.cuMemcpyDtoDAsync_v2, (u64(p_dst + 1003), u64(p_src + 5), ctypes.c_size_t(333), h)),
            (cu.cuMemsetD8Async, (u64(p_dst + 1500), ctypes.c_ubyte(0xAB), ctypes.c_size_t(77), h)),
            (cu.cuMemsetD2D16Async, (u64(p_dst + 2048), ctypes.c_size_t(64), ctypes.c_ushort(0x1234),
                                     ctypes.c_size_t(10), ctypes.c_size_t(5), h)),
            (cu.cuMemsetD32Async, (u64(p_dst + 3072), ctypes.c_uint(0xDEADBEEF), ctypes.c_size_t(100), h)),
            (cu.cuMemcpyDtoDAsync_v2, (u64(p_other), u64(p_other + 2048), ctypes.c_size_t(512), h)),
        ]
        try:
            for fn, args in ops:
                assert fn(*args) == 0
        finally:
            graph.capture_end()
    err = ctypes.create_string_buffer(1024)
    starts, sizes = [p_src, p_dst], [4096, 4096]
    lowered = lib.hk_graph_lower_copies(graph.raw_cuda_graph(), 2, int_array(starts, u64),
                                        int_array(sizes, u64), err, 1024)
    assert lowered == 5, err.value
    want = np.zeros(4096, np.uint8)
    s = (np.arange(4096) + 7).astype(np.uint8)
    want[:1000] = s[:1000]
    want[1003:1336] = s[5:338]
    want[1500:1577] = 0xAB
    for r in range(5):
        want[2048 + 64 * r:2048 + 64 * r + 20] = np.frombuffer(np.uint16(0x1234).tobytes() * 10, np.uint8)
    want[3072:3472] = np.frombuffer(np.uint32(0xDEADBEEF).tobytes() * 100, np.uint8)
    graph.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(dst.cpu().numpy(), want)
    assert other.abs().sum().item() == 0       # the untouched copy still ran: zeros to zeros


@gpu
def test_memcpy_nodes_of_arguments_and_results_run_as_copy_kernels_on_the_native_path(monkeypatch):
    # The executable returns its argument (a copy into the result) and a reversed copy. With
    # the runtime's own kernel copies off, the capture records memcpy nodes from the argument
    # into the results, which the driver will not re-point at XLA's buffers: the launcher
    # replaces them by its copy kernel. New arguments every call, earlier results held.
    import runtime
    from runtime.cuda import executable_of
    from runtime.cuda.native import launcher
    context = launcher.NativeGraph._context

    def memcpy_context(self):
        ctx = context(self)
        ctx.kernel_copies = False          # thunks.copy_bytes: Tensor.copy_, a memcpy node
        return ctx
    monkeypatch.setattr(launcher.NativeGraph, "_context", memcpy_context)
    dev = _jax_gpu()
    fn = lambda x, y: (x, y * 2.0, x[::-1] + y)  # noqa: E731
    spec = jax.ShapeDtypeStruct((1001,), jnp.float32)          # 4004 bytes: a byte tail
    c = runtime.jit(fn, backend="cuda").lower(spec, spec).compile()
    rng = np.random.default_rng(1)
    calls = [[jax.device_put(rng.standard_normal(1001).astype(np.float32), dev) for _ in "xy"]
             for _ in range(4)]
    held = [c(*a) for a in calls]
    exe = executable_of(c)
    assert exe.native is not None, exe.native_reason
    assert exe.native.lowered_copies >= 1 and "run as kernels" in exe.report(), exe.report()
    assert {n.kind for n in exe.native.nodes} == {"kernel"}, exe.report()
    for a, h in zip(calls, held):
        _close(h, jax.jit(fn)(*a), 0)


@gpu
def test_runtime_jit_front_with_static_and_keyword_arguments_and_bad_arguments():
    import runtime
    from hlo.errors import InvalidArgumentError
    dev = _jax_gpu()
    f = runtime.jit(lambda x, n, *, scale: {"y": x * n * scale, "s": (x * scale).sum()},
                    backend="cuda", static_argnums=(1,))
    x = jax.device_put(np.arange(12, dtype=np.float32).reshape(3, 4), dev)
    s = jax.device_put(np.float32(0.5), dev)
    out = f(x, 3, scale=s)
    _close(out, {"s": np.float32(33.0), "y": np.asarray(x) * 1.5}, 1e-6)
    f(x, 4, scale=s)
    assert f.cache_info().misses == 2
    with pytest.raises(InvalidArgumentError, match="argument 0"):
        f("not an array", 3, scale=s)


@gpu
def test_first_call_is_the_python_path_and_the_second_builds_the_native_graph(monkeypatch):
    import runtime
    from runtime.cuda import executable_of
    dev = _jax_gpu()
    fn = lambda x, y: (jnp.tanh(x) * y, (x - y).sum())  # noqa: E731
    rng = np.random.default_rng(5)
    x, y = (jax.device_put(rng.standard_normal((64, 96)).astype(np.float32), dev) for _ in "xy")
    want = jax.jit(fn)(x, y)
    f = runtime.jit(fn, backend="cuda")
    _close(f(x, y), want, 1e-6)
    exe = executable_of(f._cache[next(iter(f._cache))])
    assert exe.native is None and not f._front and "not tried" in exe.native_reason
    _close(f(x, y), want, 1e-6)
    assert exe.native is not None and f._front, exe.native_reason
    _close(f(x, y), want, 1e-6)
    # HLOTK_NATIVE_FIRST_CALL=1: the graph from the first call (a Compiled's too).
    monkeypatch.setenv("HLOTK_NATIVE_FIRST_CALL", "1")
    c = runtime.jit(fn, backend="cuda").lower(x, y).compile()
    _close(c(x, y), want, 1e-6)
    assert executable_of(c).native is not None


@gpu
def test_host_control_flow_takes_the_python_path_with_the_same_answer():
    from jax import lax
    import runtime
    from runtime.cuda import executable_of
    dev = _jax_gpu()
    # A data-dependent loop (a counted one, fori_loop(0, 3), is one graph: see below).
    fn = lambda v: lax.while_loop(lambda c: c[0] < 40.0,  # noqa: E731
                                  lambda c: (c[0] * 2 + 1, c[1] * 2), (v[0], v))[1]
    x = jax.device_put(np.ones(8, np.float32), dev)
    f = runtime.jit(fn, backend="cuda")
    _close(f(x), jax.jit(fn)(x), 1e-6)      # a first call is on the Python path anyway
    _close(f(x), jax.jit(fn)(x), 1e-6)      # the second decides: the checked path, still right
    exe = executable_of(f._cache[next(iter(f._cache))])
    assert exe.native is None and "while" in exe.native_reason
    assert "host path: python" in exe.report()
    counted = lambda v: lax.fori_loop(0, 3, lambda i, c: c * 2 + i, v)  # noqa: E731
    g = runtime.jit(counted, backend="cuda")
    _close(g(x), jax.jit(counted)(x), 1e-6)
    _close(g(x), jax.jit(counted)(x), 1e-6)
    exe = executable_of(g._cache[next(iter(g._cache))])
    assert exe.native is not None, exe.native_reason
