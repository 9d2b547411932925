"""Partitioned programs on several devices in several processes (runtime/cuda/distributed.py).

``runtime.jit(f, backend="cuda", in_shardings=..., mesh=...)`` partitions the program, runs
the CUDA pipeline on the per-device module, and runs it in one worker process per device
with its collectives through torch.distributed:

- on a machine with >= 2 GPUs: NCCL, one GPU per process (the lent ``nvidia-h200-x2``);
- without GPUs: gloo between CPU processes, Triton kernels in Triton's interpreter
  (``TRITON_INTERPRET=1``): the same thunks, the same groups, the same chunk orders.

Skipped where torch/triton are not installed (CI). Results are compared with jax.jit on the
CPU (conftest gives JAX 8 host devices), with the same shardings on the same mesh shape.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
HAS_CUDA = bool(torch.cuda.is_available())
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import runtime  # noqa: E402
from hlo.errors import HlotkError  # noqa: E402
from passes.spmd import collective_stats  # noqa: E402
from runtime.cuda.collectives import CollectiveError  # noqa: E402
from runtime.cuda.distributed import GpuMesh  # noqa: E402

N_GPUS = torch.cuda.device_count() if HAS_CUDA else 0
needs = pytest.mark.skipif(
    (HAS_CUDA and N_GPUS < 2) or (not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs 2 GPUs, or no GPU and Triton's interpreter (TRITON_INTERPRET=1)")
# Mesh sizes: the GPUs there are (up to 4); on the CPU, 2 and 4 processes.
SIZES = [n for n in (2, 4) if not HAS_CUDA or n <= N_GPUS]


def _mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def _args(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in shapes]


def megatron_mlp(n):
    mesh = _mesh((n,), ("model",))

    def mlp(x, w1, w2):
        return jax.nn.relu(x @ w1) @ w2
    return mlp, dict(in_shardings=(P(), P(None, "model"), P("model", None)),
                     out_shardings=P(), mesh=mesh), _args([(16, 32), (32, 64), (64, 32)])


def dp_train_step(n):
    mesh = _mesh((n,), ("data",))

    def step(w, b, x, y):
        def loss(w, b):
            return jnp.mean((jnp.tanh(x @ w + b) - y) ** 2)
        lv, (gw, gb) = jax.value_and_grad(loss, argnums=(0, 1))(w, b)
        return w - 0.1 * gw, b - 0.1 * gb, lv
    return step, dict(in_shardings=(P(), P(), P("data"), P("data")),
                      out_shardings=(P(), P(), P()), mesh=mesh), \
        _args([(16, 8), (8,), (32, 16), (32, 8)])


def transformer_block(n):
    """benchmarks/spmd_gpu.py's 2-D mesh block at its small size (mesh (1, 2) on 2 devices,
    (n/2, 2) on more)."""
    from benchmarks.spmd_gpu import transformer_block_2d
    return transformer_block_2d(n, small=True)


def seq_sharded(n):
    mesh = _mesh((n,), ("seq",))

    def fn(x):
        y = jnp.tanh(x) * x + 1.0
        return jnp.sum(y, axis=1), jnp.max(y, axis=2)
    return fn, dict(in_shardings=(P(None, "seq"),), out_shardings=(P(), P(None, "seq")),
                    mesh=mesh), _args([(4, 64, 16)])


def resharded(n):
    """Row-sharded in, column-sharded out: the partitioner's all-to-all."""
    mesh = _mesh((n,), ("x",))

    def fn(a):
        return jnp.sin(a) * 2.0
    return fn, dict(in_shardings=(P("x", None),), out_shardings=P(None, "x"), mesh=mesh), \
        _args([(8, 16)])


PROGRAMS = {"megatron_mlp": megatron_mlp, "dp_train_step": dp_train_step,
            "transformer_block_2d": transformer_block, "seq_sharded_reduce": seq_sharded,
            "resharded_all_to_all": resharded}


@needs
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_partitioned_program_on_devices_equals_jax_jit(name, n):
    fn, shardings, args = PROGRAMS[name](n)
    g = runtime.jit(fn, backend="cuda", **shardings)
    # f32 dots at DEFAULT precision are TF32 on a GPU (as XLA:GPU): compare at full f32.
    with jax.default_matmul_precision("highest"):
        got = g(*args)
        want = jax.jit(fn)(*args)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    spmd = g.lower(*args).compile().executable
    assert spmd.backend == "cuda" and spmd.num_devices == n
    # The collectives the partitioner inserted are in the module the workers run, and ran
    # through torch.distributed (each worker's report counts collective thunks).
    stats = collective_stats(spmd.module)
    mesh, _ = spmd.gpu_mesh()
    n_collectives = sum(c for c, _ in stats.values())
    if n_collectives:
        assert all(f"{n_collectives} collective" in r for r in mesh.reports), mesh.reports


@needs
def test_megatron_mlp_has_exactly_one_all_reduce_on_devices():
    fn, shardings, args = megatron_mlp(2)
    spmd = runtime.jit(fn, backend="cuda", **shardings).lower(*args).compile().executable
    assert {k: v[0] for k, v in collective_stats(spmd.module).items()} == {"all-reduce": 1}


COLLECTIVES_HLO = """HloModule m, num_partitions=%(n)d

%%max (a: f32[], b: f32[]) -> f32[] {
  %%a = f32[] parameter(0)
  %%b = f32[] parameter(1)
  ROOT %%m = f32[] maximum(%%a, %%b)
}

%%sum (c: f32[], d: f32[]) -> f32[] {
  %%c = f32[] parameter(0)
  %%d = f32[] parameter(1)
  ROOT %%s = f32[] add(%%c, %%d)
}

ENTRY %%e (x: f32[2,4]) -> (f32[2,8], f32[2,2], f32[2,4], f32[2,4], f32[2,4], u32[]) {
  %%x = f32[2,4] parameter(0)
  %%ag = f32[2,8] all-gather(%%x), channel_id=1, replica_groups=%(pairs)s, dimensions={1}, use_global_device_ids=true
  %%rs = f32[2,2] reduce-scatter(%%x), channel_id=2, replica_groups=%(pairs)s, dimensions={1}, use_global_device_ids=true, to_apply=%%sum
  %%a2a = f32[2,4] all-to-all(%%x), channel_id=3, replica_groups=%(a2a)s, dimensions={1}
  %%ar = f32[2,4] all-reduce(%%x), channel_id=4, replica_groups=%(ar)s, use_global_device_ids=true, to_apply=%%max
  %%cp = f32[2,4] collective-permute(%%x), channel_id=5, source_target_pairs=%(cp)s
  %%pid = u32[] partition-id()
  ROOT %%t = (f32[2,8], f32[2,2], f32[2,4], f32[2,4], f32[2,4], u32[]) tuple(%%ag, %%rs, %%a2a, %%ar, %%cp, %%pid)
}
"""
GROUPS = {
    # groups listed out of rank order; on 4 devices a permute ring that leaves device 3 out
    2: dict(n=2, pairs="{{1,0}}", a2a="{{1,0}}", ar="{{0,1}}", cp="{{0,1}}"),
    4: dict(n=4, pairs="{{1,0},{3,2}}", a2a="{{2,0,3,1}}", ar="{{0,3},{1,2}}",
            cp="{{0,1},{1,2},{2,0}}"),
}


@needs
@pytest.mark.parametrize("n", SIZES)
def test_collectives_with_unsorted_groups_and_every_kind(n):
    """Hand-written per-device HLO: groups listed out of rank order (XLA's order decides
    chunk order, torch's is sorted), all-gather/reduce-scatter/all-to-all on a non-leading
    dim, a max all-reduce, a collective-permute where some device is no target (it gets
    zeros), partition-id; every result equal to the multi-device interpreter's."""
    import hlo
    from hlo.evaluator.collectives import simulate
    from passes import run_pipeline
    from passes.pipelines import pipeline_spec
    from runtime.client import flatten_value
    module = hlo.parse_hlo(COLLECTIVES_HLO % GROUPS[n])
    xs = [np.arange(8, dtype=np.float32).reshape(2, 4) * (d + 1) + d for d in range(n)]
    want = [flatten_value(r) for r in simulate(module, [[x] for x in xs], 1, n)]
    run_pipeline(module, pipeline_spec("default", "cuda"))
    with GpuMesh(n) as mesh:
        got = mesh.run(mesh.load(module), [[x] for x in xs])
        assert all("6 collective" in r for r in mesh.reports), mesh.reports
    for d in range(n):
        for k, (a, b) in enumerate(zip(got[d], want[d])):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                          err_msg=f"device {d}, result {k}")


@needs
def test_a_worker_failure_is_a_clear_error_and_ends_the_mesh():
    with GpuMesh(2) as mesh:
        with pytest.raises(CollectiveError, match=r"(?s)GPU worker \d failed:.*ParseError"):
            mesh.load("HloModule broken\n\nENTRY %e { not hlo }")
        with pytest.raises(CollectiveError, match="closed"):
            mesh.load("HloModule m")


@pytest.mark.skipif(not HAS_CUDA, reason="counts GPUs")
def test_more_devices_than_gpus_is_a_clear_error():
    fn, shardings, args = megatron_mlp(2)
    # Eight devices JAX has wherever it runs (conftest's host devices), also where JAX's
    # default backend is the two GPUs (JAX_PLATFORMS=cuda,cpu).
    shardings["mesh"] = jax.sharding.Mesh(np.array(jax.devices("cpu")[:8]), ("model",),
                                          axis_types=(jax.sharding.AxisType.Auto,))
    with pytest.raises(HlotkError, match="partitioned over 8 devices but this machine has"):
        runtime.jit(fn, backend="cuda", **shardings)(*args)


# --- asynchronous collectives, packing, shared arguments, timelines ----------------------
PACKED_HLO = """HloModule packed, num_partitions=2

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %e (x: f32[4,8], y: f32[8], z: f32[], w: f32[8,8]) -> (f32[4,8], f32[8], f32[], f32[8,8]) {
  %x = f32[4,8] parameter(0)
  %y = f32[8] parameter(1)
  %z = f32[] parameter(2)
  %w = f32[8,8] parameter(3)
  %ar = (f32[4,8], f32[8], f32[]) all-reduce(%x, %y, %z), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%sum
  %gx = f32[4,8] get-tuple-element(%ar), index=0
  %gy = f32[8] get-tuple-element(%ar), index=1
  %gz = f32[] get-tuple-element(%ar), index=2
  %independent = f32[8,8] dot(%w, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,highest}
  ROOT %t = (f32[4,8], f32[8], f32[], f32[8,8]) tuple(%gx, %gy, %gz, %independent)
}
"""


@needs
def test_combined_all_reduce_is_one_call_and_runs_asynchronously_on_the_workers():
    """A variadic all-reduce of three operands: one communication call over one packed
    buffer (the profiler sees one all-reduce per step), as an async pair with the
    independent dot between its start and done; results equal the interpreter's (the dot
    at HIGHEST precision: at DEFAULT an f32 dot is TF32 on a GPU, as XLA:GPU's)."""
    import hlo
    from hlo.evaluator.collectives import simulate
    from passes import run_pipeline
    from passes.pipelines import pipeline_spec
    from runtime.client import flatten_value
    from runtime.cuda.timeline import events_from_trace
    module = hlo.parse_hlo(PACKED_HLO)
    rng = np.random.default_rng(0)
    per = [[rng.standard_normal(s).astype(np.float32) for s in [(4, 8), (8,), (), (8, 8)]]
           for _ in range(2)]
    want = [flatten_value(r) for r in simulate(module, per, 1, 2)]
    run_pipeline(module, "async-collective-creator," + pipeline_spec("default", "cuda"))
    order = [i.opcode for i in module.entry.instructions]
    assert order.index("all-reduce-start") < order.index("dot") < order.index("all-reduce-done")
    with GpuMesh(2) as mesh:
        key = mesh.load(module)
        got = mesh.run(key, per)
        stats = mesh.stats(key)
        assert all(s["packed_all_reduce_operands"] == 3 for s in stats), stats
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            files = mesh.trace(key, per, tmp)
            names = [e.name for e in events_from_trace(files[0])]
        # one call: one c10d all-reduce op where the profiler names it, else one NCCL
        # all-reduce kernel (torch 2.11's trace on the H200 names only the kernel)
        calls = sum(n == "c10d::allreduce_" for n in names) or \
            sum(n.startswith("ncclDevKernel_AllReduce") for n in names)
        assert calls == 1, names
    for d in range(2):
        for a, b in zip(got[d], want[d]):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


@needs
def test_sharded_jax_arrays_reach_the_workers_through_shared_buffers():
    fn, shardings, args = megatron_mlp(2)
    mesh = shardings["mesh"]
    from jax.sharding import NamedSharding
    on_mesh = [jax.device_put(a, NamedSharding(mesh, s))
               for a, s in zip(args, shardings["in_shardings"])]
    # Traced at full f32 (f32 dots at DEFAULT precision are TF32 on a GPU, as XLA:GPU's).
    with jax.default_matmul_precision("highest"):
        compiled = runtime.jit(fn, backend="cuda", **shardings).lower(*on_mesh).compile()
        want = np.asarray(jax.jit(fn)(*args))
    spmd = compiled.executable
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(compiled(*on_mesh)), want, rtol=2e-4, atol=2e-5)
    gpu_mesh, key = spmd.gpu_mesh()
    assert spmd.transfers == {"sharded_arguments": 6, "host_arguments": 0}
    # Handles cross the pipes once per (argument, device); the second call sends ids.
    assert gpu_mesh._staging.stats["handles_sent"] == 3 * 2
    assert all(s["shared_buffers_opened"] == 3 for s in gpu_mesh.stats(key))


def test_device_tensor_keeps_the_shape_of_scalars_and_bf16():
    """The workers' time/trace/profile arguments: a 0-d argument stays 0-d (else the
    executable does not take it as its device buffer and reads it back through numpy)."""
    import ml_dtypes
    from runtime.cuda.distributed import _device_tensor
    t = _device_tensor(np.array(2.5, np.float32), "cpu")
    assert tuple(t.shape) == () and t.dtype == torch.float32 and float(t) == 2.5
    b = _device_tensor(np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
                       "cpu")
    assert tuple(b.shape) == (2, 3) and b.dtype == torch.bfloat16
    assert b.float().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_collectives_join_cuda_graphs_only_on_nccl_and_pairs_only_when_all_between_do():
    import hlo
    from runtime.cuda.collectives import (AsyncDoneThunk, AsyncStartThunk, CollectiveThunk,
                                          Communicator, pair_capturable)
    from runtime.thunks import Slot
    m = hlo.parse_hlo(PACKED_HLO.replace("num_partitions=2", "num_partitions=1")
                      .replace("{{0,1}}", "{{0}}"))
    ar = next(i for i in m.entry.instructions if i.opcode == "all-reduce")
    slots = [Slot(0, 0, o.shape) for o in ar.operands]

    def thunk(backend, capture=True):
        return CollectiveThunk(ar, slots, slots, Communicator(0, 1, backend), capture=capture)
    assert not thunk("gloo").capturable
    assert not thunk("nccl").capturable          # a group of one: host copy, no NCCL call
    two = hlo.parse_hlo(PACKED_HLO)
    ar2 = next(i for i in two.entry.instructions if i.opcode == "all-reduce")
    comm = Communicator(0, 2, "nccl")
    comm._groups[((0, 1),)] = (None, [0, 1])       # the world group, without a process group
    t = CollectiveThunk(ar2, slots, slots, comm)
    assert t.fast and t.capturable
    assert not CollectiveThunk(ar2, slots, slots, comm, capture=False).capturable
    start = AsyncStartThunk(t)
    done = AsyncDoneThunk(ar2, start)

    class Kernel:
        capturable = True

    class Host:
        capturable = False
    pair_capturable([start, Kernel(), done])
    assert start.capturable and done.capturable
    pair_capturable([start, Host(), done])
    assert not start.capturable and not done.capturable
