"""PJRT-shaped runtime objects: ``Client`` -> ``Device`` / ``Buffer`` / ``LoadedExecutable``.

    c = runtime.client("cpu")
    exe = c.compile(module)                       # an hlo.Module
    outs = exe.execute([c.buffer_from_pyval(x)])  # list[Buffer], tuple results flattened

A backend is one entry in ``BACKENDS``: a factory taking the client and returning an object
with ``device_kind`` and ``prepare(module) -> body``, where ``body(list[np.ndarray]) ->
list[np.ndarray]`` runs the entry computation on flattened arguments and returns flattened
results. The CPU backend's body is a thunk sequence over one buffer arena
(runtime/executable.py); backend ``interpreter`` runs ``hlo.evaluate`` instead.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

import hlo
from hlo import dtypes as dt
from hlo.errors import HlotkError, InvalidArgumentError, UnimplementedError
from hlo.shape import AnyShape, Shape, leaf_paths

# Named values of ``compile(pipeline=...)``; any pass spec string is accepted too.
PIPELINES: tuple[str, ...] = ("none", "default", "simplify")


def resolve_pipeline(pipeline: str, backend: str = "cpu") -> str:
    """The pass spec for a pipeline name or spec; raises PassError naming what is wrong."""
    from passes.pipeline import parse_pipeline
    from passes.pipelines import pipeline_spec
    if not isinstance(pipeline, str):
        raise InvalidArgumentError(f"pipeline must be a string (one of {', '.join(PIPELINES)} "
                                   f"or a pass spec), got {type(pipeline).__name__}")
    spec = pipeline_spec(pipeline, backend)
    parse_pipeline(spec)  # validate now: unknown passes/options fail before any work
    return spec

Body = Callable[[list[np.ndarray]], list[np.ndarray]]


class ClientError(HlotkError):
    """Misuse of the runtime (a deleted buffer, an unknown backend, a foreign device)."""


# --- backends ------------------------------------------------------------------------------
class _InterpreterBackend:
    """Runs the entry computation with ``hlo.evaluate`` (XLA semantics, numpy values)."""

    device_kind = "cpu (hlotk reference interpreter)"

    def __init__(self, client: "Client"):
        self.client = client

    def prepare(self, module: hlo.Module, poison: Optional[bool] = None,
                target: Optional[str] = None) -> Body:
        # poison and target concern the arena and library calls: the interpreter has neither.
        def run(args: list[np.ndarray]) -> list[np.ndarray]:
            return flatten_value(hlo.evaluate(module, args))
        return run


class _ThunkBackend:
    """Builds the thunk sequence over one buffer arena (runtime/executable.py) and runs it.

    The module is scheduled first when the pipeline did not (``schedule`` pass: copy
    insertion and the lowest-peak schedule); buffer assignment then places every value.
    """

    device_kind = "cpu (hlotk thunks over one arena)"

    def __init__(self, client: "Client"):
        self.client = client

    def prepare(self, module: hlo.Module, poison: Optional[bool] = None,
                target: Optional[str] = None) -> Body:
        from passes.scheduling import Schedule
        from .executable import CpuExecutable
        if not module.is_scheduled:
            module = module.clone()
            Schedule().run(module)
        exe = CpuExecutable.build(module, poison=poison, target=target)

        def run(args: list[np.ndarray], donated: frozenset[int] = frozenset()) -> list[np.ndarray]:
            return exe.run(args, donated)
        run.module = module               # type: ignore[attr-defined]
        run.executable = exe              # type: ignore[attr-defined]
        run.donated_parameters = exe.donated_parameters  # type: ignore[attr-defined]
        return run


def _cuda_backend(client: "Client") -> Any:
    # Triton kernels + cuBLAS over one device arena, CUDA graphs (runtime/cuda/). Raises
    # NoCudaDeviceError here, at client creation, without torch/triton or a GPU.
    from .cuda.backend import CudaBackend
    return CudaBackend(client)


BACKENDS: dict[str, Callable[["Client"], Any]] = {
    "cpu": _ThunkBackend,
    "interpreter": _InterpreterBackend,
    "cuda": _cuda_backend,
}


def flatten_value(value: Any) -> list[np.ndarray]:
    """Tuples (nested too) flattened into their array leaves, in order, as PJRT returns them."""
    if isinstance(value, tuple):
        out: list[np.ndarray] = []
        for v in value:
            out.extend(flatten_value(v))
        return out
    if not isinstance(value, np.ndarray) and not np.isscalar(value):
        raise UnimplementedError(f"the runtime cannot return a {type(value).__name__} "
                                 "(token) result from the entry computation")
    return [np.asarray(value)]


# --- devices and buffers -------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Device:
    id: int
    platform: str
    device_kind: str
    client: "Client"

    def __repr__(self) -> str:
        return f"Device(id={self.id}, platform={self.platform!r})"

    def __str__(self) -> str:
        return f"{self.platform.upper()}_{self.id}"


class Buffer:
    """An array on one device. On the CPU backend it holds a read-only numpy array."""

    def __init__(self, array: np.ndarray, device: Device):
        arr = np.array(array, copy=True, order="C")
        arr.flags.writeable = False
        self._array: Optional[np.ndarray] = arr
        self.device = device

    @classmethod
    def _adopt(cls, array: np.ndarray, device: Device) -> "Buffer":
        """Wrap a fresh array the runtime owns (an executable's output) without copying."""
        b = cls.__new__(cls)
        array.flags.writeable = False
        b._array, b.device, b._deleted_why = array, device, ""
        return b

    def _live(self) -> np.ndarray:
        if self._array is None:
            why = getattr(self, "_deleted_why", "")
            raise ClientError(f"this Buffer was {why or 'deleted'}; it cannot be read or "
                              "passed to execute")
        return self._array

    def _donate(self, to: str) -> np.ndarray:
        """Give this buffer's memory to an executable (``donate_argnums``): the Buffer is
        invalid afterwards, as a donated jax.Array is."""
        arr = self._live()
        self._array = None
        self._deleted_why = f"donated to {to} (donate_argnums) and is invalid after that call"
        if arr.flags.owndata:
            arr.flags.writeable = True
        return arr

    @property
    def shape(self) -> tuple[int, ...]:
        return self._live().shape

    @property
    def dtype(self) -> np.dtype:
        return self._live().dtype

    @property
    def hlo_shape(self) -> Shape:
        a = self._live()
        return Shape(dt.from_numpy(a.dtype), a.shape)

    def on_device_size_in_bytes(self) -> int:
        return self._live().nbytes

    def to_numpy(self) -> np.ndarray:
        return self._live()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self._live()
        return a if dtype is None else a.astype(dtype)

    def delete(self) -> None:
        self._array = None

    def is_deleted(self) -> bool:
        return self._array is None

    def __repr__(self) -> str:
        if self._array is None:
            return f"Buffer(<deleted>, device={self.device})"
        return f"Buffer({self.hlo_shape}, device={self.device})"


# --- executables ---------------------------------------------------------------------------
def _describe(shape: AnyShape) -> str:
    return shape.to_text(print_layout=False)


class LoadedExecutable:
    """A compiled module bound to a device. ``execute`` checks arguments, then runs the body."""

    def __init__(self, client: "Client", module: hlo.Module, body: Body, device: Device,
                 pipeline: str):
        self.client = client
        self.module = module
        self.device = device
        self.pipeline = pipeline
        self._body = body
        entry = module.entry
        assert entry is not None
        self.parameter_shapes: list[AnyShape] = list(entry.parameter_shapes)
        self.result_shapes: list[Shape] = [s for _, s in leaf_paths(entry.result_shape)]

    @property
    def name(self) -> str:
        return self.module.name

    def devices(self) -> list[Device]:
        return [self.device]

    def hlo_modules(self) -> list[hlo.Module]:
        return [self.module]

    def as_text(self) -> str:
        return self.module.to_text()

    def _check_arg(self, index: int, arg: Any, shape: AnyShape) -> Any:
        if shape.is_tuple:
            if not isinstance(arg, (tuple, list)) or len(arg) != len(shape.elements):
                raise InvalidArgumentError(f"argument {index}: expected a tuple of "
                                           f"{len(shape.elements)} buffers for "
                                           f"{_describe(shape)}, got {type(arg).__name__}")
            return tuple(self._check_arg(index, a, s) for a, s in zip(arg, shape.elements))
        if not isinstance(arg, Buffer):
            raise InvalidArgumentError(f"argument {index}: expected a Buffer, got "
                                       f"{type(arg).__name__} (use client.buffer_from_pyval)")
        if arg.is_deleted():
            raise InvalidArgumentError(f"argument {index}: the buffer was deleted")
        if arg.device.client is not self.client:
            raise InvalidArgumentError(f"argument {index}: the buffer lives on {arg.device} "
                                       f"of another client")
        got = arg.hlo_shape
        if not got.compatible(shape):
            raise InvalidArgumentError(f"argument {index}: expected {_describe(shape)}, got "
                                       f"{_describe(got)}")
        return arg.to_numpy()

    def execute(self, arguments: Sequence[Any]) -> list[Buffer]:
        """Run on ``arguments`` (Buffers; a tuple of Buffers for a tuple parameter).

        Returns one Buffer per array leaf of the result: a tuple result is flattened, as
        PJRT's ``Execute`` does.
        """
        args = list(arguments)
        if len(args) != len(self.parameter_shapes):
            sig = ", ".join(_describe(s) for s in self.parameter_shapes)
            raise InvalidArgumentError(f"{self.name} takes {len(self.parameter_shapes)} "
                                       f"arguments ({sig}), got {len(args)}")
        values = [self._check_arg(i, a, s) for i, (a, s) in enumerate(zip(args, self.parameter_shapes))]
        donated = [i for i in getattr(self._body, "donated_parameters", ())
                   if isinstance(args[i], Buffer)]
        if not donated:
            results = self._body(values)
            return [Buffer._adopt(np.asarray(r), self.device) for r in results]
        if len({id(args[i]) for i in donated}) != len(donated) or any(
                args[i] is args[j] for i in donated for j in range(len(args)) if j != i):
            raise InvalidArgumentError(f"{self.name}: a donated buffer is passed twice")
        for i in donated:
            values[i] = args[i]._donate(self.name)
        results = self._body(values, frozenset(donated))
        return [Buffer._adopt(np.asarray(r), self.device) for r in results]

    def profile(self, arguments: Sequence[Any], reps: int = 3) -> list[tuple[str, float]]:
        """Time of each top-level thunk, ``[(description naming %instruction, ms), ...]``
        (``hlotk view --profile`` and ``runtime.viewer.profile_by_name`` read it)."""
        exe = getattr(self._body, "executable", None)
        if exe is None or not hasattr(exe, "profile"):
            raise ClientError(f"{self.name}: this backend's executable cannot be profiled")
        args = [a.to_numpy() if isinstance(a, Buffer) else np.asarray(a) for a in arguments]
        return exe.profile(args, reps)

    def __repr__(self) -> str:
        return f"LoadedExecutable({self.name}, device={self.device}, pipeline={self.pipeline!r})"


# --- the client ----------------------------------------------------------------------------
class Client:
    def __init__(self, platform: str = "cpu", num_devices: int = 1):
        if platform not in BACKENDS:
            raise ClientError(f"unknown backend {platform!r}; known backends: "
                                + ", ".join(sorted(BACKENDS)))
        if num_devices < 1:
            raise ClientError(f"num_devices must be at least 1, got {num_devices}")
        self.platform = platform
        self._backend = BACKENDS[platform](self)
        self._devices = [Device(i, platform, self._backend.device_kind, self)
                         for i in range(num_devices)]

    def devices(self) -> list[Device]:
        return list(self._devices)

    def local_devices(self) -> list[Device]:
        return self.devices()

    def device_count(self) -> int:
        return len(self._devices)

    def _device(self, device: Optional[Device]) -> Device:
        if device is None:
            return self._devices[0]
        if not isinstance(device, Device) or device.client is not self:
            raise ClientError(f"{device!r} is not a device of this {self.platform} client")
        return device

    def buffer_from_pyval(self, x: Any, device: Optional[Device] = None) -> Buffer:
        """Copy ``x`` (numpy array, scalar, JAX array) onto ``device`` (default: device 0)."""
        arr = np.asarray(x)
        try:
            dt.from_numpy(arr.dtype)
        except HlotkError:
            raise InvalidArgumentError(f"cannot place a value of numpy dtype {arr.dtype} in a "
                                       "buffer: it has no HLO element type") from None
        return Buffer(arr, self._device(device))

    def compile(self, module: hlo.Module, *, pipeline: str = "default",
                device: Optional[Device] = None, verify: bool = True,
                dump_dir: Optional[str] = None, poison: Optional[bool] = None,
                target: Optional[str] = None) -> LoadedExecutable:
        """Compile ``module`` for one device.

        ``pipeline`` chooses the HLO passes run first: ``"none"``, ``"default"`` (the
        backend's full pipeline), ``"simplify"`` or a pass spec such as
        ``"inline,fixpoint(simplify,cse,dce)"``. The caller's module is not modified.
        ``verify`` checks the module before the passes and after every pass that changed it;
        ``dump_dir`` writes the per-pass dump (HLO text, graphs, index.html). ``poison``
        (CPU) fills the buffer arena with 0xFF bytes before each run (default: env
        ``HLOTK_POISON_ARENA=1``).
        """
        with fewer_collections():
            return self._compile(module, pipeline, device, verify, dump_dir, poison, target)

    def _compile(self, module: hlo.Module, pipeline: str, device: Optional[Device],
                 verify: bool, dump_dir: Optional[str], poison: Optional[bool],
                 target: Optional[str]) -> LoadedExecutable:
        spec = resolve_pipeline(pipeline, self.platform)
        if target is None:
            # A GPU backend decides fusion for the GPU it runs on (an H200's bandwidth, not
            # the H100's the fusion pass assumes when told nothing).
            target = getattr(self._backend, "fusion_target", None)
        if target is not None:
            # ``target`` (h100, h200, a100 ...) picks the device spec fusion decides for.
            from passes.fusion.pass_ import with_target
            spec = with_target(spec, target)
        if not isinstance(module, hlo.Module) or module.entry is None:
            raise InvalidArgumentError("compile expects an hlo.Module with an entry computation")
        started = getattr(self._backend, "compile_started", None)
        if started is not None:     # e.g. the CUDA backend's cuDNN start-up, in a thread
            started(module)
        records: list = []
        cache_hit = False
        if spec and dump_dir is None:
            # Through the on-disk cache of optimized modules (runtime/compile_cache.py). The
            # input is verified there, unless the entry found says that this exact text was
            # verified when it was stored (same hlo/ sources: the key covers them).
            from . import compile_cache
            original = module

            def run(m: hlo.Module) -> list:
                from .tools import compile_module      # only on a miss (its imports)
                # ``m`` is a copy of the module compile_cache has just verified (``check``);
                # verified once after the passes, the input copied again only should that
                # or a pass fail, to name the pass (run_pipeline's ``replay``).
                return compile_module(m, spec, backend=self.platform, verify=verify,
                                      verified=verify, replay=original.copy)[0]
            # A new entry is written while the CUDA backend's first call waits for its
            # kernels (runtime/deferred.py); elsewhere at once.
            module, records, cache_hit = compile_cache.compiled(
                module, spec, self.platform, run, check=hlo.verify if verify else None,
                defer=self.platform == "cuda")
        else:
            if verify:
                hlo.verify(module)
            module = module.copy()
            if dump_dir is not None:
                from .tools import compile_module
                records, _ = compile_module(module, spec, backend=self.platform,
                                            dump_dir=dump_dir, verify=verify, verified=verify)
        # The backend's own lowering (passes/pipelines.py MANDATORY_LOWERING), whatever
        # the pipeline: a spec of "none" or one a user wrote must not give a wrong answer.
        from passes.pipelines import run_mandatory_lowering
        records += run_mandatory_lowering(module, self.platform, records, verify=verify)
        options = {k: v for k, v in (("poison", poison), ("target", target)) if v is not None}
        body = self._backend.prepare(module, **options)
        module = getattr(body, "module", module)   # the module the body runs (scheduled)
        exe = LoadedExecutable(self, module, body, self._device(device), pipeline)
        exe.pass_records = records
        exe.module_cache_hit = cache_hit      # the passes' result came from the disk cache
        return exe

    def __repr__(self) -> str:
        return f"Client(platform={self.platform!r}, devices={len(self._devices)})"


# The cyclic collector's first threshold while a compile runs (Python's default: 700).
COMPILE_GEN0_THRESHOLD = 50_000


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect cycles less often while a compile runs: it allocates hundreds of thousands
    of container objects (instructions, their operand and user lists, attribute dicts,
    estimates) that nearly all live until it ends, and every young-generation collection
    walks those allocated since the last one and promotes them, for nothing (issue 13:
    a deviceless compile of the Lion step over 200 arrays, medians of 3: 3.15 -> 2.66 s).
    The old thresholds come back afterwards; a collector the caller turned off or set to
    collect less often than this is left alone. What the compile leaves as garbage is
    collected by the next collections, as usual."""
    old = gc.get_threshold()
    if old[0] == 0 or old[0] >= COMPILE_GEN0_THRESHOLD:
        yield
        return
    gc.set_threshold(COMPILE_GEN0_THRESHOLD, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def client(platform: str = "cpu", num_devices: int = 1) -> Client:
    """A runtime client for ``platform`` (one of ``BACKENDS``)."""
    return Client(platform, num_devices)
