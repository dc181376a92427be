"""python -m fattn info | demo: what this build holds and whether this machine's GPU can run it;
a checked example call."""

from __future__ import annotations

import argparse
import collections
import sys

# What build_info()'s "toolchain" means for where the library runs (build_support/toolchain.py).
TOOLCHAINS = {
    "zig": "zig c++ (portable: glibc 2.28 or newer, C++ runtime linked in, no libstdc++ needed)",
    "gcc": "g++ (a development build: needs this build machine's glibc and libstdc++ or newer)",
    "cmake": "CMake (the C++ caller's own compiler)",
}


def _served(path, rows) -> str:
    """What serves a GPU for one kernel (path: serving_archs's answer; rows: its table rows)."""
    if path is None:
        return "NOT SUPPORTED"
    arch, ptx, older = path
    text = f"sm_{arch} {'PTX' if ptx else 'cubins'}"
    if older is not None:
        # The variants the op would take from the older arch: those its lookup key (dtype,
        # head-dim bucket, flags) finds there and not at `arch`.
        def keys(a):
            return {(r["dtype"], r["block_d"], r["flags_key"]) for r in rows if r["arch"] == a}
        lacking = len(keys(older) - keys(arch))
        if lacking:
            text += f" (sm_{older}'s for the {lacking} variants sm_{arch} lacks)"
    return text + (" (JIT-compiled by the driver: no cubin for this GPU)" if ptx else "")


def info() -> int:
    import torch

    import fattn
    from fattn._library import serving_archs

    data = fattn.build_info()
    kernels = data["kernels"]
    print(f"fattn {fattn.__version__}  library {fattn.library_path()}")
    print(f"torch {torch.__version__}; kernels compiled by triton {data['triton_version']} "
          f"(triton is not needed at run time)")
    toolchain = data.get("toolchain", "unknown")
    print(f"library linked by {TOOLCHAINS.get(toolchain, toolchain)}")
    by_kernel = collections.defaultdict(list)
    for k in kernels:
        by_kernel[k["kernel"]].append(k)
    for name, rows in by_kernel.items():
        archs = sorted({r["arch"] for r in rows})
        dtypes = sorted({r["dtype"] for r in rows})
        buckets = sorted({r["constants"]["BLOCK_D"] for r in rows if "BLOCK_D" in r["constants"]}) or "none"
        size = sum(r["cubin_size"] for r in rows) / 2**20
        with_ptx = sorted({r["arch"] for r in rows if r["ptx_size"]})
        print(f"  {name}: {len(rows)} variants; archs {', '.join(f'sm_{a}' for a in archs)}; "
              f"dtypes {', '.join(dtypes)}; head-dim buckets {buckets}; cubins {size:.1f} MiB; "
              f"PTX for {', '.join(f'sm_{a}' for a in with_ptx) or 'no arch'}")
    if not torch.cuda.is_available():
        print("this machine: no CUDA GPU visible to torch (CPU implementations only)")
        return 0
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        served = {name: serving_archs(name, major, minor) for name in by_kernel}
        status = ", ".join(f"{n} -> {_served(path, by_kernel[n])}" for n, path in served.items())
        print(f"cuda:{index} {torch.cuda.get_device_name(index)} (sm_{major}{minor}): {status}")
    return 0


def demo() -> int:
    """A causal GQA attention call and a decode step over a paged cache, checked against float64."""
    import torch

    import fattn
    from fattn.reference import attention_reference

    device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
    q = torch.randn(2, 1000, 16, 128, device=device, dtype=dtype)
    k = torch.randn(2, 1000, 4, 128, device=device, dtype=dtype)
    v = torch.randn(2, 1000, 4, 128, device=device, dtype=dtype)
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    ref, _ = attention_reference(q, k, v, causal=True, dtype=torch.float64)
    err = (out.double() - ref.double()).abs().max().item()
    print(f"fattn.flash_attn_func on {device} ({dtype}): out {tuple(out.shape)}, lse {tuple(lse.shape)}, "
          f"max |out - float64 reference| = {err:.2e}")

    # One decode step over a paged KV cache holding those keys: append a token, attend.
    page = 64
    pages = torch.randperm(2 * 16, device=device).to(torch.int32).view(2, 16)  # 16 pages of 64 per sequence
    k_cache = torch.zeros(2 * 16, page, 4, 128, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    k_cache[pages.flatten().long()] = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, 24)).view(-1, page, 4, 128)
    v_cache[pages.flatten().long()] = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, 24)).view(-1, page, 4, 128)
    q1, k1, v1 = (torch.randn(2, 1, h, 128, device=device, dtype=dtype) for h in (16, 4, 4))
    step = fattn.flash_attn_with_kvcache(q1, k_cache, v_cache, k=k1, v=v1, cache_seqlens=1000, block_table=pages)
    ref1, _ = attention_reference(q1, torch.cat([k, k1], 1), torch.cat([v, v1], 1), dtype=torch.float64)
    err1 = (step.double() - ref1.double()).abs().max().item()
    print(f"fattn.flash_attn_with_kvcache on {device} ({dtype}), paged cache, one appended token: "
          f"max |out - float64 reference| = {err1:.2e}")
    tolerance = 3e-2 if device == "cuda" else 1e-5
    return 0 if err < tolerance and err1 < tolerance else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fattn")
    parser.add_argument("command", choices=["info", "demo"],
                        help="info: print what was built; demo: run one call and check it")
    args = parser.parse_args(argv)
    return {"info": info, "demo": demo}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
