"""Does the Hopper forward gain from TMA maps made by the host instead of in each program?

    python benchmarks/studies/forward_host_maps.py --head-dims 64,128 --seqlens 1024,2048,4096 --out maps.json

Each program of triton_src/forward_sm90.py makes four TMA descriptors (Q, K, V, Out) over its
(sequence, head) before its consumers start: 3.0-3.3 us of a 3.6-3.9 us setup at d128
(docs/notes/tuning.md T36), at about four programs per SM a tenth of a 1k causal call. A dense
call can have them made once, by the host: rank-4 maps over [batch, seqlen, heads, head_dim]
clip each sequence at its end as the per-(sequence, head) ones do, a tile's coordinates being
[batch, row, head, column].

host_maps_source() rewrites the kernel's text into that form (written beside it as
forward_sm90_host_maps.py and launched through Triton's JIT, which encodes the maps it is given
as TensorDescriptor arguments at each launch): Q, K, V and Out arrive as maps, each descriptor
becomes a (map, batch, head) tuple, and every TMA copy goes through _load4 / _store4, which view
the kernel's 2-D shared-memory tile as the map's [1, rows, 1, columns] box. The kernel is
otherwise the same, so the copy must give the library kernel's output to the bit; the study
then times both, interleaved, on the op's programs per (head, batch). Dense bf16 calls of the
power-of-two buckets without a bias (the variant the rewrite covers: no FP8, no second
head-dim piece).

compile_check() compiles the copy for sm_90 without a GPU (the maps as `tensordesc` in the
signature) and counts what its PTX still has: tensormap.replace (in-kernel descriptors) and
4-D TMA copies; tests/test_forward_host_maps.py runs it.
Needs an sm_90 GPU and a built library for the timing (the op's programs per pair).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

COPY = "forward_sm90_host_maps"  # the rewritten kernel's module, in triton_src/

_HELPERS = '''

@gluon.jit
def _load4(desc, row, barrier, smem):
    """TMA load of rows [row, row + box) of a host map's (batch, head) into a 2-D tile."""
    tile_map, batch, head = desc
    box: gl.constexpr = tile_map.block_type.shape
    tma.async_copy_global_to_shared(tile_map, [batch, row, head, 0], barrier,
                                    smem._reinterpret(smem.dtype, box, tile_map.layout))


@gluon.jit
def _store4(desc, row, smem):
    """TMA store of a 2-D tile to rows [row, row + box) of a host map's (batch, head)."""
    tile_map, batch, head = desc
    box: gl.constexpr = tile_map.block_type.shape
    tma.async_copy_shared_to_global(tile_map, [batch, row, head, 0], smem._reinterpret(smem.dtype, box,
                                                                                      tile_map.layout))

'''


def host_maps_source(src: str) -> str:
    """triton_src/forward_sm90.py's text with Q, K, V and Out as host-made rank-4 maps. Each edit is
    anchored on the kernel's text; an anchor found other than expected raises (the kernel
    changed: move the anchor)."""

    def replace(old: str, new: str, count: int = 1) -> None:
        nonlocal src
        if src.count(old) != count:
            raise ValueError(f"forward_host_maps: anchor found {src.count(old)} times, not {count}: {old!r}")
        src = src.replace(old, new)

    def sub(pattern: str, repl: str, count: int) -> None:
        nonlocal src
        src, n = re.subn(pattern, repl, src)
        if n != count:
            raise ValueError(f"forward_host_maps: pattern matched {n} times, not {count}: {pattern!r}")

    # Every TMA copy of a row tile at column 0 (V^T's copy, [0, start_n], is FP8's alone: left).
    sub(r"tma\.async_copy_global_to_shared\((\w+), \[([^\[\]]+?), 0\], ", r"_load4(\1, \2, ", 6)
    sub(r"tma\.async_copy_shared_to_global\((\w+), \[(\w+), 0\], ", r"_store4(\1, \2, ", 2)
    sub(r"\b([qkv]_desc1?)\.block_type\.nbytes", r"\1[0].block_type.nbytes", 9)
    # The kernel: the maps come as Q, K, V and Out; a descriptor is (map, batch, head).
    for name in ("Q", "K", "V"):
        replace(f"    {name} = fp8_pointer({name}, FP8)\n", "")
    replace("dtype: gl.constexpr = Q.dtype.element_ty", "dtype: gl.constexpr = Q.dtype")
    replace("out_dtype: gl.constexpr = Out.dtype.element_ty", "out_dtype: gl.constexpr = Out.dtype")
    for base in ("q_base", "k_base", "o_base"):
        sub(rf"\n    {base} = [^\n]+", "", 1)
    sub(r"\n        v_base = V \+ batch \* stride_vb \+ k_start[^\n]+", "", 1)
    sub(r"q_desc = tma\.make_tensor_descriptor\(q_base[^\n]+", "q_desc = (Q, batch.to(gl.int32), head)", 1)
    sub(r"k_desc = tma\.make_tensor_descriptor\(k_base[^\n]+", "k_desc = (K, batch.to(gl.int32), kv_head)", 1)
    sub(r"o_desc = tma\.make_tensor_descriptor\(o_base[^\n]+", "o_desc = (Out, batch.to(gl.int32), head)", 1)
    sub(r"v_desc = tma\.make_tensor_descriptor\(v_base, \[seqlen_k[^\n]+", "v_desc = (V, batch.to(gl.int32), kv_head)", 1)
    replace("    gl.static_assert(TILE_LOOP,",
            "    gl.static_assert((FP8 == 0) & (SCORE_MOD != BIAS_TMA), \"host maps: 16-bit inputs, no bias\")\n"
            "    gl.static_assert(TILE_LOOP,")
    replace("\n\n@gluon.jit\ndef head_alibi_log2(", _HELPERS + "\n@gluon.jit\ndef head_alibi_log2(")
    return src


def map_layouts(head_dim_bucket: int):
    """The NVMMA layouts of the kernel's tiles for a power-of-two bf16 bucket (forward_sm90.py's
    tile_layout and out_layout), as rank-4 layouts of the maps' boxes."""
    from triton.experimental.gluon import language as gl

    swizzle = 128 if head_dim_bucket * 2 >= 128 else head_dim_bucket * 2
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=4)


def write_copy() -> str:
    """Writes the rewritten kernel beside forward_sm90.py; returns its module name."""
    (ROOT / "triton_src" / f"{COPY}.py").write_text(host_maps_source((ROOT / "triton_src" / "forward_sm90.py")
                                                                     .read_text()))
    return f"triton_src.{COPY}"


def compile_check(head_dim: int = 128, arch: int = 90) -> dict:
    """Compiles the copy's plain variant for `arch` without a GPU; returns what its PTX holds."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental import gluon

    from aot_build import grid
    from aot_build.signatures import triton_signature

    module = importlib.import_module(write_copy())
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": str(arch), "FATTN_HEAD_DIMS": str(head_dim)})
                   if v.implementation == "attn_fwd_sm90" and v.dtype == "bf16" and not v.constant_dict["FP8"]
                   and v.constant_dict["SCORE_MOD"] == 0)
    c = variant.constant_dict
    signature, attrs = triton_signature("attn_fwd_sm90", variant.dtype)
    layout = map_layouts(c["BLOCK_D"])
    rows = {"Q": 64, "Out": 64, "K": c["BLOCK_N"], "V": c["BLOCK_N"]}
    names = list(signature)
    for name, box_rows in rows.items():
        signature[name] = f"tensordesc<bf16[1, {box_rows}, 1, {c['BLOCK_D']}],{layout}>"
        attrs.pop((names.index(name),), None)  # a pointer's alignment: not a map's
    src = gluon._runtime.GluonASTSource(module.attn_fwd_sm90, signature, variant.constant_dict, attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": variant.num_warps, "num_stages": variant.num_stages})
    ptx = compiled.asm["ptx"]
    return {"tensormap_replace": len(re.findall(r"\btensormap\.replace", ptx)),
            "tma_4d": len(re.findall(r"cp\.async\.bulk\.tensor\.4d", ptx)),
            "tma_2d": len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)),
            "maps": [m["block_size"] for m in compiled.metadata.tensordesc_meta]}


def host_maps(q, k, v, out, block_n: int):
    """The four rank-4 maps over dense [batch, seqlen, heads, head_dim] tensors, boxes as the
    kernel's tiles: 64 query rows per consumer, block_n keys."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    bucket = 1 << (q.shape[-1] - 1).bit_length()
    layout = map_layouts(bucket)
    return {name: TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, 1, bucket], layout)
            for name, t, rows in (("Q", q, 64), ("K", k, block_n), ("V", v, block_n), ("Out", out, 64))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="1024,2048,4096")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--pairs", type=int, default=4, help="interleaved timing pairs per case")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("forward_host_maps needs a Hopper GPU (sm_90)", file=sys.stderr)
        return 2
    import triton

    import fattn._library as library
    from common import interleaved_ms
    from triton_src.forward_sm90 import ATTN_FWD_SM90
    from tuning import launch
    from tuning.tune import Problem, graph_replay
    from tuning.tune_tile_loop import _looping_tiles

    copy = importlib.import_module(write_copy()).ATTN_FWD_SM90
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for d in (int(x) for x in args.head_dims.split(",")):
        _, tiles = _looping_tiles(90, d)
        for s in (int(x) for x in args.seqlens.split(",")):
            for causal in (True, False):
                heads, batch = args.hidden // d, max(1, args.tokens // s)
                p = Problem(batch, s, heads, heads, d, causal)
                programs = library.query_tile_programs(-(-s // tiles.block_m), batch * heads, sms, causal)
                variant = launch.Variant(causal=causal)
                out = torch.full_like(p.q, float("nan"))
                maps = host_maps(p.q, p.k, p.v, out, tiles.block_n)

                def library_kernel():
                    return launch.forward(p.q, p.k, p.v, tiles, variant, spec=ATTN_FWD_SM90, programs=programs)[0]

                def with_maps():
                    launch.forward(p.q, p.k, p.v, tiles, variant, spec=copy, programs=programs, replace=maps)
                    return out

                want = library_kernel()
                got = with_maps()
                if not torch.equal(got, want):
                    bad = (got != want).sum().item()
                    raise RuntimeError(f"d{d} s{s} causal={causal}: the host-map copy differs in {bad} elements")
                ms = interleaved_ms({"in_kernel": graph_replay(library_kernel), "host_maps": graph_replay(with_maps)},
                                    pairs=args.pairs)
                row = {"head_dim": d, "seqlen": s, "causal": causal, "programs_per_pair": programs,
                       "ms": {k: round(v, 4) for k, v in ms.items()},
                       "speedup": round(ms["in_kernel"] / ms["host_maps"], 3)}
                print(json.dumps(row), flush=True)
                rows.append(row)
                p = out = maps = None
                torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "triton": triton.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
