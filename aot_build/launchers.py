"""Writes kernel_launchers.h: one typed C++ launcher per kernel, derived from its spec.

The header declares, inside `fattn::kernels`, the score-modifier variants
(triton_src/variants.py) as `score_mod::Value`, an unscoped enum (kPlain, kSoftcapAlibi, ...)
whose values convert to the int64_t of a Flags' SCORE_MOD; then one struct per argument group
the kernels share (triton_src/arguments.py): its parameters, typed (pointers, int64 integers,
double floats), each a runtime::Required<T> (no default constructor). csrc/attention/kernel_args.h has one
builder per group. Then, for each kernel, inside `fattn::kernels::<kernel>`:
- `Args`: the kernel's runtime parameters in its order, its own ones typed as the groups' are and
  each shared group as one member named after it. Ops fill it with C++20 designated
  initializers: a misspelt, misordered or missing name does not compile.
- `Flags`: the kernel's variant flags from configs.json (PAD_D and BLOCK_D excluded: the
  chooser derives them from head_dim), also Required, and `flags_key`, their packing as the
  table stores it.
- `Constant`: indices of the variant's constexprs in each table entry (names sorted).
- `Maps` (a kernel whose spec has map-able tensors, `map_rows`): each such tensor as a
  runtime::MapSource, for the variants that take it as a host-made TMA map (HOST_MAPS).
- `launch_<kernel>(variant, grid, args[, maps])`: narrows the int32/float32 parameters (an int32
  overflow raises, naming the parameter) and hands cuLaunchKernel a positional array; no lookups.
  Where the chosen variant's table entry has maps, each map-able tensor's parameter is its map,
  encoded from `maps` (runtime/tensor_maps.h), in place of its pointer.

The table (kernel_table.cpp) stores each entry's kernel id and flags key computed by the
same `flags_key` below, so the two cannot disagree.
"""

from __future__ import annotations

import textwrap

from triton_src.spec import MAPS_FLAG, Group
from triton_src.variants import SCORE_MODS

FLAG_BITS = 8  # one byte per flag value in a table key
DERIVED_FLAGS = ("PAD_D",)  # chosen from head_dim, not by the op

_FIELD_TYPES = {"*T": "const void*", "*fp32": "const void*", "*i32": "const void*", "*i64": "const void*",
                "i32": "int64_t", "i64": "int64_t", "fp32": "double"}
_REQUIRED = "runtime::Required<{}>"


def flag_names(kernel_cfg: dict) -> list[str]:
    """The flags of a kernel in key order: configs.json's order, derived ones last."""
    names = [n for n in kernel_cfg["flags"] if n not in DERIVED_FLAGS]
    return names + [n for n in kernel_cfg["flags"] if n in DERIVED_FLAGS]


def flags_key(kernel_cfg: dict, constants: dict) -> int:
    key = 0
    for i, name in enumerate(flag_names(kernel_cfg)):
        value = int(constants[name])
        if not 0 <= value < 1 << FLAG_BITS:
            raise ValueError(f"flag {name}={value} does not fit a {FLAG_BITS}-bit table key")
        key |= value << (FLAG_BITS * i)
    return key


def kernel_ids(config: dict) -> list[str]:
    """Kernel ids in a stable order: configs.json's."""
    return list(config["kernels"])


def _field(p, indent: str) -> str:
    return f"{indent}{_REQUIRED.format(_FIELD_TYPES[p.type])} {p.name};"


def _group_struct(group) -> list[str]:
    return [
        *[f"// {line}" for line in textwrap.wrap(f"{group.name}: {group.doc}", 100)],
        f"struct {group.struct} {{",
        *[_field(p, "  ") for p in group.params],
        "};",
        "",
    ]


def _score_mod_enum() -> list[str]:
    """triton_src/variants.py's table as C++: the values the ops pass as SCORE_MOD, by name."""
    lines = ["// SCORE_MOD's values, the score-modifier variants (triton_src/variants.py says what each",
             "// compiles). Unscoped, so that a value converts to the int64_t of a Flags' SCORE_MOD.",
             "namespace score_mod {", "enum Value : int64_t {"]
    for m in SCORE_MODS:
        lines += [f"  // {line}" for line in textwrap.wrap(f"{m.name}: {m.doc}", 96)]
        lines.append(f"  {m.cpp} = {m.value},")
    return lines + ["};", "}  // namespace score_mod", ""]


def _struct(kernel: str, kernel_id: int, spec, kernel_cfg: dict, constant_names: list[str]) -> list[str]:
    fields = [f"    {item.struct} {item.name};" if isinstance(item, Group) else _field(item, "    ")
              for item in spec.items]
    op_flags = [n for n in flag_names(kernel_cfg) if n not in DERIVED_FLAGS]
    key_terms = [f"(uint64_t(f.{n}.value) << {FLAG_BITS * i})" for i, n in enumerate(op_flags)]
    pad_shift = FLAG_BITS * len(op_flags)
    lines = [
        f"struct {kernel} {{",
        f"  static constexpr int kId = {kernel_id};",
        f"  static constexpr const char* kName = \"{kernel}\";",
        "  struct Args {",
        *fields,
        "  };",
        "  struct Flags {",
        *[f"    {_REQUIRED.format('int64_t')} {n};" for n in op_flags],
        "  };",
        f"  enum Constant : int {{ {', '.join(constant_names)} }};",
        *([f"  // The tensors its {MAPS_FLAG} variants take as host-made TMA maps.",
           "  struct Maps {", *[f"    runtime::MapSource {p.name};" for p in spec.maps], "  };"] if spec.maps else []),
        "  static uint64_t flags_key(const Flags& f, bool pad_d) {",
        f"    {'(void)f; ' if not op_flags else ''}return {' | '.join(key_terms + [f'(uint64_t(pad_d) << {pad_shift})'])};",
        "  }",
        "};",
        "",
    ]
    return lines


def _paths(spec) -> list[tuple[object, str]]:
    """(param, its C++ path in Args) in the kernel's order: `a.name` or `a.group.name`."""
    out = []
    for item in spec.items:
        if isinstance(item, Group):
            out += [(p, f"a.{item.name}.{p.name}") for p in item.params]
        else:
            out.append((item, f"a.{item.name}"))
    return out


def _slots(spec, as_maps: bool) -> tuple[list[str], list[str]]:
    """(locals, parameter slots) of a launch; as_maps: each map-able tensor as its encoded map
    (Triton's ABI for a tensordesc: the CUtensorMap, then the shape's four int32 and the strides'
    four int64, each a parameter)."""
    locals_, slots = [], []
    maps = [p.name for p in spec.maps] if as_maps else []
    for p, path in _paths(spec):
        if p.name in maps:
            name = f"map_{p.name}"
            locals_.append(f"const runtime::EncodedMap {name} = runtime::encode_map(v.target, {maps.index(p.name)}, "
                           f"\"{p.name}\", maps->{p.name});")
            slots += [f"const_cast<cuda::CUtensorMap*>(&{name}.map)",
                      *[f"const_cast<int32_t*>(&{name}.shape[{d}])" for d in range(4)],
                      *[f"const_cast<int64_t*>(&{name}.strides[{d}])" for d in range(4)]]
        elif p.type == "i32":
            locals_.append(f"const int32_t {p.name} = runtime::narrow_i32(v.target, \"{p.name}\", {path}.value);")
            slots.append(f"const_cast<int32_t*>(&{p.name})")
        elif p.type == "fp32":
            locals_.append(f"const float {p.name} = static_cast<float>({path}.value);")
            slots.append(f"const_cast<float*>(&{p.name})")
        elif p.type == "i64":
            slots.append(f"const_cast<int64_t*>(&{path}.value)")
        else:
            slots.append(f"const_cast<void**>(&{path}.value)")
    return locals_, slots


def _launch_body(spec, as_maps: bool, indent: str) -> list[str]:
    locals_, slots = _slots(spec, as_maps)
    return [
        *[indent + line for line in locals_],
        f"{indent}void* scratch[2] = {{nullptr, nullptr}};  // Triton's global and profile scratch pointers",
        f"{indent}void* params[] = {{",
        *[f"{indent}    {s}," for s in slots],
        f"{indent}    &scratch[0], &scratch[1]}};",
        f"{indent}runtime::launch(v.target, grid, params, scratch);",
    ]


def _launch_fn(kernel: str, spec) -> list[str]:
    if not spec.maps:
        return [
            f"inline void launch_{kernel}(const runtime::Variant<{kernel}>& v, runtime::Grid grid, const {kernel}::Args& a) {{",
            *_launch_body(spec, False, "  "),
            "}",
            "",
        ]
    return [
        f"inline void launch_{kernel}(const runtime::Variant<{kernel}>& v, runtime::Grid grid, const {kernel}::Args& a,",
        f"                            const {kernel}::Maps* maps = nullptr) {{",
        "  if (v.target.entry->num_maps > 0) {",
        f"    runtime::require_maps(v.target, maps != nullptr, {len(spec.maps)});",
        *_launch_body(spec, True, "    "),
        "    return;",
        "  }",
        *_launch_body(spec, False, "  "),
        "}",
        "",
    ]


def header(config: dict, specs: dict, constants_by_kernel: dict[str, list[str]]) -> str:
    """The whole kernel_launchers.h. `constants_by_kernel`: each kernel's constexpr names,
    sorted, as every table entry of that kernel stores them."""
    ids = kernel_ids(config)
    lines = [
        "// Generated by aot_build from the kernel specs in triton_src/ and aot_build/configs.json.",
        "// Do not edit: change a kernel's spec and rebuild.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        '#include "runtime/launch.h"',
        '#include "runtime/tensor_maps.h"',
        "",
        "namespace fattn::kernels {",
        "",
        f"constexpr int kNumKernels = {len(ids)};",
        "",
        *_score_mod_enum(),
    ]
    for g in sorted({g for kernel in ids for g in specs[kernel].groups}, key=lambda g: g.rank):
        lines += _group_struct(g)
    for i, kernel in enumerate(ids):
        lines += _struct(kernel, i, specs[kernel], config["kernels"][kernel], constants_by_kernel[kernel])
    for kernel in ids:
        lines += _launch_fn(kernel, specs[kernel])
    lines += ["}  // namespace fattn::kernels", ""]
    return "\n".join(lines)


def constant_names(config: dict, kernel: str) -> list[str]:
    """The constexpr names every variant of `kernel` carries (tile keys, BLOCK_D unless the kernel
    has no head-dim buckets, flags), sorted: grid.expand builds each variant's constants from
    exactly these."""
    kcfg = config["kernels"][kernel]
    tile_keys: set[str] | None = None
    tables = [kcfg["configs"]] + [impl["configs"] for impl in kcfg.get("implementations", [])]
    for per_arch in (p for table in tables for p in table.values()):
        for tile in per_arch.values():
            keys = {k for k in tile if k not in ("num_warps", "num_stages")}
            if tile_keys is not None and keys != tile_keys:
                raise ValueError(f"configs.json: {kernel}'s tile configs set different constants "
                                 f"({sorted(tile_keys)} vs {sorted(keys)}); every variant needs the same")
            tile_keys = keys
    head_dim = {"BLOCK_D"} if "head_dim_buckets" in kcfg else set()
    return sorted((tile_keys or set()) | head_dim | set(kcfg["flags"]))
