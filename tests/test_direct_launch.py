"""Direct launch of Triton kernels (codegen/triton/direct_launch.py, launch_params.py):
parameter layouts worked out by hand from Triton 3.6's launcher rules, the decision to keep
Triton's launch, and (on a GPU with Triton 3.6) launches equal to Triton's own, down to the
parameter bytes a captured graph node holds."""
from __future__ import annotations

import collections
import struct

import pytest

from codegen.triton import launch_params as lp

SIG = {"x": "*fp32", "y": "*bf16", "n": "i32", "BLOCK": "constexpr", "eps": "fp32",
       "flag": "i1", "m": "i64", "h": "bf16", "hf": "fp16", "u": "u8"}


def test_plan_skips_constexprs_and_gives_each_parameter_a_slot():
    plan = lp.plan_params(SIG)
    assert [p.index for p in plan.params] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert [p.name for p in plan.params] == ["x", "y", "n", "eps", "flag", "m", "h", "hf", "u"]
    # the two scratch addresses come last
    assert plan.sizes() == [8, 8, 4, 4, 1, 8, 2, 2, 1, 8, 8]
    assert plan.count == 11 and plan.nbytes == 88


class FakeTensor:
    def __init__(self, ptr: int, cuda: bool = True):
        self.ptr, self.is_cuda = ptr, cuda
        self.dtype = "float32"

    def data_ptr(self) -> int:
        return self.ptr


def test_pack_by_hand():
    plan = lp.plan_params(SIG)
    bound = [FakeTensor(0x7F0000001000), None, 1000, 64, 1e-5, True, -3, 1.5, 1.5, 200]
    raw = lp.pack(plan, bound)
    expected = bytes.fromhex(
        "0010000000 7f0000".replace(" ", "")   # x: the tensor's address, little-endian
        + "00" * 8                             # y: None is a null pointer
        + "e8030000" + "00" * 4                # n = 1000 as int32, padded to the slot
        + "acc52737" + "00" * 4                # eps = 1e-5 as float32 (0x3727c5ac)
        + "01" + "00" * 7                      # flag = True as one byte
        + "fdffffffffffffff"                   # m = -3 as int64
        + "c03f" + "00" * 6                    # h = 1.5 as bf16: 0x3fc0
        + "003e" + "00" * 6                    # hf = 1.5 as fp16: 0x3e00
        + "c8" + "00" * 7                      # u = 200 as uint8
        + "00" * 16)                           # global and profile scratch: none
    assert raw == expected


def test_bf16_is_truncated_like_triton_36():
    # 1 + 3/512: float32 0x3f80c000; rounding would give 0x3f81, Triton 3.6 truncates
    assert lp.bf16_bits(1.0 + 3 / 512) == 0x3F80
    assert lp.bf16_bits(-2.0) == 0xC000


def test_cpu_tensor_is_refused():
    plan = lp.plan_params({"x": "*fp32"})
    with pytest.raises(ValueError, match="not on a CUDA device"):
        lp.pack(plan, [FakeTensor(0x1000, cuda=False)])


@pytest.mark.parametrize("sig, why", [
    ({"d": "tensordesc<fp16[64, 64]>"}, "tensor descriptor"),
    ({"d": "nvTmaDesc"}, "tensor descriptor"),
    ({"t": ("*fp32", "i32")}, "tuple"),
    ({"x": "fp8e5"}, "does not know"),
])
def test_plan_refuses_what_it_cannot_express(sig, why):
    with pytest.raises(lp.Unsupported, match=why):
        lp.plan_params(sig)


Meta = collections.namedtuple("Meta", "name num_warps num_ctas shared global_scratch_size "
                              "profile_scratch_size launch_pdl launch_cooperative_grid "
                              "tensordesc_meta cluster_dims")


def meta(**kw):
    base = dict(name="k", num_warps=8, num_ctas=1, shared=1024, global_scratch_size=0,
                profile_scratch_size=0, launch_pdl=False, launch_cooperative_grid=False,
                tensordesc_meta=None, cluster_dims=(1, 1, 1))
    base.update(kw)
    return Meta(**base)


def test_launch_meta_reads_namedtuples_and_dicts():
    m = lp.launch_meta(meta(launch_pdl=True))
    assert (m.name, m.num_warps, m.shared, m.launch_pdl, m.cooperative) == ("k", 8, 1024, True, False)
    assert lp.launch_meta(dict(name="k2", num_warps=4, shared=0)).num_warps == 4


@pytest.mark.parametrize("kw, why", [
    (dict(num_ctas=2), "cluster"), (dict(cluster_dims=(2, 1, 1)), "cluster"),
    (dict(global_scratch_size=256), "global_scratch"),
    (dict(profile_scratch_size=64), "profile_scratch"),
    (dict(tensordesc_meta=[{"swizzle": 3}]), "tensor descriptors"),
    (dict(name=""), "names no kernel"),
])
def test_launch_meta_keeps_triton_for(kw, why):
    with pytest.raises(lp.Unsupported, match=why):
        lp.launch_meta(meta(**kw))


def test_versions_and_modes():
    assert lp.supported_version("3.6.0") is None
    assert "3.6" in lp.supported_version("3.9.0")
    assert lp.supported_version("3.60.0") is not None
    assert lp.launch_mode({}) == "direct"
    assert lp.launch_mode({"HLOTK_TRITON_LAUNCH": "Triton"}) == "triton"
    with pytest.raises(ValueError, match="HLOTK_TRITON_LAUNCH"):
        lp.launch_mode({"HLOTK_TRITON_LAUNCH": "fast"})


def test_direct_reason():
    sig = {"x": "*fp32", "n": "i32", "B": "constexpr"}
    assert lp.direct_reason(sig, meta(), "3.6.0", {}) is None
    assert "HLOTK_TRITON_LAUNCH" in lp.direct_reason(sig, meta(), "3.6.0",
                                                     {"HLOTK_TRITON_LAUNCH": "triton"})
    assert "interpreter" in lp.direct_reason(sig, meta(), "3.6.0", {"TRITON_INTERPRET": "1"})
    assert "Triton 3.9" in lp.direct_reason(sig, meta(), "3.9.0", {})
    assert "cluster" in lp.direct_reason(sig, meta(num_ctas=4), "3.6.0", {})


def test_check_layout():
    plan = lp.plan_params({"x": "*fp32", "n": "i32"})
    assert lp.check_layout(plan, [(0, 8), (8, 4), (16, 8), (24, 8)]) is None
    why = lp.check_layout(plan, [(0, 8), (8, 4), (16, 8)])     # no profile scratch
    assert "3 parameters" in why and "4 of sizes" in why
    assert lp.check_layout(plan, [(0, 8), (8, 8), (16, 8), (24, 8)]) is not None


# --- the launch decision (Triton imported, no GPU needed) ----------------------------------
class FakeFn:
    """A stand-in @triton.jit function: records Triton launches and warmups."""

    def __init__(self, compiled=None):
        self.compiled = compiled
        self.launched: list = []
        self.warmups = 0
        self.params = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launched.append((grid, args, kwargs))
            return "triton"
        return run

    def warmup(self, *args, grid, **kwargs):
        self.warmups += 1
        return self.compiled


Src = collections.namedtuple("Src", "signature")
Compiled = collections.namedtuple("Compiled", "src metadata asm")


@pytest.fixture
def dl(monkeypatch):
    pytest.importorskip("triton")
    from codegen.triton import direct_launch
    monkeypatch.delenv("HLOTK_TRITON_LAUNCH", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return direct_launch


def test_triton_mode_launches_through_triton(dl, monkeypatch):
    monkeypatch.setenv("HLOTK_TRITON_LAUNCH", "triton")
    fn = FakeFn()
    assert dl.launch(fn, (4,), (1, 2), {"B": 8}) == "triton"
    assert fn.launched == [((4,), (1, 2), {"B": 8})] and fn.warmups == 0


def test_bad_mode_is_a_project_error(dl, monkeypatch):
    from codegen.triton import TritonCodegenError
    monkeypatch.setenv("HLOTK_TRITON_LAUNCH", "fast")
    with pytest.raises(TritonCodegenError, match="expected one of direct, triton"):
        dl.launch(FakeFn(), (1,), (), {})


def _enabled(dl, monkeypatch):
    monkeypatch.setattr(dl, "_ENABLED", "")
    monkeypatch.setattr(dl, "_current_device", lambda: 0)
    monkeypatch.setattr(dl, "_raw_stream", lambda d: 0)
    monkeypatch.setattr(dl, "install_driver", lambda: True)


def test_unsupported_kernel_keeps_triton_and_says_why(dl, monkeypatch, caplog):
    _enabled(dl, monkeypatch)
    compiled = Compiled(Src({"x": "*fp32", "B": "constexpr"}), meta(num_ctas=2), {})
    fn = FakeFn(compiled)
    x = FakeTensor(0x1000)
    with caplog.at_level("DEBUG", logger="hlotk.triton.launch"):
        assert dl.launch(fn, (2,), (x,), {"B": 4}) == "triton"
        assert dl.launch(fn, (2,), (x,), {"B": 4}) == "triton"
    assert fn.warmups == 1                  # decided once per variant
    assert len(fn.launched) == 2
    assert any("keeps Triton's launch" in r.message and "num_ctas=2" in r.message
               for r in caplog.records)


def test_variants_are_keyed_by_alignment_and_scalars(dl, monkeypatch):
    _enabled(dl, monkeypatch)
    made: list = []

    class Loaded:
        compiled = "kernel"

        def __init__(self):
            self.calls: list = []

        def launch(self, grid, args, kwargs, stream):
            self.calls.append((grid, args[1]))

    def prepare(fn, grid, args, kwargs, device):
        made.append(args)
        return Loaded()
    monkeypatch.setattr(dl, "_prepare", prepare)
    fn = FakeFn()
    a16, a16b, a8 = FakeTensor(0x1000), FakeTensor(0x2000), FakeTensor(0x1008)
    assert dl.launch(fn, (1,), (a16, 5), {"B": 4}) == "kernel"
    dl.launch(fn, (2,), (a16b, 5), {"B": 4})      # same alignment, same scalars: reused
    dl.launch(fn, (1,), (a8, 5), {"B": 4})        # 8-byte aligned: another variant
    dl.launch(fn, (1,), (a16, 6), {"B": 4})       # another scalar value
    dl.launch(fn, (1,), (a16, 5), {"B": 8})       # another constexpr
    assert len(made) == 4 and fn.launched == []


def test_driver_failure_keeps_triton(dl, monkeypatch):
    _enabled(dl, monkeypatch)

    def no_driver():
        raise dl.TritonCodegenError("no usable CUDA driver library for the direct launch")
    monkeypatch.setattr(dl, "_cuda", no_driver)
    compiled = Compiled(Src({"x": "*fp32"}), meta(), {"cubin": b""})
    fn = FakeFn(compiled)
    assert dl.launch(fn, (1,), (FakeTensor(0x1000),), {}) == "triton"
    assert fn.launched and any("no usable CUDA driver" in v
                               for v in dl.STATS["why_triton"].values())


def test_collecting_launches_go_to_triton(dl, monkeypatch):
    _enabled(dl, monkeypatch)
    monkeypatch.setattr(dl, "collecting_now", lambda: True)
    fn = FakeFn()
    assert dl.launch(fn, (1,), (FakeTensor(0x1000),), {}) == "triton"
    assert fn.warmups == 0


# --- on a GPU (Triton 3.6) -----------------------------------------------------------------
def _gpu_direct():
    torch = pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if lp.supported_version(triton.__version__):
        pytest.skip(lp.supported_version(triton.__version__))
    return torch


def _scaled_add():
    from tests import direct_launch_kernels
    return direct_launch_kernels.scaled_add


@pytest.mark.gpu
def test_gpu_direct_equals_triton_launch(monkeypatch):
    torch = _gpu_direct()
    from codegen.triton import direct_launch as dl
    monkeypatch.delenv("HLOTK_TRITON_LAUNCH", raising=False)
    kernel = _scaled_add()
    n = 1000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    outs = []
    for mode in ("triton", "direct"):
        monkeypatch.setenv("HLOTK_TRITON_LAUNCH", mode)
        out = torch.empty(n, device="cuda")
        before = dl.STATS["launches"]
        dl.launch(kernel, (triton_cdiv(n, 256),), (x, y, out, n, 0.5, -2, True, 1.5),
                  {"BLOCK": 256})
        assert (dl.STATS["launches"] > before) == (mode == "direct")
        outs.append(out)
    torch.cuda.synchronize()
    want = x * 0.5 + y * -2 + 1.5
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1], want)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.gpu
def test_gpu_captured_parameter_bytes_match_triton(monkeypatch):
    """A graph node captured from the direct launch holds the same parameter bytes as one
    captured from Triton's launcher (what runtime/cuda/native/patch.py diffs)."""
    torch = _gpu_direct()
    import ctypes

    from codegen.triton import direct_launch as dl
    from runtime.cuda.native import _ERRBUF, driver_library
    from runtime.cuda.native.patch import parse_nodes
    lib = driver_library()
    kernel = _scaled_add()
    n = 4096
    x, y, out = (torch.randn(n, device="cuda") for _ in range(3))
    args = (x, y, out, n, 0.25, 3, False, -1.0)
    blobs = []
    for mode in ("triton", "direct"):
        monkeypatch.setenv("HLOTK_TRITON_LAUNCH", mode)
        dl.launch(kernel, (n // 256,), args, {"BLOCK": 256})     # compiled and loaded
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            dl.launch(kernel, (n // 256,), args, {"BLOCK": 256})
            graph.capture_end()
        err = ctypes.create_string_buffer(_ERRBUF)
        size = ctypes.c_uint64(0)
        raw = graph.raw_cuda_graph()
        assert lib.hk_graph_describe(raw, None, ctypes.byref(size), err, _ERRBUF) >= 0
        buf = ctypes.create_string_buffer(max(size.value, 1))
        assert lib.hk_graph_describe(raw, buf, ctypes.byref(size), err, _ERRBUF) >= 0
        nodes = parse_nodes(buf.raw[:size.value])
        assert len(nodes) == 1 and nodes[0].kind == "kernel"
        blobs.append(nodes[0].blob)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, x * 0.25 + y * 3 + 1.0)   # flag False: minus c
    assert blobs[0] == blobs[1]
    words = struct.unpack_from("<3Q", blobs[1])
    assert list(words) == [x.data_ptr(), y.data_ptr(), out.data_ptr()]


def test_worker_skips_launcher_only_for_direct_kernels(monkeypatch):
    """The compile worker (loaded by path, as the pool starts it) builds Triton's C launcher
    only for kernels the launching process will not launch itself."""
    triton = pytest.importorskip("triton")
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "codegen" / "triton" / "compile_worker.py"
    spec = importlib.util.spec_from_file_location("hlotk_compile_worker_test", path)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.delenv("HLOTK_TRITON_LAUNCH", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    plain = Compiled(Src({"x": "*fp32", "n": "i32", "B": "constexpr"}), meta(), {})
    cluster = Compiled(Src({"x": "*fp32"}), meta(num_ctas=2), {})
    assert worker.launched_directly(plain)
    assert not worker.launched_directly(cluster)
    monkeypatch.setenv("HLOTK_TRITON_LAUNCH", "triton")
    assert not worker.launched_directly(plain)
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    monkeypatch.delenv("HLOTK_TRITON_LAUNCH")
    assert not worker.launched_directly(plain)


def test_lazy_driver_answers_from_torch_and_delegates_the_rest(dl, monkeypatch):
    """The driver installed at the client's creation: device, stream, target and
    benchmarking from torch; anything else (Triton's ``utils``: cuda_utils) from Triton's
    own driver, made only then."""
    torch = pytest.importorskip("torch")
    from triton.runtime.driver import driver

    class Real:
        utils = "cuda_utils of Triton's own driver"
    made: list = []
    monkeypatch.setattr(driver, "_active", None)
    monkeypatch.setattr(driver, "_default", None)
    monkeypatch.setattr(type(driver), "default", property(lambda self: made.append(1) or Real()))
    monkeypatch.setattr(dl, "_ENABLED", "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dl.install_driver()
    lazy = driver._active
    assert type(lazy).__name__ == "LazyCudaDriver" and dl.install_driver()
    assert lazy.get_device_interface() is torch.cuda
    assert lazy.map_python_to_cpp_type("i32") == "int32_t"
    monkeypatch.setattr(lazy, "get_device_capability", lambda dev: (9, 0))
    monkeypatch.setattr(lazy, "get_current_device", lambda: 0)
    target = lazy.get_current_target()
    assert (target.backend, target.arch, target.warp_size) == ("cuda", 90, 32)
    assert made == []                       # nothing so far needed Triton's own driver
    assert lazy.utils == "cuda_utils of Triton's own driver" and made == [1]


def test_no_lazy_driver_over_an_existing_one(dl, monkeypatch):
    from triton.runtime.driver import driver
    existing = object()
    monkeypatch.setattr(driver, "_active", existing)
    monkeypatch.setattr(dl, "_ENABLED", "")
    assert not dl.install_driver() and driver._active is existing
