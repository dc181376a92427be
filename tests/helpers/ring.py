"""The ring schedule's designed point-to-point traffic, which the CPU (gloo) and GPU (NCCL) ring
tests hold the implementation to."""


def designed_p2p_ops(behind: int, ahead: int) -> int:
    """P2P ops one rank posts for a forward and a backward (sends plus receives) under the schedule
    fattn.ring.ring_schedule gives: each hop of a K/V block moves k and v (4 ops) in the forward and
    again in the backward, and the block's dK/dV accumulator makes the same number of hops (it
    starts one rank on, and its last hop goes straight back to the owner)."""
    hops = behind + ahead
    return 4 * hops + 4 * hops + 4 * hops
