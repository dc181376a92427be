"""A Gluon kernel built ahead of time runs on Hopper (skipped elsewhere): the probe of
tests/helpers/gluon_probe.py (blocked loads, NVMMA shared memory, one wgmma) is compiled by
aot_build's compile_variant, its cubin loaded with the driver and launched with the kernels'
ABI (the runtime parameters, then Triton's global and profile scratch pointers), as the C++
runtime launches every kernel; C = A @ B must meet the 2x rule against float64."""

import ctypes

import pytest
import torch

from helpers import requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _check(result, what):
    assert result == 0, f"{what} failed: CUresult {result}"


@pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (the probe is sm_90 wgmma code)")
def test_gluon_cubin_from_the_build_runs_with_the_kernel_abi(tmp_path, monkeypatch):
    from helpers.gluon_probe import WARPS, build_probe

    artifact = build_probe(tmp_path, monkeypatch)

    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(64, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    c = torch.full((64, 64), float("nan"), device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()

    cuda = ctypes.CDLL("libcuda.so.1")
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    _check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(artifact.cubin)), "cuModuleLoadData")
    try:
        _check(cuda.cuModuleGetFunction(ctypes.byref(function), module, artifact.meta["name"].encode()),
               "cuModuleGetFunction")
        values = [ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()), ctypes.c_void_p(c.data_ptr()),
                  ctypes.c_int32(64), ctypes.c_int32(64), ctypes.c_int32(64),
                  ctypes.c_void_p(0), ctypes.c_void_p(0)]  # no global or profile scratch (sizes 0)
        assert artifact.meta["global_scratch_size"] == 0 and artifact.meta["profile_scratch_size"] == 0
        params = (ctypes.c_void_p * len(values))(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values))
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _check(cuda.cuLaunchKernel(function, 1, 1, 1, 32 * WARPS, 1, 1, artifact.meta["shared"], stream, params,
                                   None), "cuLaunchKernel")
        torch.cuda.synchronize()
    finally:
        cuda.cuModuleUnload(module)

    exact = a.double() @ b.double()
    torch_err = ((a @ b).double() - exact).abs().max().item()  # PyTorch's fp16 matmul
    err = (c.double() - exact).abs().max().item()
    assert err <= 2 * torch_err, f"probe error {err:.3e} > 2 x torch's fp16 error {torch_err:.3e}"
