"""The ring schedule's designed point-to-point traffic, which the CPU (gloo) and GPU (NCCL) ring
tests hold the implementation to."""


def designed_p2p_ops(world: int, steps: int) -> int:
    """P2P ops one rank posts for a forward and a backward (sends plus receives) when the ring runs
    `steps` steps (fattn.ring.ring_steps): k and v at every step but the last, in each pass; dk
    and dv to the next rank at every step but the last, then straight back to their owner (no
    hop when the ring never left it)."""
    home = 4 if (1 - steps) % world else 0
    return 4 * (steps - 1) + 4 * (steps - 1) + 4 * (steps - 1) + home
