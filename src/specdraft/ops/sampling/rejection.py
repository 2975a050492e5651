"""Rejection sampling of draft tokens against the target model (vLLM's rejection
sampler).

Per request b with n = num_draft_tokens[b] drafts x_0..x_{n-1} (n <= K, padded
with -1) and target logits for K + 1 rows (row n gives the bonus token):

- greedy (temperature 0): accept x_j while x_j == argmax(target row j); at the
  first mismatch emit that argmax; if all n are accepted emit argmax(row n).
- random (temperature T > 0), Leviathan et al.: p_j = softmax(target_j / T),
  q_j = draft_probs[b, j] (one-hot of x_j when draft_probs is None). Accept x_j
  while u_j * q_j(x_j) <= p_j(x_j) (u_j <= p/q without dividing by q = 0). At the
  first rejection j, emit a sample of normalise(max(p_j - q_j, 0)); if all are
  accepted, emit a sample of p_n. A draft token outside [0, V) is rejected.

Truncation (top-k / top-p / min-p): with `logit_cut` [B, K + 1], one cut per target
row (ops.truncation_cut of the rows viewed as [B * (K + 1), V]), a random request's
p_j is softmax(target_j / T) restricted to {i : target_j[i] >= cut[b, j]},
renormalised: in the acceptance test, the residual max(p_j - q_j, 0) and the bonus
token alike. The emitted tokens then follow the truncated target exactly, whatever q
is (drafts inside or outside the truncation: a draft the cut removes has p = 0 and
is always rejected). The noise is unchanged: the cut only masks.

Noise: the counter-based hash of noise.py, at position positions[b] + j for row j,
in two streams of its own (so independent of the draft sampling noise at the same
position): STREAM_ACCEPT for u_j (token index 0), STREAM_SAMPLE for the emitted
token. The residual is sampled by the exponential race argmax_i r_i / E_i (E_i the
noise's Exp(1) draw, noise.py: Gumbel-max over log r_i without taking log 0);
should the residual be all zero (q exceeding p everywhere, only possible with
unnormalised draft probs or rounding) the same race runs over p. The bonus token is
Gumbel-max over target / T, which needs no normalisation. Both draw the same E as
draft sampling, far tail included; the acceptance tests use the 23-bit u.

Kernels: (1) per (request, row, vocab chunk) statistics: the argmax for greedy
rows 0..n, the online-softmax max and sum for random rows 0..n-1; rows past those
are never read. (2) per (request, vocab chunk): the acceptance chain from those
statistics (cheap, recomputed by every chunk program; chunk 0 writes the tokens
and counts), then for random requests the partial race over its chunk of the one
row c that emits. (3) per request: combine the races into the emitted token. (1)
and (3) are verify_kernels.py's, shared with tree verification; (2), with the
acceptance test and the residual race step it scans a row with, is below.
"""

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_tensor_arg

from ..backend import NAMESPACE, cdiv, tl, triton, use_triton

# Imported by name: Inductor re-emits a user Triton kernel with the jit functions it
# calls, and a module attribute (noise.x) is not carried along.
from ..common.fastmath import FAST_LOG2, exp2, rcp
from ..common.scan import (
    combine_argmax,
    combine_softmax,
    lane_argmax_finish,
    lane_argmax_init,
    lane_argmax_update,
    scan_vocab,
)
from .draft import (
    argmax_skipping_nan,
    check_draft_sample_values,
    check_logit_cut_arg,
    check_logit_cut_values,
    truncate_logits,
)
from .noise import (
    STREAM_ACCEPT,
    STREAM_SAMPLE,
    check_request_params,
    check_salt,
    exponential2,
    exponential2_torch,
    gumbel2_torch,
    gumbel_gain,
    gumbel_gain_torch,
    noise_bits,
    noise_bits_torch,
    row_key,
    row_key_torch,
    salt_key,
    uniform,
    uniform_torch,
)
from .tiles import RS_LARGE_FROM, RS_TILES_LARGE, RS_TILES_SMALL, SPLIT_BLOCK
from .verify_kernels import gumbel_step, race_finish_kernel, row_cut, target_stats_kernel

# ------------------------------------------- the chain kernel and its device-side rules


@triton.jit
def residual_race_step(acc, x, q, idx, args, FLAGS: tl.constexpr):
    """A rejected row: the exponential races r / E over the residual r = max(p - q, 0)
    and, as the fallback, over p. p = softmax in base 2: 2**(x * log2(e) / T -
    max * log2(e)) / sum, the division and the division by T hoisted out of the loop
    (args). Without draft probs q is the one-hot of the rejected token."""
    HAS_DRAFT_PROBS: tl.constexpr = FLAGS[0]  # annotated: a plain assignment would make a runtime value
    FAST: tl.constexpr = FLAGS[1]
    CUT: tl.constexpr = FLAGS[2]
    race, race_idx, fall, fall_idx = acc
    gain, max2, inv_sum, key, end, rejected, cut = args
    mask = idx < end
    if CUT:  # p = 0 below the cut
        x = tl.where(x < cut, float("-inf"), x)
    p = exp2(x * gain - max2, FAST) * inv_sum
    if not HAS_DRAFT_PROBS:
        q = (idx == rejected).to(tl.float32)
    # 1 / (E / ln 2): the races rank r / E, and a common factor ln 2 changes no winner.
    inv_e = rcp(exponential2(noise_bits(key, idx), FAST), FAST)
    race_keys = tl.where(mask, tl.maximum(p - q, 0.0) * inv_e, float("-inf"))
    fall_keys = tl.where(mask, p * inv_e, float("-inf"))
    race, race_idx = lane_argmax_update(race, race_idx, race_keys, idx)
    fall, fall_idx = lane_argmax_update(fall, fall_idx, fall_keys, idx)
    return race, race_idx, fall, fall_idx


@triton.jit
def accept_draft(
    logits_ptr, draft_probs_ptr, part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,
    draft, logits_row, q_row, parts, greedy, temp, seed, position, vocab, num_splits, cut,
    ACCEPT_KEY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """Whether one draft token is accepted (as int32), from the statistics kernel's
    partials of its target row: greedy, draft == argmax; random, u * q(x) <= p(x),
    p(x) = 0 where the logit is below the row's cut."""
    if greedy:
        _, target = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
        accept = (draft == target).to(tl.int32)
    else:
        valid = (draft >= 0) & (draft < vocab)
        run_max, run_sum = combine_softmax(part_max_ptr + parts, part_sum_ptr + parts, num_splits, SPLIT_BLOCK)
        x = tl.load(logits_ptr + logits_row + draft, mask=valid, other=float("-inf")).to(tl.float32)
        x = tl.where(x < cut, float("-inf"), x)  # cut = -inf without truncation
        p = tl.exp(x / temp - run_max) / run_sum
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_probs_ptr + q_row * vocab + draft, mask=valid, other=0.0).to(tl.float32)
        else:
            q = 1.0
        u = uniform(noise_bits(row_key(seed, position, ACCEPT_KEY), tl.full([], 0, tl.int32)))
        accept = (valid & (u * q <= p)).to(tl.int32)
    return accept


@triton.jit
def _rs_chain_kernel(
    logits_ptr, draft_tokens_ptr, draft_probs_ptr, num_draft_ptr, temperature_ptr, seeds_ptr, positions_ptr,
    cut_ptr,  # [B, K + 1], read with HAS_CUT
    tokens_ptr, counts_ptr,  # out
    part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,  # in: the statistics kernel's partials
    race_key_ptr, race_idx_ptr, fall_key_ptr, fall_idx_ptr,  # out: per (request, chunk)
    vocab, req_stride, row_stride, num_spec, num_splits,
    ACCEPT_KEY: tl.constexpr, SAMPLE_KEY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, HAS_CUT: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, SPLIT_BLOCK: tl.constexpr, FAST_LOG2: tl.constexpr,
):  # fmt: skip
    req = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    num_draft = tl.minimum(tl.maximum(tl.load(num_draft_ptr + req), 0), num_spec)
    temp = tl.load(temperature_ptr + req).to(tl.float32)
    greedy = temp <= 0
    seed = tl.load(seeds_ptr + req).to(tl.int64)
    position = tl.load(positions_ptr + req).to(tl.int64)
    draft_base = draft_tokens_ptr + req * num_spec

    # The acceptance chain: count = number of leading accepted drafts.
    count = tl.full([], 0, tl.int32)
    alive = tl.full([], 1, tl.int32)
    for j in range(0, num_spec):
        accept = tl.full([], 0, tl.int32)
        if (alive != 0) & (j < num_draft):
            row = req * (num_spec + 1) + j
            accept = accept_draft(
                logits_ptr, draft_probs_ptr, part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,
                tl.load(draft_base + j).to(tl.int64), req * req_stride + j * row_stride, req * num_spec + j,
                row * num_splits,
                greedy, temp, seed, position + j, vocab, num_splits, row_cut(cut_ptr, row, HAS_CUT),
                ACCEPT_KEY, HAS_DRAFT_PROBS, SPLIT_BLOCK,
            )  # fmt: skip
        count += accept
        alive = accept

    row = req * (num_spec + 1) + count
    parts = row * num_splits
    if split == 0:
        emitted = tl.full([], -1, tl.int32)  # random requests: filled in by the finish kernel
        if greedy:
            _, emitted = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
        for i in range(0, num_spec + 1):
            draft = tl.load(draft_base + i, mask=i < count, other=-1).to(tl.int32)
            token = tl.where(i < count, draft, tl.where(i == count, emitted, -1))
            tl.store(tokens_ptr + req * (num_spec + 1) + i, token)
        tl.store(counts_ptr + req, count)

    if not greedy:
        key = row_key(seed, position + count, SAMPLE_KEY)
        cut = row_cut(cut_ptr, row, HAS_CUT)
        row_ptr = logits_ptr + req * req_stride + count * row_stride
        start = split * CHUNK
        end = tl.minimum(start + CHUNK, vocab)
        race, race_idx = lane_argmax_init(start, BLOCK)
        fall, fall_idx = race, race_idx
        if count < num_draft:  # rejected at row `count`: race over the residual
            run_max, run_sum = combine_softmax(part_max_ptr + parts, part_sum_ptr + parts, num_splits, SPLIT_BLOCK)
            rejected = tl.load(draft_base + count).to(tl.int64)
            q_ptr = draft_probs_ptr + (req * num_spec + count) * vocab
            args = (gumbel_gain(temp), run_max * 1.4426950408889634, 1.0 / run_sum, key, end, rejected, cut)
            race, race_idx, fall, fall_idx = scan_vocab(
                row_ptr, q_ptr, start, end, (race, race_idx, fall, fall_idx), args, residual_race_step,
                (HAS_DRAFT_PROBS, FAST_LOG2, HAS_CUT), HAS_DRAFT_PROBS, BLOCK,
            )  # fmt: skip
        else:  # all accepted: the bonus token
            race, race_idx = scan_vocab(
                row_ptr, row_ptr, start, end, (race, race_idx), (gumbel_gain(temp), key, cut), gumbel_step,
                (FAST_LOG2, HAS_CUT), False, BLOCK,
            )  # fmt: skip
            fall, fall_idx = race, race_idx  # its own fallback: race_finish_kernel takes either
        race, race_idx = lane_argmax_finish(race, race_idx)
        fall, fall_idx = lane_argmax_finish(fall, fall_idx)
        part = req * num_splits + split
        tl.store(race_key_ptr + part, race)
        tl.store(race_idx_ptr + part, race_idx)
        tl.store(fall_key_ptr + part, fall)
        tl.store(fall_idx_ptr + part, fall_idx)


# ------------------------------------------------------------------------ reference


def _gather_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t [B, R, V], index [B] -> t[b, index[b]] [B, V]."""
    return t.gather(1, index.view(-1, 1, 1).expand(-1, 1, t.shape[-1])).squeeze(1)


def rejection_sample_reference(
    draft_tokens, num_draft_tokens, draft_probs, target_logits, temperature, seeds, positions, salt: int = 0,
    logit_cut=None,
):  # fmt: skip
    num_reqs, num_spec = draft_tokens.shape
    vocab, device = target_logits.shape[-1], target_logits.device
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    target_argmax = argmax_skipping_nan(target_logits.float())  # [B, K+1]
    x = truncate_logits(target_logits, temperature, logit_cut)  # greedy rows: untouched
    z = x / scale[:, None, None]
    p = torch.softmax(z, -1)
    num_draft = num_draft_tokens.long().clamp(0, num_spec)
    steps = torch.arange(num_spec, device=device)
    draft = draft_tokens.long()
    valid = (draft >= 0) & (draft < vocab)
    safe = draft.clamp(0, vocab - 1)[..., None]

    # Acceptance of every draft, then the leading run of accepted ones.
    p_x = p[:, :num_spec].gather(2, safe)[..., 0]
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.float().gather(2, safe)[..., 0]
    accept_keys = row_key_torch(seeds[:, None], positions.long()[:, None] + steps, salt_key(salt, STREAM_ACCEPT))
    u = uniform_torch(noise_bits_torch(accept_keys, torch.zeros_like(accept_keys)))
    accept = torch.where(greedy[:, None], draft == target_argmax[:, :num_spec], valid & (u * q_x <= p_x))
    accept = accept & (steps < num_draft[:, None])
    count = accept.long().cumprod(1).sum(1)  # [B]

    # The emitted token comes from row `count`: recovered if count < n, else the bonus.
    token = torch.arange(vocab, device=device)
    sample_keys = row_key_torch(seeds, positions.long() + count, salt_key(salt, STREAM_SAMPLE))
    bits = noise_bits_torch(sample_keys[:, None], token)
    p_c = _gather_rows(p, count)
    q_row = count.clamp(max=num_spec - 1)
    if draft_probs is None:
        q_c = (token == draft.gather(1, q_row[:, None])).float()
    else:
        q_c = _gather_rows(draft_probs.float(), q_row)
    e = exponential2_torch(bits)  # E / ln 2: the same winners as E
    race = (p_c - q_c).clamp(min=0) / e
    recovered = torch.where((race > 0).any(-1), race.argmax(-1), (p_c / e).argmax(-1))
    bonus_keys = _gather_rows(x, count) * gumbel_gain_torch(temperature)[:, None] + gumbel2_torch(bits)
    bonus = argmax_skipping_nan(bonus_keys)
    random_token = torch.where(count < num_draft, recovered, bonus)
    emitted = torch.where(greedy, target_argmax.gather(1, count[:, None])[:, 0], random_token)

    slots = torch.arange(num_spec + 1, device=device)
    padded = torch.cat([draft, torch.full_like(draft[:, :1], -1)], 1)
    tokens = torch.where(slots < count[:, None], padded, torch.where(slots == count[:, None], emitted[:, None], -1))
    return tokens.to(torch.int32), count.to(torch.int32)


# --------------------------------------------------------------------------- the op


def _launch(draft_tokens, num_draft_tokens, draft_probs, target_logits, temperature, seeds, positions, salt, logit_cut):
    num_reqs, num_spec = draft_tokens.shape
    vocab, device = target_logits.shape[-1], target_logits.device
    tokens = torch.empty((num_reqs, num_spec + 1), dtype=torch.int32, device=device)
    counts = torch.empty((num_reqs,), dtype=torch.int32, device=device)
    if num_reqs == 0:
        return tokens, counts
    large = statically_known_true(num_reqs * vocab >= RS_LARGE_FROM)
    chunk, block, warps = RS_TILES_LARGE if large else RS_TILES_SMALL
    num_splits = cdiv(vocab, chunk)
    stat_shape = (num_reqs, num_spec + 1, num_splits)
    part_key = torch.empty(stat_shape, dtype=torch.float32, device=device)
    part_idx = torch.empty(stat_shape, dtype=torch.int32, device=device)
    part_max = torch.empty(stat_shape, dtype=torch.float32, device=device)
    part_sum = torch.empty(stat_shape, dtype=torch.float32, device=device)
    race_key = torch.empty((num_reqs, num_splits), dtype=torch.float32, device=device)
    race_idx = torch.empty((num_reqs, num_splits), dtype=torch.int32, device=device)
    fall_key = torch.empty_like(race_key)
    fall_idx = torch.empty_like(race_idx)
    probs = target_logits if draft_probs is None else draft_probs
    cut_ptr = temperature if logit_cut is None else logit_cut  # unread without a cut
    has_cut = logit_cut is not None

    wrap_triton(target_stats_kernel)[(num_reqs, num_spec + 1, num_splits)](
        target_logits, num_draft_tokens, temperature, cut_ptr, part_key, part_idx, part_max, part_sum,
        vocab, target_logits.stride(0), target_logits.stride(1), num_spec + 1, num_splits,
        ROWS_OF_DRAFTS=True, HAS_CUT=has_cut, CHUNK=chunk, BLOCK=block, FAST_LOG2=FAST_LOG2, num_warps=warps,
    )  # fmt: skip
    wrap_triton(_rs_chain_kernel)[(num_reqs, num_splits)](
        target_logits, draft_tokens, probs, num_draft_tokens, temperature, seeds, positions, cut_ptr, tokens, counts,
        part_key, part_idx, part_max, part_sum, race_key, race_idx, fall_key, fall_idx,
        vocab, target_logits.stride(0), target_logits.stride(1), num_spec, num_splits,
        ACCEPT_KEY=salt_key(salt, STREAM_ACCEPT), SAMPLE_KEY=salt_key(salt, STREAM_SAMPLE),
        HAS_DRAFT_PROBS=draft_probs is not None, HAS_CUT=has_cut, CHUNK=chunk, BLOCK=block, SPLIT_BLOCK=SPLIT_BLOCK,
        FAST_LOG2=FAST_LOG2, num_warps=warps,
    )  # fmt: skip
    wrap_triton(race_finish_kernel)[(num_reqs,)](
        temperature, tokens, counts, race_key, race_idx, fall_key, fall_idx, num_spec + 1, num_splits,
        SPLIT_BLOCK=SPLIT_BLOCK, num_warps=1,
    )  # fmt: skip
    return tokens, counts


@triton_op(f"{NAMESPACE}::rejection_sample", mutates_args=())
def _rejection_sample_op(
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    salt: int,
    logit_cut: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    args = (draft_tokens, num_draft_tokens, draft_probs, target_logits, temperature, seeds, positions, salt, logit_cut)
    if not use_triton(target_logits):
        return rejection_sample_reference(*args)
    return _launch(*args)


# ---------------------------------------------------------------- public wrapper


def rejection_sample(
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    salt: int = 0,
    logit_cut: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify K draft tokens per request against the target.

    Value-level contracts (temperature >= 0, n <= K, valid draft ids) are checked in
    checked mode (specdraft.checked_mode); outside it, n is clamped to [0, K] and a
    draft id outside [0, V) is never read (rejected).

    Args:
        draft_tokens: [B, K] int32/int64, contiguous, K >= 1; a request with n < K drafts
            pads with -1.
        num_draft_tokens: [B] int32/int64, contiguous: n, clamped to [0, K].
        draft_probs: [B, K, V] fp32 / bf16 / fp16, contiguous, or None (one-hot of the
            draft tokens, e.g. greedy drafts).
        target_logits: [B, K + 1, V] fp32 / bf16 / fp16 (row n gives the bonus token; rows
            contiguous, any strides between them: e.g. a view of the target's
            [num_tokens, V] logits, as vLLM takes them).
        temperature: [B] fp32, contiguous (0 = greedy).
        seeds: [B] int32/int64, contiguous.
        positions: [B] int32/int64, contiguous: position of the first draft token, draft
            j at positions + j.
        salt: Python int in [0, 2**31 - 1], default 0; part of the noise's hash.
        logit_cut: [B, K + 1] fp32, contiguous, or None (no truncation, no extra work):
            the cut of each target row (ops.truncation_cut of target_logits viewed as
            [B * (K + 1), V], reshaped). A random request verifies against
            softmax(target_j / T) over {i : target_j[i] >= cut[b, j]}, renormalised
            (module docstring). Greedy requests ignore it; -inf keeps every token; a
            cut above a sampled row's largest logit keeps none (checked mode refuses
            it). draft_probs should be the distribution the drafts were drawn from,
            truncated or not.

    Returns:
        (tokens, counts): tokens [B, K + 1] int32, the accepted drafts, the emitted
        recovered / bonus token, then -1; counts [B] int32, accepted drafts, not counting
        the emitted token.
    """
    check_tensor_arg("draft_tokens", draft_tokens, INDEX_DTYPES, shape=(None, at_least(1, "K")), contiguous=True)
    num_reqs, num_spec = draft_tokens.shape
    check_tensor_arg(
        "num_draft_tokens", num_draft_tokens, INDEX_DTYPES, shape=(num_reqs,), contiguous=True, device_of=draft_tokens
    )
    check_tensor_arg(
        "target_logits", target_logits, FLOAT_DTYPES, shape=(num_reqs, num_spec + 1, at_least(1, "V")),
        contiguous="rows", device_of=draft_tokens,
    )  # fmt: skip
    vocab = target_logits.shape[2]
    check_tensor_arg(
        "draft_probs", draft_probs, FLOAT_DTYPES, shape=(num_reqs, num_spec, vocab), contiguous=True,
        device_of=draft_tokens, optional=True,
    )  # fmt: skip
    check_request_params(num_reqs, temperature, seeds, positions, device_of=draft_tokens)
    check_salt(salt)
    check_logit_cut_arg(logit_cut, (num_reqs, num_spec + 1), target_logits)
    if is_checked():
        check_rejection_sample_values(draft_tokens, num_draft_tokens, temperature, vocab, draft_probs)
        if logit_cut is not None:
            check_logit_cut_values(logit_cut, target_logits, temperature)
    return _rejection_sample_op(
        draft_tokens, num_draft_tokens, draft_probs, target_logits, temperature, seeds, positions, salt, logit_cut
    )


# --------------------------------------------- checked mode's value checks (syncs)


def check_rejection_sample_values(
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    vocab: int,
    draft_probs: torch.Tensor | None = None,
) -> None:
    """rejection_sample: temperature finite and >= 0; 0 <= num_draft_tokens <= K;
    draft ids in [0, vocab) for the first num_draft_tokens entries and -1 after;
    draft_probs non-negative and finite."""
    check_draft_sample_values(temperature)
    num_spec = draft_tokens.shape[1]
    drafts, counts = draft_tokens.tolist(), num_draft_tokens.tolist()
    for b, (row, n) in enumerate(zip(drafts, counts, strict=True)):
        if not 0 <= n <= num_spec:
            raise ValueError(f"num_draft_tokens[{b}] = {n} is outside [0, K={num_spec}]")
        for j, token in enumerate(row):
            if j < n and not 0 <= token < vocab:
                raise ValueError(f"draft_tokens[{b}, {j}] = {token} is outside [0, vocab={vocab})")
            if j >= n and token != -1:
                raise ValueError(f"draft_tokens[{b}, {j}] = {token} must be -1 past num_draft_tokens[{b}] = {n}")
    if draft_probs is not None and not (torch.isfinite(draft_probs).all() and (draft_probs >= 0).all()):
        raise ValueError("draft_probs must be finite and non-negative")
    if draft_probs is not None:
        # A sampled row's draft was drawn from draft_probs: probability 0 means the
        # probabilities are not the ones it was drawn from (an all-zero row, say).
        # Greedy rows read no draft_probs.
        steps = torch.arange(num_spec, device=draft_tokens.device)
        drafted = (steps < num_draft_tokens[:, None]) & (temperature > 0)[:, None]
        q = draft_probs.gather(2, draft_tokens.long().clamp(min=0)[..., None])[..., 0]
        bad = torch.nonzero(drafted & ~(q > 0))
        if bad.numel():
            b, j = (int(i) for i in bad[0])
            token = drafts[b][j]
            raise ValueError(
                f"draft_probs[{b}, {j}, {token}] = {float(q[b, j])}: drafted token {token} has no "
                "probability, so it cannot have been sampled from these draft_probs"
            )
