"""`rejection_sample`: the registered op (CUDA tensors run kernel.py's chain kernel
between verify_kernels.py's statistics and race passes, CPU tensors reference.py),
its public wrapper, and checked mode's value checks."""

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_tensor_arg

from ...backend import NAMESPACE, cdiv, use_triton
from ...common.fastmath import FAST_LOG2
from ..draft import (
    check_draft_sample_values,
    check_logit_cut_arg,
    check_logit_cut_values,
)
from ..noise import (
    STREAM_ACCEPT,
    STREAM_SAMPLE,
    check_request_params,
    check_salt,
    salt_key,
)
from ..tiles import RS_LARGE_FROM, RS_TILES_LARGE, RS_TILES_SMALL, SPLIT_BLOCK
from ..verify_kernels import race_finish_kernel, target_stats_kernel
from .kernel import rs_chain_kernel
from .reference import rejection_sample_reference


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
    wrap_triton(rs_chain_kernel)[(num_reqs, num_splits)](
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
