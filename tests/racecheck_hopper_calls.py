"""One call that runs one Hopper (Gluon, warp-specialized) kernel variant, for
test_hardening_gpu.py to put under compute-sanitizer's racecheck by itself:

    python tests/racecheck_hopper_calls.py forward-d128 | forward-d64 | backward-d64 |
                                           backward-d64-deterministic | backward-d128-softcap | backward-d256 |
                                           dq-d128

Prints the variant's shared-memory size (from fattn.build_info) as `shared <bytes>`."""

from __future__ import annotations

import sys

import torch

import fattn

CALLS = {  # name: (head_dim, backward, deterministic, softcap, the kernel function, its constants)
    "forward-d128": (128, False, False, 0.0, "attn_fwd_sm90", {"BLOCK_D": 128, "SCORE_MOD": 0}),
    "forward-d64": (64, False, False, 0.0, "attn_fwd_sm90", {"BLOCK_D": 64, "SCORE_MOD": 0}),
    "backward-d64": (64, True, False, 0.0, "attn_bwd_dkdv_sm90",
                     {"BLOCK_D": 64, "SCORE_MOD": 0, "ACCUMULATE_DQ": 1}),
    "backward-d64-deterministic": (64, True, True, 0.0, "attn_bwd_dkdv_sm90",
                                   {"BLOCK_D": 64, "SCORE_MOD": 0, "ACCUMULATE_DQ": 0}),
    "backward-d128-softcap": (128, True, False, 30.0, "attn_bwd_dkdv_sm90",
                              {"BLOCK_D": 128, "SCORE_MOD": 1, "ACCUMULATE_DQ": 1}),
    "backward-d256": (256, True, False, 0.0, "attn_bwd_dkdv_sm90", {"BLOCK_D": 256, "SCORE_MOD": 0}),
    "dq-d128": (128, True, False, 0.0, "attn_bwd_dq_sm90", {"BLOCK_D": 128, "SCORE_MOD": 0}),
}
# Queries and keys per call: 200 each, but d64 runs the Hopper forward from 4096 queries only
# (csrc/attention/query_tile_programs.h); its 400 keys give the last query tiles (causal) three and
# four key tiles, so the two-slot K/V ring refills slots the consumers released.
SEQLEN_Q = {"forward-d64": 4096}
SEQLEN_K = {"forward-d64": 400}
# Where the kernel's tile buffers end, for a call whose barriers and partition values take more
# than the last 1 KB of its shared memory: the d64 forward's three consumer warpgroups (Q and Out
# tiles of 3 x 64 rows, a two-slot ring of 128-key K and V tiles, 64 columns of 2 bytes).
TILES_END = {"forward-d64": (2 * 3 * 64 + 2 * 2 * 128) * 64 * 2}


def shared_bytes(function: str, constants: dict) -> int:
    """The bf16 sm_90 variant's shared memory, which must be unique for the call to be classified."""
    sizes = {e["shared"] for e in fattn.build_info()["kernels"]
             if e["function"] == function and e["arch"] == 90 and e["dtype"] == "bf16"
             and all(e["constants"].get(k) == v for k, v in constants.items())}
    if len(sizes) != 1:
        raise SystemExit(f"{function} {constants}: the build has variants with shared sizes {sorted(sizes)}")
    return sizes.pop()


def main(name: str) -> None:
    head_dim, backward, deterministic, softcap, function, constants = CALLS[name]
    torch.manual_seed(0)
    q = torch.randn(1, SEQLEN_Q.get(name, 200), 2, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k, v = (torch.randn(1, SEQLEN_K.get(name, 200), 2, head_dim, dtype=torch.bfloat16, device="cuda",
                        requires_grad=True) for _ in range(2))
    out = fattn.flash_attn_func(q, k, v, causal=True, softcap=softcap, deterministic=deterministic)
    if backward:
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    print(f"shared {shared_bytes(function, constants)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
