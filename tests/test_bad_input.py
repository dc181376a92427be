"""Every bad-input rule of the attention forward raises a clear error naming the argument,
before any launch, and the op's fake raises the same one (torch.compile sees that error).

Validation is shared by the CPU and CUDA implementations (csrc/attention/attention_shape.cpp),
so CPU tensors exercise it here; test_forward_gpu.py checks the CUDA-only rules.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fattn
from fattn._library import pick_arch, pick_path, serving_archs
from helpers import FORWARD, check_fake_raises_like_op


def qkv(b=2, sq=8, sk=8, h=4, hk=2, d=32, dtype=torch.float16):
    return (torch.randn(b, sq, h, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype),
            torch.randn(b, sk, hk, d, dtype=dtype))


def expect(match, q, k, v, softmax_scale=None):
    with pytest.raises(RuntimeError, match=match):
        fattn.flash_attn_func(q, k, v, softmax_scale=softmax_scale)
    check_fake_raises_like_op(FORWARD, (q, k, v, softmax_scale, False, False), match)


def test_wrong_dtype():
    q, k, v = qkv()
    expect(r"q has dtype int32; expected float16 or bfloat16", q.int(), k.int(), v.int())


def test_mixed_dtypes():
    q, k, v = qkv()
    expect(r"k has dtype bfloat16 but q has float16", q, k.bfloat16(), v)
    expect(r"v has dtype float32 but q has float16", q, k, v.float())


def test_wrong_rank():
    q, k, v = qkv()
    expect(r"q must be a 4-D tensor \[batch, seqlen, heads, head_dim\], got shape \[2, 8, 128\]",
           q.flatten(2), k, v)
    expect(r"k must be a 4-D tensor", q, k[0], v)


def test_head_dims_differ():
    q, k, v = qkv()
    expect(r"k has head_dim 40 but q has 32", q, torch.randn(2, 8, 2, 40, dtype=q.dtype), v)
    expect(r"v has head_dim 40 but q has 32", q, k, torch.randn(2, 8, 2, 40, dtype=q.dtype))


@pytest.mark.parametrize("d", [264, 512])
def test_head_dim_over_256(d):
    q, k, v = qkv(d=d)
    expect(rf"head_dim {d} is not supported; expected a multiple of 8 from 8 to 256", q, k, v)


@pytest.mark.parametrize("d", [4, 12, 100])
def test_the_op_takes_multiples_of_8_only(d):
    # The public functions pad such head dims (test_head_dims_cpu.py); the op itself does not.
    q, k, v = qkv(d=d)
    check_fake_raises_like_op(FORWARD, (q, k, v, None, False, False), rf"head_dim {d} is not supported")


def test_q_heads_not_multiple_of_kv_heads():
    q, k, v = qkv(h=6, hk=4)
    expect(r"q has 6 heads, which is not a multiple of the 4 heads of k and v", q, k, v)


def test_k_v_disagree():
    q, k, v = qkv()
    expect(r"v has shape \[2, 9, 2, 32\] but k has \[2, 8, 2, 32\]", q, k, torch.randn(2, 9, 2, 32, dtype=q.dtype))


def test_non_contiguous_last_dim():
    q, k, v = qkv()
    q_t = torch.randn(2, 8, 32, 4, dtype=q.dtype).transpose(2, 3)
    expect(r"q must have a contiguous last dim \(stride 1\), got stride 4", q_t, k, v)


def test_batch_mismatch():
    q, k, v = qkv()
    expect(r"k has batch size 3 but q has 2", q, torch.randn(3, 8, 2, 32, dtype=q.dtype), v)


def test_non_finite_softmax_scale():
    q, k, v = qkv()
    expect(r"softmax_scale must be a finite number", q, k, v, softmax_scale=float("nan"))


def test_fake_applies_the_cuda_rules():
    # Fake CUDA tensors need no GPU. The op's own errors for these inputs are pinned by
    # test_forward_gpu.py's test_bad_input_cuda_rules.
    with FakeTensorMode():
        q, k, v = (torch.randn(1, 8, 2, 64, dtype=torch.float16, device="cuda") for _ in range(3))
        out, lse = FORWARD(q, k, v, None, False, False)
        assert out.device == q.device and lse.dtype == torch.float32
        with pytest.raises(RuntimeError, match=r"k is on cpu but q is on cuda:0"):
            FORWARD(q, torch.randn(1, 8, 2, 64, dtype=torch.float16), v, None, False, False)
        with pytest.raises(RuntimeError, match=r"q has dtype float32; expected float16 or bfloat16 "
                                               r"\(or float8_e4m3fn/float8_e5m2\)$"):
            FORWARD(q.float(), k.float(), v.float(), None, False, False)


def test_arch_rule_cubins_then_newer_gpus_on_ptx_then_refusal():
    # The rule the CUDA op applies (exported by the library, so this runs without a GPU):
    # the exact arch's cubins, else an older minor's of the same major, else (a GPU newer than
    # every cubin) the newest older arch's PTX, else nothing.
    built = sorted({e["arch"] for e in fattn.build_info()["kernels"] if e["kernel"] == "attn_fwd"})
    assert built, "the library holds no forward kernels"
    for arch in built:
        assert pick_arch("attn_fwd", arch // 10, arch % 10) == arch
    assert pick_arch("attn_fwd", 7, 0) is None       # Volta: older than anything built
    assert pick_arch("attn_fwd", 12, 0) is None      # no same-major cubin
    assert pick_path("attn_fwd", 7, 0) is None       # and no PTX can run on an older GPU
    # A GPU newer than every cubin takes the PTX of the newest arch below it whose PTX the build
    # embeds (FATTN_PTX_ARCHS), never sm_90's (sm_90a features).
    with_ptx = {e["arch"] for e in fattn.build_info()["kernels"] if e["kernel"] == "attn_fwd" and e["ptx_size"]}
    newest = max(with_ptx - {90}) if with_ptx - {90} else None
    assert pick_path("attn_fwd", 12, 0) == ((newest, True) if newest else None)
    if 90 in built:
        assert pick_path("attn_fwd", 9, 0) == (90, False)
    if 80 in built and 86 not in built:
        assert pick_arch("attn_fwd", 8, 6) == 80     # an sm_80 cubin runs on 8.6
    if 90 in built:
        assert pick_arch("attn_fwd", 9, 1) is None or 91 in built  # sm_90a code runs on 9.0 only
    # A variant the serving arch lacks comes from the next older arch of its major (sm_89 holds
    # only the FP8 variants beside sm_86: configs.json served_by), never from sm_90.
    for arch in built:
        older = max((a for a in built if a // 10 == arch // 10 and a < arch and a != 90), default=None)
        assert serving_archs("attn_fwd", arch // 10, arch % 10) == (arch, False, older)
    assert serving_archs("attn_fwd", 7, 0) is None
