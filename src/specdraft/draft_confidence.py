"""The draft's confidence at a drafted position: what budgeted verification ranks a
chain's and a block's drafts by (specdraft.generation.budget), in serving (the
proposers) and offline (specdraft.training's budget curve) alike. Torch only, so
both layers read the one definition."""

import torch


def row_confidence(logits: torch.Tensor, temperature: torch.Tensor | None,
                   cut: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """[rows] fp32: the largest probability of each row's distribution, softmax(logits
    / T) over the logits >= the row's cut (its truncation) when given, T = 1 where the
    row drafts greedily (T not > 0, or temperature None). A greedy draft's probability
    of its own token; budgeted verification ranks positions by it.

    Not the probability of the token drafted: at T > 0 that depends on which token was
    drawn, and verifying a draft only when its own token is likely biases what
    rejection sampling emits (accepted drafts would over-represent likely tokens).
    This depends on the row (the context) alone, so deciding by it keeps rejection
    sampling exact."""
    scaled = logits.float()
    if cut is not None:
        scaled = torch.where(scaled >= cut[:, None], scaled, float("-inf"))
    if temperature is not None:
        scaled = scaled / torch.where(temperature > 0, temperature, 1.0)[:, None]
    return (scaled.amax(dim=-1) - torch.logsumexp(scaled, dim=-1)).exp()
