"""Kernel specs: each kernel's runtime signature, declared once beside the kernel.

A spec lists the kernel's non-constexpr parameters in order with their types and the
alignment promises the C++ ops keep: the kernel's own parameters, and the argument groups
that several kernels share (triton_src/arguments.py: the window, the score scales, the bias...),
each defined once. Everything else is derived from it:

- aot_build's Triton signature and divisibility attributes (aot_build/signatures.py);
- the generated C++ launcher: one typed struct per shared group, filled by one builder in
  csrc/attention/kernel_args.h, and one argument struct per kernel holding its own
  parameters and its groups, filled by the op with designated initializers, so a missing,
  misspelt or misordered argument fails the C++ build (aot_build/launchers.py);
- `KernelSpec.launch`, the Python launch used by the tuners and the interpreter tests.

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


MAPS_FLAG = "HOST_MAPS"  # the variant flag under which a kernel takes its mappable tensors as host-made maps


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    divisible_by: int | None = None
    # A tensor [batch, seqlen, heads, head_dim] that variants with the kernel family's HOST_MAPS
    # flag take as a TMA map the host made over the whole tensor, whose box is map_rows rows (a
    # number, the name of the constexpr that holds it, or that name and a divisor: "BLOCK_N/2")
    # by BLOCK_D columns; None: a pointer in every variant.
    map_rows: int | str | None = None

    def __post_init__(self):
        if self.type not in TYPES:
            raise ValueError(f"parameter {self.name}: type {self.type!r} is not one of {TYPES}")

    @property
    def is_pointer(self) -> bool:
        return self.type.startswith("*")


# Constructors that read like the kernel's own vocabulary.
def tensor(name: str, map_rows: int | str | None = None) -> Param:
    """A tensor of the variant's dtype, 16-byte aligned; map_rows: see Param."""
    return Param(name, "*T", 16, map_rows)


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


@dataclass(frozen=True)
class Group:
    """A run of runtime parameters that several kernels take alike, in this order, and one C++
    builder fills for all of them: the struct `kernels::<Name>Args`, each kernel argument struct's
    member `<name>`, filled by `<name>_args(...)` (csrc/attention/kernel_args.h)."""
    name: str
    params: tuple[Param, ...]
    doc: str
    rank: int  # its place in the one order every kernel takes its groups in: the order of definition

    @property
    def struct(self) -> str:
        return "".join(part.capitalize() for part in self.name.split("_")) + "Args"


_defined_groups: list[Group] = []


def group(name: str, doc: str, *params: Param | list[Param]) -> Group:
    """Defines a group; the groups' order of definition is the order kernels take them in."""
    flat = [q for p in params for q in (p if isinstance(p, list) else [p])]
    defined = Group(name, tuple(flat), doc, len(_defined_groups))
    _defined_groups.append(defined)
    return defined


def defined_groups() -> tuple[Group, ...]:
    """Every group defined so far, in the agreed order."""
    return tuple(_defined_groups)


class KernelSpec:
    """The runtime signature of one @triton.jit kernel, checked against the kernel itself."""

    def __init__(self, kernel, items: list[Param | Group], loops_over_tiles: bool = False):
        """loops_over_tiles: each program loops over tiles of the grid's first axis (program x
        runs some of tiles x, x + gx, ...; the kernel's docstring says which), so a launch may
        give that axis fewer programs than tiles, down to one. Such a kernel takes the family's
        TILE_LOOP flag as true (it asserts so, and the others assert false): configs.json builds
        its variants with TILE_LOOP, the op reads the flag of the variant it chose and sizes the
        grid by it (csrc/attention/query_tile_programs.h), and the Python launch passes it."""
        self.kernel = kernel
        self.name: str = kernel.fn.__name__
        self.items: tuple[Param | Group, ...] = tuple(items)
        self.params: tuple[Param, ...] = tuple(
            p for item in self.items for p in (item.params if isinstance(item, Group) else (item,)))
        self.groups: tuple[Group, ...] = tuple(item for item in self.items if isinstance(item, Group))
        names = [p.name for p in self.params] + [g.name for g in self.groups]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise TypeError(f"{self.name}: {repeated} named twice among its parameters and groups")
        agreed = sorted(self.groups, key=lambda g: g.rank)
        if agreed != list(self.groups):
            raise TypeError(f"{self.name}: takes its argument groups in the order {[g.name for g in self.groups]}; "
                            f"the agreed order is {[g.name for g in agreed]} (triton_src/arguments.py)")
        self.loops_over_tiles = loops_over_tiles
        arguments = _kernel_arguments(kernel)
        runtime = [name for name, is_constexpr in arguments if not is_constexpr]
        declared = [p.name for p in self.params]
        if declared != runtime:
            raise TypeError(f"{self.name}: the spec declares runtime parameters {declared} but the kernel "
                            f"takes {runtime}; keep the spec beside the kernel in the kernel's order")
        self.constexprs: tuple[str, ...] = tuple(name for name, is_constexpr in arguments if is_constexpr)
        self.arg_names: tuple[str, ...] = tuple(name for name, _ in arguments)
        # The tensors a HOST_MAPS variant takes as maps, in the kernel's order (the launchers'
        # and the kernel table's order of maps).
        self.maps: tuple[Param, ...] = tuple(p for p in self.params if p.map_rows is not None)
        if self.maps and MAPS_FLAG not in self.constexprs:
            raise TypeError(f"{self.name}: {[p.name for p in self.maps]} may be maps, but the kernel has no "
                            f"{MAPS_FLAG} constexpr to say when")

    def takes_maps(self, constants: dict | None) -> bool:
        """Whether a variant with these constexprs takes the spec's maps (its HOST_MAPS flag)."""
        return bool(self.maps and constants and constants.get(MAPS_FLAG))

    def map_box(self, param: Param, constants: dict) -> list[int]:
        """The box of `param`'s map in a variant: [1, rows, 1, BLOCK_D] over [batch, seqlen, heads, head_dim]."""
        rows = param.map_rows
        if isinstance(rows, str):
            name, _, divisor = rows.partition("/")
            rows = int(constants[name]) // int(divisor or 1)
        return [1, rows, 1, int(constants["BLOCK_D"])]

    def triton_signature(self, dtype: str, constants: dict | None = None) -> tuple[dict, dict]:
        """(signature, attrs) for triton.compile's ASTSource; constexprs are "constexpr". A
        variant that takes maps (`constants`' HOST_MAPS) has them as `tensordesc` parameters,
        which Triton lowers to the 128-byte CUtensorMap by value, then the map's shape (int32)
        and strides (int64)."""
        types = {p.name: p for p in self.params}
        maps = {p.name for p in self.maps} if self.takes_maps(constants) else set()
        signature, attrs = {}, {}
        for index, name in enumerate(self.arg_names):
            param = types.get(name)
            if param is None:
                signature[name] = "constexpr"
                continue
            if name in maps:
                box = ", ".join(map(str, self.map_box(param, constants)))
                signature[name] = f"tensordesc<{dtype}[{box}],{map_layout(dtype, constants['BLOCK_D'])}>"
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


def map_layout(dtype: str, block_d: int):
    """The shared-memory layout of a map's box: the kernels' own row tiles' (a 128-byte swizzle
    where a row of BLOCK_D elements has 128 bytes, else the row's width) at rank 4."""
    from triton.experimental.gluon import language as gl

    bits = {"fp16": 16, "bf16": 16, "fp32": 32}[dtype]
    row_bytes = int(block_d) * bits // 8
    return gl.NVMMASharedLayout(swizzle_byte_width=min(128, row_bytes), element_bitwidth=bits, rank=4)


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
