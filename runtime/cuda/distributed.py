"""A partitioned program on several GPUs: one worker process per GPU, NCCL between them.

    mesh = GpuMesh(2)                          # workers on cuda:0 and cuda:1 (torch.distributed)
    key = mesh.load(partitioned_module)        # every worker builds a CudaExecutable
    pieces = mesh.run(key, per_device_args)    # per device: its result leaves (numpy)
    pieces = mesh.run_shared(key, on_devices)  # arguments already on the GPUs: CUDA IPC
    ms = mesh.time(key, per_device_args)       # per-call wall ms, arguments already on the GPUs
    files = mesh.trace(key, per_device_args, "traces/")   # one step, torch.profiler
    mesh.close()

Each worker is a spawned process that owns one GPU (``torch.cuda.set_device(rank)``), joins
the NCCL process group and builds the same scheduled module into a ``CudaExecutable`` whose
collective instructions run through ``collectives.CollectiveThunk``. The parent sends
commands over pipes and waits for every worker with a deadline: a worker that fails sends
its traceback, a worker that dies or a collective that never completes (mismatched programs
or groups) ends the whole mesh with a ``CollectiveError`` naming the rank — never a hang.

``backend="gloo"`` runs the same workers on CPU tensors with Triton's interpreter (no GPU
needed): the path the tests exercise on machines without GPUs.
"""
from __future__ import annotations

import atexit
import os
import socket
import time
import traceback
from datetime import timedelta
from typing import Any, Optional, Sequence

import numpy as np

import hlo

from .collectives import CollectiveError

# Workers never touch JAX arrays (results go back as numpy); if anything imports jax there,
# it must not grab the GPUs' memory or initialize CUDA for them.
_WORKER_ENV = {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, init_method: str, backend: str, conn: Any,
            timeout_s: float) -> None:
    """One process of the mesh: join the group, then serve load/run/time commands."""
    conn.send(rank)
    import torch
    import torch.distributed as dist
    try:
        kw: dict[str, Any] = {}
        if backend == "nccl":
            torch.cuda.set_device(rank)
            kw["device_id"] = torch.device("cuda", rank)
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout_s), **kw)
        device = f"cuda:{rank}" if backend == "nccl" else "cpu"
        from .backend import CudaExecutable
        from .collectives import Communicator
        comm = Communicator.current()
        executables: dict[int, Any] = {}
        from .sharing import SharedOpener
        shared = SharedOpener(device)
        conn.send(("ok", device))
    except Exception:  # noqa: BLE001  (reported to the parent, which raises)
        conn.send(("error", traceback.format_exc()))
        return
    try:
        while True:
            cmd, *payload = conn.recv()
            if cmd == "stop":
                break
            try:
                if cmd == "load":
                    key, text, options = payload
                    exe = CudaExecutable.build(hlo.parse_hlo(text), device=device,
                                               communicator=comm, **options)
                    executables[key] = exe
                    conn.send(("ok", exe.report()))
                elif cmd == "run":
                    key, args = payload
                    outs = executables[key].run(list(args), output="numpy")
                    conn.send(("ok", outs))
                elif cmd == "run_shared":
                    key, refs = payload
                    args = [shared.open(ref) for ref in refs]
                    outs = executables[key].run(args, output="numpy")
                    conn.send(("ok", outs))
                elif cmd == "profile":
                    key, args = payload
                    dev_args = [_device_tensor(a, device) for a in args]
                    conn.send(("ok", executables[key].profile(dev_args)))
                elif cmd == "time":
                    key, args, reps = payload
                    conn.send(("ok", _time(executables[key], args, reps, device)))
                elif cmd == "stats":
                    (key,) = payload
                    exe = executables[key]
                    conn.send(("ok", {k: v for k, v in exe.stats.items()
                                      if isinstance(v, (int, float))} | {
                        "shared_buffers_opened": shared.opened}))
                elif cmd == "trace":
                    key, args, path = payload
                    conn.send(("ok", _trace(executables[key], args, device, path)))
                else:
                    conn.send(("error", f"unknown command {cmd!r}"))
            except Exception:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _device_tensor(a: np.ndarray, device: str) -> Any:
    """``a`` copied to ``device`` as a torch tensor of its dtype (bf16 and friends
    included, which ``torch.from_numpy`` does not take)."""
    import torch
    from hlo.dtypes import from_numpy
    from .arena import torch_dtype
    shape = np.shape(a)          # ascontiguousarray makes a 0-d array 1-d: keep the shape
    a = np.ascontiguousarray(a)
    raw = torch.from_numpy(a.reshape(-1).view(np.uint8).copy()).to(device)
    return raw.view(torch_dtype(from_numpy(a.dtype))).reshape(shape)


def _time(exe: Any, args: Sequence[np.ndarray], reps: int, device: str) -> float:
    """Median of 5 batches of per-call wall ms, the arguments resident on this GPU, every
    rank starting each batch together (a barrier)."""
    import torch
    import torch.distributed as dist
    dev_args = [_device_tensor(a, device) for a in args]
    for _ in range(3):
        exe.run(dev_args, output="torch")

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        dist.barrier()
    batches = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            exe.run(dev_args, output="torch")
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        batches.append((time.perf_counter() - t0) * 1e3 / reps)
    return float(np.median(batches))


def _trace(exe: Any, args: Sequence[np.ndarray], device: str, path: str) -> str:
    """One step recorded by torch.profiler (after warm-up runs, every rank together),
    written to ``path`` as a Chrome trace (device kernels by stream on GPUs)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile
    dev_args = [_device_tensor(a, device) for a in args]
    for _ in range(3):
        exe.run(dev_args, output="torch")
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=activities) as prof:
        exe.run(dev_args, output="torch")
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    return path


class GpuMesh:
    """``num_devices`` worker processes, one per GPU, joined by torch.distributed."""

    def __init__(self, num_devices: int, *, backend: Optional[str] = None,
                 timeout: float = 300.0):
        import torch
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl" and torch.cuda.device_count() < num_devices:
            raise CollectiveError(f"the program is partitioned over {num_devices} devices but "
                                  f"this machine has {torch.cuda.device_count()} GPUs; the "
                                  "mesh must match the devices")
        if backend == "gloo" and os.environ.get("TRITON_INTERPRET") != "1":
            raise CollectiveError("backend 'gloo' runs the CUDA executables on the CPU through "
                                  "Triton's interpreter: set TRITON_INTERPRET=1")
        self.num_devices = num_devices
        self.backend = backend
        self.timeout = timeout
        self._next_key = 0
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        from .sharing import SharedStaging
        self._staging = SharedStaging(backend)
        self._start()
        atexit.register(self.close)

    def _start(self) -> None:
        """Start one worker per device (``python -m runtime.cuda.distributed``: a fresh
        interpreter, so the caller's ``__main__`` is never re-run) and accept their
        connections."""
        import subprocess
        import sys
        import threading
        from multiprocessing.connection import Listener
        authkey = os.urandom(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        host, port = listener.address
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, **_WORKER_ENV, HLOTK_MESH_AUTHKEY=authkey.hex(),
                   PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        init = f"tcp://127.0.0.1:{_free_port()}"
        for rank in range(self.num_devices):
            self._procs.append(subprocess.Popen(
                [sys.executable, "-m", "runtime.cuda.distributed", str(rank),
                 str(self.num_devices), init, self.backend, f"{host}:{port}", str(self.timeout)],
                env=env))
        accepted: dict[int, Any] = {}

        def accept() -> None:
            try:
                while len(accepted) < self.num_devices:
                    conn = listener.accept()
                    accepted[conn.recv()] = conn
            except OSError:      # the listener closed: we gave up waiting
                pass
        t = threading.Thread(target=accept, daemon=True)
        t.start()
        deadline = time.monotonic() + self.timeout
        while t.is_alive() and time.monotonic() < deadline:
            t.join(0.2)
            dead = [r for r, p in enumerate(self._procs) if p.poll() is not None]
            if dead:
                break
        listener.close()
        if len(accepted) < self.num_devices:
            codes = {r: p.poll() for r, p in enumerate(self._procs)}
            self.close()
            missing = sorted(set(range(self.num_devices)) - set(accepted))
            raise CollectiveError(f"GPU workers {missing} did not start (exit codes "
                                  f"{[codes[r] for r in missing]}; their stderr is above)")
        self._conns = [accepted[r] for r in range(self.num_devices)]
        self._gather("start")

    # --- talking to the workers ----------------------------------------------------------
    def _gather(self, what: str) -> list[Any]:
        """Every worker's answer, in rank order; the first failure ends the mesh."""
        from multiprocessing.connection import wait
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + self.timeout
        pending = dict(enumerate(self._conns))
        while pending:
            left = deadline - time.monotonic()
            ready = wait(list(pending.values()), timeout=max(left, 0)) if left > 0 else []
            if not ready:
                dead = {r: self._procs[r].poll() for r in pending
                        if self._procs[r].poll() is not None}
                self.close()
                if dead:
                    r, code = next(iter(dead.items()))
                    raise CollectiveError(f"{what}: GPU worker {r} exited (code {code})")
                raise CollectiveError(f"{what}: GPU workers {sorted(pending)} gave no answer "
                                      f"within {self.timeout:.0f} s (a collective that never "
                                      "completes: programs or replica groups that differ "
                                      "between devices?)")
            for rank, conn in list(pending.items()):
                if conn not in ready:
                    continue
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    code = self._procs[rank].poll()
                    self.close()
                    raise CollectiveError(f"{what}: GPU worker {rank} exited (code "
                                          f"{code})") from None
                if status != "ok":
                    self.close()
                    raise CollectiveError(f"{what}: GPU worker {rank} failed:\n{value}")
                answers[rank] = value
                del pending[rank]
        return [answers[r] for r in range(self.num_devices)]

    def _command(self, what: str, per_rank: Sequence[tuple]) -> list[Any]:
        if not self._procs:
            raise CollectiveError("this GpuMesh is closed (a worker failed, or close() ran)")
        for conn, msg in zip(self._conns, per_rank):
            conn.send(msg)
        return self._gather(what)

    # --- the public API -------------------------------------------------------------------
    def load(self, module: hlo.Module | str, **options: Any) -> int:
        """Build ``module`` (scheduled, partitioned) on every worker; returns its key."""
        text = module if isinstance(module, str) else module.to_text()
        key = self._next_key
        self._next_key += 1
        self.reports = self._command("load", [("load", key, text, options)] * self.num_devices)
        return key

    def run(self, key: int, per_device_args: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """Run executable ``key``: device d gets ``per_device_args[d]``; each device's
        result leaves, as numpy arrays."""
        self._check_args(per_device_args)
        return self._command("run", [("run", key, list(a)) for a in per_device_args])

    def run_shared(self, key: int, per_device_args: Sequence[Sequence[Any]]) -> list[list[np.ndarray]]:
        """``run`` with arguments already on the devices: ``per_device_args[d]`` are arrays
        on device d (torch tensors on ``cuda:d``; numpy arrays on the gloo path). Each is
        copied into a buffer this process shares with worker d (CUDA IPC on GPUs, POSIX
        shared memory on the CPU), which the worker opens once and reads in place: only
        small handles cross the pipes, not pickled host copies of the arguments."""
        self._check_args(per_device_args)
        refs = [[self._staging.put((key, k), d, a) for k, a in enumerate(args)]
                for d, args in enumerate(per_device_args)]
        self._staging.sync()
        return self._command("run_shared", [("run_shared", key, r) for r in refs])

    def time(self, key: int, per_device_args: Sequence[Sequence[np.ndarray]],
             reps: int = 20) -> float:
        """Per-call wall ms of executable ``key`` (the slowest device's median)."""
        self._check_args(per_device_args)
        return max(self._command("time", [("time", key, list(a), reps)
                                          for a in per_device_args]))

    def trace(self, key: int, per_device_args: Sequence[Sequence[np.ndarray]],
              directory: str) -> list[str]:
        """One step of executable ``key`` recorded by torch.profiler on every worker; the
        Chrome trace files (``directory/rank{d}.json``), read with ``timeline.py``."""
        self._check_args(per_device_args)
        os.makedirs(directory, exist_ok=True)
        return self._command("trace", [("trace", key, list(a),
                                        os.path.join(directory, f"rank{d}.json"))
                                       for d, a in enumerate(per_device_args)])

    def stats(self, key: int) -> list[dict[str, int]]:
        """Each worker's counters of executable ``key`` (runs, collectives, graph replays,
        packed all-reduce operands, shared argument buffers opened ...)."""
        return self._command("stats", [("stats", key)] * self.num_devices)

    def profile(self, key: int, per_device_args: Sequence[Sequence[np.ndarray]]) -> list:
        """Each device's (thunk, device ms) list (``CudaExecutable.profile``)."""
        self._check_args(per_device_args)
        return self._command("profile", [("profile", key, list(a)) for a in per_device_args])

    def _check_args(self, per_device_args: Sequence[Sequence[np.ndarray]]) -> None:
        if len(per_device_args) != self.num_devices:
            raise CollectiveError(f"expected arguments for {self.num_devices} devices, got "
                                  f"{len(per_device_args)}")

    @property
    def alive(self) -> bool:
        """Whether the workers are up (false after close() or a worker failure)."""
        return bool(self._procs)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        for conn in self._conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001  (subprocess.TimeoutExpired: stuck in a collective)
                p.kill()
                p.wait(timeout=5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        self._staging.close()

    def __enter__(self) -> "GpuMesh":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_MESHES: dict[tuple[int, str], GpuMesh] = {}


def shared_mesh(num_devices: int, backend: Optional[str] = None) -> GpuMesh:
    """One mesh per (size, backend) per process, started on first use and reused by every
    partitioned executable (starting workers costs seconds). ``HLOTK_MESH_TIMEOUT_S``
    (default 300) bounds each command: a collective that never completes becomes a
    ``CollectiveError`` after that long (benchmarks under a watchdog set it lower)."""
    import torch
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    mesh = _MESHES.get((num_devices, backend))
    if mesh is None or not mesh.alive:
        timeout = float(os.environ.get("HLOTK_MESH_TIMEOUT_S", "300"))
        mesh = _MESHES[(num_devices, backend)] = GpuMesh(num_devices, backend=backend,
                                                         timeout=timeout)
    return mesh


def _main(argv: Sequence[str]) -> None:
    """Worker entry point: ``rank world init_method backend host:port timeout``."""
    from multiprocessing.connection import Client
    rank, world, init_method, backend, address, timeout_s = argv
    host, port = address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ["HLOTK_MESH_AUTHKEY"]))
    _worker(int(rank), int(world), init_method, backend, conn, float(timeout_s))


if __name__ == "__main__":
    import sys
    _main(sys.argv[1:])
