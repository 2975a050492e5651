"""The torch reference of `budget_keep` (this package's docstring defines what it
computes): the CPU path and the kernel's oracle. A lexicographic order by two stable
sorts: by depth (the flat index b * N + i already ascending), then by value
descending."""

import torch


def budget_keep_reference(
    values: torch.Tensor, depths: torch.Tensor, budget: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    num_reqs, num_pos = values.shape
    flat = values.reshape(-1)
    eligible = flat >= 0
    # Eligible values as they order (-0.0 as 0.0); the ineligible after every one of them.
    score = torch.where(flat > 0, flat, torch.where(eligible, 0.0, -1.0))
    depth = depths.reshape(-1).clamp(0, num_pos)
    by_depth = torch.argsort(depth, stable=True)
    order = by_depth.gather(0, torch.argsort(score.gather(0, by_depth), descending=True, stable=True))
    rank = torch.zeros_like(order).scatter_(0, order, torch.arange(order.numel(), device=values.device))
    keep = (eligible & (rank < budget.clamp_min(0))).reshape(num_reqs, num_pos)
    return keep, keep.sum(1, dtype=torch.int32)
