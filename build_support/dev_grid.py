"""The kernel grid of a development build (`pip install -e .`, `setup.py build_ext --inplace`).

A wheel carries the full grid (every arch, every head-dim bucket: 1160 variants, about
8 minutes on 2 cores). A development build compiles what this machine can run: the archs
of its visible GPUs, every bucket; and on a machine without a GPU a minimal set (one
arch, one bucket) that is enough for the CPU implementation, the tests and the demo,
which never launch a kernel there. FATTN_CUDA_ARCHS or FATTN_HEAD_DIMS set by hand wins.
"""

from __future__ import annotations

import subprocess

MINIMAL = {"FATTN_CUDA_ARCHS": "80", "FATTN_HEAD_DIMS": "64"}
HINT = ("for every GPU set FATTN_CUDA_ARCHS=all (or a list, e.g. FATTN_CUDA_ARCHS='80;90') "
        "before the build, and optionally FATTN_HEAD_DIMS (e.g. '64;128'; default: all)")


def visible_gpus() -> list[tuple[str, int]]:
    """(name, 10 * major + minor) of each visible GPU: torch's view, else nvidia-smi's
    (a CPU build of torch sees no GPU on a machine that has one)."""
    try:
        import torch

        if torch.cuda.is_available():
            return [(torch.cuda.get_device_name(i), 10 * torch.cuda.get_device_capability(i)[0]
                     + torch.cuda.get_device_capability(i)[1]) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken CUDA setup must not break a CPU build
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        name, _, cap = line.rpartition(",")
        major, _, minor = cap.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            gpus.append((name.strip(), 10 * int(major) + int(minor)))
    return gpus


def serving_arch(device_arch: int, archs: list[int]) -> int | None:
    """The grid arch whose cubins run on `device_arch`, by the library's rule: the exact
    arch, else the newest of the same major that is not newer."""
    fitting = [a for a in archs if a // 10 == device_arch // 10 and a <= device_arch]
    return max(fitting, default=None)


def choose(env, archs: list[int], gpus=None, log=print) -> dict:
    """The knobs to add to `env` for a development build, and a line saying why."""
    if env.get("FATTN_CUDA_ARCHS") or env.get("FATTN_HEAD_DIMS"):
        return {}
    gpus = visible_gpus() if gpus is None else gpus
    served = {}
    for name, device_arch in gpus:
        arch = serving_arch(device_arch, archs)
        if arch is None:
            log(f"fattn: {name} (sm_{device_arch}) has no kernels in this grid (archs {archs})")
        else:
            served[arch] = name
    if served:
        chosen = ";".join(str(a) for a in sorted(served))
        log(f"fattn: development build for the visible GPUs: FATTN_CUDA_ARCHS={chosen} "
            f"({', '.join(f'sm_{a}: {n}' for a, n in sorted(served.items()))}), every head dim")
        return {"FATTN_CUDA_ARCHS": chosen}
    log(f"fattn: no usable GPU visible: development build of a minimal kernel set "
        f"(sm_{MINIMAL['FATTN_CUDA_ARCHS']}, head dim {MINIMAL['FATTN_HEAD_DIMS']}), enough for the "
        f"CPU implementation, the tests and the demo; {HINT}")
    return dict(MINIMAL)
