"""The variant grid: which (kernel, arch, dtype, head-dim bucket, flags, config) get compiled.

The grid itself is data (configs.json beside this file); this module only reads it,
applies the FATTN_CUDA_ARCHS / FATTN_HEAD_DIMS narrowing and expands the product.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_PATH = Path(__file__).with_name("configs.json")
TUNED_DIR = Path(__file__).with_name("tuned")  # the tuners' output (tuning/tune.py): sm<arch>.json
# sm_89 builds only what sm_86 lacks (configs.json "served_by": its FP8 variants); `all` is the same.
DEFAULT_ARCHS = "75;80;86;89;90"


class GridError(ValueError):
    """A knob or the config file asks for something the grid cannot provide."""


@dataclass(frozen=True)
class Variant:
    kernel: str                 # Triton function name, e.g. "attn_fwd"
    source: str                 # module holding it, e.g. "triton_src.forward"
    arch: int                   # compute capability as 10*major+minor
    dtype: str                  # Triton element type of the tensors: fp16 / bf16
    constants: tuple            # ((name, value), ...) every constexpr of the kernel
    num_warps: int
    num_stages: int
    # The kernel function compiled for this variant when it is not `kernel` itself: another
    # implementation of the same contract (triton_src.IMPLEMENTATIONS), e.g. the Hopper forward.
    implementation: str = ""

    @property
    def constant_dict(self) -> dict:
        return dict(self.constants)

    @property
    def label(self) -> str:
        flags = " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in self.constants)
        name = f"{self.kernel} ({self.implementation})" if self.implementation else self.kernel
        return f"{name} sm{self.arch} {self.dtype} {flags} w{self.num_warps} s{self.num_stages}"


def load_config(path: Path = CONFIG_PATH, tuned_dir: Path = TUNED_DIR) -> dict:
    """configs.json with the tiles the offline tuner chose (tuned/sm<arch>.json) filled in. A
    (kernel, arch, bucket) tile lives in one of the two files: one in both is an error. The
    tuned TILE_LOOP crossovers (tuning/tune_tile_loop.py) go to config["tile_loop"][arch]."""
    with open(path) as f:
        config = json.load(f)
    for tuned in sorted(Path(tuned_dir).glob("sm*.json")):
        data = json.loads(tuned.read_text())
        arch = str(data["arch"])
        for kernel, buckets in data.get("tile_loop", {}).get("kernels", {}).items():
            if "TILE_LOOP" not in config["kernels"].get(kernel, {}).get("flags", {}):
                raise GridError(f"{tuned.name} has TILE_LOOP crossovers for {kernel}, which has no TILE_LOOP flag")
            config.setdefault("tile_loop", {}).setdefault(arch, {})[kernel] = buckets
        for kernel, buckets in data["kernels"].items():
            if kernel not in config["kernels"]:
                raise GridError(f"{tuned.name} tunes {kernel}, which configs.json does not list")
            per_arch = config["kernels"][kernel]["configs"].setdefault(arch, {})
            for bucket, entry in buckets.items():
                if bucket in per_arch:
                    raise GridError(f"{kernel} sm{arch} head-dim bucket {bucket} has a tile in both configs.json "
                                    f"and {tuned.name}; keep one")
                per_arch[bucket] = dict(entry["chosen"])
    return config


def _parse_int_list(text: str, knob: str) -> list[int]:
    items = [t.strip() for t in text.replace(",", ";").split(";") if t.strip()]
    try:
        return [int(t.lower().removeprefix("sm_").removeprefix("sm")) for t in items]
    except ValueError:
        raise GridError(f"{knob}={text!r}: expected a ';'-separated list of integers") from None


def selected_archs(config: dict, env: dict | None = None) -> list[int]:
    env = os.environ if env is None else env
    known = config["archs"]
    text = env.get("FATTN_CUDA_ARCHS", DEFAULT_ARCHS)
    if text.strip().lower() == "all":
        return sorted(known)
    archs = _parse_int_list(text, "FATTN_CUDA_ARCHS")
    bad = [a for a in archs if a not in known]
    if bad or not archs:
        raise GridError(f"FATTN_CUDA_ARCHS asks for {bad or 'nothing'}; supported archs are {known}")
    return sorted(set(archs))


def served_archs(config: dict, archs: list[int]) -> dict[int, int]:
    """{arch: the built arch serving it}: configs.json's "served_by" entries whose serving arch is
    in `archs` too. Such an arch builds only the variants the serving arch lacks (expand)."""
    served = {int(a): int(e["arch"]) for a, e in config.get("served_by", {}).items() if not a.startswith("_")}
    for a, by in served.items():
        if by >= a or by // 10 != a // 10:
            raise GridError(f"configs.json served_by: sm{a} by sm{by}; a cubin serves later minors of its major only")
    return {a: by for a, by in served.items() if a in archs and by in archs}


def ptx_archs(archs: list[int], env: dict | None = None, served: dict[int, int] | None = None) -> list[int]:
    """The archs (of the built `archs`) whose variants embed their PTX, from FATTN_PTX_ARCHS:
    `newest` (default), the newest built arch other than sm_90 that builds the whole grid (not
    one of `served`, served_archs's keys), the only one whose PTX the runtime runs by itself (a
    GPU newer than every cubin; sm_90's PTX uses sm_90a features); `all`; `none`; or a list.
    PTX is about half the compressed images, so the others are left out unless asked for
    (FATTN_FORCE_PTX_ARCH runs older archs' code on a newer GPU)."""
    env = os.environ if env is None else env
    text = env.get("FATTN_PTX_ARCHS", "newest").strip().lower()
    if text == "newest":
        older = [a for a in archs if a != 90 and a not in (served or {})]
        return [max(older)] if older else []
    if text == "all":
        return sorted(archs)
    if text == "none":
        return []
    chosen = _parse_int_list(text, "FATTN_PTX_ARCHS")
    bad = [a for a in chosen if a not in archs]
    if bad or not chosen:
        raise GridError(f"FATTN_PTX_ARCHS asks for {bad or 'nothing'}; the build's archs are {archs} "
                        "(or use newest, all, none)")
    return sorted(set(chosen))


def selected_buckets(kernel_cfg: dict, env: dict | None = None) -> list[int]:
    """The head-dim buckets to build: all, or those serving FATTN_HEAD_DIMS. A kernel that lists
    no buckets does not depend on the head dim: it is built once, as bucket 0, without BLOCK_D."""
    env = os.environ if env is None else env
    if "head_dim_buckets" not in kernel_cfg:
        return [0]
    buckets = kernel_cfg["head_dim_buckets"]
    text = env.get("FATTN_HEAD_DIMS")
    if not text or text.strip().lower() == "all":
        return list(buckets)
    chosen = set()
    for d in _parse_int_list(text, "FATTN_HEAD_DIMS"):
        fitting = [b for b in buckets if b >= d]
        if d <= 0 or not fitting:
            raise GridError(f"FATTN_HEAD_DIMS asks for head dim {d}; buckets are {buckets}")
        chosen.add(fitting[0])  # a head dim is served by the smallest bucket that holds it
        # A bucket that is not a power of two (96, 192) exists for some kernels, archs and
        # flags only; the next power of two serves the head dim everywhere else.
        chosen.add(next(b for b in fitting if b & (b - 1) == 0))
    return sorted(chosen)


def tile_config(kernel: str, config: dict, arch: int, bucket: int) -> dict:
    """The tile config (constexprs, num_warps, num_stages) of (kernel, arch, bucket), before
    flag overrides."""
    return _tile_config(kernel, config["kernels"][kernel], arch, bucket)


def _tile_config(kernel: str, kcfg: dict, arch: int, bucket: int) -> dict:
    """The config of (arch, bucket); "default" keys stand in at either level, so kernels
    whose tiles do not depend on the arch (or bucket) need one entry, not twenty."""
    configs = kcfg["configs"]
    per_arch = configs.get(str(arch), configs.get("default"))
    tile = None if per_arch is None else per_arch.get(str(bucket), per_arch.get("default"))
    if tile is None:
        raise GridError(f"configs.json: {kernel} has no config for sm{arch} head-dim bucket {bucket}")
    return dict(tile)


def _named_flags() -> dict:
    """The flags that configs.json spells by name, each with the function that turns a name into
    the kernels' integer (raising ValueError on any other value): SCORE_MOD's variants, named in
    triton_src/variants.py."""
    from triton_src.variants import score_mod_value

    return {"SCORE_MOD": score_mod_value}


def _resolved(kernel: str, kcfg: dict) -> dict:
    """kcfg with every named flag value (the flags' lists and the exclude, flag_overrides and
    implementations entries) replaced by its integer: the one place configs.json's names meet the
    kernels' constexprs, so that variants, labels and table keys carry the integers."""
    named = _named_flags()

    def value(where: str, flag: str, v):
        if flag not in named:
            return v
        if isinstance(v, list):
            return [value(where, flag, x) for x in v]
        try:
            return named[flag](v)
        except ValueError as e:
            raise GridError(f"configs.json: {kernel} {where} {flag}: {e}") from None

    def flags(where: str, entry_flags: dict) -> dict:
        return {n: value(where, n, v) for n, v in entry_flags.items()}

    out = dict(kcfg, flags=flags("flags", kcfg["flags"]))
    for section in ("exclude", "flag_overrides", "implementations"):
        if section in kcfg:
            out[section] = [dict(e, flags=flags(section, e["flags"])) for e in kcfg[section]]
    return out


def _matches(kernel: str, kcfg: dict, what: str, entry: dict, arch: int, bucket: int, flags: dict,
             dtype: str | None = None) -> bool:
    """Whether a flag_overrides / exclude entry applies: its flags (a value, or a list of the
    values that match), archs, buckets and dtypes (each optional) all match the variant's."""
    unknown = set(entry["flags"]) - set(kcfg["flags"])
    if unknown:
        raise GridError(f"configs.json: {kernel} {what} name unknown flags {sorted(unknown)}")
    return (all(flags[n] in v if isinstance(v, list) else flags[n] == v for n, v in entry["flags"].items())
            and arch in entry.get("archs", [arch])
            and bucket in entry.get("buckets", [bucket])
            and dtype in entry.get("dtypes", [dtype]))


def _flag_overrides(kernel: str, kcfg: dict, arch: int, bucket: int, flags: dict) -> dict:
    """Launch options that differ for some flag values: configs.json's "flag_overrides", a list of
    {"flags": {...}, "archs": [...], "buckets": [...], "set": {...}, "why": "..."} entries, applied
    in order to every variant they match (e.g. fewer pipeline stages for the SCORE_MOD variants,
    whose bias and dropout code needs shared memory of its own)."""
    out = {}
    for entry in kcfg.get("flag_overrides", []):
        if _matches(kernel, kcfg, "flag_overrides", entry, arch, bucket, flags):
            out.update(entry["set"])
    return out


def _excluded(kernel: str, kcfg: dict, arch: int, bucket: int, flags: dict, dtype: str) -> bool:
    """Whether configs.json's "exclude" (entries shaped like flag_overrides', without "set", and
    optionally "dtypes") leaves the variant out of the grid; the op that would use it must fall
    back (csrc says how)."""
    return any(_matches(kernel, kcfg, "exclude", entry, arch, bucket, flags, dtype)
               for entry in kcfg.get("exclude", []))


def _implementation(kernel: str, kcfg: dict, arch: int, bucket: int, flags: dict) -> dict | None:
    """The first of configs.json's "implementations" of `kernel` that serves the variant: entries
    shaped like flag_overrides' plus "kernel" (a triton_src.IMPLEMENTATIONS name), "source" and
    "configs" (its tiles, keyed like the family's), for variants another kernel function runs
    under the same contract (arguments, grid, results)."""
    for entry in kcfg.get("implementations", []):
        if _matches(kernel, kcfg, "implementations", entry, arch, bucket, flags):
            return entry
    return None


def expand(config: dict | None = None, env: dict | None = None) -> list[Variant]:
    """All variants to build, in a stable order."""
    config = load_config() if config is None else config
    archs = selected_archs(config, env)
    served = served_archs(config, archs)
    variants = []
    # (kernel, arch, dtype, bucket, flags) -> its variant: what a served arch's variant is
    # compared against (the runtime looks variants up by that key).
    by_key = {}
    for kernel, kcfg in config["kernels"].items():
        kcfg = _resolved(kernel, kcfg)
        buckets = selected_buckets(kcfg, env)
        flag_names = list(kcfg["flags"])
        for arch, dtype, bucket in itertools.product(archs, kcfg["dtypes"], buckets):
            for flag_values in itertools.product(*(kcfg["flags"][n] for n in flag_names)):
                flags = dict(zip(flag_names, flag_values))
                if _excluded(kernel, kcfg, arch, bucket, flags, dtype):
                    continue
                impl = _implementation(kernel, kcfg, arch, bucket, flags)
                if impl is None:
                    # Only a variant that is built needs the family's tile for (arch, bucket).
                    base = _tile_config(kernel, kcfg, arch, bucket)
                    tile = dict(base, **_flag_overrides(kernel, kcfg, arch, bucket, flags))
                else:
                    tile = _tile_config(f"{kernel} ({impl['kernel']})", impl, arch, bucket)
                num_warps = tile.pop("num_warps")
                num_stages = tile.pop("num_stages")
                constants = dict(tile, **flags)
                if "head_dim_buckets" in kcfg:
                    constants["BLOCK_D"] = bucket
                variant = Variant(kernel, impl["source"] if impl else kcfg["source"], arch, dtype,
                                  tuple(sorted(constants.items())), num_warps, num_stages,
                                  impl["kernel"] if impl else "")
                key = (kernel, dtype, bucket, flag_values)
                serving = by_key.get((served[arch],) + key) if arch in served else None
                if serving is not None:
                    _check_served(variant, serving)
                    continue
                by_key[(arch,) + key] = variant
                variants.append(variant)
    return variants


def _check_served(variant: Variant, serving: Variant) -> None:
    """A served arch's variant is left to the serving arch's cubin only if that one is the same
    code: a tile of its own (configs.json, tuned/) would otherwise be silently never built."""
    own = (variant.constants, variant.num_warps, variant.num_stages, variant.implementation)
    other = (serving.constants, serving.num_warps, serving.num_stages, serving.implementation)
    if own != other:
        raise GridError(f"{variant.label} differs from {serving.label}, whose cubin serves sm{variant.arch} "
                        f"(configs.json served_by): give both archs the same tile, or drop the served_by entry")
