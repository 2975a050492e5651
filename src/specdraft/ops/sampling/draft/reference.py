"""draft_sample in pure torch: the CPU path of the op and the oracle of its kernels
(the rules in the package docstring), and the pieces the other samplers' references
share (the NaN-skipping argmax, the cut)."""

import torch

from ..noise import STREAM_DRAFT, gumbel2_torch, gumbel_gain_torch, noise_bits_torch, row_key_torch, salt_key


def argmax_skipping_nan(keys: torch.Tensor) -> torch.Tensor:
    """keys.argmax(-1) with NaN ranked as -inf, as the kernels' argmax ranks it
    (ops/common/scan.py): torch.argmax takes NaN for the max, and a NaN logit is never
    among the tokens a cut keeps. The references' argmaxes all go through it."""
    return torch.where(torch.isnan(keys), float("-inf"), keys).argmax(-1)


def truncate_logits(logits: torch.Tensor, temperature: torch.Tensor, logit_cut: torch.Tensor | None) -> torch.Tensor:
    """logits in fp32, -inf where below the row's cut in sampled rows (T > 0); greedy
    rows and a None cut: unchanged. logits [..., V], temperature [B], logit_cut
    [B, ...] (one cut per row of logits)."""
    x = logits.float()
    if logit_cut is None:
        return x
    sampled = (temperature > 0).view(-1, *([1] * (logit_cut.dim() - 1)))
    below = (x < logit_cut[..., None]) & sampled[..., None]
    return torch.where(below, float("-inf"), x)


def scaled_logits(logits: torch.Tensor, temperature: torch.Tensor):
    """(logits / T in fp32, greedy mask); greedy rows are divided by 1."""
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    return logits.float() / scale[:, None], greedy


def draft_sample_reference(logits, temperature, seeds, positions, salt: int = 0, logit_cut=None) -> torch.Tensor:
    token = torch.arange(logits.shape[-1], device=logits.device)
    key = row_key_torch(seeds, positions, salt_key(salt, STREAM_DRAFT))
    bits = noise_bits_torch(key[:, None], token)
    keys = truncate_logits(logits, temperature, logit_cut) * gumbel_gain_torch(temperature)[:, None]
    keys = torch.where((temperature <= 0)[:, None], keys, keys + gumbel2_torch(bits))
    return argmax_skipping_nan(keys).to(torch.int32)


def store_step_reference(out: torch.Tensor, step: torch.Tensor, values: torch.Tensor) -> None:
    """out[:, step] = values when 0 <= step < K, else nothing; no host sync.

    A whole-buffer select rather than index_copy_ at a clamped step: under
    Inductor (torch 2.13, CPU) the index_copy_ form was miscompiled, a later op in
    the same graph read the buffer's old values."""
    steps = torch.arange(out.shape[1], device=out.device)
    out.copy_(torch.where((steps == step)[None, :, None], values.unsqueeze(1).to(out.dtype), out))


def draft_sample_store_reference(
    logits, temperature, seeds, positions, out, step, salt: int, write_probs: bool, logit_cut=None
):
    tokens = draft_sample_reference(logits, temperature, seeds, positions, salt, logit_cut)
    z, _ = scaled_logits(truncate_logits(logits, temperature, logit_cut), temperature)
    store_step_reference(out, step, torch.softmax(z, -1) if write_probs else z)
    return tokens
