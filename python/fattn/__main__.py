"""python -m fattn info: what this build holds and whether this machine's GPU can run it."""

from __future__ import annotations

import argparse
import collections
import sys


def info() -> int:
    import torch

    import fattn
    from fattn._library import pick_arch

    data = fattn.build_info()
    kernels = data["kernels"]
    print(f"fattn {fattn.__version__}  library {fattn.library_path()}")
    print(f"torch {torch.__version__}; kernels compiled by triton {data['triton_version']} "
          f"(triton is not needed at run time)")
    by_kernel = collections.defaultdict(list)
    for k in kernels:
        by_kernel[k["kernel"]].append(k)
    for name, rows in by_kernel.items():
        archs = sorted({r["arch"] for r in rows})
        dtypes = sorted({r["dtype"] for r in rows})
        buckets = sorted({r["constants"].get("BLOCK_D") for r in rows})
        size = sum(r["cubin_size"] for r in rows) / 2**20
        print(f"  {name}: {len(rows)} variants; archs {', '.join(f'sm_{a}' for a in archs)}; "
              f"dtypes {', '.join(dtypes)}; head-dim buckets {buckets}; cubins {size:.1f} MiB")
    if not torch.cuda.is_available():
        print("this machine: no CUDA GPU visible to torch (CPU implementations only)")
        return 0
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        served = {name: pick_arch(name, major, minor) for name in by_kernel}
        status = ", ".join(f"{n} -> {'sm_%d cubins' % a if a else 'NOT SUPPORTED'}" for n, a in served.items())
        print(f"cuda:{index} {torch.cuda.get_device_name(index)} (sm_{major}{minor}): {status}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fattn")
    parser.add_argument("command", choices=["info"], help="info: print what was built")
    args = parser.parse_args(argv)
    return {"info": info}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
