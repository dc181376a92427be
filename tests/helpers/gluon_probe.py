"""A Gluon kernel that exercises what the Hopper attention kernels will need from Gluon, kept
out of the library: it proves that @gluon.jit code goes through aot_build's compiler like the
Triton kernels (tests/test_aot_build.py on a CPU, tests/test_gluon_gpu.py on a Hopper GPU).

One 64 x 64 tile of C = A @ B (fp16 in, fp32 out) through the kernels' own ABI (pointers and
integer strides, no host-side tensor descriptors): blocked loads into registers, stores into
NVMMA-swizzled shared memory, one warpgroup MMA (wgmma) into an fp32 accumulator."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from triton_src.spec import KernelSpec, f32_tensor, i32, tensor

WARPS = 4  # one warpgroup


@gluon.jit
def gluon_wgmma_probe(A, B, C, stride_a, stride_b, stride_c, BLOCK: gl.constexpr):
    blocked: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                             warps_per_cta=[4, 1], order=[1, 0])
    rows = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, blocked))
    cols = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, blocked))
    a = gl.load(A + rows[:, None] * stride_a + cols[None, :])
    b = gl.load(B + rows[:, None] * stride_b + cols[None, :])
    # 64 fp16 = 128 bytes per row: the 128-byte swizzle wgmma reads without bank conflicts.
    shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    a_smem = gl.allocate_shared_memory(gl.float16, [BLOCK, BLOCK], shared, a)
    b_smem = gl.allocate_shared_memory(gl.float16, [BLOCK, BLOCK], shared, b)
    fence_async_shared()  # the generic-proxy stores above before wgmma's async-proxy reads
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK, 16])
    acc = warpgroup_mma(a_smem, b_smem, gl.zeros([BLOCK, BLOCK], gl.float32, layout=mma))
    gl.store(C + rows[:, None] * stride_c + cols[None, :], gl.convert_layout(acc, blocked))


GLUON_WGMMA_PROBE = KernelSpec(gluon_wgmma_probe, [
    tensor("A"), tensor("B"), f32_tensor("C"), i32("stride_a"), i32("stride_b"), i32("stride_c"),
])


def build_probe(cache_dir, monkeypatch):
    """The probe compiled for sm_90 by aot_build's compile_variant, as a variant of the grid (its
    spec registered beside the library's kernels for the duration of the test)."""
    import triton_src
    from aot_build.compiler import compile_variant
    from aot_build.grid import Variant

    monkeypatch.setitem(triton_src.KERNELS, "gluon_wgmma_probe", GLUON_WGMMA_PROBE)
    variant = Variant("gluon_wgmma_probe", __name__, 90, "fp16", (("BLOCK", 64),), WARPS, 1)
    return compile_variant(variant, shared_limit=232448, cache_dir=cache_dir)
