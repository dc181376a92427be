"""What the attention variants cost, forward and backward: fattn against FlexAttention and
FlashAttention-4 (the peers with a fused sliding window and softcap) and against fattn's own plain
attention.

    python benchmarks/bench_variants.py --out benchmarks/results/variants_h100.json
    python benchmarks/bench_variants.py --device cpu --quick      # smoke run of every code path

The studies, on bf16, [batch, seq, heads, dim] for fattn and FlashAttention-4 ("fa4"),
[batch, heads, seq, dim] for Flex:
- window: at --window-seqlen tokens (batch 1), a bottom-right sliding window of each of
  --windows keys to the left (right edge 0, as causal) and full causal attention; time should
  grow with the window, not the sequence. FLOPs count the visible (query, key) pairs.
- score_mod: what each variant costs over plain attention, in one run at --mod-seqlen tokens,
  non-causal and causal: plain, softcap 30, ALiBi, both, sinks (one logit per head in the
  denominator), dropout 0.1, a sliding window of --mod-window keys (to the left; to the right
  too when not causal), segment ids (--segments documents per row), GQA (--gqa query heads per
  KV head), an additive bias [1, heads, s, s] (not differentiated) and that bias with dropout
  0.1. fattn's rows carry
  vs_plain (time over fattn's plain run of the same shape) and ratio_vs against Flex and fa4
  with the same modification (no Flex for sinks, dropout and the bias; fa4 has causal, the
  window, softcap, sinks and GQA, and its rows for ALiBi, dropout, segment ids and the bias say
  "unsupported") or SDPA's flash backend (dropout). Every row counts the plain problem's FLOPs,
  so its TFLOP/s compares as its time does.
  The window study times fa4 with the same window too. fa4 runs on sm_90 and sm_100 where
  flash-attn-4 is installed; elsewhere its rows have no time and say why (--no-fa4: no rows).
- varlen: a causal batch of --varlen-batch random lengths in 1..--varlen-max-seqlen (seeded),
  packed for flash_attn_varlen_func, against the padded equivalent: every sequence padded to
  the longest, run by fattn's dense call and by SDPA's flash and cuDNN backends (no padding
  mask: what a dense kernel computes at best; a mask would only add work). FLOPs count the
  real sequences' visible pairs, so the padded runs' TFLOP/s show the waste.
- bias: an additive bias [1, heads, s, s] and a boolean mask [batch, 1, s, s] at --bias-seqlen,
  against SDPA's memory-efficient and cuDNN backends given the same attn_mask and against
  fattn's plain run; the score_mod study also times dropout 0.1 (beside SDPA flash's dropout).
- head_dim: what padding costs a head dim that is not a multiple of 8 (the public functions pad
  q, k and v with zero columns): causal attention at each of --pad-head-dims against the same
  problem at the padded head dim, where no copy is needed; --tokens per step, 16 heads.
- bucket (not in the default --studies): head dims between powers of two, each of
  --bucket-head-dims causal and not, against the same problem zero-padded to the next power of
  two and SDPA flash and cuDNN at the head dim; --tokens per step at --mod-seqlen, 16 heads;
  with --bucket-softcap every call has that softcap (the softcap_alibi kernels) and SDPA is left out.
Hidden size --hidden over head dim --head-dim heads; --tokens per step for the score_mod study.
Timing as bench_attention.py's: --calls back-to-back calls per timed unit (the GPU's steady-state
time per call).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn.attention import sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (PeerUnavailable, Results, alibi_slopes, fa4_peer, fa4_unavailable, int_list,  # noqa: E402
                    print_table, require_device, sdpa_peers, short_error, time_ms)

import fattn  # noqa: E402


def visible_pairs(seqlen, left):
    """(query, key) pairs a bottom-right window (left, 0) shows on a square problem; left < 0: causal."""
    if left < 0 or left >= seqlen:
        return seqlen * (seqlen + 1) // 2
    return (left + 1) * seqlen - left * (left + 1) // 2


def timed(fn, direction, inputs):
    if direction == "forward":
        return lambda: fn(*inputs)
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


class Flex:
    """FlexAttention compiled once per mask/score_mod kind (shapes are static per study)."""

    def __init__(self, device):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        torch._dynamo.config.recompile_limit = 1024
        torch._dynamo.config.accumulated_recompile_limit = 4096
        self.create_block_mask = create_block_mask
        self.flex = torch.compile(flex_attention, dynamic=False)
        self.device = device

    def window(self, seqlen, left):
        def visible(b, h, qi, ki):
            return (qi >= ki) & ((qi - ki <= left) if left >= 0 else (qi >= 0))
        mask = self.create_block_mask(visible, None, None, seqlen, seqlen, device=self.device)
        return lambda qt, kt, vt: self.flex(qt, kt, vt, block_mask=mask)

    def masked(self, seqlen, visible, batch=None):
        """visible(qi, ki, b) -> bool: a block mask over (query, key), per batch row when `batch` is given."""
        mask = self.create_block_mask(lambda b, h, qi, ki: visible(qi, ki, b), batch, None, seqlen, seqlen,
                                      device=self.device)
        return lambda qt, kt, vt: self.flex(qt, kt, vt, block_mask=mask, enable_gqa=kt.shape[1] != qt.shape[1])

    def modified(self, seqlen, causal, softcap, slopes):
        def score_mod(score, b, h, qi, ki):
            if softcap:
                score = softcap * torch.tanh(score / softcap)
            if slopes is not None:
                score = score - slopes[h] * (qi - ki).abs()
            return score
        mask = None
        if causal:
            mask = self.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seqlen, seqlen,
                                          device=self.device)
        return lambda qt, kt, vt: self.flex(qt, kt, vt, score_mod=score_mod, block_mask=mask)


def measure(results, case, impls, direction, inputs, flops, reps, unsupported=None):
    """Times each of `impls` on its `inputs`; `unsupported` {impl: why} are peers that lack the
    case's modification, recorded with that reason and no time, so a missing peer reads as such."""
    for name, fn in impls.items():
        try:
            call = timed(fn, direction, inputs[name])
            ms, error = time_ms([call] * results.config["calls"], reps=reps, device=results.config["device"]), None
            del call
        except Exception as e:  # noqa: BLE001  (a peer without a kernel for this shape)
            ms, error = None, short_error(e)
            if not isinstance(e, PeerUnavailable):  # said once, when the run starts
                print(f"  {name} {case} failed: {error[:160]}", flush=True)
        results.add(case, name, ms, error, flops=flops)
    for name, why in (unsupported or {}).items():
        results.add(case, name, None, f"unsupported: {why}", flops=flops)


def window_study(results, args, flex, fa4, direction):
    d, s = args.head_dim, args.window_seqlen
    h = args.hidden // d
    q, k, v = (torch.randn(1, s, h, d, device=args.device, dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    for left in [*int_list(args.windows), -1]:
        case = {"study": "window", "pass": direction, "head_dim": d, "seqlen": s, "heads": h, "window_left": left}
        impls = {"fattn": lambda q, k, v, left=left: fattn.flash_attn_func(q, k, v, causal=True,
                                                                           window_size=(left, 0))}
        inputs = {"fattn": (q, k, v)}
        if flex:
            impls["flex"] = flex.window(s, left)
            inputs["flex"] = (qt, kt, vt)
        if fa4:  # FA4 reads a negative left edge as no window only when both edges are: say none
            window = (None, None) if left < 0 else (left, 0)
            impls["fa4"] = lambda q, k, v, window=window: fa4(q, k, v, causal=True, window_size=window)
            inputs["fa4"] = (q, k, v)
        flops = 4 * h * visible_pairs(s, left) * d * (2.5 if direction == "backward" else 1)
        measure(results, case, impls, direction, inputs, flops, args.reps)
        results.compare(case, peers=["flex", "fa4"])
        results.write(args.out)


def score_mod_variants(args, causal, b, h, s):
    """The score_mod study's rows: name -> (fattn's keyword arguments, the Flex peer's kind or None).
    The "gqa" keyword is the study's own: k and v with h / gqa heads. fa4_options says which of them
    FlashAttention-4 has."""
    device, left, slopes = args.device, args.mod_window, alibi_slopes(h, args.device)
    # Documents of equal length packed into each row, the same cut for q and k.
    docs = (torch.arange(s, device=device) * args.segments // s).to(torch.int32).expand(b, s).contiguous()
    return {
        "plain": (dict(), "modified"),
        "softcap": (dict(softcap=30.0), "modified"),
        "alibi": (dict(alibi_slopes=slopes), "modified"),
        "softcap+alibi": (dict(softcap=30.0, alibi_slopes=slopes), "modified"),
        "sinks": (dict(sinks=torch.randn(h, device=device)), None),  # Flex has no sink term
        "dropout0.1": (dict(dropout_p=0.1), None),  # nor dropout: SDPA flash is the peer
        f"window{left}": (dict(window_size=(left, 0 if causal else left)), "window"),
        f"segments{args.segments}": (dict(q_segment_ids=docs, kv_segment_ids=docs), "segments"),
        f"gqa{args.gqa}": (dict(gqa=args.gqa), "gqa"),
        "bias": (dict(bias=torch.randn(1, h, s, s, device=device, dtype=torch.bfloat16)), None),
        "bias+dropout0.1": (dict(bias=torch.randn(1, h, s, s, device=device, dtype=torch.bfloat16), dropout_p=0.1),
                            None),
    }


# fattn's keyword -> FlashAttention-4's (flash-attn-4 4.0.0b36's flash_attn_func); what is not here it
# lacks: no ALiBi slopes, dropout, segment ids or additive bias (only a CuTe DSL score_mod / mask_mod
# one would write for it, which is not the library's own variant).
FA4_KEYWORDS = {"softcap": "softcap", "window_size": "window_size", "sinks": "learnable_sink"}


def fa4_options(options):
    """FlashAttention-4's keyword arguments for fattn's `options` (GQA popped), or (None, what it
    lacks). Its sinks are fattn's: one natural-log logit per head in the denominator, no value."""
    lacking = [key for key in options if key not in FA4_KEYWORDS]
    if lacking:
        return None, f"flash-attn-4 has no {', '.join(lacking)}"
    return {FA4_KEYWORDS[key]: value for key, value in options.items()}, None


def _flex_peer(flex, kind, s, causal, options):
    """The Flex call with the same modification as fattn's `options`."""
    after = (lambda qi, ki: qi >= ki) if causal else (lambda qi, ki: qi >= 0)
    if kind == "modified":
        return flex.modified(s, causal, options.get("softcap", 0.0), options.get("alibi_slopes"))
    if kind == "window":
        left, right = options["window_size"]
        return flex.masked(s, lambda qi, ki, b: (ki >= qi - left) & (ki <= qi + right))
    if kind == "segments":
        docs = options["q_segment_ids"]
        return flex.masked(s, lambda qi, ki, b: (docs[b, qi] == docs[b, ki]) & after(qi, ki), batch=docs.shape[0])
    return flex.masked(s, lambda qi, ki, b: after(qi, ki))  # gqa: plain attention, fewer KV heads


def score_mod_study(results, args, flex, fa4, direction):
    d, s = args.head_dim, args.mod_seqlen
    h, b = args.hidden // d, max(1, args.tokens // args.mod_seqlen)
    q, k, v = (torch.randn(b, s, h, d, device=args.device, dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    for causal in (False, True):
        plain_case = None
        mods = score_mod_variants(args, causal, b, h, s)
        chosen = ["plain", *(m for m in mods if m != "plain")] if args.mods is None else ["plain", *args.mods.split(",")]
        unknown = [m for m in chosen if m not in mods]
        if unknown:
            raise SystemExit(f"--mods: unknown {unknown}; the study has {list(mods)}")
        for mod in dict.fromkeys(chosen):
            options, flex_kind = mods[mod]
            case = {"study": "score_mod", "pass": direction, "head_dim": d, "seqlen": s, "batch": b, "heads": h,
                    "causal": causal, "mod": mod}
            options = dict(options)
            group = options.pop("gqa", 1)
            kv = (k, v) if group == 1 else tuple(t[:, :, :h // group].contiguous() for t in (k, v))
            impls = {"fattn": lambda q, k, v, c=causal, o=options: fattn.flash_attn_func(q, k, v, causal=c, **o)}
            inputs = {"fattn": (q, *kv)}
            if flex and flex_kind:
                impls["flex"] = _flex_peer(flex, flex_kind, s, causal, options)
                inputs["flex"] = (qt, *(t.transpose(1, 2).contiguous() for t in kv))
            unsupported = {}
            if fa4:
                fa4_kw, lacking = fa4_options(options)
                if lacking:
                    unsupported["fa4"] = lacking
                else:
                    impls["fa4"] = lambda q, k, v, c=causal, o=fa4_kw: fa4(q, k, v, causal=c, **o)
                    inputs["fa4"] = (q, *kv)
            p = options.get("dropout_p", 0.0)
            if p > 0:  # SDPA's flash backend drops out too (its own generator)
                for name, backend in sdpa_peers(args.device).items():
                    impls[name] = lambda q, k, v, c=causal, p=p, backend=backend: _sdpa(q, k, v, backend, c, None, p)
                    inputs[name] = (qt, kt, vt)
            flops = 4 * b * h * s * s * d / (2 if causal else 1) * (2.5 if direction == "backward" else 1)
            measure(results, case, impls, direction, inputs, flops, args.reps, unsupported)
            if plain_case is None:
                plain_case = case
            else:  # the cost of the modification over fattn's own plain attention
                plain_ms = results.case_rows(plain_case)[0]["ms"]
                row = results.case_rows(case)[0]
                if plain_ms and row["ms"]:
                    row["vs_plain"] = row["ms"] / plain_ms
            results.compare(case, peers=["flex", "fa4", *sdpa_peers(args.device)])
            results.write(args.out)


def _sdpa(q, k, v, backend, causal, mask, dropout_p=0.0):
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                                is_causal=causal)


BIAS_PEERS = {"sdpa_efficient": "EFFICIENT_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}


def bias_study(results, args, direction):
    """An additive bias [1, heads, s, s] (bf16, differentiable in the backward) and a boolean mask
    [batch, 1, s, s] at --bias-seqlen: fattn against SDPA's memory-efficient and cuDNN backends
    given the same attn_mask, and against fattn's plain run."""
    from torch.nn.attention import SDPBackend

    d, s = args.head_dim, args.bias_seqlen
    h, b = args.hidden // d, max(1, args.tokens // s)
    q, k, v = (torch.randn(b, s, h, d, device=args.device, dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    bias = torch.randn(1, h, s, s, device=args.device, dtype=torch.bfloat16)
    mask = torch.rand(b, 1, s, s, device=args.device) > 0.2
    peers = {name: getattr(SDPBackend, backend) for name, backend in BIAS_PEERS.items()} \
        if args.device == "cuda" else sdpa_peers(args.device)
    plain_case = {"study": "bias", "pass": direction, "head_dim": d, "seqlen": s, "batch": b, "heads": h,
                  "bias": "none"}
    measure(results, plain_case, {"fattn": lambda q, k, v: fattn.flash_attn_func(q, k, v)}, direction,
            {"fattn": (q, k, v)}, 4 * b * h * s * s * d * (2.5 if direction == "backward" else 1), args.reps)
    for kind, tensor in (("bias-1hqk", bias), ("mask-b1qk", mask)):
        case = dict(plain_case, bias=kind)
        differentiable = direction == "backward" and tensor.is_floating_point()
        impls = {"fattn": lambda q, k, v, *b: fattn.flash_attn_func(q, k, v, bias=b[0] if b else tensor)}
        inputs = {"fattn": (q, k, v, tensor) if differentiable else (q, k, v)}
        for name, backend in peers.items():
            impls[name] = lambda q, k, v, *b, backend=backend: _sdpa(q, k, v, backend, False, b[0] if b else tensor)
            inputs[name] = (qt, kt, vt, tensor) if differentiable else (qt, kt, vt)
        measure(results, case, impls, direction, inputs, 4 * b * h * s * s * d * (2.5 if direction == "backward" else 1),
                args.reps)
        plain_ms, row = results.case_rows(plain_case)[0]["ms"], results.case_rows(case)[0]
        if plain_ms and row["ms"]:
            row["vs_plain"] = row["ms"] / plain_ms
        results.compare(case, peers=list(peers))
        results.write(args.out)


def varlen_study(results, args, direction):
    d, h, b = args.head_dim, args.hidden // args.head_dim, args.varlen_batch
    gen = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(1, args.varlen_max_seqlen + 1, (b,), generator=gen)
    longest, total = int(lengths.max()), int(lengths.sum())
    cu = torch.zeros(b + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    cu = cu.to(args.device)
    q, k, v = (torch.randn(total, h, d, device=args.device, dtype=torch.bfloat16) for _ in range(3))
    padded = []
    for packed in (q, k, v):  # [b, longest, h, d], zeros past each sequence's end
        t = packed.new_zeros(b, longest, h, d)
        for i in range(b):
            t[i, :lengths[i]] = packed[cu[i]:cu[i + 1]]
        padded.append(t)
    qp, kp, vp = padded
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in padded)
    case = {"study": "varlen", "pass": direction, "head_dim": d, "heads": h, "batch": b, "causal": True,
            "max_seqlen": longest, "total_tokens": total, "lengths": lengths.tolist()}
    impls = {"fattn-varlen": lambda q, k, v: fattn.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest,
                                                                           causal=True),
             "fattn-padded": lambda q, k, v: fattn.flash_attn_func(q, k, v, causal=True)}
    inputs = {"fattn-varlen": (q, k, v), "fattn-padded": (qp, kp, vp)}
    for name, backend in sdpa_peers(args.device).items():
        def sdpa(q, k, v, backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        impls[name + "-padded"], inputs[name + "-padded"] = sdpa, (qt, kt, vt)
    flops = sum(4 * h * n * (n + 1) // 2 * d for n in lengths.tolist()) * (2.5 if direction == "backward" else 1)
    measure(results, case, impls, direction, inputs, flops, args.reps)
    results.compare(case, peers=[name for name in impls if name != "fattn-varlen"], ours=["fattn-varlen"])
    results.write(args.out)


def head_dim_study(results, args, direction):
    s, h = args.mod_seqlen, 16
    b = max(1, args.tokens // s)
    for d in int_list(args.pad_head_dims):
        padded = d + (-d % 8)
        case = {"study": "head_dim", "pass": direction, "head_dim": d, "padded_head_dim": padded, "seqlen": s,
                "batch": b, "heads": h, "causal": True}
        q, k, v = (torch.randn(b, s, h, d, device=args.device, dtype=torch.bfloat16) for _ in range(3))
        qp, kp, vp = (torch.nn.functional.pad(t, (0, padded - d)) for t in (q, k, v))
        impls = {"fattn": lambda q, k, v: fattn.flash_attn_func(q, k, v, causal=True),
                 "fattn-at-padded-dim": lambda q, k, v: fattn.flash_attn_func(q, k, v, causal=True)}
        inputs = {"fattn": (q, k, v), "fattn-at-padded-dim": (qp, kp, vp)}
        flops = 4 * b * h * s * s * d / 2 * (2.5 if direction == "backward" else 1)
        measure(results, case, impls, direction, inputs, flops, args.reps)
        results.compare(case, peers=["fattn-at-padded-dim"], ours=["fattn"])
        results.write(args.out)


def bucket_study(results, args, direction):
    """Head dims between powers of two: fattn at each of --bucket-head-dims against the same
    problem zero-padded to the next power of two (the work a power-of-two bucket does for it: its
    products run the padded width) and SDPA's flash and cuDNN backends at the head dim itself."""
    s, h = args.mod_seqlen, 16
    b = max(1, args.tokens // s)
    for d in int_list(args.bucket_head_dims):
        pow2 = 1 << (d - 1).bit_length()
        q, k, v = (torch.randn(b, s, h, d, device=args.device, dtype=torch.bfloat16) for _ in range(3))
        qp, kp, vp = (torch.nn.functional.pad(t, (0, pow2 - d)) for t in (q, k, v))
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        for causal in (False, True):
            case = {"study": "bucket", "pass": direction, "head_dim": d, "pow2_head_dim": pow2, "seqlen": s,
                    "batch": b, "heads": h, "causal": causal}
            cap = args.bucket_softcap
            if cap:
                case["softcap"] = cap
            impls = {"fattn": lambda q, k, v, c=causal: fattn.flash_attn_func(q, k, v, causal=c, softcap=cap),
                     "fattn-at-pow2": lambda q, k, v, c=causal, d=d: fattn.flash_attn_func(
                         q, k, v, causal=c, softmax_scale=d ** -0.5, softcap=cap)}
            inputs = {"fattn": (q, k, v), "fattn-at-pow2": (qp, kp, vp)}
            for name, backend in ({} if cap else sdpa_peers(args.device)).items():  # SDPA has no softcap
                def sdpa(q, k, v, backend=backend, c=causal):
                    with sdpa_kernel(backend):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=c)
                impls[name], inputs[name] = sdpa, (qt, kt, vt)
            flops = 4 * b * h * s * s * d / (2 if causal else 1) * (2.5 if direction == "backward" else 1)
            measure(results, case, impls, direction, inputs, flops, args.reps)
            results.compare(case, peers=[name for name in impls if name != "fattn"], ours=["fattn"])
            results.write(args.out)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/variants.json"))
    parser.add_argument("--passes", default="forward,backward")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--window-seqlen", type=int, default=16384)
    parser.add_argument("--windows", default="1024,4096")
    parser.add_argument("--mod-seqlen", type=int, default=8192)
    parser.add_argument("--mod-window", type=int, default=4096, help="score_mod study: the window's keys per side")
    parser.add_argument("--segments", type=int, default=4, help="score_mod study: documents per row")
    parser.add_argument("--mods", default=None,
                        help="score_mod study: only these rows (comma-separated names, e.g. alibi,softcap), and plain")
    parser.add_argument("--gqa", type=int, default=4, help="score_mod study: query heads per KV head")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--varlen-batch", type=int, default=8)
    parser.add_argument("--varlen-max-seqlen", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0, help="the varlen study's lengths")
    parser.add_argument("--studies", default="window,score_mod,varlen,head_dim,bias")
    parser.add_argument("--bias-seqlen", type=int, default=4096)
    parser.add_argument("--pad-head-dims", default="59,100")
    parser.add_argument("--bucket-head-dims", default="80,96,160,192", help="bucket study: head dims to time")
    parser.add_argument("--bucket-softcap", type=float, default=0.0,
                        help="bucket study: a softcap for every call (> 0: the softcap_alibi kernels; no SDPA peers)")
    parser.add_argument("--no-flex", action="store_true")
    parser.add_argument("--no-fa4", action="store_true", help="skip FlashAttention-4 (flash-attn-4)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--calls", type=int, default=8,
                        help="back-to-back calls per timed unit, as bench_attention.py's (1: each call from an idle GPU)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, few reps, no Flex: a smoke run (fa4 stays, to record why it cannot run)")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    if args.quick:
        args.calls = 1
        args.head_dim, args.hidden, args.window_seqlen, args.windows = 64, 128, 256, "16,64"
        args.mod_seqlen, args.tokens, args.reps, args.no_flex, args.mod_window, args.gqa = 128, 256, 2, True, 32, 2
        args.varlen_batch, args.varlen_max_seqlen, args.pad_head_dims, args.bias_seqlen = 3, 100, "13", 128
    return args


def main(argv=None):
    args = parse_args(argv)
    require_device(args.device, "bench_variants")
    results = Results.start("variants", args, args.device)
    flex = None if args.no_flex else Flex(args.device)
    fa4 = None if args.no_fa4 else fa4_peer(args.device)
    if fa4 and fa4_unavailable(args.device):
        print(f"fa4: unavailable, recorded without times: {fa4_unavailable(args.device)}", flush=True)
    for direction in args.passes.split(","):
        studies = args.studies.split(",")
        if "window" in studies:
            window_study(results, args, flex, fa4, direction)
        if "score_mod" in studies:
            score_mod_study(results, args, flex, fa4, direction)
        if "varlen" in studies:
            varlen_study(results, args, direction)
        if "head_dim" in studies:
            head_dim_study(results, args, direction)
        if "bucket" in studies:
            bucket_study(results, args, direction)
        if "bias" in studies:
            bias_study(results, args, direction)
    print_summary(results)
    print(f"wrote {args.out}")


def print_summary(results):
    fattn_rows = [r for r in results.rows if r["impl"] == "fattn" and r["study"] in ("window", "score_mod")]
    lines = []
    for r in fattn_rows:
        what = f"window {r['window_left']}" if r["study"] == "window" else f"{r['mod']} causal={r['causal']}"
        lines.append([r["pass"], r["seqlen"], what, r["ms"], r["tflops"] and f"{r['tflops']:.1f}",
                      r.get("vs_plain"), r["ratio_vs"].get("flex"), r["ratio_vs"].get("fa4")])
    print_table(["pass", "seqlen", "variant", "fattn ms", "TFLOP/s", "vs plain", "fattn/flex", "fattn/fa4"], lines,
                title="\nvariants: fattn/<peer> = time ratio (< 1: fattn faster); "
                      "vs plain = time over fattn's plain run")
    lines = [[r["pass"], r["batch"], r["max_seqlen"], r["total_tokens"], r["ms"], r["tflops"] and f"{r['tflops']:.1f}",
              *(r["ratio_vs"].get(peer) for peer in ("fattn-padded", "sdpa_flash-padded", "sdpa_cudnn-padded"))]
             for r in results.rows if r["impl"] == "fattn-varlen"]
    print_table(["pass", "batch", "max len", "tokens", "varlen ms", "TFLOP/s", "/fattn pad", "/flash pad",
                 "/cudnn pad"], lines, title="\nvarlen (causal): time ratio of fattn varlen over each padded run")
    lines = [[r["pass"], r["head_dim"], r["padded_head_dim"], r["ms"], r["ratio_vs"].get("fattn-at-padded-dim")]
             for r in results.rows if r["study"] == "head_dim" and r["impl"] == "fattn"]
    print_table(["pass", "head dim", "padded", "fattn ms", "/at padded dim"], lines,
                title="\nhead dims that are not a multiple of 8: time over the same problem at the padded dim")
    lines = [[r["pass"], r["head_dim"], r["causal"], r["ms"], r["tflops"] and f"{r['tflops']:.1f}",
              *(r["ratio_vs"].get(peer) for peer in ("fattn-at-pow2", "sdpa_flash", "sdpa_cudnn"))]
             for r in results.rows if r["study"] == "bucket" and r["impl"] == "fattn"]
    print_table(["pass", "head dim", "causal", "fattn ms", "TFLOP/s", "/at pow2", "/sdpa flash", "/sdpa cudnn"], lines,
                title="\nhead dims between powers of two: time ratio of fattn over each (< 1: fattn faster)")
    lines = [[r["pass"], r["seqlen"], r["bias"], r["ms"], r["tflops"] and f"{r['tflops']:.1f}", r.get("vs_plain"),
              *(r["ratio_vs"].get(peer) for peer in BIAS_PEERS)]
             for r in results.rows if r["study"] == "bias" and r["impl"] == "fattn" and r["bias"] != "none"]
    print_table(["pass", "seqlen", "bias", "fattn ms", "TFLOP/s", "vs plain", "/sdpa eff", "/sdpa cudnn"], lines,
                title="\nbias: time ratio of fattn over SDPA given the same attn_mask (< 1: fattn faster)")


if __name__ == "__main__":
    main()
