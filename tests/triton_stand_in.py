"""A stand-in Triton driver that plays an H200 (sm_90) on a machine without a GPU, so
Triton compiles for it (no launch): for tests that run in a process of their own without
TRITON_INTERPRET."""
from __future__ import annotations


def use_h200_stand_in() -> None:
    """Make the stand-in Triton's active driver (for the rest of this process)."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class StandIn:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_active_torch_device(self):
            return torch.device("cpu")
    driver.set_active(StandIn())
