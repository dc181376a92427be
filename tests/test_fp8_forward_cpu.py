"""The FP8 forward on the CPU: the op's float64 definition (csrc/attention/forward_cpu.cpp) against
the Python reference written apart from it (fattn.reference, fp8_probabilities), the fakes and
opcheck on FP8 samples, the public functions' FP8 arguments, and every bad-input rule."""

import inspect

import pytest
import torch

import fattn
from fattn.reference import attention_reference
from helpers import FORWARD, VARLEN_FORWARD, call_with_fakes, check_fake_raises_like_op
from helpers.fp8 import FP8_DTYPES, dequantize, fp8_qkv

# name, (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim), causal, variant keywords, q_descale per
CASES = [
    ("gqa2", (2, 9, 13, 4, 2, 16), False, {}, "kv"),
    ("gqa2-causal-q-descale-per-head", (2, 13, 9, 4, 2, 16), True, {}, "q"),
    ("mqa-window-softcap", (1, 17, 17, 3, 1, 32), False, dict(window_size=(4, 2), softcap=1.5), "kv"),
    ("alibi-sinks-causal", (2, 7, 11, 2, 2, 8), True, dict(alibi_slopes="heads", sinks=True), "q"),
    ("rows-without-keys", (1, 12, 5, 2, 2, 8), False, dict(window_size=(0, 0)), "kv"),
]


def _variant(variant, heads):
    out = dict(variant)
    if out.get("alibi_slopes") == "heads":
        out["alibi_slopes"] = torch.rand(heads) * 0.5
    if out.get("sinks"):
        out["sinks"] = torch.randn(heads)
    return out


def _op_args(q, k, v, qd, kd, vd, causal, variant):
    """fattn::forward's positional arguments for an FP8 call."""
    window = variant.get("window_size", (-1, -1))
    return (q, k, v, None, causal, False, window[0], window[1], variant.get("softcap", 0.0),
            variant.get("alibi_slopes"), None, None, variant.get("sinks"), None, 0.0, None, 0, qd, kd, vd)


@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_cpu_op_matches_the_python_reference(case, fp8):
    name, shape, causal, variant, q_heads = case
    q, k, v, qd, kd, vd = fp8_qkv(*shape, fp8, "cpu", q_descale_heads=q_heads, seed=len(name))
    variant = _variant(variant, shape[3])
    out, lse = FORWARD(*_op_args(q, k, v, qd, kd, vd, causal, variant))
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    want, want_lse = attention_reference(dequantize(q, qd), dequantize(k, kd), dequantize(v, vd), None, causal,
                                         fp8_probabilities=True, **variant)
    # out is bfloat16: the two float64 computations may round a last bit apart before the cast.
    torch.testing.assert_close(out.double(), want.to(torch.bfloat16).double(), rtol=2**-7, atol=1e-6)
    torch.testing.assert_close(lse.double(), want_lse.double(), rtol=1e-6, atol=1e-6)


def test_probabilities_are_rounded_to_e4m3():
    """Two keys whose probabilities e4m3 cannot tell apart from their rounded values: the op's out
    is the rounded weights' average, not the exact one (a test that the rounding happens)."""
    torch.manual_seed(0)
    d = 16
    q = torch.zeros(1, 1, 1, d)
    q[..., 0] = 1.0
    k = torch.zeros(1, 2, 1, d)
    k[0, 1, 0, 0] = -0.6875  # an e4m3 value: scores 0 and -0.6875 * scale, weights 1 and 0.8420...
    v = torch.zeros(1, 2, 1, d)
    v[0, 0, 0, :] = 1.0
    v[0, 1, 0, :] = -1.0
    args = [t.to(torch.float8_e4m3fn) for t in (q, k, v)]
    out, _ = FORWARD(*args)
    w = torch.exp(torch.tensor(-0.6875 * d**-0.5, dtype=torch.float64))
    rounded = (w * 256).to(torch.float8_e4m3fn).double() / 256
    exact = (1 - w) / (1 + w)
    emulated = (1 - rounded) / (1 + w)
    assert abs(emulated - exact) > 1e-3  # the case tells the two apart
    torch.testing.assert_close(out[0, 0, 0].double(), emulated.to(torch.bfloat16).double().expand(d))


@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=str)
def test_varlen_matches_each_sequence_alone(fp8):
    lens_q, lens_k, heads, kv_heads, d = [5, 1, 9], [7, 3, 4], 4, 2, 16
    pieces = [fp8_qkv(1, sq, sk, heads, kv_heads, d, fp8, "cpu", seed=i) for i, (sq, sk) in
              enumerate(zip(lens_q, lens_k))]
    q = torch.cat([p[0][0] for p in pieces])
    k = torch.cat([p[1][0] for p in pieces])
    v = torch.cat([p[2][0] for p in pieces])
    qd, kd, vd = (torch.cat([p[i] for p in pieces]) for i in (3, 4, 5))
    cu_q = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 10, 14], dtype=torch.int32)
    out, lse = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 7, causal=True, return_lse=True,
                                            q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16
    for b, p in enumerate(pieces):
        want, want_lse = fattn.flash_attn_func(*p[:3], causal=True, return_lse=True, q_descale=p[3], k_descale=p[4],
                                               v_descale=p[5])
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        torch.testing.assert_close(out[rows], want[0])
        torch.testing.assert_close(lse[:, rows], want_lse[0])


def test_missing_descales_stand_for_one():
    q, k, v, *_ = fp8_qkv(1, 6, 6, 2, 2, 16, torch.float8_e4m3fn, "cpu")
    ones = torch.ones(1, 2)
    torch.testing.assert_close(fattn.flash_attn_func(q, k, v), fattn.flash_attn_func(q, k, v, q_descale=ones,
                                                                                      k_descale=ones, v_descale=ones))


def test_head_dim_not_a_multiple_of_8_is_padded():
    q, k, v, qd, kd, vd = fp8_qkv(1, 7, 9, 2, 1, 20, torch.float8_e4m3fn, "cpu", layout="strided")
    out = fattn.flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    want, _ = attention_reference(dequantize(q, qd), dequantize(k, kd), dequantize(v, vd), None, True,
                                  fp8_probabilities=True)
    assert out.shape == (1, 7, 2, 20)
    torch.testing.assert_close(out.double(), want.to(torch.bfloat16).double(), rtol=2**-7, atol=1e-6)


def test_public_signatures_keep_flash_attn_order():
    """The descales are keyword-only extras: flash-attn 2.8's positional parameters are unchanged."""
    for fn in (fattn.flash_attn_func, fattn.flash_attn_varlen_func):
        params = inspect.signature(fn).parameters
        for name in ("q_descale", "k_descale", "v_descale"):
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default is None


def _samples():
    for fp8 in FP8_DTYPES:
        for name, shape, causal, variant, q_heads in CASES:
            q, k, v, qd, kd, vd = fp8_qkv(*shape, fp8, "cpu", q_descale_heads=q_heads)
            yield f"{name}-{fp8}", _op_args(q, k, v, qd, kd, vd, causal, _variant(variant, shape[3]))
        q, k, v, *_ = fp8_qkv(1, 5, 5, 2, 2, 16, fp8, "cpu", layout="strided")
        yield f"strided-no-descales-{fp8}", (q, k, v)


# opcheck's schema test compares tensors with arithmetic torch's CPU kernels lack for float8
# ("mul_cpu_reduced_float"): the other tests run, and _unchanged checks what it would (no input written).
OPCHECKS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _unchanged(op, args):
    before = [a.clone() for a in args if isinstance(a, torch.Tensor)]
    out = op(*args)
    after = [a for a in args if isinstance(a, torch.Tensor)]
    for b, a in zip(before, after):
        assert torch.equal(b.view(torch.uint8) if b.element_size() == 1 else b,
                           a.view(torch.uint8) if a.element_size() == 1 else a), "an input changed"
    return out


@pytest.mark.parametrize("name,args", list(_samples()), ids=lambda x: x if isinstance(x, str) else "")
def test_opcheck_and_fake(name, args):
    torch.library.opcheck(FORWARD, args, test_utils=OPCHECKS)
    fakes, reals = call_with_fakes(FORWARD, args), _unchanged(FORWARD, args)
    for fake, real in zip(fakes, reals):
        assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype)


def test_varlen_opcheck_and_fake():
    q, k, v, qd, kd, vd = fp8_qkv(1, 12, 12, 4, 2, 16, torch.float8_e5m2, "cpu")
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    args = (q[0], k[0], v[0], cu, cu, 7, 7, None, None, True, False, -1, -1, 0.0, None, None, 0.0, None,
            qd[:, :2].expand(2, 2).contiguous(), kd.expand(2, 2).contiguous(), vd.expand(2, 2).contiguous())
    torch.library.opcheck(VARLEN_FORWARD, args, test_utils=OPCHECKS)
    fake, real = call_with_fakes(VARLEN_FORWARD, args)[0], _unchanged(VARLEN_FORWARD, args)[0]
    assert (fake.shape, fake.dtype) == (real.shape, real.dtype) == (q[0].shape, torch.bfloat16)


# ---------------------------------------------------------------- bad input

def _fp8_call(**overrides):
    q, k, v, qd, kd, vd = fp8_qkv(2, 5, 7, 4, 2, 16, torch.float8_e4m3fn, "cpu")
    args = dict(q=q, k=k, v=v, qd=qd, kd=kd, vd=vd)
    args.update(overrides)
    return args


def _args(a, bias=None, dropout=(0.0, None), segments=(None, None)):
    return (a["q"], a["k"], a["v"], None, False, False, -1, -1, 0.0, None, segments[0], segments[1], None, bias,
            dropout[0], dropout[1], 0, a["qd"], a["kd"], a["vd"])


@pytest.mark.parametrize("overrides,match", [
    (dict(kd=torch.ones(2, 3)), r"k_descale has shape \[2, 3\]; expected \[batch, kv_heads\] = \[2, 2\]"),
    (dict(qd=torch.ones(2, 3)), r"q_descale has shape \[2, 3\]; expected \[batch, kv_heads\] = \[2, 2\] or "
                                r"\[batch, heads\] = \[2, 4\]"),
    (dict(vd=torch.ones(2, 2, dtype=torch.float64)), "v_descale has dtype float64; expected float32"),
    (dict(vd=torch.ones(1, 2)), r"v_descale has shape \[1, 2\]"),
    (dict(v=torch.zeros(2, 7, 2, 16, dtype=torch.float8_e5m2)), "v has dtype float8_e5m2 but q has float8_e4m3fn"),
    (dict(q=torch.zeros(2, 5, 4, 16, dtype=torch.bfloat16)), "q_descale is given but q has dtype bfloat16"),
])
def test_bad_fp8_arguments(overrides, match):
    a = _fp8_call(**overrides)
    if a["q"].dtype == torch.bfloat16:
        a.update(k=a["k"].to(torch.bfloat16), v=a["v"].to(torch.bfloat16))
    check_fake_raises_like_op(FORWARD, _args(a), match=match)


def test_fp8_takes_no_bias_dropout_or_segments():
    a = _fp8_call()
    check_fake_raises_like_op(FORWARD, _args(a, bias=torch.zeros(2, 4, 5, 7, dtype=torch.float8_e4m3fn)),
                              match="float8 q, k and v take no bias")
    check_fake_raises_like_op(FORWARD, _args(a, dropout=(0.1, torch.tensor([1], dtype=torch.int64))),
                              match="take no dropout")
    ids = torch.zeros(2, 5, dtype=torch.int32), torch.zeros(2, 7, dtype=torch.int32)
    check_fake_raises_like_op(FORWARD, _args(a, segments=ids), match="take no segment ids")


def test_fp8_inputs_have_no_backward():
    a = _fp8_call()
    q = a["q"].detach().requires_grad_()
    with pytest.raises(RuntimeError, match="float8 q, k and v have no backward"):
        fattn.flash_attn_func(q, a["k"], a["v"])
    with torch.no_grad():
        fattn.flash_attn_func(q, a["k"], a["v"])  # inference under no_grad is fine
    sinks = torch.zeros(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="have no backward"):
        fattn.flash_attn_func(a["q"], a["k"], a["v"], sinks=sinks)
    out = torch.zeros(2, 5, 4, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="q has dtype float8_e4m3fn; expected float16 or bfloat16"):
        torch.ops.fattn.backward(out, a["q"], a["k"], a["v"], out, torch.zeros(2, 4, 5), None, None, False, False)


def test_varlen_block_table_refuses_fp8():
    q, k, v, qd, kd, vd = fp8_qkv(1, 16, 16, 2, 2, 16, torch.float8_e4m3fn, "cpu")
    cu = torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="not taken with block_table"):
        fattn.flash_attn_varlen_func(q[0], k, v, cu, cu, 16, 16, block_table=torch.zeros(1, 1, dtype=torch.int32),
                                     q_descale=qd)
