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

    @property
    def constant_dict(self) -> dict:
        return dict(self.constants)

    @property
    def label(self) -> str:
        flags = " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in self.constants)
        return f"{self.kernel} sm{self.arch} {self.dtype} {flags} w{self.num_warps} s{self.num_stages}"


def load_config(path: Path = CONFIG_PATH) -> dict:
    with open(path) as f:
        return json.load(f)


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


def selected_buckets(kernel_cfg: dict, env: dict | None = None) -> list[int]:
    env = os.environ if env is None else env
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
    return sorted(chosen)


def _tile_config(kernel: str, kcfg: dict, arch: int, bucket: int) -> dict:
    """The config of (arch, bucket); "default" keys stand in at either level, so kernels
    whose tiles do not depend on the arch (or bucket) need one entry, not twenty."""
    configs = kcfg["configs"]
    per_arch = configs.get(str(arch), configs.get("default"))
    tile = None if per_arch is None else per_arch.get(str(bucket), per_arch.get("default"))
    if tile is None:
        raise GridError(f"configs.json: {kernel} has no config for sm{arch} head-dim bucket {bucket}")
    return dict(tile)


def _flag_overrides(kernel: str, kcfg: dict, arch: int, bucket: int, flags: dict) -> dict:
    """Launch options that differ for some flag values: configs.json's "flag_overrides", a list of
    {"flags": {...}, "archs": [...], "buckets": [...], "set": {...}, "why": "..."} entries, applied
    in order to every variant whose flags (a value, or a list of the values that match), arch and
    bucket match (e.g. fewer pipeline stages for the SCORE_MOD variants, whose bias and dropout
    code needs shared memory of its own)."""
    out = {}
    for entry in kcfg.get("flag_overrides", []):
        unknown = set(entry["flags"]) - set(kcfg["flags"])
        if unknown:
            raise GridError(f"configs.json: {kernel} flag_overrides name unknown flags {sorted(unknown)}")
        if (all(flags[n] in v if isinstance(v, list) else flags[n] == v for n, v in entry["flags"].items())
                and arch in entry.get("archs", [arch])
                and bucket in entry.get("buckets", [bucket])):
            out.update(entry["set"])
    return out


def expand(config: dict | None = None, env: dict | None = None) -> list[Variant]:
    """All variants to build, in a stable order."""
    config = load_config() if config is None else config
    archs = selected_archs(config, env)
    variants = []
    for kernel, kcfg in config["kernels"].items():
        buckets = selected_buckets(kcfg, env)
        flag_names = list(kcfg["flags"])
        for arch, dtype, bucket in itertools.product(archs, kcfg["dtypes"], buckets):
            base = _tile_config(kernel, kcfg, arch, bucket)
            for flag_values in itertools.product(*(kcfg["flags"][n] for n in flag_names)):
                flags = dict(zip(flag_names, flag_values))
                tile = dict(base, **_flag_overrides(kernel, kcfg, arch, bucket, flags))
                num_warps = tile.pop("num_warps")
                num_stages = tile.pop("num_stages")
                constants = dict(tile, BLOCK_D=bucket, **flags)
                variants.append(Variant(kernel, kcfg["source"], arch, dtype,
                                        tuple(sorted(constants.items())), num_warps, num_stages))
    return variants
