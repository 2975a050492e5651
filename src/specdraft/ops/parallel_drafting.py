"""Attention metadata for parallel drafting (vLLM's `extend_all_queries_by_N` and
the slot mapping its caller computes for the expanded layout).

- `extend_queries_by_n`: every request's query grows by N tokens, so
  query_start_loc[i] += N * i, seq_lens += N, and the host-side bounds
  max_query_len / max_seq_len grow by N (Python ints, no device read).
- `new_slot_mapping`: the KV-cache slot of every slot of the expanded layout (the
  output of `copy_and_expand_inputs`, windows given by the extended
  query_start_loc): block_table[r, min(p // block_size, width - 1)] * block_size +
  p % block_size at p = min(position, max_model_len - 1); PADDING_SLOT_ID where the
  position is >= max_model_len, the slot is rejected, or it lies past the batch.

vLLM finds each slot's request with `repeat_interleave` over the new query lengths,
which needs the output size on the host (or syncs to get it); here one program per
request walks its own window, so no per-token request index is ever built.
"""

from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import INDEX_DTYPES, at_least, check_int_range, check_tensor_arg
from specdraft.layout import PADDING_SLOT_ID, window_of
from specdraft.value_checks import check_in_range, window_lengths

from .backend import NAMESPACE, cdiv, tl, triton, use_triton

BLOCK_TOKENS = 64
NUM_WARPS = 2
# Grid axis 1 is limited to 65535; programs stride over longer windows anyway.
MAX_TOKEN_BLOCKS = 4096
BLOCK_REQS = 1024


class ExtendedQueries(NamedTuple):
    query_start_loc: torch.Tensor  # [B+1], + N * arange(B + 1)
    seq_lens: torch.Tensor  # [B], + N
    max_query_len: int | None  # + N
    max_seq_len: int | None  # + N


# -------------------------------------------------------------------------- kernels


@triton.jit
def _new_slot_mapping_kernel(
    positions_ptr,
    rejected_ptr,
    query_start_loc_ptr,
    block_table_ptr,
    slot_mapping_ptr,
    num_reqs,
    num_tokens,
    block_table_stride0,
    block_table_stride1,
    blocks_per_req,
    max_model_len,
    BLOCK_SIZE: tl.constexpr,
    PAD_ID: tl.constexpr,
    HAS_REJECTED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Program (num_reqs, *) covers the tail past the batch, which is all padding.
    req = tl.program_id(0)
    is_req = req < num_reqs
    start = tl.load(query_start_loc_ptr + req).to(tl.int64)
    stop = tl.load(query_start_loc_ptr + req + 1, mask=is_req, other=num_tokens).to(tl.int64)
    # Clipped to [0, T]: the same tokens get written (stores are masked to [0, T)
    # anyway), but a garbage bound cannot make the strided loop run for ages.
    start = tl.minimum(tl.maximum(start, 0), num_tokens)
    stop = tl.minimum(tl.maximum(stop, start), num_tokens)
    row = block_table_ptr + tl.where(is_req, req, 0).to(tl.int64) * block_table_stride0  # tail: never read

    lanes = tl.arange(0, BLOCK).to(tl.int64)
    lo = tl.program_id(1).to(tl.int64) * BLOCK
    step = tl.num_programs(1).to(tl.int64) * BLOCK
    for j0 in range(lo, stop - start, step):  # strided: any grid covers the window
        tok = start + j0 + lanes
        write = (tok < stop) & (tok >= 0) & (tok < num_tokens)
        pos = tl.load(positions_ptr + tok, mask=write, other=0).to(tl.int64)
        clamped = tl.minimum(tl.maximum(pos, 0), max_model_len - 1)
        block_idx = tl.minimum(clamped // BLOCK_SIZE, blocks_per_req - 1)
        # The tail has no block-table row (and B may be 0): no lookup there. A scalar &
        # vector mask trips the interpreter, hence the scalar bound.
        lookup = write & (lanes < tl.where(is_req, BLOCK, 0))
        block_id = tl.load(row + block_idx * block_table_stride1, mask=lookup, other=0).to(tl.int64)
        slot = block_id * BLOCK_SIZE + clamped % BLOCK_SIZE
        pad = (pos >= max_model_len) | (lanes >= tl.where(is_req, BLOCK, 0))
        if HAS_REJECTED:
            pad = pad | (tl.load(rejected_ptr + tok, mask=write, other=1) != 0)
        tl.store(slot_mapping_ptr + tok, tl.where(pad, PAD_ID, slot), mask=write)


@triton.jit
def _extend_queries_kernel(
    query_start_loc_ptr,
    seq_lens_ptr,
    query_start_loc_out_ptr,
    seq_lens_out_ptr,
    num_reqs,
    n,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_qsl = i <= num_reqs
    loc = tl.load(query_start_loc_ptr + i, mask=in_qsl, other=0)
    tl.store(query_start_loc_out_ptr + i, loc + n * i, mask=in_qsl)
    in_reqs = i < num_reqs
    seq_len = tl.load(seq_lens_ptr + i, mask=in_reqs, other=0)
    tl.store(seq_lens_out_ptr + i, seq_len + n, mask=in_reqs)


# ----------------------------------------------------------------------- references


def new_slot_mapping_reference(
    positions: torch.Tensor,
    is_rejected_token_mask: torch.Tensor | None,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    max_model_len: int,
) -> torch.Tensor:
    num_tokens, num_reqs = positions.shape[0], query_start_loc.shape[0] - 1
    token = torch.arange(num_tokens, device=positions.device)
    owner = window_of(token, query_start_loc[1:].long())
    past_batch = owner >= num_reqs
    pos = positions.long()
    clamped = pos.clamp(0, max_model_len - 1)
    block_idx = (clamped // block_size).clamp(max=block_table.shape[1] - 1)
    if num_reqs > 0:
        block_id = block_table[owner.clamp(max=num_reqs - 1), block_idx].long()
    else:
        block_id = torch.zeros_like(pos)
    slot = block_id * block_size + clamped % block_size
    pad = past_batch | (pos >= max_model_len)
    if is_rejected_token_mask is not None:
        pad = pad | is_rejected_token_mask
    return torch.where(pad, PADDING_SLOT_ID, slot)


def extend_queries_by_n_reference(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    steps = torch.arange(query_start_loc.shape[0], device=query_start_loc.device, dtype=query_start_loc.dtype)
    return query_start_loc + n * steps, seq_lens + n


# ------------------------------------------------------------------------------ ops


@triton_op(f"{NAMESPACE}::new_slot_mapping", mutates_args=())
def _new_slot_mapping_op(
    positions: torch.Tensor,
    is_rejected_token_mask: torch.Tensor | None,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    max_model_len: int,
    max_query_len: int,
) -> torch.Tensor:
    if not use_triton(positions):
        return new_slot_mapping_reference(
            positions, is_rejected_token_mask, query_start_loc, block_table, block_size, max_model_len
        )
    num_tokens, num_reqs = positions.shape[0], query_start_loc.shape[0] - 1
    slot_mapping = torch.empty(num_tokens, dtype=torch.int64, device=positions.device)
    token_blocks = torch.sym_min(torch.sym_max(1, cdiv(max_query_len, BLOCK_TOKENS)), MAX_TOKEN_BLOCKS)
    has_rejected = is_rejected_token_mask is not None
    wrap_triton(_new_slot_mapping_kernel)[(num_reqs + 1, token_blocks)](
        positions, is_rejected_token_mask if has_rejected else positions, query_start_loc, block_table,
        slot_mapping, num_reqs, num_tokens, block_table.stride(0), block_table.stride(1), block_table.shape[1],
        max_model_len,
        BLOCK_SIZE=block_size, PAD_ID=PADDING_SLOT_ID, HAS_REJECTED=has_rejected, BLOCK=BLOCK_TOKENS,
        num_warps=NUM_WARPS,
    )  # fmt: skip
    return slot_mapping


@triton_op(f"{NAMESPACE}::extend_queries_by_n", mutates_args=())
def _extend_queries_by_n_op(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(query_start_loc):
        return extend_queries_by_n_reference(query_start_loc, seq_lens, n)
    num_reqs = seq_lens.shape[0]
    query_start_loc_out = torch.empty_like(query_start_loc)
    seq_lens_out = torch.empty_like(seq_lens)
    wrap_triton(_extend_queries_kernel)[(cdiv(num_reqs + 1, BLOCK_REQS),)](
        query_start_loc, seq_lens, query_start_loc_out, seq_lens_out, num_reqs, n, BLOCK=BLOCK_REQS
    )
    return query_start_loc_out, seq_lens_out


# ---------------------------------------------------------------- public wrappers


def new_slot_mapping(
    positions: torch.Tensor,
    is_rejected_token_mask: torch.Tensor | None,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    *,
    block_size: int,
    max_model_len: int,
    max_query_len: int | None = None,
) -> torch.Tensor:
    """Slot mapping of the expanded parallel-drafting layout.

    slot = block_table[r, min(p // block_size, W - 1)] * block_size + p % block_size
    with p = min(position, max_model_len - 1); PADDING_SLOT_ID (-1) where position
    >= max_model_len, where the slot is rejected, and for slots past
    query_start_loc[-1].

    Args:
        positions: [T] int32/int64, contiguous, as returned by `copy_and_expand_inputs`.
            Sequence indices (for M-RoPE not the temporal row, which images compress: a
            slot there would belong to an earlier token).
        is_rejected_token_mask: [T] bool, or None (nothing rejected), as returned by
            `copy_and_expand_inputs`.
        query_start_loc: [B + 1] int32/int64. The *expanded* windows
            (`extend_queries_by_n(...).query_start_loc`), starting at 0.
        block_table: [B, W] int32/int64, W >= 1, any strides; one row per request.
        block_size: Python int >= 1.
        max_model_len: Python int >= 1.
        max_query_len: Python int >= 0, or None (T). Hint of the longest expanded window;
            sizes the grid only, results never depend on it.

    Returns:
        slot_mapping: [T] int64.

    Out of contract (unchecked mode): the block table is read only inside its
    shape (the block number is capped at W - 1, the row at B - 1); a block id
    outside the KV cache gives a slot outside it, which write_kv_cache skips.
    """
    check_tensor_arg("positions", positions, INDEX_DTYPES, rank=1, contiguous=True)
    num_tokens = positions.shape[0]
    check_tensor_arg(
        "is_rejected_token_mask", is_rejected_token_mask, torch.bool, shape=(num_tokens,), contiguous=True,
        device_of=positions, optional=True,
    )  # fmt: skip
    check_tensor_arg(
        "query_start_loc", query_start_loc, INDEX_DTYPES, shape=(at_least(1, "B + 1"),), contiguous=True,
        device_of=positions,
    )  # fmt: skip
    num_reqs = query_start_loc.shape[0] - 1
    check_tensor_arg("block_table", block_table, INDEX_DTYPES, shape=(num_reqs, at_least(1, "W")), device_of=positions)
    check_int_range("block_size", block_size, 1)
    check_int_range("max_model_len", max_model_len, 1)
    max_query_len = num_tokens if max_query_len is None else max_query_len
    check_int_range("max_query_len", max_query_len, 0)
    if is_checked():
        check_new_slot_mapping_values(
            positions, is_rejected_token_mask, query_start_loc, block_table, block_size, max_model_len
        )
    return _new_slot_mapping_op(
        positions, is_rejected_token_mask, query_start_loc, block_table, block_size, max_model_len, max_query_len
    )


def extend_queries_by_n(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    n: int,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
) -> ExtendedQueries:
    """Grow every request's query by n tokens (parallel drafting: n = P - shift).

    Inputs are left untouched. The token count of the extended batch is T + B * n,
    known from shapes.

    Args:
        query_start_loc: [B + 1] int32/int64, contiguous.
        seq_lens: [B] int32/int64, contiguous.
        n: Python int >= 0, the tokens added to each request.
        max_query_len: Python int >= 0, or None. Host-side bound of the query lengths.
        max_seq_len: Python int >= 0, or None. Host-side bound of seq_lens.

    Returns:
        ExtendedQueries:
            query_start_loc: [B + 1], dtype of query_start_loc. query_start_loc + n * arange(B + 1).
            seq_lens: [B], dtype of seq_lens. seq_lens + n.
            max_query_len: Python int max_query_len + n, or None.
            max_seq_len: Python int max_seq_len + n, or None.
    """
    check_tensor_arg("query_start_loc", query_start_loc, INDEX_DTYPES, shape=(at_least(1, "B + 1"),), contiguous=True)
    num_reqs = query_start_loc.shape[0] - 1
    check_tensor_arg("seq_lens", seq_lens, INDEX_DTYPES, shape=(num_reqs,), contiguous=True, device_of=query_start_loc)
    check_int_range("n", n, 0)
    check_int_range("max_query_len", max_query_len, 0, optional=True)
    check_int_range("max_seq_len", max_seq_len, 0, optional=True)
    if is_checked():
        check_extend_queries_values(query_start_loc, seq_lens)
    new_query_start_loc, new_seq_lens = _extend_queries_by_n_op(query_start_loc, seq_lens, n)
    return ExtendedQueries(
        new_query_start_loc,
        new_seq_lens,
        None if max_query_len is None else max_query_len + n,
        None if max_seq_len is None else max_seq_len + n,
    )


# --------------------------------------------- checked mode's value checks (syncs)


def check_new_slot_mapping_values(
    positions: torch.Tensor,
    is_rejected_token_mask: torch.Tensor | None,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    max_model_len: int,
) -> None:
    """new_slot_mapping: windows from 0, non-decreasing, within T; positions inside
    the windows non-negative; every block id a slot is taken from (tokens in a
    window, not rejected, below max_model_len) non-negative. Other entries of the
    table are not read, so they may hold anything (engines pad tables)."""
    lens = window_lengths(query_start_loc, positions.shape[0])
    total = sum(lens)
    pos = positions[:total].long().cpu()
    check_in_range("positions", pos, 0, None)
    if total == 0:
        return
    owner = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    wanted = pos.clamp(max=max_model_len - 1) // block_size
    used = pos < max_model_len
    if is_rejected_token_mask is not None:
        used = used & ~is_rejected_token_mask[:total].cpu()
    past = torch.nonzero(used & (wanted >= block_table.shape[1]))
    if past.numel():
        t = int(past[0, 0])
        raise ValueError(
            f"block_table: token {t} (request {int(owner[t])}) at position {int(pos[t])} is in block column "
            f"{int(wanted[t])}, past the table's {block_table.shape[1]} columns (block_size {block_size}); "
            "unchecked mode would take its slot from the last column's block"
        )
    column = wanted.clamp(max=block_table.shape[1] - 1)
    blocks = block_table.cpu().long()[owner, column]
    bad = torch.nonzero(used & (blocks < 0))
    if bad.numel():
        t = int(bad[0, 0])
        raise ValueError(
            f"block_table[{int(owner[t])}, {int(column[t])}] = {int(blocks[t])} is negative "
            f"(the block of token {t} at position {int(pos[t])})"
        )


def check_extend_queries_values(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """extend_queries_by_n: windows from 0, non-decreasing, each seq_len at least
    its window."""
    lens = window_lengths(query_start_loc)
    for b, s in enumerate(seq_lens.tolist()):
        if s < lens[b]:
            raise ValueError(f"seq_lens[{b}] = {s} is shorter than request {b}'s window of {lens[b]} tokens")
