"""fattn.quantize_fp8 on the CPU: the FP8 tensor and its [batch, heads] descale reconstruct the
input within the FP8 dtype's rounding (half a unit in the last place of its mantissa, or half its
smallest subnormal step, times the group's scale), each group's largest magnitude lands on the
dtype's largest finite value, groups of zeros keep scale 1, and bad input raises naming what is
wrong."""

import pytest
import torch

import fattn

# (mantissa bits, smallest subnormal step) of each FP8 dtype.
FORMATS = {torch.float8_e4m3fn: (3, 2.0**-9), torch.float8_e5m2: (2, 2.0**-16)}


def _inputs(seed, shape=(2, 113, 3, 72), dtype=torch.bfloat16):
    torch.manual_seed(seed)
    x = torch.randn(shape) * torch.logspace(-3, 2, shape[2])[None, None, :, None]  # heads of different ranges
    return x.to(dtype)


@pytest.mark.parametrize("granularity", ["tensor", "head"])
@pytest.mark.parametrize("fp8", list(FORMATS), ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_round_trip_within_the_format_rounding(dtype, fp8, granularity):
    x = _inputs(7, dtype=dtype)
    q, descale = fattn.quantize_fp8(x, fp8, granularity)
    assert q.dtype == fp8 and q.shape == x.shape and q.is_contiguous()
    assert descale.dtype == torch.float32 and descale.shape == (2, 3) and descale.is_contiguous()
    xf = x.double()
    scale = descale.double()[:, None, :, None]
    mantissa, step = FORMATS[fp8]
    err = (q.double() * scale - xf).abs()
    bound = 2.0 ** -(mantissa + 1) * xf.abs() + step / 2 * scale
    assert bool((err <= bound * (1 + 1e-6)).all()), (err - bound).max()
    amax = xf.abs().amax(dim=(1, 3)) if granularity == "head" else xf.abs().amax().expand(2, 3)
    assert torch.allclose(descale.double(), amax / torch.finfo(fp8).max, rtol=1e-6)
    # Each group's largest magnitude is the dtype's largest finite value: nothing saturates,
    # nothing is left unused at the top.
    top = q.float().abs().amax(dim=(1, 3))
    if granularity == "head":
        assert bool((top == torch.finfo(fp8).max).all()), top
    else:
        assert top.max() == torch.finfo(fp8).max and bool(torch.all(descale == descale[0, 0]))


def test_per_head_scales_keep_small_heads_precise():
    # Heads four orders of magnitude apart: one scale for the tensor flushes the small head to
    # subnormals (or zero), one per head keeps it to the format's relative precision.
    x = _inputs(3, dtype=torch.float32)
    small = x[:, :, 0].double()
    errors = {}
    for granularity in ("tensor", "head"):
        q, descale = fattn.quantize_fp8(x, torch.float8_e4m3fn, granularity)
        back = q.double() * descale.double()[:, None, :, None]
        errors[granularity] = ((back[:, :, 0] - small).abs().max() / small.abs().max()).item()
    assert errors["head"] <= 2.0**-4 < errors["tensor"], errors


def test_zero_groups_and_empty_tensors():
    x = _inputs(5)
    x[1, :, 2] = 0
    q, descale = fattn.quantize_fp8(x, torch.float8_e4m3fn, "head")
    assert descale[1, 2] == 1 and bool((q[1, :, 2].float() == 0).all())
    q, descale = fattn.quantize_fp8(torch.zeros(2, 5, 3, 8), torch.float8_e5m2, "tensor")
    assert bool((descale == 1).all()) and bool((q.float() == 0).all())
    q, descale = fattn.quantize_fp8(torch.zeros(2, 0, 3, 8, dtype=torch.bfloat16), granularity="head")
    assert q.shape == (2, 0, 3, 8) and q.dtype == torch.float8_e4m3fn and bool((descale == 1).all())


@pytest.mark.parametrize("case,match", [
    ("rank", r"x must be a 4-D tensor \[batch, seqlen, heads, head_dim\], got shape \[2, 113, 3\]"),
    ("int", r"x has dtype int32; expected float16, bfloat16 or float32"),
    ("float64", r"x has dtype float64; expected float16, bfloat16 or float32"),
    ("dtype", r"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got torch.float16"),
    ("granularity", r"granularity must be \"tensor\" or \"head\", got 'row'"),
    ("inf", r"x has values that are not finite"),
    ("nan", r"x has values that are not finite"),
    ("not a tensor", r"x must be a tensor, got list"),
])
def test_bad_input_names_what_is_wrong(case, match):
    x = _inputs(1)
    kwargs = {}
    if case == "rank":
        x = x[:, :, :, 0]
    elif case == "int":
        x = x.to(torch.int32)
    elif case == "float64":
        x = x.double()
    elif case == "dtype":
        kwargs["dtype"] = torch.float16
    elif case == "granularity":
        kwargs["granularity"] = "row"
    elif case in ("inf", "nan"):
        x[1, 7, 2, 5] = float(case)
    elif case == "not a tensor":
        x = [1.0]
    with pytest.raises(RuntimeError, match=r"^fattn.quantize_fp8: " + match):
        fattn.quantize_fp8(x, **kwargs)
