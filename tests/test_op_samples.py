"""Every op on its sample inputs (tests/helpers/samples.py), on the CPU and, where there is
one, a GPU: torch.library.opcheck, the fake against the real op, and the forward's
gradients (finite differences in float64 on the CPU, float64 autograd of the reference
with the 2x rule on a GPU)."""

from contextlib import contextmanager

import pytest
import torch
from torch.autograd import gradcheck

from fattn.reference import attention_reference
from helpers import (
    FORWARD, OPS, SAMPLE_INPUTS, call_with_fakes, check_gradients, device_dtype_params, expected_lse_dtype,
    forward_samples, grads_of, reference_variant, requires_gpu,
)

OP_NAMES = list(SAMPLE_INPUTS)
HALF = [torch.float16, torch.bfloat16]
# The merge also takes float32 partials on CUDA; the other ops' kernels are half precision only.
CUDA_DTYPES = {op: HALF + ([torch.float32] if op == "merge" else []) for op in OP_NAMES}


@contextmanager
def sample_named(sample):
    try:
        yield
    except Exception as error:
        raise AssertionError(f"sample {sample.name!r}: {error}") from error


def _params(cpu_dtypes):
    return [pytest.param(op, *p.values, marks=p.marks, id=f"{op}-{p.id}")
            for op in OP_NAMES for p in device_dtype_params(cpu_dtypes, CUDA_DTYPES[op])]


# opcheck's test_schema compares every argument before and after the call with torch.allclose,
# which torch 2.13 does not implement for float8 tensors on the CPU; the decode schema's mutation
# declarations are the same for FP8 caches and are checked by the 16-bit samples.
ALL_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _opcheck_utils(sample):
    fp8 = any(isinstance(a, torch.Tensor) and a.dtype in FP8 for a in sample.args)
    return tuple(u for u in ALL_UTILS if not (fp8 and u == "test_schema"))


# On the CPU in float32 alone: what opcheck checks (the schema's mutations, the autograd
# registration, fake tensors, dynamic-shape tracing) does not depend on the float dtype, and a
# float64 pass doubled the fast tier's costliest tests; float64 outputs against their fakes are
# test_fake_matches_real's, float64 values the CPU reference tests'.
@pytest.mark.parametrize("op,device,dtype", _params([torch.float32]))
def test_opcheck(op, device, dtype):
    for sample in SAMPLE_INPUTS[op](device, dtype):
        with sample_named(sample):
            torch.library.opcheck(OPS[op], sample.args, test_utils=_opcheck_utils(sample))
    if op in ("forward", "varlen_forward"):  # again with gradients: the registered autograd, traced and eager
        for sample in SAMPLE_INPUTS[op](device, dtype, requires_grad=True):
            with sample_named(sample):
                torch.library.opcheck(OPS[op], sample.args)


@pytest.mark.parametrize("op,device,dtype", _params([torch.float16, torch.bfloat16, torch.float32, torch.float64]))
def test_fake_matches_real(op, device, dtype):
    for sample in SAMPLE_INPUTS[op](device, dtype):
        with sample_named(sample):
            fakes = call_with_fakes(OPS[op], sample.args)
            reals = OPS[op](*sample.args)
            assert len(fakes) == len(reals)
            for i, (fake, real) in enumerate(zip(fakes, reals)):
                assert (fake.shape, fake.stride(), fake.dtype, fake.device) == (
                    real.shape, real.stride(), real.dtype, real.device), f"output {i}"
            if not op.endswith("backward"):
                assert reals[1].dtype == expected_lse_dtype(dtype), "lse dtype"


def _finite_lse(*options):
    def f(q, k, v):
        out, lse = FORWARD(q, k, v, *options)
        # Rows that see no key have lse = -inf; finite differences there are NaN.
        return out, torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return f


def test_forward_cpu_matches_the_python_reference():
    """The C++ float64 implementation and fattn.reference are written independently: every
    sample (windows, softcap, ALiBi included) must agree between them, out and lse."""
    for sample in forward_samples("cpu", torch.float64):
        q, k, v, softmax_scale, causal, *options = sample.args
        with sample_named(sample):
            out, lse = FORWARD(*sample.args)
            want_out, want_lse = attention_reference(q, k, v, softmax_scale, causal, **reference_variant(sample.args))
            torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


# Samples of more inputs than this are checked one input at a time on a random projection of the
# Jacobian (gradcheck's fast_mode) instead of every column: the full check of the largest sample
# (23040 inputs, two forward calls each) took three minutes of CPU time. One input at a time and
# with a tighter atol than the full check's per-entry 1e-6, so that neither a projection dv
# dominates nor a small one hides a wrong dq or dk: each of dq, dk, dv scaled by 1.01 fails.
FULL_GRADCHECK_INPUTS = 4096


def _gradcheck_each_input_fast(fn, inputs):
    for i in range(len(inputs)):
        def one(x, i=i):
            return fn(*inputs[:i], x, *inputs[i + 1:])
        assert gradcheck(one, (inputs[i],), eps=1e-6, atol=1e-9, fast_mode=True), f"input {i}"
    return True


@pytest.mark.slow  # the slow tier (-m slow): gradcheck of every forward sample, about 25 s
def test_forward_gradcheck_cpu():
    # Gradients into both outputs: lse's gradient (dlse) reaches q and k.
    for sample in forward_samples("cpu", torch.float64, requires_grad=True):
        q, k, v, *options = sample.args
        with sample_named(sample):
            if q.numel() + k.numel() + v.numel() > FULL_GRADCHECK_INPUTS:
                assert _gradcheck_each_input_fast(_finite_lse(*options), (q, k, v))
            else:
                assert gradcheck(_finite_lse(*options), (q, k, v), eps=1e-6, atol=1e-6)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
def test_forward_gradients_cuda(dtype):
    for sample in forward_samples("cuda", dtype):
        q, k, v, softmax_scale, causal, *options = sample.args
        variant = reference_variant(sample.args)
        with sample_named(sample):
            ref_lse = attention_reference(q, k, v, softmax_scale, causal, **variant)[1]
            w_out = torch.randn(q.shape, device="cuda")
            # lse of rows that see no key is -inf: weight them 0 so the loss stays finite.
            w_lse = torch.randn(ref_lse.shape, device="cuda").masked_fill(torch.isinf(ref_lse), 0)
            got = grads_of(lambda q, k, v: FORWARD(q, k, v, softmax_scale, causal, *options), q, k, v, w_out, w_lse)
            ref = grads_of(lambda q, k, v: attention_reference(q, k, v, softmax_scale, causal, **variant), q.double(),
                           k.double(), v.double(), w_out.double(), w_lse.double())
            low = grads_of(lambda q, k, v: attention_reference(q, k, v, softmax_scale, causal, dtype=dtype, **variant),
                           q, k, v, w_out, w_lse)
            check_gradients(got, ref, low, dtype, what=sample.name)
