"""Kernel specs: each kernel's runtime signature, declared once beside the kernel.

A spec lists the kernel's non-constexpr parameters in order with their types and the
alignment promises the C++ ops keep. Everything else is derived from it:

- aot_build's Triton signature and divisibility attributes (aot_build/signatures.py);
- the generated C++ launcher: one typed argument struct per kernel, filled by the op
  with designated initializers, so a missing, misspelt or misordered argument fails the
  C++ build (aot_build/launchers.py);
- `KernelSpec.launch`, the Python launch used by the tune scripts and the interpreter test.

Types: "*T" is a pointer to the variant's element type (fp16/bf16/fp32), "*fp32", "*i32"
and "*i64" are fixed pointers, "i32", "i64", "fp32" scalars. `divisible_by` is a promise:
a pointer 16-byte aligned, an integer a multiple of 8. Triton turns those into 16-byte
vector loads; the ops check them before the launch (aligned_for_kernel copies a view
that breaks them).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

TYPES = ("*T", "*fp32", "*i32", "*i64", "i32", "i64", "fp32")


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    divisible_by: int | None = None

    def __post_init__(self):
        if self.type not in TYPES:
            raise ValueError(f"parameter {self.name}: type {self.type!r} is not one of {TYPES}")

    @property
    def is_pointer(self) -> bool:
        return self.type.startswith("*")


# Constructors that read like the kernel's own vocabulary.
def tensor(name: str) -> Param:
    """A tensor of the variant's dtype, 16-byte aligned."""
    return Param(name, "*T", 16)


def f32_tensor(name: str) -> Param:
    """A float32 tensor (lse, partials), 16-byte aligned."""
    return Param(name, "*fp32", 16)


def slopes_tensor(name: str) -> Param:
    """A float32 tensor of per-head values (ALiBi slopes, sinks) that may be a view: no alignment promise."""
    return Param(name, "*fp32")


def view(name: str) -> Param:
    """A tensor of the variant's dtype that may be a broadcast view (a bias): no alignment promise."""
    return Param(name, "*T")


def seed_tensor(name: str) -> Param:
    """An int64 tensor (the dropout seed), read on the device so that CUDA graphs replay with
    the seed torch's generator wrote at each replay."""
    return Param(name, "*i64")


def index_tensor(name: str) -> Param:
    """An int32 tensor (lengths, block tables) that may be a view: no alignment promise."""
    return Param(name, "*i32")


def strides(tensor_tag: str, dims: str = "bsh", aligned: bool = True) -> list[Param]:
    """Element strides of `tensor_tag` over `dims`, e.g. strides("q") -> stride_qb, stride_qs,
    stride_qh. Aligned strides are multiples of 8 elements (16 bytes in fp16/bf16)."""
    return [Param(f"stride_{tensor_tag}{d}", "i64", 8 if aligned else None) for d in dims]


def i32(name: str, multiple_of: int | None = None) -> Param:
    return Param(name, "i32", multiple_of)


def i64(name: str) -> Param:
    return Param(name, "i64")


def f32(name: str) -> Param:
    return Param(name, "fp32")


class KernelSpec:
    """The runtime signature of one @triton.jit kernel, checked against the kernel itself."""

    def __init__(self, kernel, params: list[Param], loops_over_tiles: bool = False):
        """loops_over_tiles: each program loops over tiles of the grid's first axis (program x
        runs some of tiles x, x + gx, ...; the kernel's docstring says which), so a launch may
        give that axis fewer programs than tiles, down to one. Such a kernel takes the family's
        TILE_LOOP flag as true (it asserts so, and the others assert false): configs.json builds
        its variants with TILE_LOOP, the op reads the flag of the variant it chose and sizes the
        grid by it (csrc/attention/query_tile_programs.h), and the Python launch passes it."""
        self.kernel = kernel
        self.name: str = kernel.fn.__name__
        self.params: tuple[Param, ...] = tuple(params)
        self.loops_over_tiles = loops_over_tiles
        arguments = _kernel_arguments(kernel)
        runtime = [name for name, is_constexpr in arguments if not is_constexpr]
        declared = [p.name for p in self.params]
        if declared != runtime:
            raise TypeError(f"{self.name}: the spec declares runtime parameters {declared} but the kernel "
                            f"takes {runtime}; keep the spec beside the kernel in the kernel's order")
        self.constexprs: tuple[str, ...] = tuple(name for name, is_constexpr in arguments if is_constexpr)
        self.arg_names: tuple[str, ...] = tuple(name for name, _ in arguments)

    def triton_signature(self, dtype: str) -> tuple[dict, dict]:
        """(signature, attrs) for triton.compile's ASTSource; constexprs are "constexpr"."""
        types = {p.name: p for p in self.params}
        signature, attrs = {}, {}
        for index, name in enumerate(self.arg_names):
            param = types.get(name)
            if param is None:
                signature[name] = "constexpr"
                continue
            signature[name] = param.type.replace("*T", "*" + dtype)
            if param.divisible_by:
                attrs[(index,)] = [["tt.divisibility", param.divisible_by]]
        return signature, attrs

    def launch(self, grid, num_warps: int = 4, num_stages: int = 1, **arguments):
        """Launches the JIT kernel with every runtime parameter named exactly once, plus its
        constexprs by name. A missing or unknown name raises before the launch."""
        names = [p.name for p in self.params]
        missing = [n for n in names if n not in arguments]
        unknown = [n for n in arguments if n not in names and n not in self.constexprs]
        if missing or unknown:
            raise TypeError(f"{self.name}: missing arguments {missing}, unknown arguments {unknown}")
        runtime = [arguments[n] for n in names]
        constants = {n: arguments[n] for n in self.constexprs if n in arguments}
        return self.kernel[grid](*runtime, **constants, num_warps=num_warps, num_stages=num_stages)


def _kernel_arguments(kernel) -> list[tuple[str, bool]]:
    """(name, is_constexpr) of each parameter of a @triton.jit function, read from its Python
    signature, which the JIT and the interpreter (TRITON_INTERPRET=1) both keep as `.fn`."""
    out = []
    for p in inspect.signature(kernel.fn).parameters.values():
        annotation = p.annotation
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        out.append((p.name, text.split(".")[-1] == "constexpr"))
    return out


def tensor_strides(tensor_tag: str, t, dims: str = "bsh") -> dict:
    """{stride_<tag><dim>: t.stride(i)} for the leading dims of t, the way the C++ ops pass
    them (a dim of size 1 is never stepped: its stride is passed as 0)."""
    return {f"stride_{tensor_tag}{d}": (t.stride(i) if t.shape[i] > 1 else 0) for i, d in enumerate(dims)}
