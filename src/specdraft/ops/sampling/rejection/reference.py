"""Rejection sampling in pure torch: the CPU path of the op and the oracle of its
kernels (the rules in the package docstring)."""

import torch

from ..draft import (
    argmax_skipping_nan,
    truncate_logits,
)
from ..noise import (
    STREAM_ACCEPT,
    STREAM_SAMPLE,
    exponential2_torch,
    gumbel2_torch,
    gumbel_gain_torch,
    noise_bits_torch,
    row_key_torch,
    salt_key,
    uniform_torch,
)


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
