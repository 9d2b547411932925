"""codegen: turning one fusion into a kernel for a backend, and the on-disk kernel cache.

``codegen.cpu.compile_fusion(fusion_inst) -> Kernel`` generates one numpy function per
fusion (the CPU backend); ``codegen.cache`` is the content-hashed source cache that every
backend's generator shares.
"""
