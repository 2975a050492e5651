"""The bottom layer's vocabulary of batch layouts, shared by the ops and the library
above them (pure torch, no imports from specdraft)."""

from dataclasses import dataclass

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


def sequence_of(index: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The packed sequence each index falls in: i where cu_seqlens[i] <= index <
    cu_seqlens[i + 1]; -1 before cu_seqlens[0], S at or past cu_seqlens[-1] (callers
    clamp as their contract says). Counted over all S + 1 bounds rather than in the S
    ends cu_seqlens[1:]: that slice is size 1 for a single sequence, which a dynamic
    graph specialises on, compiling a second graph at S = 2."""
    return window_of(index, cu_seqlens) - 1


def position_rows(positions: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """positions[..., index] for 1-D [T] or M-RoPE [3, T] positions; index of any
    shape (the result has positions' leading dims, then index's shape)."""
    flat = positions.index_select(positions.dim() - 1, index.reshape(-1))
    return flat.view(*positions.shape[:-1], *index.shape)


@dataclass
class BatchMetadata:
    """One batch as the engine lays it out; the draft's passes, the attention layers
    and the proposers all read this one type.

    query_start_loc [B+1] int32: request b's tokens are rows query_start_loc[b] ..
    query_start_loc[b+1] - 1 of the packed batch; seq_lens [B] int32: each request's
    length including this pass's tokens; block_table [B, max_blocks] int32;
    slot_mapping [T] int64 (PADDING_SLOT_ID writes nothing). max_query_len: a Python
    int >= every query length; max_seq_len: a Python int >= every seq_len, or None
    for the block table's reach (width * block size). Both size static shapes, so no
    device value is ever read on the host. B and T come from the shapes.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int
    max_seq_len: int | None = None

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.shape[0]


@dataclass
class TreeBatchMetadata(BatchMetadata):
    """A target verify pass over a draft tree: N nodes per request (max_query_len =
    N, every query length N), node i of request b at sequence index prefix_lens[b] +
    i (its KV slot), seeing the request's first prefix_lens[b] keys and the nodes j
    with ancestors[b, i, j] (itself and its ancestors). A pass over the paged cache
    with this type runs tree attention (models.cache_attention picks it, outside
    the layers).

    packed: False for N rows per request (query_start_loc = b * N); True for a
    budgeted pass, whose request b sends only its first n_b <= N nodes (a subtree
    renumbered so that parents still come first), packed by query_start_loc into
    rows that may end in padding; max_query_len is N either way."""

    prefix_lens: torch.Tensor | None = None  # [B] int64
    ancestors: torch.Tensor | None = None  # [B, N, N] bool
    packed: bool = False


def resolve_max_seq_len(max_seq_len, block_table: torch.Tensor, block_size: int):
    """max_seq_len as given, or for None the block table's reach (width x block
    size): the one place that default is decided (attention and the proposers)."""
    return block_table.shape[1] * block_size if max_seq_len is None else max_seq_len
