"""``runtime.jit``: the front door, shaped like ``jax.jit`` and ``jax.stages``.

    f = runtime.jit(fn)                  # Jitted
    f(x, {"w": w})                       # numpy results in fn's output pytree
    lowered = f.lower(x, {"w": w})       # Lowered: .as_text() is the imported HLO
    compiled = lowered.compile()         # Compiled: .as_text(), .memory_analysis(),
    compiled(x, {"w": w})                #   .cost_analysis(), callable

The JAX function is traced on a flat signature (one parameter per array leaf, in
``jax.tree_util`` order; static arguments closed over) and imported with ``hlo.from_jax``;
the module is then compiled by a ``runtime.Client`` for the chosen backend. ``Jitted``
caches one ``Compiled`` per input signature (pytree structure, leaf shapes/dtypes/weak
types, static argument values).
"""
from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

import hlo
from hlo.errors import HlotkError, InvalidArgumentError

from . import analysis
from .client import Buffer, Client, LoadedExecutable, fewer_collections, resolve_pipeline
from .client import client as make_client

_CLIENTS: dict[str, Client] = {}


def default_client(backend: str) -> Client:
    """One shared client per backend, created on first use."""
    if backend not in _CLIENTS:
        _CLIENTS[backend] = make_client(backend)
    return _CLIENTS[backend]


# --- abstract values ---------------------------------------------------------------------
@dataclass(frozen=True)
class LeafSpec:
    """What the compiled program expects for one array leaf."""
    shape: tuple[int, ...]
    dtype: np.dtype
    weak_type: bool   # a Python scalar: JAX types it weakly (it adapts to other operands)

    def describe(self) -> str:
        return f"{hlo.dtypes.from_numpy(self.dtype).name}[{','.join(map(str, self.shape))}]"


_PY_SCALARS = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}


def _leaf_spec(x: Any, where: str) -> LeafSpec:
    import jax
    if type(x) in _PY_SCALARS:
        dtype = jax.dtypes.canonicalize_dtype(_PY_SCALARS[type(x)])
        return LeafSpec((), np.dtype(dtype), True)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        try:
            dtype = np.dtype(jax.dtypes.canonicalize_dtype(x.dtype))
        except TypeError:
            raise InvalidArgumentError(f"{where}: dtype {x.dtype} is not supported") from None
        return LeafSpec(tuple(int(d) for d in x.shape), dtype,
                        bool(getattr(x, "weak_type", False)))
    raise InvalidArgumentError(f"{where}: expected an array or a Python scalar, got "
                               f"{type(x).__name__}")


def _path_text(path: tuple, arg_names: Sequence[str], static: frozenset[int]) -> str:
    """``argument 1 (params['w'])`` for the leaf at ``path`` of ``(args, kwargs)``."""
    import jax
    if not path:
        return "argument"
    if path[0].idx == 0:           # positional: path[1] indexes the dynamic args
        dyn_index = path[1].idx
        positions = [i for i in range(dyn_index + len(static) + 1) if i not in static]
        index = positions[dyn_index]
        name = arg_names[index] if index < len(arg_names) else f"args[{index}]"
        rest = jax.tree_util.keystr(tuple(path[2:]))
        return f"argument {index} ({name}{rest})"
    key = path[1].key
    rest = jax.tree_util.keystr(tuple(path[2:]))
    return f"keyword argument {key!r} ({key}{rest})"


class _Signature(NamedTuple):
    in_tree: Any
    leaves: tuple[LeafSpec, ...]
    static: tuple[Any, ...]


def _split_static(args: tuple, static_argnums: frozenset[int]) -> tuple[tuple, tuple]:
    dynamic = tuple(a for i, a in enumerate(args) if i not in static_argnums)
    static = tuple((i, args[i]) for i in sorted(static_argnums) if i < len(args))
    return dynamic, static


def _to_numpy(x: Any, spec: LeafSpec) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype != spec.dtype:
        # Only canonicalization reaches here (f64 -> f32 without x64, Python scalars).
        arr = arr.astype(spec.dtype)
    return arr


# --- stages --------------------------------------------------------------------------------
def first_call_python(backend: str, donated: Any) -> bool:
    """Whether a cuda program's first call runs on the Python path, its native graph
    (runtime/cuda/native: a warm-up, four captures, XLA's compile of the FFI call) made on
    the second call instead. The first call then returns 0.04-0.08 s sooner (H200, NOTES
    session 7), and a program called once never builds the graph. Not where arguments are
    donated: the native call is what hands their buffers to the results."""
    return backend == "cuda" and not donated and \
        os.environ.get("HLOTK_NATIVE_FIRST_CALL", "0") in ("0", "")


class Compiled:
    """A compiled program for one input signature (``jax.stages.Compiled``).

    Called with the dynamic arguments only: static arguments were fixed at ``lower``.
    """

    def __init__(self, lowered: "Lowered", executable: LoadedExecutable):
        self.lowered = lowered
        self.executable = executable
        self.in_tree = lowered.in_tree
        self.out_tree = lowered.out_tree
        # cuda: the call through the executable's native graph (runtime/cuda/native), made
        # on the second call (``first_call_python``); False where there is none.
        self._native: Any = None
        self._calls = 0

    @property
    def module(self) -> hlo.Module:
        return self.executable.module

    def as_text(self) -> str:
        return self.executable.as_text()

    def memory_analysis(self) -> analysis.CompiledMemoryStats:
        exe = getattr(getattr(self.executable, "_body", None), "executable", None)
        return analysis.memory_analysis(self.module, getattr(exe, "assignment", None))

    def buffer_assignment(self) -> Any:
        """The BufferAssignment the CPU executable runs with (``.to_text()``, timeline)."""
        from passes.buffer_assignment import assign_buffers
        exe = getattr(getattr(self.executable, "_body", None), "executable", None)
        return exe.assignment if exe is not None else assign_buffers(self.module)

    def cost_analysis(self) -> dict[str, float]:
        return analysis.cost_analysis(self.module)

    def _flat_inputs(self, args: tuple, kwargs: dict) -> list[np.ndarray]:
        import jax
        lowered = self.lowered
        if getattr(getattr(self.executable, "_body", None), "run_device", None) is not None:
            # Device backend fast path (a call's host time is comparable to a small kernel):
            # JAX arrays of exactly the compiled shapes/dtypes pass as they are; anything
            # else takes the checked path below, with its error messages.
            leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
            if tree == self.in_tree and all(
                    isinstance(x, jax.Array) and x.shape == s.shape and x.dtype == s.dtype
                    for x, s in zip(leaves, lowered.in_specs)):
                return leaves
        leaves_with_path, tree = jax.tree_util.tree_flatten_with_path((args, kwargs))
        if tree != self.in_tree:
            n_args = len(args)
            expected = lowered.num_dynamic_args
            if n_args != expected and not kwargs:
                raise InvalidArgumentError(
                    f"{lowered.name} was compiled for {expected} (non-static) arguments, got "
                    f"{n_args}")
            raise InvalidArgumentError(f"{lowered.name}: the arguments' pytree structure "
                                       f"{tree} differs from the compiled one {self.in_tree}")
        out = []
        # A device backend (cuda) takes arrays as they are (JAX arrays through DLPack, no
        # host round trip); only Python scalars and dtype canonicalization go through numpy.
        device_native = getattr(getattr(self.executable, "_body", None), "run_device", None) is not None
        for (path, x), spec in zip(leaves_with_path, lowered.in_specs):
            where = _path_text(path, lowered.arg_names, lowered.static_argnums)
            got = _leaf_spec(x, where)
            if got.shape != spec.shape or got.dtype != spec.dtype:
                raise InvalidArgumentError(f"{where}: expected {spec.describe()}, got "
                                           f"{got.describe()}")
            # An hlotk Buffer is passed as it is (so that donating it invalidates it).
            if device_native and hasattr(x, "__dlpack__") and np.dtype(x.dtype) == spec.dtype:
                out.append(x)
                continue
            out.append(x if isinstance(x, Buffer) and x.dtype == spec.dtype else _to_numpy(x, spec))
        return out

    def call_flat(self, flat: list[np.ndarray]) -> list[np.ndarray]:
        run_device = getattr(getattr(self.executable, "_body", None), "run_device", None)
        if run_device is not None:      # cuda: device arrays in, JAX arrays out (DLPack)
            return run_device(flat)
        client = self.executable.client
        buffers = [x if isinstance(x, Buffer) and x.device is self.executable.device
                   else client.buffer_from_pyval(x, self.executable.device) for x in flat]
        return [b.to_numpy() for b in self.executable.execute(buffers)]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        native = self._native
        if native is None:
            # The first run (thunks, kernels loaded) and the native graph's build: collected
            # less often, as a compile (fewer_collections)
            with fewer_collections():
                self._calls += 1
                if self._calls == 1 and first_call_python(self.lowered.backend,
                                                          self.lowered.donate_dynamic):
                    return self._call_checked(args, kwargs)
                native = self._native = self._native_caller()
                if native:
                    return native(args, kwargs)
                return self._call_checked(args, kwargs)
        if native:
            return native(args, kwargs)
        return self._call_checked(args, kwargs)

    def _native_caller(self) -> Any:
        if self.lowered.backend != "cuda":
            return False
        from .cuda.native.front import compiled_caller, disabled
        return False if disabled() else compiled_caller(self)

    def _call_checked(self, args: tuple, kwargs: dict) -> Any:
        import jax
        outs = self.call_flat(self._flat_inputs(args, kwargs))
        if len(outs) != self.out_tree.num_leaves:
            raise HlotkError(f"{self.lowered.name}: the executable returned {len(outs)} "
                             f"arrays, the function's output has {self.out_tree.num_leaves}")
        return jax.tree_util.tree_unflatten(self.out_tree, outs)

    def __repr__(self) -> str:
        return f"Compiled({self.lowered.name}, backend={self.lowered.backend!r})"


class Lowered:
    """The imported HLO module for one input signature (``jax.stages.Lowered``)."""

    def __init__(self, module: hlo.Module, *, name: str, in_tree: Any,
                 in_specs: tuple[LeafSpec, ...], out_tree: Any, backend: str, pipeline: str,
                 arg_names: Sequence[str], static_argnums: frozenset[int],
                 num_dynamic_args: int):
        self.module = module
        self.name = name
        self.in_tree = in_tree
        self.in_specs = in_specs
        self.out_tree = out_tree
        self.backend = backend
        self.pipeline = pipeline
        self.arg_names = list(arg_names)
        self.static_argnums = static_argnums
        self.num_dynamic_args = num_dynamic_args

    def as_text(self) -> str:
        return self.module.to_text()

    def compile(self, *, dump_dir: str | None = None, verify: bool = True) -> Compiled:
        """Run the pipeline and build the executable; ``dump_dir`` writes the per-pass dump
        (HLO text before/after each pass, graphs, ``index.html``)."""
        if self.module.config.get("num_partitions", 1) > 1:
            # Sharded (in_shardings/out_shardings/mesh): partition and run on N devices.
            from .spmd import compile_spmd
            return Compiled(self, compile_spmd(self.module, verify=verify,
                                               backend=self.backend))
        client = default_client(self.backend)
        module = self.module
        donated = getattr(self, "donated_leaves", ())
        if donated:
            module = module.clone()
            aliases = donation_aliases(module, donated)
            if aliases:
                from passes.dataflow import format_input_output_alias
                module.config["input_output_alias"] = format_input_output_alias(aliases)
        extra = {} if getattr(self, "poison", None) is None else {"poison": self.poison}
        if getattr(self, "target", None) is not None:
            extra["target"] = self.target
        return Compiled(self, client.compile(module, pipeline=self.pipeline,
                                             dump_dir=dump_dir, verify=verify, **extra))

    def __repr__(self) -> str:
        return f"Lowered({self.name}, {len(self.in_specs)} inputs)"


def donation_aliases(module: hlo.Module, donated: Sequence[int]) -> dict[tuple[int, ...], int]:
    """Output index -> donated parameter, as JAX pairs them: each donated input goes to the
    first output leaf of the same shape and dtype not taken yet."""
    from passes.dataflow import array_leaves
    root = module.entry.root.shape
    outs = list(array_leaves(root))
    taken: set[tuple[int, ...]] = set()
    pairs: dict[tuple[int, ...], int] = {}
    for p in sorted(donated):
        ps = module.entry.parameters[p].shape
        for ix, s in outs:
            if ix not in taken and not ps.is_tuple and s.compatible(ps):
                taken.add(ix)
                pairs[ix] = p
                break
    return pairs


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    size: int


class Jitted:
    """The object ``runtime.jit(fn)`` returns (``jax.stages.Wrapped``)."""

    def __init__(self, fn: Callable, backend: str = "cpu", pipeline: str = "default",
                 static_argnums: int | Sequence[int] = (), donate_argnums: int | Sequence[int] = (),
                 in_shardings: Any = None, out_shardings: Any = None, mesh: Any = None,
                 poison: bool | None = None, target: str | None = None):
        if not callable(fn):
            raise InvalidArgumentError(f"jit expects a callable, got {type(fn).__name__}")
        self.fn = fn
        if in_shardings is None and out_shardings is None and mesh is None:
            self._sharding_kwargs: dict = {}      # (runtime.spmd not imported for nothing)
        else:
            from .spmd import jax_sharding_kwargs   # jax.jit's own sharding arguments
            self._sharding_kwargs = jax_sharding_kwargs(in_shardings, out_shardings, mesh)
        self.backend = backend
        self.pipeline = pipeline
        as_set = lambda v: frozenset((v,) if isinstance(v, int) else v)  # noqa: E731
        self.static_argnums = as_set(static_argnums)
        # Donated arguments may share a buffer with an output (input_output_alias); an hlotk
        # Buffer passed for one is invalid after the call, as a donated jax.Array is.
        self.donate_argnums = as_set(donate_argnums)
        self.poison = poison
        self.target = target      # GPU spec fusion decides for (h100, h200, a100 ...)
        self._cache: dict[_Signature, Compiled] = {}
        self._hits = 0
        self._misses = 0
        # cuda: one jax.jit whose trace compiles with hlotk and emits the native graph's FFI
        # call (runtime/cuda/native/front.py), made on the first call; False: none.
        self._front: Any = None
        try:
            params = inspect.signature(fn).parameters.values()
            self._arg_names = [p.name for p in params
                               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            self._arg_names = []
        self.__name__ = getattr(fn, "__name__", "fn")
        functools.update_wrapper(self, fn)
        # Fail early on a backend or pipeline name the runtime does not know.
        default_client(backend)
        resolve_pipeline(pipeline, backend)

    # --- signatures ----------------------------------------------------------------------
    def _signature(self, args: tuple, kwargs: dict) -> tuple[_Signature, tuple]:
        import jax
        for i in self.static_argnums:
            if i >= len(args):
                raise InvalidArgumentError(f"{self.__name__}: static_argnums has {i} but only "
                                           f"{len(args)} positional arguments were given")
        dynamic, static = _split_static(args, self.static_argnums)
        for i, v in static:
            try:
                hash(v)
            except TypeError:
                raise InvalidArgumentError(f"argument {i} is static (static_argnums) and must be "
                                           f"hashable; got {type(v).__name__}") from None
        leaves_with_path, tree = jax.tree_util.tree_flatten_with_path((dynamic, kwargs))
        specs = tuple(_leaf_spec(x, _path_text(p, self._arg_names, self.static_argnums))
                      for p, x in leaves_with_path)
        return _Signature(tree, specs, static), dynamic

    # --- stages --------------------------------------------------------------------------
    def _lower(self, sig: _Signature, num_dynamic: int) -> Lowered:
        import jax
        store: dict[str, Any] = {}

        # Wrapped so that JAX names the entry parameters after fn's own arguments
        # (``x``, ``params['w']``) and so that the output pytree is recorded while tracing.
        @functools.wraps(self.fn)
        def traced_fn(*args: Any, **kwargs: Any) -> Any:
            out = self.fn(*args, **kwargs)
            store["out_tree"] = jax.tree_util.tree_structure(out)
            return out

        # keep_unused: one entry parameter per leaf, even for arguments fn ignores.
        traced = jax.jit(traced_fn, static_argnums=tuple(sorted(self.static_argnums)),
                         keep_unused=True, **self._sharding_kwargs)
        specs = [jax.ShapeDtypeStruct(s.shape, s.dtype, weak_type=s.weak_type) for s in sig.leaves]
        dyn_specs, kw_specs = jax.tree_util.tree_unflatten(sig.in_tree, specs)
        it = iter(dyn_specs)
        static = dict(sig.static)
        n = len(dyn_specs) + len(static)
        full = [static[i] if i in static else next(it) for i in range(n)]
        from hlo.stablehlo.importer import export_jax

        from .compile_cache import imported
        # hlo.from_jax's two steps, the import through the on-disk cache (by the bytecode);
        # on the CUDA backend the new entry is written while the first call waits for its
        # kernels (runtime/deferred.py).
        module = imported(export_jax(traced, *full, **kw_specs), defer=self.backend == "cuda")
        if len(module.entry.parameters) != len(specs):
            raise HlotkError(f"{self.__name__}: the imported module has "
                             f"{len(module.entry.parameters)} parameters for {len(specs)} "
                             "argument leaves")
        lowered = Lowered(module, name=self.__name__, in_tree=sig.in_tree, in_specs=sig.leaves,
                          out_tree=store["out_tree"], backend=self.backend,
                          pipeline=self.pipeline, arg_names=self._arg_names,
                          static_argnums=self.static_argnums, num_dynamic_args=num_dynamic)
        lowered.donated_leaves = self._donated_leaves(sig)
        positions = [i for i in range(num_dynamic + len(sig.static)) if i not in self.static_argnums]
        lowered.donate_dynamic = tuple(k for k, i in enumerate(positions)
                                       if i in self.donate_argnums)
        lowered.poison = self.poison
        lowered.target = self.target
        return lowered

    def _donated_leaves(self, sig: _Signature) -> tuple[int, ...]:
        """Flat parameter numbers of the leaves of the donated positional arguments."""
        import jax
        if not self.donate_argnums:
            return ()
        numbered = jax.tree_util.tree_unflatten(sig.in_tree, list(range(len(sig.leaves))))
        dynamic_args = numbered[0]
        static = {i for i, _ in sig.static}
        positions = [i for i in range(len(dynamic_args) + len(static)) if i not in static]
        out: list[int] = []
        for k, argnum in enumerate(positions):
            if argnum in self.donate_argnums and argnum not in self.static_argnums:
                out.extend(jax.tree_util.tree_leaves(dynamic_args[k]))
        return tuple(out)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        sig, dynamic = self._signature(args, kwargs)
        with fewer_collections():
            return self._lower(sig, len(dynamic))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        front = self._front
        if front is None:
            if not self._cache and first_call_python(self.backend, self.donate_argnums):
                return self._call_checked(args, kwargs)
            front = self._front = self._native_front()
        if front:
            return front(args, kwargs)
        return self._call_checked(args, kwargs)

    def _native_front(self) -> Any:
        if self.backend != "cuda":
            return False
        from .cuda.native.front import jitted_front
        return jitted_front(self)

    def _call_checked(self, args: tuple, kwargs: dict) -> Any:
        sig, dynamic = self._signature(args, kwargs)
        if sig in self._cache:
            return self._compiled_for(sig, len(dynamic))(*dynamic, **kwargs)
        # A first call: the tracing, the import and the first run allocate as the compile
        # does (fewer_collections' reason), and on the CUDA backend the first run also
        # builds a thunk per kernel. Collected at Python's default rate, the Lion and AdamW
        # steps over 200 arrays spent 0.21 and 0.58 s of their first call in the collector
        # (H200, session 9), two full collections among them.
        with fewer_collections():
            return self._compiled_for(sig, len(dynamic))(*dynamic, **kwargs)

    def _compiled_for(self, sig: _Signature, num_dynamic: int) -> Compiled:
        compiled = self._cache.get(sig)
        if compiled is None:
            self._misses += 1
            with fewer_collections():
                compiled = self._lower(sig, num_dynamic).compile()
            self._cache[sig] = compiled
        else:
            self._hits += 1
        return compiled

    def cache_info(self) -> CacheInfo:
        """Hits and misses of the compile cache (a miss is one lower + compile)."""
        return CacheInfo(self._hits, self._misses, len(self._cache))

    def clear_cache(self) -> None:
        self._cache.clear()
        self._front = None      # jax.jit's own cache holds the native calls of the old ones

    def __repr__(self) -> str:
        return f"Jitted({self.__name__}, backend={self.backend!r})"


def jit(fn: Callable, backend: str = "cpu", pipeline: str = "default",
        static_argnums: int | Sequence[int] = (),
        donate_argnums: int | Sequence[int] = (), in_shardings: Any = None,
        out_shardings: Any = None, mesh: Any = None, poison: bool | None = None,
        target: str | None = None) -> Jitted:
    """Compile ``fn`` (a JAX-traceable function) with hlotk, like ``jax.jit``.

    ``in_shardings``/``out_shardings`` take what jax.jit takes (NamedSharding, or a
    PartitionSpec with ``mesh=``); a sharded program is partitioned and runs on as many
    simulated CPU devices as the mesh has (see runtime/spmd.py). ``donate_argnums`` lets
    outputs reuse those arguments' buffers; ``poison=True`` fills the CPU buffer arena with
    0xFF bytes before each run (a debugging aid; env ``HLOTK_POISON_ARENA=1`` does the same).
    ``target`` ("h100", "h200", "a100" ...) is the GPU whose cost model fusion decides for.
    """
    return Jitted(fn, backend=backend, pipeline=pipeline, static_argnums=static_argnums,
                  donate_argnums=donate_argnums, in_shardings=in_shardings,
                  out_shardings=out_shardings, mesh=mesh, poison=poison, target=target)

