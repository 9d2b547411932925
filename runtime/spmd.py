"""Running a sharded module on N devices: simulated CPU devices, or GPUs.

    exe = runtime.spmd.compile_spmd(module, num_devices=8)   # partitions the module
    outs = exe.execute_arrays([x, w1, w2])                   # whole arrays in and out

``compile_spmd`` runs ``sharding-propagation``, ``spmd-partitioner``, the simplifier,
``all-reduce-combiner``, ``async-collective-creator`` and ``latency-hiding-scheduler`` on a
copy of the module (collectives as start/done pairs with independent work between them). Executing splits every whole argument into
the piece each device holds (by the partitioned parameter's sharding), runs the per-device
program on every device, and puts the results back together from the root's sharding:

- ``backend="cpu"``: in lock-step threads (``hlo.evaluator.collectives.simulate``:
  collectives meet at a barrier, a device that never arrives is a timeout error, never a
  hang);
- ``backend="cuda"``: the per-device program also goes through the CUDA pipeline and runs in
  one worker process per GPU, collectives through NCCL (``runtime.cuda.distributed``).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

import hlo
from hlo.errors import HlotkError, InvalidArgumentError
from hlo.sharding import Sharding

from .client import Buffer, Client, Device, flatten_value


def spmd_pipeline() -> str:
    import passes.collective_combiner  # noqa: F401  (registers all-reduce-combiner)
    from passes.pipelines import SIMPLIFY
    # The combiner comes after folding and CSE: they can only cut dependencies between
    # all-reduces, so more of them are independent and merge. Then every collective becomes
    # a start/done pair and the latency-hiding scheduler moves independent work between
    # them (the backend pipeline's ``schedule`` keeps that order for these computations).
    return (f"sharding-propagation,spmd-partitioner,{SIMPLIFY},all-reduce-combiner,"
            "async-collective-creator,latency-hiding-scheduler")


def _tiling(sharding: Any, rank: int, n: int):
    from passes.spmd.tiling import Tiling
    return Tiling.from_sharding(sharding, rank, n)


def split_array(x: np.ndarray, sharding: Any, n: int) -> list[np.ndarray]:
    """The piece of ``x`` each of ``n`` devices holds under ``sharding``; a dimension that
    does not divide evenly is padded with zeros at the end (every piece has the same
    shape, as the partitioned program expects)."""
    t = _tiling(sharding, x.ndim, n)
    loc = t.local_dims(x.shape)
    pieces = []
    for ix in t.index:
        piece = x[tuple(slice(i * l, (i + 1) * l) for i, l in zip(ix, loc))]
        if piece.shape != loc:
            piece = np.pad(piece, [(0, l - s) for l, s in zip(loc, piece.shape)])
        pieces.append(piece)
    return pieces


def join_array(pieces: Sequence[np.ndarray], sharding: Any, global_dims: Sequence[int],
               n: int) -> np.ndarray:
    """The whole array from each device's piece (the inverse of ``split_array``: padding
    dropped)."""
    t = _tiling(sharding, len(global_dims), n)
    out = np.empty(tuple(global_dims), dtype=pieces[0].dtype)
    loc = t.local_dims(global_dims)
    for ix, p in zip(t.index, pieces):
        region = tuple(slice(i * l, (i + 1) * l) for i, l in zip(ix, loc))
        target = out[region]
        out[region] = p[tuple(slice(0, s) for s in target.shape)]
    return out


class SpmdExecutable:
    """A partitioned module bound to the devices of a client (the PJRT executable shape:
    ``execute`` takes and returns Buffers; here they hold whole arrays)."""

    def __init__(self, client: Client, module: hlo.Module, original: hlo.Module,
                 timeout: float = 30.0, backend: str = "cpu"):
        self.client = client
        self.backend = backend
        self._gpu_key: Optional[tuple[Any, int]] = None   # (GpuMesh, executable key)
        self.module = module
        self.original = original
        self.timeout = timeout
        self.num_devices = int(module.config.get("num_partitions", 1))
        self.device = client.devices()[0]
        self.pipeline = spmd_pipeline()
        self.pass_records: list = []
        self.global_parameter_shapes = [p.shape for p in original.entry.parameters]
        self.global_result_shape = original.entry.root.shape
        # How arguments split and results join, read before any later pass (the GPU
        # pipeline fuses the root away).
        self.parameter_shardings = [p.sharding for p in module.entry.parameters]
        self.result_sharding = module.entry.root.sharding
        # backend "cpu" with a pipeline: the compiled CPU executable (thunks over an arena)
        # runs on every simulated device; without one, the interpreter does.
        self.cpu_executable: Any = None
        # Arguments passed as device shards / as host arrays split here, over all calls.
        self.transfers = {"sharded_arguments": 0, "host_arguments": 0}
        # runtime.jit hands a device executable's arguments over as they are (jax.Arrays
        # stay sharded on their devices): Compiled looks for ``_body.run_device``.
        self._body = _DeviceEntry(self.execute_arrays)

    def devices(self) -> list[Device]:
        return self.client.devices()[:self.num_devices]

    def hlo_modules(self) -> list[hlo.Module]:
        return [self.module]

    def as_text(self) -> str:
        return self.module.to_text()

    def execute_arrays(self, args: Sequence[Any]) -> list[np.ndarray]:
        """Whole arrays in, whole arrays out. A ``jax.Array`` already split over the mesh
        the way its parameter is passes shard by shard (no gather to the host and split
        again); on GPUs its shards reach the workers through shared device buffers."""
        entry = self.module.entry
        n = self.num_devices
        if len(args) != len(entry.parameters):
            raise InvalidArgumentError(f"{self.module.name} takes {len(entry.parameters)} "
                                       f"arguments, got {len(args)}")
        per_device: list[list[Any]] = [[] for _ in range(n)]
        for k, (a, p, g) in enumerate(zip(args, self.parameter_shardings,
                                          self.global_parameter_shapes)):
            pieces = device_pieces(a, p, g, n)
            if pieces is not None:
                self.transfers["sharded_arguments"] += 1
            else:
                a = np.asarray(a)
                if tuple(a.shape) != tuple(g.dims):
                    raise InvalidArgumentError(f"argument {k}: expected shape {list(g.dims)}, "
                                               f"got {list(a.shape)}")
                pieces = split_array(a, p, n)
                self.transfers["host_arguments"] += 1
            for d, piece in enumerate(pieces):
                per_device[d].append(piece)
        if self.backend == "cuda":
            flat = self._run_on_gpus(per_device)
        else:
            per_device = [[np.asarray(x) for x in args] for args in per_device]
            if self.cpu_executable is not None:
                from hlo.evaluator.collectives import lockstep
                exe = self.cpu_executable
                flat = lockstep(lambda d, ctx: exe.run(per_device[d], ctx=ctx), 1, n,
                                timeout=self.timeout)
            else:
                from hlo.evaluator.collectives import simulate
                results = simulate(self.module, per_device, 1, n, timeout=self.timeout)
                flat = [flatten_value(r) for r in results]
        g_leaves = (self.global_result_shape.elements if self.global_result_shape.is_tuple
                    else (self.global_result_shape,))
        s = self.result_sharding
        leaf_sh = (s.elements if isinstance(s, Sharding) and s.is_tuple
                   else [s] * len(g_leaves))
        return [join_array([f[k] for f in flat], leaf_sh[k], g.dims, n)
                for k, g in enumerate(g_leaves)]

    def gpu_mesh(self) -> tuple[Any, int]:
        """(the GpuMesh of worker processes, this executable's key on it), loaded on first
        use (backend ``cuda``)."""
        from .cuda.distributed import shared_mesh
        if self._gpu_key is None or not self._gpu_key[0].alive:
            mesh = shared_mesh(self.num_devices)
            self._gpu_key = (mesh, mesh.load(self.module))
        return self._gpu_key

    def _run_on_gpus(self, per_device: list[list[Any]]) -> list[list[np.ndarray]]:
        """Device-resident shards (jax arrays) go to the workers through shared buffers
        (``GpuMesh.run_shared``); when every argument is a host array, through the pipes."""
        mesh, key = self.gpu_mesh()
        if all(isinstance(x, np.ndarray) for args in per_device for x in args):
            return mesh.run(key, per_device)
        return mesh.run_shared(key, [[_device_view(x) for x in args] for args in per_device])

    def execute(self, arguments: Sequence[Buffer]) -> list[Buffer]:
        outs = self.execute_arrays([np.asarray(b) for b in arguments])
        return [Buffer(o, self.device) for o in outs]


class _DeviceEntry:
    def __init__(self, run_device: Any):
        self.run_device = run_device


def device_pieces(x: Any, sharding: Any, g: Any, n: int) -> Optional[list[Any]]:
    """Partition d's piece of ``x`` for every d, taken from the shards of a ``jax.Array``
    split over an ``n``-device mesh exactly as the partitioned parameter is (the shard on
    the mesh's d-th device, its slice the tile the parameter's sharding gives d); None for
    anything else (numpy arrays, other splits), which is split on the host."""
    try:
        import jax
    except ImportError:
        return None
    if not isinstance(x, jax.Array) or tuple(x.shape) != tuple(g.dims):
        return None
    mesh = getattr(x.sharding, "mesh", None)
    if mesh is None or getattr(mesh, "size", 0) != n or np.dtype(x.dtype) != g.dtype.np_dtype:
        return None
    t = _tiling(sharding, x.ndim, n)
    loc = t.local_dims(x.shape)
    if t.padded_dims(x.shape):
        return None
    shards = {sh.device: sh for sh in x.addressable_shards}
    pieces = []
    for dev, ix in zip(mesh.devices.flat, t.index):
        sh = shards.get(dev)
        if sh is None:
            return None
        want = tuple((i * l, (i + 1) * l) for i, l in zip(ix, loc))
        got = tuple((sl.start or 0, size if sl.stop is None else sl.stop)
                    for sl, size in zip(sh.index, x.shape))
        if got != want:
            return None
        pieces.append(sh.data)
    return pieces


def _device_view(x: Any) -> Any:
    """A torch view of a jax array on its GPU (DLPack, no copy); numpy stays numpy."""
    if isinstance(x, np.ndarray):
        return x
    import torch
    try:
        return torch.from_dlpack(x)
    except Exception:  # noqa: BLE001  (a CPU jax array on the gloo path, or no DLPack)
        return np.asarray(x)


def compile_spmd(module: hlo.Module, num_devices: Optional[int] = None,
                 client: Optional[Client] = None, verify: bool = True,
                 timeout: float = 30.0, backend: str = "cpu",
                 pipeline: Optional[str] = None) -> SpmdExecutable:
    """Partition ``module`` (not modified) for ``num_devices`` devices: simulated CPU
    devices (``backend="cpu"``), or GPUs (``"cuda"``: the partitioned module goes through
    the CUDA pipeline and runs in one worker process per GPU, NCCL between them).

    On the CPU the interpreter runs the partitioned module; with ``pipeline`` (a name such
    as ``"default"`` or a spec) the module goes through that CPU pipeline and the compiled
    CPU executable runs on every device (asynchronous collectives in background threads)."""
    from passes import run_pipeline
    from passes.spmd.propagation import num_devices as module_devices
    n = module_devices(module)
    if num_devices is not None and num_devices != n:
        raise HlotkError(f"the module is sharded over {n} devices (mesh/num_partitions) but "
                         f"{num_devices} devices were given; the mesh must match the devices")
    if backend not in ("cpu", "interpreter", "cuda"):
        raise HlotkError(f"a partitioned program runs on backend 'cpu' (simulated devices) "
                         f"or 'cuda' (one GPU per device), not {backend!r}")
    if client is None:
        from .client import client as make_client
        client = make_client("cpu", num_devices=n)
    if client.device_count() < n:
        raise HlotkError(f"the module is sharded over {n} devices but the client has "
                         f"{client.device_count()}; use runtime.client('cpu', num_devices={n})")
    part = module.clone()
    run_pipeline(part, spmd_pipeline(), verify=verify)
    part.config["num_partitions"] = n
    if backend != "cuda":
        exe = SpmdExecutable(client, part, module, timeout)
        if pipeline is not None:
            from passes.pipelines import pipeline_spec
            from .executable import CpuExecutable
            spec = pipeline_spec(pipeline, "cpu")
            run_pipeline(part, spec, verify=verify)       # after the shardings were read
            if not part.is_scheduled:
                run_pipeline(part, "schedule")
            exe.cpu_executable = CpuExecutable.build(part)
            exe.pipeline += "," + spec
        return exe
    _check_gpu_count(n)
    from passes.fusion.pass_ import with_target
    from passes.pipelines import pipeline_spec
    # Fusion decided for the GPUs the workers run on, as Client.compile does for one GPU.
    gpu_pipeline = with_target(pipeline_spec("default", "cuda"), _gpu_fusion_target())
    exe = SpmdExecutable(client, part, module, timeout, backend="cuda")
    run_pipeline(part, gpu_pipeline, verify=verify)    # after the shardings were read
    exe.pipeline += "," + gpu_pipeline
    return exe


def _gpu_fusion_target() -> Optional[str]:
    """The device spec of GPU 0 (h200, h100, a100 by name) for the partitioned module's
    fusion decisions; None without a GPU (the pipeline's default)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from .cuda.backend import default_target
    return default_target(torch.device("cuda", 0))


def _check_gpu_count(n: int) -> None:
    try:
        import torch
    except ImportError:
        from .cuda.errors import NoCudaDeviceError
        raise NoCudaDeviceError("backend 'cuda' needs PyTorch (pip install torch triton)") from None
    import os
    have = torch.cuda.device_count()
    if have < n and os.environ.get("TRITON_INTERPRET") != "1":
        raise HlotkError(f"the program is partitioned over {n} devices but this machine has "
                         f"{have} GPUs; the mesh must match the devices")


def jax_sharding_kwargs(in_shardings: Any, out_shardings: Any, mesh: Any) -> dict:
    """``jax.jit`` keyword arguments for hlotk's ``jit(in_shardings=, out_shardings=,
    mesh=)``: NamedShardings pass through; a PartitionSpec (or None inside a pytree) is
    bound to ``mesh``. JAX then writes the shardings into the export hlotk imports."""
    if in_shardings is None and out_shardings is None:
        if mesh is not None:
            raise InvalidArgumentError("jit(mesh=...) needs in_shardings or out_shardings")
        return {}
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    def bind(tree: Any) -> Any:
        def one(s: Any) -> Any:
            if isinstance(s, PartitionSpec):
                if mesh is None:
                    raise InvalidArgumentError(f"sharding {s} is a PartitionSpec: pass "
                                               "mesh=... to jit (or use NamedSharding)")
                return NamedSharding(mesh, s)
            if isinstance(s, jax.sharding.Sharding):
                if mesh is not None and isinstance(s, NamedSharding) and s.mesh.shape != mesh.shape:
                    raise InvalidArgumentError(f"sharding {s} is on mesh {dict(s.mesh.shape)} "
                                               f"but jit was given mesh {dict(mesh.shape)}")
                return s
            raise InvalidArgumentError(f"expected a NamedSharding or PartitionSpec, got "
                                       f"{type(s).__name__}")
        return jax.tree_util.tree_map(one, tree,
                                      is_leaf=lambda x: isinstance(x, (PartitionSpec,
                                                                      jax.sharding.Sharding)))
    out: dict = {}
    if in_shardings is not None:
        out["in_shardings"] = bind(in_shardings)
    if out_shardings is not None:
        out["out_shardings"] = bind(out_shardings)
    return out
