"""Triton kernels of fattn, one file per family; compiled ahead of time by aot_build."""
