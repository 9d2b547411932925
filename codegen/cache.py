"""On-disk kernel cache, shared by the code generators (CPU numpy, later Triton).

Entries are generated source files keyed by a content hash (of the fused computation's
text and the generator's version), stored under ``$HLOTK_CACHE_DIR/<backend>/<key><suffix>``
(default ``~/.cache/hlotk``). Each file starts with a checksum line over the rest, so a
truncated or edited entry is detected and regenerated instead of being trusted or
crashing; writes go to a temporary file that is renamed into place (atomic on POSIX), so
a reader never sees half a file. A cache directory that cannot be written only costs
regeneration next time.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

_CHECK_PREFIX = "# hlotk-cache sha256="


def cache_root() -> Path:
    """The cache directory: ``$HLOTK_CACHE_DIR`` if set, else ``~/.cache/hlotk``."""
    env = os.environ.get("HLOTK_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hlotk"


def machine_cache_root() -> Path:
    """Caches that depend only on this machine's installation (the native launcher library,
    Triton's installation key), shared by every ``HLOTK_CACHE_DIR``:
    ``$HLOTK_MACHINE_CACHE_DIR`` if set, else ``~/.cache/hlotk-machine``. A new program
    cache directory then rebuilds none of them."""
    env = os.environ.get("HLOTK_MACHINE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hlotk-machine"


class CacheWarning(UserWarning):
    """A cache entry on disk could not be used (corrupt, unreadable): it is recomputed."""


def content_key(*parts: str) -> str:
    """A stable hex digest of the given strings (length-prefixed, so parts cannot blur)."""
    h = hashlib.sha256()
    for p in parts:
        data = p.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


@dataclass
class CacheStats:
    hits: int = 0          # read from disk
    misses: int = 0        # generated (no entry on disk)
    corrupt: int = 0       # an entry on disk failed its checksum and was regenerated
    write_errors: int = 0  # an entry could not be written (the kernel still works)


class KernelCache:
    """Source files by key for one backend (``cpu``, ``triton``...)."""

    def __init__(self, backend: str, suffix: str = ".py"):
        self.backend = backend
        self.suffix = suffix
        self.stats = CacheStats()

    def path(self, key: str, root: Optional[Path] = None) -> Path:
        return (root or cache_root()) / self.backend / f"{key}{self.suffix}"

    def get_or_create(self, key: str, generate: Callable[[], str],
                      validate: Optional[Callable[[str], bool]] = None) -> str:
        """The cached source for ``key``, or ``generate()``'s, written to the cache.

        ``validate(source)``: an extra check of a cached entry (e.g. that it compiles);
        an entry failing it or the checksum is regenerated and overwritten.
        """
        path = self.path(key)
        cached = self._read(path)   # None: missing, or bad checksum (counted as corrupt)
        if cached is not None:
            if validate is None or validate(cached):
                self.stats.hits += 1
                return cached
            self.stats.corrupt += 1
        elif not path.exists():
            self.stats.misses += 1
        source = generate()
        self._write(path, source)
        return source

    def _read(self, path: Path) -> Optional[str]:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError):
            self.stats.corrupt += 1
            return None
        first, _, body = text.partition("\n")
        if not first.startswith(_CHECK_PREFIX) or \
                first[len(_CHECK_PREFIX):] != hashlib.sha256(body.encode()).hexdigest():
            self.stats.corrupt += 1
            return None
        return body

    def _write(self, path: Path, source: str) -> None:
        text = f"{_CHECK_PREFIX}{hashlib.sha256(source.encode()).hexdigest()}\n{source}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:
            self.stats.write_errors += 1
            warnings.warn(f"hlotk kernel cache: cannot write {path}: {e}", RuntimeWarning,
                          stacklevel=3)
