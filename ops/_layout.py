"""Layout helpers shared by the references (pure torch)."""

import torch

# A slot_mapping entry that writes no KV (vLLM's value).
PADDING_SLOT_ID = -1


def window_of(index: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """The window each index falls in: how many window ends (exclusive, non-
    decreasing) are at or before it, i.e. torch.searchsorted(ends, index,
    right=True). Indices past the last end get len(ends); empty windows are skipped.

    A compare-and-count instead of searchsorted: torch 2.11's Inductor cannot lower
    searchsorted over a view such as query_start_loc[1:] (NotImplementedError:
    SliceView). The [N, B] comparison is reduced in one fused kernel when compiled."""
    return (ends[None, :] <= index[..., None]).sum(dim=-1)
