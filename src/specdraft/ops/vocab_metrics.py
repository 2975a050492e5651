"""Vocabulary-wide metrics of a draft row against a target row, neither softmax
materialised: the op behind specdraft.training's draft metrics.

Per row n of draft logits [N, Vd] and target logits [N, V], at temperature
T = temperature[n] (scale s = T; s = 1 for a greedy row, T <= 0): q = softmax(draft / s)
over the draft vocabulary, p = softmax(target / s) over the whole target vocabulary.
Draft id i stands for target id i + d2t[i] (EAGLE-3's map, as
Eagle3Head.map_draft_to_target; without d2t, Vd == V and the map is the identity).
The map must be injective (EAGLE-3's are); an id it sends outside [0, V) has no mass.

Outputs, per row:
- draft_token: the target id of argmax(draft) (the lowest draft id on ties, as
  torch.argmax), int32; target_token: argmax(target), the lowest id on ties, int32;
- draft_lse, target_lse: logsumexp(draft / s), logsumexp(target / s) (natural log);
- accept: the expected acceptance sum_i min(q(i), p(i + d2t[i])); target mass outside
  the draft vocabulary never accepts. Greedy: p and q are one-hot, so accept is 1.0
  when draft_token == target_token, else 0.0;
- with divergence=True, cross_entropy = -sum_i pd(i) log q(i) and
  kl = sum_i pd(i) (log pd(i) - log q(i)), pd the target restricted to the draft
  vocabulary and renormalised (the usual EAGLE-3 training target), at the same s
  (1 for greedy rows). Terms with pd(i) = 0 count 0; pd(i) > 0 where q(i) = 0 makes
  both +inf. Without divergence both are empty ([0]).

A row of all -inf logits has no mass (lse -inf, no acceptance, argmax 0). With
target_is_probs, target holds probabilities: p = softmax(log(target) / s) (target
itself at s = 1), target_lse = logsumexp(log(target) / s).

The kernel: one program per row, two passes over the row's tiles. Pass 1 keeps, per
lane, the online-softmax statistics and the argmax of both rows (and, for divergence
with a map, the target's statistics on the draft ids). Pass 2 needs both normalisers;
it reads the tiles back to front, so the tiles pass 1 read last, the likeliest still
in L2, come first. In base 2, min(p, q) = 2**min(log2 p, log2 q): one exp2 per token
pair. Extra memory: the outputs, O(N). The row scans' per-lane statistics are
ops/common/scan.py's; the reads of a draft tile and of the target at its ids,
vocab_metrics_tiles.py's.
"""

from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_bool, check_tensor_arg

from .backend import NAMESPACE, TRITON_INTERPRET, tl, triton, use_triton

# Imported by name: Inductor re-emits a user Triton kernel with the jit functions it
# calls, and a module attribute is not carried along.
from .common.fastmath import FAST_LOG2, exp2
from .common.scan import (
    lane_argmax_finish,
    lane_argmax_init,
    lane_argmax_update,
    lane_lse2,
    lane_softmax_init,
    lane_softmax_update,
)
from .vocab_metrics_tiles import draft_tile, load_target, target_log2

# The interpreter emulates every lane in NumPy: small blocks keep it fast and make
# small test vocabularies span several tiles (and pass 2's reversed order matter).
BLOCK_V = 16 if TRITON_INTERPRET else 2048
NUM_WARPS = 8
# The reference's rows per chunk in eager mode: about 4M elements per fp32 temporary.
REFERENCE_CHUNK_ELEMENTS = 1 << 22


class VocabMetrics(NamedTuple):
    """Per-row outputs of `vocab_metrics` (see the module docstring)."""

    draft_token: torch.Tensor  # [N] int32, a target id
    target_token: torch.Tensor  # [N] int32
    draft_lse: torch.Tensor  # [N] fp32
    target_lse: torch.Tensor  # [N] fp32
    accept: torch.Tensor  # [N] fp32, sum_i min(p, q)
    cross_entropy: torch.Tensor  # [N] fp32, or [0] without divergence
    kl: torch.Tensor  # [N] fp32, or [0] without divergence


# --------------------------------------------------------------------------- kernel


@triton.jit
def _second_pass(
    draft_row, target_row, d2t_ptr, draft_vocab, vocab, draft_gain, target_gain, d_lse2, t_lse2, o_lse2,
    HAS_MAP: tl.constexpr, PROBS: tl.constexpr, DIVERGENCE: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """(sum min(p, q), cross-entropy, KL) of one row, its normalisers known (base 2).
    Tiles back to front: the ones pass 1 read last are the likeliest still in L2."""
    # A normaliser of -inf (an empty row) becomes +inf: that row's probabilities are 0, not NaN.
    d_norm = tl.where(d_lse2 == float("-inf"), float("inf"), d_lse2)
    t_norm = tl.where(t_lse2 == float("-inf"), float("inf"), t_lse2)
    o_norm = tl.where(o_lse2 == float("-inf"), float("inf"), o_lse2)
    lanes = tl.arange(0, BLOCK)
    min_lane = tl.zeros([BLOCK], tl.float32)
    ce_lane = tl.zeros([BLOCK], tl.float32)
    kl_lane = tl.zeros([BLOCK], tl.float32)
    num_blocks = tl.cdiv(draft_vocab, BLOCK)
    tile = draft_tile(draft_row, target_row, d2t_ptr, (num_blocks - 1) * BLOCK + lanes, draft_vocab, vocab, True,
                      HAS_MAP, PROBS)  # fmt: skip
    for back in range(0, num_blocks):
        idx = (num_blocks - 1 - back) * BLOCK + lanes
        x, xt = tile
        # Prefetch: the next tile's loads are in flight while this one is summed.
        tile = draft_tile(draft_row, target_row, d2t_ptr, idx - BLOCK, draft_vocab, vocab, True, HAS_MAP, PROBS)
        zt = target_log2(xt.to(tl.float32), target_gain, PROBS)
        log_q = x.to(tl.float32) * draft_gain - d_norm
        log_p = zt - t_norm
        if DIVERGENCE:
            log_pd = zt - o_norm
            pd = exp2(log_pd, FAST)
            if HAS_MAP:
                p = exp2(log_p, FAST)
            else:
                p = pd  # without a map the draft vocabulary is the whole vocabulary: pd is p
            min_lane += tl.minimum(p, exp2(log_q, FAST))
            counted = pd > 0
            ce_lane += tl.where(counted, -pd * log_q, 0.0)
            kl_lane += tl.where(counted, pd * (log_pd - log_q), 0.0)
        else:
            # min(p, q) = 2**min(log2 p, log2 q): one exp2 per token pair.
            min_lane += exp2(tl.minimum(log_p, log_q), FAST)
    ln2 = 0.6931471805599453
    return tl.sum(min_lane, 0), tl.sum(ce_lane, 0) * ln2, tl.sum(kl_lane, 0) * ln2


@triton.jit
def _vocab_metrics_kernel(
    draft_ptr, target_ptr, temperature_ptr, d2t_ptr,
    draft_token_ptr, target_token_ptr, draft_lse_ptr, target_lse_ptr, accept_ptr, ce_ptr, kl_ptr,  # out
    draft_vocab, vocab, draft_stride, target_stride, temperature_stride,
    HAS_MAP: tl.constexpr, PROBS: tl.constexpr, DIVERGENCE: tl.constexpr, BLOCK: tl.constexpr,
    FAST: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    temp = tl.load(temperature_ptr + row * temperature_stride).to(tl.float32)
    sampled = temp > 0  # anything else (T <= 0, NaN) is greedy
    scale = tl.where(sampled, temp, 1.0)
    draft_gain = 1.4426950408889634 / scale  # log2(e) / s: base-2 logits
    if PROBS:
        target_gain = 1.0 / scale
    else:
        target_gain = draft_gain
    draft_row = draft_ptr + row * draft_stride
    target_row = target_ptr + row * target_stride
    lanes = tl.arange(0, BLOCK)
    # Pass 1 reads the target along the draft ids when they are its own ids (no map), or for
    # the divergences' normaliser on the draft vocabulary.
    DRAFT_IDS_TARGET: tl.constexpr = DIVERGENCE or not HAS_MAP

    # Pass 1: per-lane softmax statistics and argmax of both rows. Each loop prefetches:
    # the next tile's loads are in flight while this one is reduced.
    d_max, d_sum = lane_softmax_init(BLOCK)
    t_max, t_sum = lane_softmax_init(BLOCK)
    o_max, o_sum = lane_softmax_init(BLOCK)  # the target on the draft ids (divergence with a map)
    d_best, d_idx = lane_argmax_init(0, BLOCK)
    t_best, t_idx = lane_argmax_init(0, BLOCK)
    if HAS_MAP:
        target_next = load_target(target_row, lanes, lanes < vocab, PROBS)
        for off in range(0, vocab, BLOCK):
            idx = off + lanes
            xt = target_next.to(tl.float32)
            target_next = load_target(target_row, idx + BLOCK, idx + BLOCK < vocab, PROBS)
            t_best, t_idx = lane_argmax_update(t_best, t_idx, xt, idx)
            t_max, t_sum = lane_softmax_update(t_max, t_sum, target_log2(xt, target_gain, PROBS), FAST)
    tile = draft_tile(draft_row, target_row, d2t_ptr, lanes, draft_vocab, vocab, DRAFT_IDS_TARGET,
                      HAS_MAP, PROBS)  # fmt: skip
    for off in range(0, draft_vocab, BLOCK):
        idx = off + lanes
        x, xt = tile
        tile = draft_tile(draft_row, target_row, d2t_ptr, idx + BLOCK, draft_vocab, vocab, DRAFT_IDS_TARGET,
                          HAS_MAP, PROBS)  # fmt: skip
        x = x.to(tl.float32)
        d_best, d_idx = lane_argmax_update(d_best, d_idx, x, idx)
        d_max, d_sum = lane_softmax_update(d_max, d_sum, x * draft_gain, FAST)
        if HAS_MAP:
            if DIVERGENCE:
                zt = target_log2(xt.to(tl.float32), target_gain, PROBS)
                o_max, o_sum = lane_softmax_update(o_max, o_sum, zt, FAST)
        else:  # the same ids: the target's own statistics
            xt = xt.to(tl.float32)
            t_best, t_idx = lane_argmax_update(t_best, t_idx, xt, idx)
            t_max, t_sum = lane_softmax_update(t_max, t_sum, target_log2(xt, target_gain, PROBS), FAST)
    _, d_arg = lane_argmax_finish(d_best, d_idx)
    _, t_arg = lane_argmax_finish(t_best, t_idx)
    d_lse2 = lane_lse2(d_max, d_sum)
    t_lse2 = lane_lse2(t_max, t_sum)
    o_lse2 = t_lse2
    draft_token = d_arg.to(tl.int64)
    if HAS_MAP:
        draft_token += tl.load(d2t_ptr + d_arg).to(tl.int64)
        if DIVERGENCE:
            o_lse2 = lane_lse2(o_max, o_sum)

    # Pass 2, skipped by a greedy row unless it needs the divergences.
    min_sum = tl.zeros([], tl.float32)
    ce = tl.zeros([], tl.float32)
    kl = tl.zeros([], tl.float32)
    if DIVERGENCE:
        min_sum, ce, kl = _second_pass(
            draft_row, target_row, d2t_ptr, draft_vocab, vocab, draft_gain, target_gain, d_lse2, t_lse2, o_lse2,
            HAS_MAP, PROBS, DIVERGENCE, BLOCK, FAST,
        )  # fmt: skip
    else:
        if sampled:
            min_sum, ce, kl = _second_pass(
                draft_row, target_row, d2t_ptr, draft_vocab, vocab, draft_gain, target_gain, d_lse2, t_lse2, o_lse2,
                HAS_MAP, PROBS, DIVERGENCE, BLOCK, FAST,
            )  # fmt: skip
    # Greedy: p and q are one-hot, sum min(p, q) is the match.
    accept = tl.where(sampled, min_sum, (draft_token == t_arg).to(tl.float32))

    ln2 = 0.6931471805599453
    tl.store(draft_token_ptr + row, draft_token.to(tl.int32))
    tl.store(target_token_ptr + row, t_arg)
    tl.store(draft_lse_ptr + row, d_lse2 * ln2)
    tl.store(target_lse_ptr + row, t_lse2 * ln2)
    tl.store(accept_ptr + row, accept)
    if DIVERGENCE:
        tl.store(ce_ptr + row, ce)
        tl.store(kl_ptr + row, kl)


# ------------------------------------------------------------------------ reference


def _no_mass(lse: torch.Tensor) -> torch.Tensor:
    """The normaliser to subtract: +inf for an empty row (-inf lse), so its probabilities are 0, not NaN."""
    return torch.where(lse == float("-inf"), float("inf"), lse)


def _reference_rows(draft_logits, target, temperature, d2t, target_is_probs: bool, divergence: bool):
    greedy = ~(temperature > 0)  # T <= 0 (or NaN), as the kernel
    scale = torch.where(greedy, 1.0, temperature).float()[:, None]
    draft_x, target_x = draft_logits.float(), target.float()
    z_d = draft_x / scale
    z_t = (target_x.log() if target_is_probs else target_x) / scale
    draft_arg = draft_x.argmax(-1)
    target_token = target_x.argmax(-1)
    draft_lse = torch.logsumexp(z_d, -1)
    target_lse = torch.logsumexp(z_t, -1)
    if d2t is None:
        draft_token, z_t_on_draft = draft_arg, z_t
    else:
        ids = torch.arange(d2t.shape[0], device=d2t.device) + d2t.long()
        readable = (ids >= 0) & (ids < target.shape[-1])
        draft_token = ids[draft_arg]
        z_t_on_draft = torch.where(
            readable, z_t.gather(1, ids.clamp(0, target.shape[-1] - 1).expand_as(z_d)), -torch.inf
        )
    log_q = z_d - _no_mass(draft_lse)[:, None]
    log_p = z_t_on_draft - _no_mass(target_lse)[:, None]
    match = (draft_token == target_token).float()
    accept = torch.where(greedy, match, torch.exp(torch.minimum(log_p, log_q)).sum(-1))
    if divergence:
        lse_on_draft = target_lse if d2t is None else torch.logsumexp(z_t_on_draft, -1)
        log_pd = z_t_on_draft - _no_mass(lse_on_draft)[:, None]
        pd = log_pd.exp()
        cross_entropy = torch.where(pd > 0, -pd * log_q, 0.0).sum(-1)
        kl = torch.where(pd > 0, pd * (log_pd - log_q), 0.0).sum(-1)
    else:
        cross_entropy, kl = draft_lse.new_empty((0,)), draft_lse.new_empty((0,))  # distinct: outputs may not alias
    return (draft_token.to(torch.int32), target_token.to(torch.int32), draft_lse, target_lse, accept, cross_entropy, kl)


def vocab_metrics_reference(
    draft_logits, target, temperature, d2t, target_is_probs: bool, divergence: bool
) -> tuple[torch.Tensor, ...]:
    """The op in torch, vectorised over rows. On real (eager) tensors it goes through
    the rows in chunks, so its fp32 temporaries stay near REFERENCE_CHUNK_ELEMENTS
    elements whatever N; traced (torch.compile), it is one expression for Inductor to
    fuse, with no Python loop over a symbolic N."""
    rows = draft_logits.shape[0]
    chunk = max(1, REFERENCE_CHUNK_ELEMENTS // max(draft_logits.shape[1], target.shape[1]))
    eager = type(draft_logits) is torch.Tensor and not torch.compiler.is_compiling()
    if not eager or rows <= chunk:
        return _reference_rows(draft_logits, target, temperature, d2t, target_is_probs, divergence)
    parts = [
        _reference_rows(draft_logits[s : s + chunk], target[s : s + chunk], temperature[s : s + chunk], d2t,
                        target_is_probs, divergence)
        for s in range(0, rows, chunk)
    ]  # fmt: skip
    return tuple(torch.cat(column) for column in zip(*parts, strict=True))


# -------------------------------------------------------------------------- the op


def _outputs(rows, device, divergence: bool):
    tokens = [torch.empty((rows,), dtype=torch.int32, device=device) for _ in range(2)]
    floats = [torch.empty((rows,), dtype=torch.float32, device=device) for _ in range(3)]
    extra = [torch.empty((rows if divergence else 0,), dtype=torch.float32, device=device) for _ in range(2)]
    return (*tokens, *floats, *extra)


@triton_op(f"{NAMESPACE}::vocab_metrics", mutates_args=())
def _vocab_metrics_op(
    draft_logits: torch.Tensor,
    target: torch.Tensor,
    temperature: torch.Tensor,
    d2t: torch.Tensor | None,
    target_is_probs: bool,
    divergence: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not use_triton(draft_logits):
        return vocab_metrics_reference(draft_logits, target, temperature, d2t, target_is_probs, divergence)
    rows, draft_vocab = draft_logits.shape
    outs = _outputs(rows, draft_logits.device, divergence)
    if rows == 0:
        return outs
    draft_token, target_token, draft_lse, target_lse, accept, ce, kl = outs
    wrap_triton(_vocab_metrics_kernel)[(rows,)](
        draft_logits, target, temperature, draft_logits if d2t is None else d2t,
        draft_token, target_token, draft_lse, target_lse, accept,
        ce if divergence else accept, kl if divergence else accept,  # unused pointers without divergence
        draft_vocab, target.shape[1], draft_logits.stride(0), target.stride(0), temperature.stride(0),
        HAS_MAP=d2t is not None, PROBS=target_is_probs, DIVERGENCE=divergence, BLOCK=BLOCK_V, FAST=FAST_LOG2,
        num_warps=NUM_WARPS,
    )  # fmt: skip
    return outs


@_vocab_metrics_op.register_fake
def _vocab_metrics_fake(draft_logits, target, temperature, d2t, target_is_probs, divergence):
    return _outputs(draft_logits.shape[0], draft_logits.device, divergence)


# ------------------------------------------------------------------ public wrapper


def vocab_metrics(
    draft_logits: torch.Tensor,
    target: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    *,
    d2t: torch.Tensor | None = None,
    target_is_probs: bool = False,
    divergence: bool = False,
) -> VocabMetrics:
    """Per-row draft/target metrics over the vocabulary in one kernel (module docstring).

    No host sync; under torch.compile the CPU path is the reference, fused by Inductor.

    Args:
        draft_logits: [N, Vd] fp32 / bf16 / fp16, rows contiguous, any row stride (rows of
            a wider buffer, or a [K, T, V] slice).
        target: [N, V] logits, or probabilities with target_is_probs; dtypes and strides as
            draft_logits.
        temperature: a Python number or a 0-dim fp32 tensor (all rows), or an fp32 tensor
            [N] (one per row, any stride); T <= 0 is greedy.
        d2t: [Vd] int32/int64, or None (requires Vd == V). Draft id i is target id i + d2t[i].
        target_is_probs: bool. target holds probabilities, not logits.
        divergence: bool. Also the cross-entropy and KL per row.

    Returns:
        VocabMetrics: draft_token, target_token [N] int32 (target ids); draft_lse,
        target_lse, accept [N] fp32; cross_entropy, kl [N] fp32 ([0] without divergence).
    """
    check_tensor_arg("draft_logits", draft_logits, FLOAT_DTYPES, shape=(None, at_least(1, "Vd")), contiguous="rows")
    rows, draft_vocab = draft_logits.shape
    check_tensor_arg(
        "target", target, FLOAT_DTYPES, shape=(rows, at_least(1, "V")), contiguous="rows", device_of=draft_logits
    )
    check_tensor_arg(
        "d2t", d2t, INDEX_DTYPES, shape=(draft_vocab,), contiguous=True, device_of=draft_logits, optional=True
    )
    if d2t is None and draft_vocab != target.shape[1]:
        raise ValueError(
            f"d2t is required when the draft vocabulary ({draft_vocab}) differs from the target's ({target.shape[1]})"
        )
    check_bool("target_is_probs", target_is_probs)
    check_bool("divergence", divergence)
    temperature = _row_temperatures(temperature, rows, draft_logits)
    return VocabMetrics(*_vocab_metrics_op(draft_logits, target, temperature, d2t, target_is_probs, divergence))


def _row_temperatures(temperature, rows, like: torch.Tensor) -> torch.Tensor:
    """temperature as an fp32 tensor [rows]; one value for all rows is expanded (stride 0), not copied."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float | torch.Tensor):
        raise ValueError(f"temperature must be a number or an fp32 tensor, got {type(temperature).__name__}")
    if not isinstance(temperature, torch.Tensor):
        return torch.full((1,), float(temperature), dtype=torch.float32, device=like.device).expand(rows)
    check_tensor_arg("temperature", temperature, torch.float32, shape=[(), (rows,)], device_of=like)
    return temperature.expand(rows)
