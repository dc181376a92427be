"""The cases the studies of the Hopper forward's looping kernel time (forward_timeline.py,
forward_host_maps.py; forward_programs.py takes the same options): per head dim, length and causal flag, the grid's tiles, the problem and the
op's programs per (head, batch), so that a copy of the kernel runs as the library's does."""

from __future__ import annotations

from typing import Iterator, NamedTuple


class ForwardCase(NamedTuple):
    head_dim: int
    seqlen: int
    causal: bool
    tiles: object  # tuning.launch.Tiles
    problem: object  # tuning.tune.Problem: q, k, v
    programs: int  # per (head, batch), as csrc/attention/query_tile_programs.cpp picks them
    variant: object  # tuning.launch.Variant


def add_case_arguments(parser, head_dims: str = "64,128", seqlens: str = "1024,2048,4096") -> None:
    """The study problem's options on a command line: --head-dims and --seqlens (comma-separated),
    --tokens per call and --hidden (heads = hidden // head dim), as forward_cases takes them."""
    parser.add_argument("--head-dims", default=head_dims)
    parser.add_argument("--seqlens", default=seqlens)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)


def forward_cases(head_dims: str, seqlens: str, tokens: int, hidden: int, sms: int) -> Iterator[ForwardCase]:
    """bf16 (float32 without a GPU) problems of `tokens` tokens per call and hidden // d heads, for
    each comma-separated head dim and length, causal then not; each case's problem is made when it
    is reached, so one case's tensors are held at a time by a caller that drops them."""
    import fattn._library as library
    from tuning import launch
    from tuning.tune import Problem
    from tuning.tune_tile_loop import _looping_tiles

    for d in (int(x) for x in head_dims.split(",")):
        _, tiles, _ = _looping_tiles(90, d)
        for s in (int(x) for x in seqlens.split(",")):
            for causal in (True, False):
                heads, batch = hidden // d, max(1, tokens // s)
                programs = library.query_tile_programs(-(-s // tiles.block_m), batch * heads, sms, causal)
                yield ForwardCase(d, s, causal, tiles, Problem(batch, s, heads, heads, d, causal), programs,
                                  launch.Variant(causal=causal))
