"""The one place for what the tests share; test modules import from here, never from
one another.

common: devices, random q/k/v, the contract's lse dtype, the accuracy rules;
kvcache: KV caches in every layout and decode's accuracy rule;
fp8_decode: decode over FP8 KV caches (cases, problems, the expected quantized append);
samples: one sample_inputs generator per op, and running an op on fake tensors;
library: the stable-ABI contract of a built libfattn.so, and the variants it holds;
compile: telling a recompile from a first compile under torch.compile;
interpreter: running a kernel script under Triton's interpreter;
profiled: which kernels a GPU call launched, with which grids and shared memory;
ring: the ring schedule's designed point-to-point traffic;
gloo: a check run on every rank of a CPU process group;
torchrun: a worker script run on several GPUs, one process per GPU.
"""

from .common import (
    HAS_GPU, check_accuracy, check_gradients, check_loss_gradients, check_variant_gradients, device_dtype_params,
    expected_lse_dtype, grads_of, loss_gradients, make_qkv, poison_allocator, requires_gpu,
)
from .compile import recompiles_forbidden
from .gloo import spawn_gloo
from .torchrun import run_on_gpus
from .interpreter import run_interpreted
from .ring import designed_p2p_ops
from .kvcache import (
    CACHE_LAYOUTS, CACHE_OPTION_CASES, KVCache, cache_option_case_id, check_outputs, new_tokens, references,
    rotated_keys, run_cache_option_case, run_decode, seqlens_tensor,
)
from .fp8_decode import FP8_CASES, Fp8Problem, fp8_case_id, fp8_problem, fp8_step, stored_tokens
from .fp8_decode import call as fp8_call
from .fp8_decode import references as fp8_references
from .library import check_stable_abi, hopper_variants, skip_without_ptx
from .paged_varlen import check_paged_varlen, paged_varlen_inputs
from .profiled import kernels_launched, kernels_launched_by_kernel, launch_args, launch_grids
from .samples import (
    BACKWARD, DECODE, FORWARD, MERGE, OPS, SAMPLE_INPUTS, Sample, backward_samples, call_with_fakes,
    check_fake_raises_like_op, decode_samples, forward_samples, fp8_decode_samples, fp8_kernels_on, merge_samples,
    reference_variant, VARLEN_BACKWARD,
    VARLEN_CASES, VARLEN_FORWARD, varlen_backward_samples, varlen_forward_samples, varlen_inputs,
)

__all__ = [
    "FP8_CASES", "Fp8Problem", "fp8_call", "fp8_case_id", "fp8_decode_samples", "fp8_kernels_on", "fp8_problem",
    "fp8_references", "fp8_step", "stored_tokens",
    "check_paged_varlen", "kernels_launched", "launch_grids", "paged_varlen_inputs",
    "BACKWARD", "CACHE_LAYOUTS", "CACHE_OPTION_CASES", "DECODE", "FORWARD", "HAS_GPU", "KVCache", "MERGE", "OPS",
    "SAMPLE_INPUTS", "Sample", "backward_samples", "call_with_fakes", "check_accuracy", "check_fake_raises_like_op",
    "check_gradients", "check_outputs", "check_stable_abi", "skip_without_ptx", "decode_samples", "device_dtype_params",
    "expected_lse_dtype", "forward_samples", "grads_of", "make_qkv", "merge_samples", "new_tokens",
    "poison_allocator", "recompiles_forbidden", "run_interpreted", "reference_variant", "references", "requires_gpu",
    "run_decode", "cache_option_case_id", "rotated_keys", "run_cache_option_case",
    "seqlens_tensor", "VARLEN_BACKWARD", "VARLEN_CASES", "VARLEN_FORWARD", "varlen_backward_samples",
    "varlen_forward_samples", "varlen_inputs",
]
