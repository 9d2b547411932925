"""``python -m runtime.cuda.native``: build the launcher ahead of time and load the driver;
prints the library's path, or why it cannot be built (exit status 1)."""
from __future__ import annotations

import sys

from ..errors import NativeLauncherError
from . import build, compiler, driver_library


def main() -> int:
    import jax.ffi
    print(f"compiler: {compiler()}; XLA FFI headers: {jax.ffi.include_dir()}")
    try:
        print(f"built: {build()}")
        driver_library()
    except NativeLauncherError as e:
        print(f"the native launcher is unavailable: {e}", file=sys.stderr)
        return 1
    print("CUDA driver loaded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
