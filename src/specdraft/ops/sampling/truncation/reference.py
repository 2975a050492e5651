"""The torch reference of `truncation_cut` (this package's docstring defines the
cut): the CPU path and the kernel's oracle. Sort-based, vectorised over the rows, no
host sync (every row computes every step; a row's switches pick the result)."""

import torch


def min_p_threshold_reference(
    top: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor, on: torch.Tensor
) -> torch.Tensor:
    """The smallest fp32 t >= top + T * ln(min_p), the sum in fp64 (min_p above 1
    counts as 1, whose log is 0 exactly); -inf where min-p is off or the sum is NaN."""
    ratio = min_p.clamp(max=1.0).double()
    span = torch.where(ratio >= 1.0, 0.0, temperature.double() * torch.log(ratio))
    exact = top.double() + span
    thr = exact.float()
    thr = torch.where(thr.double() < exact, torch.nextafter(thr, torch.full_like(thr, float("inf"))), thr)
    return torch.where(on & ~torch.isnan(exact), thr, float("-inf"))


def truncation_cut_reference(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    x = logits.float()
    x = torch.where(torch.isnan(x), float("-inf"), x)
    vocab = x.shape[-1]
    top = x.amax(-1)
    top_k = top_k.long()
    top_k_on = (top_k > 0) & (top_k < vocab)
    top_p_on = top_p < 1.0
    min_p_on = min_p > 0.0
    truncated = (temperature > 0) & (temperature < float("inf")) & (top_k_on | top_p_on | min_p_on)
    truncated = truncated & (top > float("-inf"))

    # min-p: the candidates, sorted.
    thr = min_p_threshold_reference(top, temperature, min_p, min_p_on)
    candidate = (x >= thr[:, None]) & (x > float("-inf"))
    values = torch.where(candidate, x, float("-inf")).sort(-1, descending=True).values
    last = (candidate.sum(-1) - 1).clamp(min=0)

    # top-k: the k-th largest candidate, or the smallest where there are fewer.
    kth = torch.where(top_k_on, torch.minimum(top_k - 1, last), last)
    cut_k = values.gather(-1, kth[:, None])

    # top-p over the candidates >= cut_k: the largest value c whose candidates >= c
    # weigh >= top_p * the total. The first entry whose cumulative mass passes lies
    # in that c's tie group (the cumulative mass only grows, and the group before
    # closed below the bar), so the per-entry sum finds the threshold rule's cut.
    scale = torch.where(truncated, temperature, 1.0)[:, None]
    weights = torch.where(values == top[:, None], 1.0, torch.exp((values - top[:, None]) / scale))
    weights = torch.where(values >= cut_k, weights, 0.0)
    mass = weights.double().cumsum(-1)  # fp32 over 152k entries drifts by ~1e-5 of the total
    passing = (values >= cut_k) & (mass >= top_p.double()[:, None] * mass[:, -1:])
    cut_p = values.gather(-1, passing.int().argmax(-1, keepdim=True))

    cut = torch.where(top_p_on[:, None], cut_p, cut_k)[:, 0]
    return torch.where(truncated, cut, float("-inf"))
