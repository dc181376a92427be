"""Runs triton_src/segments.py's segment_spans in Triton's interpreter (TRITON_INTERPRET=1, CPU)
against a direct search, through tuning/launch.py's launch (the one the op mirrors).
Invoked by test_segment_spans_interpreted.py in a fresh process. Prints one JSON line per case:
the spans' mismatches and how many tiles found no position."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from tuning.launch import Variant  # noqa: E402


def expected(own, other, tile):
    """(first, last + 1) of the other side's positions whose id lies in each own tile's range,
    then the same again where the tile has one id and those positions are one run, else (0, 0)."""
    batch, n = own.shape
    out = torch.zeros(batch, -(-n // tile), 4, dtype=torch.int32)
    for b in range(batch):
        for t in range(out.shape[1]):
            ids = own[b, t * tile:(t + 1) * tile]
            hits = ((other[b] >= ids.min()) & (other[b] <= ids.max())).nonzero().flatten()
            if hits.numel():
                out[b, t, :2] = torch.tensor([hits[0], hits[-1] + 1])
                if ids.min() == ids.max() and hits.numel() == hits[-1] - hits[0] + 1:
                    out[b, t, 2:] = out[b, t, :2]
    return out


CASES = [
    # name, batch, seqlen_q, seqlen_k, tile, id kind
    ("sorted-documents", 3, 200, 200, 16, "sorted"),
    ("documents-of-40", 2, 160, 160, 16, "fixed"),  # tiles of one id and tiles of two, always
    ("sorted-q-longer-than-k", 2, 1100, 700, 64, "sorted"),  # several scan blocks of 1024 on q's side
    ("unsorted-runs", 2, 300, 2500, 32, "runs"),
    ("negative-and-extreme-ids", 2, 90, 130, 16, "extreme"),
    ("tile-longer-than-sequence", 2, 5, 9, 128, "runs"),
]


def ids_for(kind, batch, n, generator):
    if kind == "sorted":
        return torch.sort(torch.randint(0, 6, (batch, n), generator=generator), dim=1).values.int()
    if kind == "fixed":
        return (torch.arange(n) // 40).int().expand(batch, n).contiguous()
    if kind == "runs":
        runs = torch.randint(0, 5, (batch, n // 7 + 1), generator=generator)
        return runs.repeat_interleave(7, dim=1)[:, :n].int()
    # Runs of 16 of the int32 extremes and negative ids.
    pool = torch.tensor([-2**31, -5, -1, 0, 3, 2**31 - 1], dtype=torch.int64)
    runs = pool[torch.randint(0, len(pool), (batch, n // 16 + 1), generator=generator)]
    return runs.repeat_interleave(16, dim=1)[:, :n].int()


if __name__ == "__main__":
    generator = torch.Generator().manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for name, batch, seqlen_q, seqlen_k, tile, kind in CASES:
        q_ids = ids_for(kind, batch, seqlen_q, generator)
        kv_ids = ids_for(kind, batch, seqlen_k, generator)
        if kind == "extreme":  # a tile of ids the other side lacks, in each direction
            q_ids[q_ids == 3], kv_ids[kv_ids == -1] = 0, 0
            q_ids[0, :16], kv_ids[0, :16] = -1, 3
        variant = Variant(segments=(q_ids, kv_ids))
        row = {"case": name}
        for label, over_keys, own, other in (("query_tiles", False, q_ids, kv_ids), ("key_tiles", True, kv_ids, q_ids)):
            got = variant.span_args(tile, over_keys, torch.device("cpu"))["SegmentSpans"]
            want = expected(own, other, tile)
            row[f"{label}_mismatches"] = int((got != want).any(-1).sum())
            row[f"{label}_empty"] = int((want[..., 1] == 0).sum())
            row[f"{label}_runs"] = int((want[..., 3] > 0).sum())
            row[f"{label}_total"] = want.shape[0] * want.shape[1]
        print(json.dumps(row), flush=True)
