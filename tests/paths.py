"""Where the shared fixtures live: ``../shared`` beside the checkout (as CI lays it out),
``$HLOTK_SHARED`` if set, else ``/work/shared``. Tests that need them skip with a reason
when none exists, instead of failing on a machine without the shared folder."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[1]


def _find_shared() -> Path:
    candidates = [os.environ.get("HLOTK_SHARED"), _REPO.parent / "shared", "/work/shared"]
    for c in candidates:
        if c and (Path(c) / "anchors").is_dir():
            return Path(c)
    return _REPO.parent / "shared"


SHARED = _find_shared()
ANCHORS = SHARED / "anchors" / "xla_gpu_h200"
CONFORMANCE = SHARED / "conformance" / "stablehlo" / "interpret"
requires_shared = pytest.mark.skipif(not ANCHORS.is_dir(),
                                     reason=f"shared fixtures not found at {SHARED}")
