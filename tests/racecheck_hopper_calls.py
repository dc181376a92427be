"""One call that runs one Hopper (Gluon, warp-specialized) kernel variant, for
test_hardening_gpu.py to put under compute-sanitizer's racecheck by itself:

    python tests/racecheck_hopper_calls.py forward-d128 | forward-d64 | forward-d96 | forward-d192 | forward-d256 |
                                           backward-d64 | backward-d64-deterministic | backward-d96 |
                                           backward-d128-softcap | backward-d256 | dq-d128 | forward-d128-bias |
                                           backward-d128-bias | dq-d128-bias

Prints the variant's shared-memory size (from fattn.build_info) as `shared <bytes>`, and for a call
in TILES_END where its tile buffers end as `tiles_end <bytes>`. With --check-launch (run without
the sanitizer) it fails unless the call launched the kernel the call names."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import fattn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import hopper_variants, kernels_launched  # noqa: E402

CALLS = {  # name: (head_dim, backward, deterministic, softcap, the kernel function, its constants)
    # A dense call of 1k rows: the form with host-made maps (HOST_MAPS, attn_fwd_sm90_maps).
    "forward-d128": (128, False, False, 0.0, "attn_fwd_sm90_maps", {"BLOCK_D": 128, "SCORE_MOD": "plain"}),
    "forward-d64": (64, False, False, 0.0, "attn_fwd_sm90", {"BLOCK_D": 64, "SCORE_MOD": "plain"}),
    # The split buckets: two head-dim pieces per tile on the same mbarriers.
    "forward-d96": (96, False, False, 0.0, "attn_fwd_sm90", {"BLOCK_D": 96, "SCORE_MOD": "plain"}),
    "forward-d192": (192, False, False, 0.0, "attn_fwd_sm90", {"BLOCK_D": 192, "SCORE_MOD": "plain"}),
    # O staged in Q's buffer (O_IN_Q_BUFFER): each warp's TMA store reads it before Q's release.
    "forward-d256": (256, False, False, 0.0, "attn_fwd_sm90", {"BLOCK_D": 256, "SCORE_MOD": "plain"}),
    # Dense backward calls up to the backward's limit: the dK/dV and dQ kernels' forms with
    # host-made maps (attn_bwd_dkdv_sm90_maps, attn_bwd_dq_sm90_maps).
    "backward-d64": (64, True, False, 0.0, "attn_bwd_dkdv_sm90_maps",
                     {"BLOCK_D": 64, "SCORE_MOD": "plain", "ACCUMULATE_DQ": 1}),
    "backward-d64-deterministic": (64, True, True, 0.0, "attn_bwd_dkdv_sm90_maps",
                                   {"BLOCK_D": 64, "SCORE_MOD": "plain", "ACCUMULATE_DQ": 0}),
    "backward-d96": (96, True, False, 0.0, "attn_bwd_dkdv_sm90",
                     {"BLOCK_D": 96, "SCORE_MOD": "plain", "ACCUMULATE_DQ": 0}),
    "backward-d128-softcap": (128, True, False, 30.0, "attn_bwd_dkdv_sm90",
                              {"BLOCK_D": 128, "SCORE_MOD": "softcap_alibi", "ACCUMULATE_DQ": 1}),
    "backward-d256": (256, True, False, 0.0, "attn_bwd_dkdv_sm90", {"BLOCK_D": 256, "SCORE_MOD": "plain"}),
    "dq-d128": (128, True, False, 0.0, "attn_bwd_dq_sm90_maps", {"BLOCK_D": 128, "SCORE_MOD": "plain"}),
    # A bias read by TMA (SCORE_MOD bias_tma): its slots, the d bias staging tiles and dropout's mask
    # (the dK/dV's through a layout conversion in shared memory).
    "forward-d128-bias": (128, False, False, 0.0, "attn_fwd_sm90", {"BLOCK_D": 128, "SCORE_MOD": "bias_tma"}),
    "backward-d128-bias": (128, True, False, 0.0, "attn_bwd_dkdv_sm90", {"BLOCK_D": 128, "SCORE_MOD": "bias_tma"}),
    "dq-d128-bias": (128, True, False, 0.0, "attn_bwd_dq_sm90", {"BLOCK_D": 128, "SCORE_MOD": "bias_tma"}),
}
# The calls with a bias [1, heads, seqlen_q, seqlen_k] that needs its gradient, and dropout.
BIAS = {"forward-d128-bias", "backward-d128-bias", "dq-d128-bias"}
# Queries and keys per call: 200 each, but the causal d64 and d128 calls need more queries than
# the tuned crossovers from which the op asks for the Hopper forward (aot_build/tuned/sm90.json,
# csrc/attention/query_tile_programs.h; below them attn_fwd serves them, and --check-launch
# fails); d64's 400 keys give the last query tiles
# three and four key tiles, so the two-slot K/V ring refills slots the consumers released. The
# d64 backward with dQ accumulated has four Q/dO slots: 640 rows give the first key tiles ten
# query tiles, so its ring refills them too; so do the Hopper dQ's four K/V slots with 400 keys
# (seven 64-key tiles for the last query tile).
# The bias calls: 640 queries and keys refill the bias slots and the Q/dO ring.
SEQLEN_Q = {"forward-d64": 8192, "forward-d128": 1024, "backward-d64": 640, "dq-d128": 400,
            **dict.fromkeys(BIAS, 640)}
SEQLEN_K = {"forward-d64": 400, "forward-d96": 400, "backward-d64": 640, "dq-d128": 400, **dict.fromkeys(BIAS, 640)}


def _forward_tiles_end(c: dict) -> int:
    """Where the Hopper forward's tile buffers end: Q and Out tiles of BLOCK_M rows, a two-slot K/V
    ring of BLOCK_N keys (forward_sm90.py, head dims up to 128), 2-byte elements."""
    return (2 * c["BLOCK_M"] + 2 * 2 * c["BLOCK_N"]) * c["BLOCK_D"] * 2


# Calls whose kernel keeps more than its last 1 KB of shared memory past its tile buffers: the d64
# forward's three consumers, whose partition values Triton places at the tiles' end, where each
# consumer's layout-conversion scratch for segment ids (512 bytes) also lives.
TILES_END = {"forward-d64": _forward_tiles_end}


def built_variant(function: str, constants: dict) -> dict:
    """The bf16 sm_90 variant's build_info entry, which must be unique for the call to be classified."""
    entries = hopper_variants(function, constants)
    if len({e["shared"] for e in entries}) != 1:
        raise SystemExit(f"{function} {constants}: the build has variants with shared sizes "
                         f"{sorted(e['shared'] for e in entries)}")
    return entries[0]


def main(name: str, check_launch: bool) -> None:
    head_dim, backward, deterministic, softcap, function, constants = CALLS[name]
    torch.manual_seed(0)
    q = torch.randn(1, SEQLEN_Q.get(name, 200), 2, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k, v = (torch.randn(1, SEQLEN_K.get(name, 200), 2, head_dim, dtype=torch.bfloat16, device="cuda",
                        requires_grad=True) for _ in range(2))

    bias, p = None, 0.0
    if name in BIAS:
        bias = torch.randn(1, 2, q.shape[1], k.shape[1], dtype=torch.bfloat16, device="cuda", requires_grad=True)
        p = 0.1

    def call():
        out = fattn.flash_attn_func(q, k, v, p, causal=True, softcap=softcap, deterministic=deterministic,
                                    bias=bias)
        if backward:
            out.backward(torch.ones_like(out))
        torch.cuda.synchronize()

    if check_launch:  # outside the sanitizer: the call must reach the kernel racecheck is told to watch
        launched = kernels_launched(call)
        if function not in launched:
            raise SystemExit(f"{name}: {function} was not launched ({sorted(launched)})")
    else:
        call()
    variant = built_variant(function, constants)
    print(f"shared {variant['shared']}", flush=True)
    if name in TILES_END:
        print(f"tiles_end {TILES_END[name](variant['constants'])}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], "--check-launch" in sys.argv[2:])
