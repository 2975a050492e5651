"""The torch reference of `vocab_metrics` (this package's docstring defines what it
computes): the CPU path and the kernel's oracle."""

import torch

# The reference's rows per chunk in eager mode: about 4M elements per fp32 temporary.
REFERENCE_CHUNK_ELEMENTS = 1 << 22


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
