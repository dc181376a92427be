"""The Triton signature of a variant and its launch ABI, derived from the kernel's spec
(triton_src/spec.py, declared beside each kernel)."""

from __future__ import annotations


def kernel_spec(kernel: str):
    """The spec of a kernel family, or of one of its other implementations (same contract)."""
    from triton_src import IMPLEMENTATIONS, KERNELS

    spec = KERNELS.get(kernel, IMPLEMENTATIONS.get(kernel))
    if spec is None:
        raise KeyError(f"no kernel spec named {kernel}; triton_src/__init__.py lists {sorted(KERNELS)} "
                       f"and the implementations {sorted(IMPLEMENTATIONS)}")
    return spec


def triton_signature(kernel: str, dtype: str, constants: dict | None = None) -> tuple[dict, dict]:
    """(signature, attrs) for triton.compile's ASTSource; constexprs are marked "constexpr";
    `constants`: the variant's, which say whether it takes maps (KernelSpec.triton_signature)."""
    return kernel_spec(kernel).triton_signature(dtype, constants)


def runtime_params(kernel: str) -> list[tuple[str, str]]:
    """The launch ABI: the non-constexpr parameters in order, as (name, C type class)."""
    return [(p.name, "ptr" if p.is_pointer else p.type) for p in kernel_spec(kernel).params]
