"""Does the Hopper forward gain from TMA maps made by the host instead of in each program?

    python benchmarks/studies/forward_host_maps.py --head-dims 64,128 --seqlens 1024,2048,4096 --out maps.json
    python benchmarks/studies/forward_host_maps.py --maps K,V --out maps_kv.json   # one set per run

Each program of triton_src/forward_sm90.py makes four TMA descriptors (Q, K, V, Out) over its
(sequence, head) before its consumers start: 3.0-3.3 us of a 3.6-3.9 us setup at d128
(docs/notes/tuning.md T36), at about four programs per SM a tenth of a 1k causal call. A dense
call can have them made once, by the host: rank-4 maps over [batch, seqlen, heads, head_dim]
clip each sequence at its end as the per-(sequence, head) ones do, a tile's coordinates being
[batch, row, head, column].

host_maps_source() rewrites the kernel's text into that form (imported as a module of
triton_src by kernel_copy.py and launched through Triton's JIT, which encodes the maps it is given
as TensorDescriptor arguments at each launch): Q, K, V and Out arrive as maps, each descriptor
becomes a (map, batch, head) tuple, and every TMA copy goes through _load4 / _store4, which view
the kernel's 2-D shared-memory tile as the map's [1, rows, 1, columns] box. The kernel is
otherwise the same, so the copy must give the library kernel's output to the bit; the study
then times them, interleaved, on the op's programs per (head, batch). --maps names the tensors
made maps (default all four; K,V or Q,Out say what each pair of descriptors costs); `stores`
writes Out by plain masked stores from the registers instead (no descriptor, no map): the one
descriptor a kernel can drop without a new launch ABI. One set per run: with two or more copies
in one process the first timed replay ended in an illegal address, though each copy alone
replays clean and compute-sanitizer's memcheck found no error in the run of all of them
(docs/notes/tuning.md T39). Dense bf16 calls of the
power-of-two buckets without a bias (the variant the rewrite covers: no FP8, no second
head-dim piece).

compile_check() compiles the copy for sm_90 without a GPU (the maps as `tensordesc` in the
signature) and counts what its PTX still has: tensormap.replace (in-kernel descriptors) and
4-D TMA copies; tests/test_forward_host_maps.py runs it.
Needs an sm_90 GPU and a built library for the timing (the op's programs per pair).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_copy import import_copy  # noqa: E402

COPY = "forward_sm90_host_maps"  # the rewritten kernel's module name in triton_src (kernel_copy.py)

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


@gluon.jit
def _store_rows(desc, row0, out, seqlen_q):
    """Out's rows [row0, row0 + rows) from the accumulator's registers by plain masked stores: no
    descriptor (desc: this (sequence, head)'s base, row stride and head_dim)."""
    base, stride, head_dim = desc
    layout: gl.constexpr = out.type.layout
    rows = row0 + gl.arange(0, out.shape[0], layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, out.shape[1], layout=gl.SliceLayout(0, layout))
    gl.store(base + rows.to(gl.int64)[:, None] * stride + cols[None, :], out.to(base.dtype.element_ty),
             mask=(rows < seqlen_q)[:, None] & (cols < head_dim)[None, :])

'''


MAPS = ("Q", "K", "V", "Out")  # the kernel's tensors that TMA reads or writes
_DESC = {"Q": "q", "K": "k", "V": "v", "Out": "o"}  # each one's descriptor, <x>_desc


def host_maps_source(src: str, maps=MAPS, out_stores: bool = False) -> str:
    """triton_src/forward_sm90.py's text with the tensors named in `maps` (of MAPS) as host-made
    rank-4 maps, the others' descriptors made in the kernel as before; out_stores (Out not a map):
    Out written by plain stores from the registers, without a descriptor. Each edit is anchored on
    the kernel's text; an anchor found other than expected raises (the kernel changed: move the
    anchor)."""
    if set(maps) - set(MAPS) or not (maps or out_stores) or (out_stores and "Out" in maps):
        raise ValueError(f"forward_host_maps: maps must be some of {MAPS} (Out not with out_stores), got {maps}")

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

    loads = "|".join(_DESC[m] for m in maps if m != "Out")
    if loads:
        # Every TMA copy of a row tile at column 0, two per tensor (the second head-dim piece's,
        # then the first's; V^T's copy, [0, start_n], is FP8's alone: left), and the bytes each
        # copy's barrier expects.
        sub(rf"tma\.async_copy_global_to_shared\((({loads})_desc1?), \[([^\[\]]+?), 0\], ", r"_load4(\1, \3, ",
            2 * len(loads.split("|")))
        sub(rf"\b(({loads})_desc1?)\.block_type\.nbytes", r"\1[0].block_type.nbytes", 3 * len(loads.split("|")))
    if "Out" in maps:
        sub(r"tma\.async_copy_shared_to_global\((o_desc1?), \[(\w+), 0\], ", r"_store4(\1, \2, ", 2)
    if out_stores:  # the power-of-two buckets' epilogue: no staging tile, no TMA store
        replace("        staging.store(out.to(staging.dtype))\n", "        _store_rows(o_desc, row0, out, seqlen_q)\n")
        replace("        tma.async_copy_shared_to_global(o_desc, [row0, 0], staging)\n", "")
        sub(r"o_desc = tma\.make_tensor_descriptor\(o_base, \[seqlen_q[^\n]+", "o_desc = (o_base, stride_os, head_dim)", 1)
    # The kernel: the maps come as the tensors' arguments; a descriptor is (map, batch, head).
    for name in ("Q", "K", "V"):
        if name in maps:
            replace(f"    {name} = fp8_pointer({name}, FP8)\n", "")
    if "Q" in maps:
        replace("dtype: gl.constexpr = Q.dtype.element_ty", "dtype: gl.constexpr = Q.dtype")
    if "Out" in maps:
        replace("out_dtype: gl.constexpr = Out.dtype.element_ty", "out_dtype: gl.constexpr = Out.dtype")
    head = {"Q": "head", "K": "kv_head", "V": "kv_head", "Out": "head"}
    for name in maps:
        x = _DESC[name]
        indent = "        " if name == "V" else "    "  # V's are in the branch without FP8
        sub(rf"\n{indent}{x}_base = {name} \+ batch \* stride_{x}b \+ [qk]_start[^\n]+", "", 1)
        sub(rf"{x}_desc = tma\.make_tensor_descriptor\({x}_base, \[seqlen_[qk][^\n]+",
            f"{x}_desc = ({name}, batch.to(gl.int32), {head[name]})", 1)
    fp8_rule = '    gl.static_assert((FP8 == 0) | (D1 == 0), "FP8 inputs: the power-of-two buckets")\n'
    replace(fp8_rule, fp8_rule + "    gl.static_assert((FP8 == 0) & (SCORE_MOD != BIAS_TMA) & (D1 == 0) & (BLOCK_D <= 128),\n"
            "                     \"host maps: 16-bit inputs, no bias, a power-of-two bucket up to 128\")\n")
    replace("\n\n@gluon.jit\ndef head_alibi_log2(", _HELPERS + "\n@gluon.jit\ndef head_alibi_log2(")
    return src


def map_layout(head_dim_bucket: int):
    """The maps' box layout for a power-of-two bf16 bucket: forward_sm90.py's tile_layout (its
    out_layout is the same for bf16) at rank 4."""
    from triton.experimental.gluon import language as gl

    swizzle = 128 if head_dim_bucket * 2 >= 128 else head_dim_bucket * 2
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=4)


def box_rows(block_n: int) -> dict:
    """Each map's box rows, as the kernel's tiles: 64 query rows per consumer, block_n keys."""
    return {"Q": 64, "K": block_n, "V": block_n, "Out": 64}


def copy_module(maps=MAPS, out_stores: bool = False):
    """The kernel rewritten for `maps` (and out_stores), imported as a module of triton_src (one
    per choice, so that a run can time several; kernel_copy.py says where it lives)."""
    name = f"{COPY}_{'_'.join([_DESC[m] for m in MAPS if m in maps] + (['ostores'] if out_stores else []))}"
    source = host_maps_source((ROOT / "triton_src" / "forward_sm90.py").read_text(), maps, out_stores)
    return import_copy(name, source)


def compile_check(head_dim: int = 128, arch: int = 90, maps=MAPS, out_stores: bool = False) -> dict:
    """Compiles the copy's plain variant for `arch` without a GPU; returns what its PTX holds."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental import gluon

    from aot_build import grid
    from aot_build.signatures import triton_signature

    module = copy_module(maps, out_stores)
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": str(arch), "FATTN_HEAD_DIMS": str(head_dim)})
                   if v.implementation == "attn_fwd_sm90" and v.dtype == "bf16" and not v.constant_dict["FP8"]
                   and v.constant_dict["SCORE_MOD"] == 0)
    c = variant.constant_dict
    signature, attrs = triton_signature("attn_fwd_sm90", variant.dtype)
    layout = map_layout(c["BLOCK_D"])
    rows = box_rows(c["BLOCK_N"])
    names = list(signature)
    for name in maps:
        signature[name] = f"tensordesc<bf16[1, {rows[name]}, 1, {c['BLOCK_D']}],{layout}>"
        attrs.pop((names.index(name),), None)  # a pointer's alignment: not a map's
    src = gluon._runtime.GluonASTSource(module.attn_fwd_sm90, signature, variant.constant_dict, attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": variant.num_warps, "num_stages": variant.num_stages})
    ptx = compiled.asm["ptx"]
    return {"tensormap_replace": len(re.findall(r"\btensormap\.replace", ptx)),
            "tma_4d": len(re.findall(r"cp\.async\.bulk\.tensor\.4d", ptx)),
            "tma_2d": len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)),
            "maps": [m["block_size"] for m in compiled.metadata.tensordesc_meta]}


def host_maps(q, k, v, out, block_n: int, maps=MAPS) -> dict:
    """The rank-4 maps named in `maps` over dense [batch, seqlen, heads, head_dim] tensors, boxes as
    the kernel's tiles (box_rows)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    bucket = 1 << (q.shape[-1] - 1).bit_length()
    layout = map_layout(bucket)
    rows = box_rows(block_n)
    tensors = {"Q": q, "K": k, "V": v, "Out": out}
    return {name: TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows[name], 1, bucket], layout)
            for name, t in tensors.items() if name in maps}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="1024,2048,4096")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--maps", default="Q,K,V,Out",
                        help="the tensors made maps by the host, timed against the library kernel; 'stores' "
                             "among them: Out by plain stores, without a descriptor")
    parser.add_argument("--pairs", type=int, default=4, help="interleaved timing pairs per case")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    names = args.maps.split(",")
    maps, out_stores = tuple(m for m in MAPS if m in names), "stores" in names
    if set(names) - set(MAPS) - {"stores"} or not (maps or out_stores) or (out_stores and "Out" in maps):
        parser.error(f"--maps: {args.maps!r} is not a set of {', '.join(MAPS)} (or 'stores', without Out)")

    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("forward_host_maps needs a Hopper GPU (sm_90)", file=sys.stderr)
        return 2

    from common import interleaved_ms, write_ab_rows
    from triton_src.forward_sm90 import ATTN_FWD_SM90
    from tuning import launch
    from tuning.tune import graph_replay

    from forward_cases import forward_cases

    copy = copy_module(maps, out_stores).ATTN_FWD_SM90
    label = "+".join(maps + (("Out stores",) if out_stores else ()))
    launch.use_torch_scratch()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for case in forward_cases(args.head_dims, args.seqlens, args.tokens, args.hidden, sms):
        d, s, causal, tiles, p, programs, variant = case

        def library_kernel():
            return launch.forward(p.q, p.k, p.v, tiles, variant, spec=ATTN_FWD_SM90, programs=programs)[0]

        want = library_kernel()
        out = torch.full_like(p.q, float("nan"))
        given = host_maps(p.q, p.k, p.v, out, tiles.block_n, maps)

        def with_maps():
            # Out, where it is not a map, is the launcher's own tensor: take the result from it.
            result = launch.forward(p.q, p.k, p.v, tiles, variant, spec=copy, programs=programs, replace=given)[0]
            return out if "Out" in given else result

        got = with_maps()
        if not torch.equal(got, want):
            raise RuntimeError(f"d{d} s{s} causal={causal} --maps {args.maps}: the copy differs in "
                               f"{(got != want).sum().item()} elements")
        ms = interleaved_ms({"in_kernel": graph_replay(library_kernel), label: graph_replay(with_maps)},
                            pairs=args.pairs)
        row = {"head_dim": d, "seqlen": s, "causal": causal, "programs_per_pair": programs,
               "ms": {k: round(v, 4) for k, v in ms.items()}, "speedup": {label: round(ms["in_kernel"] / ms[label], 3)}}
        print(json.dumps(row), flush=True)
        rows.append(row)
        if args.out:  # after each case: a run cut short keeps what it measured
            write_ab_rows(args.out, rows)
        case = p = out = given = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
