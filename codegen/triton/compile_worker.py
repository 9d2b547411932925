"""A Triton compile worker (``codegen/triton/parallel.py`` starts these): run as a plain
script (``python .../compile_worker.py``), it imports the standard library and Triton and
nothing of hlotk (no numpy, torch or jax), so a worker is ready in the time Triton takes to
import. It reads one JSON job ``[path, name, specialization]`` per stdin line and answers
``ok`` or ``error ...``.

At start, before the first job arrives, it pays Triton's once-per-process costs (the
compiler's modules, the hash of Triton's own sources and library that keys every cache
entry), so a pool started early has them done by the time jobs come. After compiling a
kernel it also builds the kernel's launcher, where this Triton compiles one in C per
signature (3.6 does; 3.9 launches from Python): the launch then finds that in Triton's
cache too.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Any


def load_fn(path: str, name: str) -> Any:
    """The ``@triton.jit`` function ``name`` of the generated kernel file ``path``, or of
    the module ``path[7:]`` imported by name where ``path`` is ``module:NAME`` (hlotk's own
    hand-written kernels, e.g. flash attention: they import other hlotk modules)."""
    if path.startswith("module:"):
        return getattr(importlib.import_module(path[7:]), name)
    mod_name = f"hlotk_triton_{os.path.basename(path)[:-3]}"
    mod = sys.modules.get(mod_name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
    return getattr(mod, name)


def compile_specialization(fn: Any, data: str) -> Any:
    """Compile what ``data`` (Triton's ``specialization_data``) describes, for the target
    it names, without a GPU: what ``JITFunction.preload`` does, minus asking the driver
    for the device, so a worker needs no CUDA context. Plain constants only (ours are
    block sizes); anything else raises and the caller uses ``preload``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            raise ValueError("a non-plain constant")
        return tuple(plain(x) for x in v) if isinstance(v, list) else v
    obj = json.loads(data)
    target = GPUTarget(**obj["target"])
    backend = make_backend(target)
    constexprs = {tuple(k): plain(v) for k, v in zip(obj["constant_keys"], obj["constant_vals"])}
    attrs = dict(zip(map(tuple, obj["attrs_keys"]), obj["attrs_vals"]))
    signature = {k: plain(v) for k, v in obj["signature"].items()}
    options = backend.parse_options({k: tuple(v) if isinstance(v, list) else v
                                     for k, v in obj["options"].items()})
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


def build_launcher(kernel: Any) -> None:
    """Build (into Triton's cache) the launcher the first launch of ``kernel`` would build.
    Best effort: no C compiler or no CUDA library here just leaves it to the launch."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher
        CudaLauncher(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001  (the launch builds it, as it would anyway)
        pass


def compile_job(path: str, name: str, data: str) -> None:
    """Compile one specialization into Triton's on-disk cache."""
    fn = load_fn(path, name)
    try:
        kernel = compile_specialization(fn, data)
    except Exception:  # noqa: BLE001  (another Triton's format: its own preload, on a GPU)
        fn.preload(data)
        return
    build_launcher(kernel)


# Where Triton versions define or import triton_key(): each module's name is rebound.
TRITON_KEY_MODULES = ("triton.runtime.cache", "triton.compiler.compiler",
                      "triton.runtime.autotuner", "triton.runtime.jit")


def patch_triton_key(value: str) -> Any:
    """Make every module in TRITON_KEY_MODULES answer ``value`` for triton_key(); returns the
    stand-in function (``codegen/triton/triton_key.py`` uses this too)."""
    import importlib

    def triton_key() -> str:
        return value
    for name in TRITON_KEY_MODULES:
        mod = sys.modules.get(name)
        if mod is None:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                continue
        if hasattr(mod, "triton_key"):
            mod.triton_key = triton_key
    return triton_key


def use_parent_key() -> bool:
    """Use the Triton installation key the parent passed in ``HLOTK_TRITON_KEY`` (it read
    it from its disk cache or hashed it for this same installation: the worker runs the
    parent's interpreter), instead of hashing Triton's sources and library again (~0.3 s)."""
    value = os.environ.get("HLOTK_TRITON_KEY")
    if not value:
        return False
    patch_triton_key(value)
    return True


def warm_up() -> None:
    """Triton's once-per-process costs, paid before the first job."""
    try:
        import triton.compiler  # noqa: F401
        if not use_parent_key():
            from triton.runtime.cache import triton_key
            triton_key()
    except Exception:  # noqa: BLE001  (the first job pays them instead)
        pass


def main() -> None:
    warm_up()
    for line in sys.stdin:
        try:
            compile_job(*json.loads(line))
            answer = "ok"
        except Exception as e:  # noqa: BLE001  (reported; the launch compiles it instead)
            answer = f"error {type(e).__name__}: {e}".replace("\n", " ")[:500]
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
