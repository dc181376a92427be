"""Compares the cubins of two aot_build outputs, variant by variant: the check that a change meant
to leave the kernels alone (a renaming, a move, a helper Triton inlines) compiles them to the same
bytes.

Usage: python scripts/compare_cubins.py BASE/manifest.json NEW/manifest.json [--common-only]

A variant is (kernel, arch, dtype, constants), the constants as integers (a flag's true is 1, a
SCORE_MOD name is its value in triton_src/variants.py), and its cubin is the manifest's
raw_cubin_sha256 (the compiler's output, before any packing). Prints how many variants are
identical, changed and missing from either side, and names each changed one and each missing
one. Exits 1 if any variant changed, or is missing from one side unless --common-only (for a
narrower build compared with a full one: only the variants both built count).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _as_int(name: str, value) -> int:
    if isinstance(value, str) and name == "SCORE_MOD":
        sys.path.insert(0, str(ROOT))
        from triton_src.variants import score_mod_value

        return score_mod_value(value)
    return int(value)


def variant_key(row: dict) -> tuple:
    constants = tuple(sorted((name, _as_int(name, value)) for name, value in row["constants"].items()))
    return row["kernel"], row["arch"], row["dtype"], constants


def label(key: tuple) -> str:
    kernel, arch, dtype, constants = key
    return f"{kernel} sm{arch} {dtype} " + " ".join(f"{n}={v}" for n, v in constants)


def cubins(manifest: Path) -> dict[tuple, str]:
    """{variant: its raw cubin's sha256}; a variant listed twice is an error of the build."""
    out = {}
    for row in json.loads(Path(manifest).read_text())["kernels"]:
        key = variant_key(row)
        if key in out:
            raise SystemExit(f"{manifest}: {label(key)} is listed twice")
        out[key] = row["raw_cubin_sha256"]
    return out


def compare(base: dict[tuple, str], new: dict[tuple, str]) -> dict[str, list[tuple]]:
    return {
        "identical": sorted(k for k in base.keys() & new.keys() if base[k] == new[k]),
        "changed": sorted(k for k in base.keys() & new.keys() if base[k] != new[k]),
        "only in base": sorted(base.keys() - new.keys()),
        "only in new": sorted(new.keys() - base.keys()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path, help="the reference build's manifest.json")
    parser.add_argument("new", type=Path, help="the build to check's manifest.json")
    parser.add_argument("--common-only", action="store_true",
                        help="compare the variants both built; the others are counted, not failed")
    args = parser.parse_args(argv)
    result = compare(cubins(args.base), cubins(args.new))
    for what in ("changed", "only in base", "only in new"):
        for key in result[what]:
            print(f"{what}: {label(key)}")
    print(", ".join(f"{len(keys)} {what}" for what, keys in result.items()))
    missing = result["only in base"] or result["only in new"]
    return 1 if result["changed"] or (missing and not args.common_only) else 0


if __name__ == "__main__":
    sys.exit(main())
