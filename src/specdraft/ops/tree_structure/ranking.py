"""The stable ranking the torch references of tree_expand and tree_select share
(their kernels rank by the same counting, in registers)."""

import torch


def stable_rank(scores: torch.Tensor) -> torch.Tensor:
    """[B, P] int64: each score's place in (descending score, then ascending index)
    order, a permutation of 0 .. P - 1 per row (NaN ranks as -inf). By counting, not
    sorting: torch 2.11's Inductor lowers a CUDA sort of a non-power-of-two row (the
    pool's 68 nodes at depth 5, topk 4) to a kernel that indexed past the row (a
    device-side assert), and P <= 456 keeps the [B, P, P] comparison small."""
    s = torch.nan_to_num(scores.float(), nan=float("-inf"))
    index = torch.arange(s.shape[-1], device=s.device)
    ahead = (s[..., None, :] > s[..., :, None]) | (
        (s[..., None, :] == s[..., :, None]) & (index[None, :] < index[:, None])
    )  # [B, i, j]: j comes before i
    return ahead.sum(dim=-1)


def rows_of_rank(rank: torch.Tensor, k: int) -> torch.Tensor:
    """[B, k]: the index holding each place 0 .. k - 1 (rank a permutation per row)."""
    index = torch.arange(rank.shape[-1], device=rank.device)
    places = torch.arange(k, device=rank.device)
    return ((rank[..., None, :] == places[:, None]).long() * index).sum(dim=-1)
