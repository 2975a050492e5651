"""One autoregressive draft step's metadata (vLLM's
`eagle_step_slot_mapping_metadata_kernel` and its propose loop's clamping).

Per request b < B, with i = the new token's index in its sequence:

    i                        = seq_index[b] + 1 with M-RoPE, else positions[b] + 1
    positions[:, b]         += 1                      (the running positions, never clamped)
    seq_index[b]            += 1                      (M-RoPE: the running index, never clamped)
    clamp                    = i >= max_model_len     (or i < 0: out of contract, treated alike)
    clamped_positions[:, b]  = 0 if clamp else positions[:, b]
    slot_mapping[b]          = PAD if clamp else
                               block_table[b, min(i // block_size, W - 1)] * block_size + i % block_size
    seq_lens[b]              = 1 if clamp else min(seq_lens[b] + 1, max_model_len)

and slot_mapping[b] = PAD for B <= b < len(slot_mapping) (CUDA-graph padding).

The KV slot and the max_model_len clamp belong to the token's index in the
sequence. With 1-D RoPE that is the position. M-RoPE positions [3, B] are rotary
coordinates, compressed over images (an image of n tokens advances the temporal row
by far less than n), so no row of them is the index: the caller passes it as
`seq_index` (the fed token's, i.e. seq_len - 1 before the first step; vLLM takes
row 0, which sends a request past an image to another sequence's slots). It is a
buffer of its own rather than read from seq_lens because seq_lens becomes 1 on a
clamp, and the next step must still know the request is past max_model_len. When
every row equals the index, M-RoPE gives exactly the 1-D results.

In place, into the caller's buffers, which is what a CUDA-graph engine wants. The
running positions (and seq_index) stay unclamped so that k steps equal one jump of
k with the same clamp rule; the model reads `clamped_positions`. (vLLM's fused
kernel writes only the clamped positions, and its propose loop keeps
`positions += 1` as a separate launch; writing the clamped value back into the
running buffer would restart a request past max_model_len at position 1 and write
its KV into its own block 0.)
"""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import INDEX_DTYPES, at_least, between, check_all_distinct, check_int_range, check_tensor_arg
from specdraft.layout import PADDING_SLOT_ID

from .backend import NAMESPACE, cdiv, tl, triton, use_triton

BLOCK_REQS = 128
MAX_POSITION_ROWS = 3


@triton.jit
def _step_metadata_kernel(
    positions_ptr,
    clamped_ptr,
    seq_lens_ptr,
    seq_index_ptr,
    block_table_ptr,
    slot_mapping_ptr,
    positions_row_stride,
    clamped_row_stride,
    block_table_stride_req,
    block_table_stride_blk,
    num_reqs,
    num_slots,
    num_blocks_per_req,
    max_model_len,
    block_size,
    num_rows,
    HAS_SEQ_INDEX: tl.constexpr,
    PAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """block_size and the row count are runtime values, not constexprs: under
    dynamic=True they arrive as symbols, and a constexpr must be concrete."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = r < num_reqs
    if HAS_SEQ_INDEX:
        index = tl.load(seq_index_ptr + r, mask=real, other=0).to(tl.int64) + 1
        tl.store(seq_index_ptr + r, index.to(seq_index_ptr.dtype.element_ty), mask=real)
    else:
        index = tl.load(positions_ptr + r, mask=real, other=0).to(tl.int64) + 1
    clamp = (index >= max_model_len) | (index < 0)
    for row in range(0, num_rows):
        row_pos = tl.load(positions_ptr + row * positions_row_stride + r, mask=real, other=0) + 1
        tl.store(positions_ptr + row * positions_row_stride + r, row_pos, mask=real)
        tl.store(clamped_ptr + row * clamped_row_stride + r, tl.where(clamp, 0, row_pos), mask=real)

    pos = tl.where(clamp, 0, index)
    blk = tl.minimum(pos // block_size, num_blocks_per_req - 1)
    block_offs = r.to(tl.int64) * block_table_stride_req + blk * block_table_stride_blk
    block_id = tl.load(block_table_ptr + block_offs, mask=real & ~clamp, other=0).to(tl.int64)
    slot = tl.where(clamp | ~real, PAD, block_id * block_size + pos % block_size)
    tl.store(slot_mapping_ptr + r, slot.to(slot_mapping_ptr.dtype.element_ty), mask=r < num_slots)

    seq_len = tl.load(seq_lens_ptr + r, mask=real, other=0).to(tl.int64)
    new_seq_len = tl.where(clamp, 1, tl.minimum(seq_len + 1, max_model_len))
    tl.store(seq_lens_ptr + r, new_seq_len.to(seq_lens_ptr.dtype.element_ty), mask=real)


def step_metadata_reference(
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    clamped_positions: torch.Tensor,
    block_size: int,
    max_model_len: int,
    seq_index: torch.Tensor | None = None,
) -> None:
    num_reqs = positions.shape[-1]
    advanced = positions + 1
    index = (positions if seq_index is None else seq_index).long() + 1
    clamp = (index >= max_model_len) | (index < 0)
    pos = torch.where(clamp, 0, index)
    blk = (pos // block_size).clamp(max=block_table.shape[1] - 1)
    block_ids = torch.gather(block_table[:num_reqs], 1, blk[:, None]).squeeze(1).long()
    slots = torch.where(clamp, PADDING_SLOT_ID, block_ids * block_size + pos % block_size)
    new_seq_lens = torch.where(clamp, 1, (seq_lens.long() + 1).clamp(max=max_model_len))

    positions.copy_(advanced)
    if seq_index is not None:
        seq_index.copy_(index)
    clamped_positions.copy_(torch.where(clamp, 0, advanced))
    seq_lens.copy_(new_seq_lens)
    slot_mapping[:num_reqs].copy_(slots)
    slot_mapping[num_reqs:].fill_(PADDING_SLOT_ID)


def _run_step_metadata(
    positions, seq_lens, block_table, slot_mapping, clamped_positions, block_size, max_model_len, seq_index
) -> None:
    if not use_triton(positions):
        step_metadata_reference(
            positions, seq_lens, block_table, slot_mapping, clamped_positions, block_size, max_model_len, seq_index
        )
        return
    num_reqs, num_slots = positions.shape[-1], slot_mapping.shape[0]
    num_rows = positions.shape[0] if positions.dim() == 2 else 1
    if num_slots == 0:
        return
    wrap_triton(_step_metadata_kernel)[(cdiv(num_slots, BLOCK_REQS),)](
        positions, clamped_positions, seq_lens, seq_lens if seq_index is None else seq_index, block_table, slot_mapping,
        positions.stride(0) if num_rows > 1 else 0, clamped_positions.stride(0) if num_rows > 1 else 0,
        block_table.stride(0), block_table.stride(1),
        num_reqs, num_slots, block_table.shape[1], max_model_len, block_size, num_rows,
        HAS_SEQ_INDEX=seq_index is not None, PAD=PADDING_SLOT_ID, BLOCK=BLOCK_REQS,
    )  # fmt: skip


# Two ops rather than one with an optional mutated seq_index: torch 2.11's autograd
# wrapper for custom ops indexes every mutated argument, and a None one fails there.
@triton_op(f"{NAMESPACE}::step_metadata", mutates_args=("positions", "seq_lens", "slot_mapping", "clamped_positions"))
def _step_metadata_op(
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    clamped_positions: torch.Tensor,
    block_size: int,
    max_model_len: int,
) -> None:
    _run_step_metadata(
        positions, seq_lens, block_table, slot_mapping, clamped_positions, block_size, max_model_len, None
    )


@triton_op(
    f"{NAMESPACE}::step_metadata_indexed",
    mutates_args=("positions", "seq_lens", "slot_mapping", "clamped_positions", "seq_index"),
)
def _step_metadata_indexed_op(
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    clamped_positions: torch.Tensor,
    block_size: int,
    max_model_len: int,
    seq_index: torch.Tensor,
) -> None:
    _run_step_metadata(
        positions, seq_lens, block_table, slot_mapping, clamped_positions, block_size, max_model_len, seq_index
    )


def step_metadata(
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    clamped_positions: torch.Tensor,
    *,
    block_size: int,
    max_model_len: int,
    seq_index: torch.Tensor | None = None,
) -> None:
    """Advance one draft step, in place (see the module docstring for the rule).

    Written: positions, seq_lens, slot_mapping, clamped_positions, seq_index; nothing
    else. One launch, no host sync. Aliased buffers (e.g. clamped_positions the same
    tensor as positions) are refused with a ValueError.

    Args:
        positions: [B] or M-RoPE [3, B] int32/int64, the running positions; advanced by 1
            (all rows together). 1-D positions are the sequence index: they decide the
            slot and the clamp. Rows may be strided views (e.g. `mrope_positions[:, :B]`)
            as long as each row is contiguous.
        seq_lens: [B] int32/int64, updated in place (the fed token's index + 1: a batch
            whose seq_lens disagree with the index gets the slot of the index).
        block_table: [>= B, W] int32/int64, W >= 1; row b holds request b's KV blocks.
        slot_mapping: [N >= B] int32/int64, written whole: rows past B get PAD (-1).
        clamped_positions: like positions (same shape and dtype, a different buffer):
            written with the positions the model should read (0 where clamped).
        block_size: Python int >= 1.
        max_model_len: Python int >= 1.
        seq_index: [B] int32/int64, or None; required with M-RoPE positions (and allowed
            with 1-D ones, where it replaces them as the index): the running index in its
            sequence of the token fed this step (seq_len - 1 before the first step);
            advanced by 1 in place, never clamped. The new token's slot and clamp come
            from seq_index + 1.

    Returns:
        None; the buffers above are written in place.

    Out of contract (unchecked mode): a negative index clamps like one past
    max_model_len (position 0, PAD slot); the block number is capped at the last
    column, so the table is never read outside; a block id outside the KV cache
    gives a slot outside it, which write_kv_cache skips.
    """
    check_tensor_arg(
        "positions", positions, INDEX_DTYPES, shape=[(None,), (between(1, MAX_POSITION_ROWS, "R"), None)],
        contiguous="rows",
    )  # fmt: skip
    num_reqs = positions.shape[-1]
    check_tensor_arg(
        "clamped_positions", clamped_positions, positions.dtype, shape=tuple(positions.shape), contiguous="rows",
        device_of=positions,
    )  # fmt: skip
    check_tensor_arg("seq_lens", seq_lens, INDEX_DTYPES, shape=(num_reqs,), contiguous="rows", device_of=positions)
    if positions.dim() == 2 and seq_index is None:
        raise ValueError(
            "seq_index is required with M-RoPE positions [R, B]: the rotary rows are compressed over images, so "
            "none of them is the token's index in the sequence (which decides its KV slot and the clamp)"
        )
    check_tensor_arg(
        "seq_index", seq_index, INDEX_DTYPES, shape=(num_reqs,), contiguous="rows", device_of=positions, optional=True
    )
    check_tensor_arg(
        "block_table", block_table, INDEX_DTYPES, shape=(at_least(num_reqs, "B"), at_least(1, "W")), device_of=positions
    )
    check_tensor_arg(
        "slot_mapping", slot_mapping, INDEX_DTYPES, shape=(at_least(num_reqs, "B"),), contiguous="rows",
        device_of=positions,
    )  # fmt: skip
    check_int_range("block_size", block_size, 1)
    check_int_range("max_model_len", max_model_len, 1)
    buffers = {"positions": positions, "seq_lens": seq_lens, "block_table": block_table, "slot_mapping": slot_mapping,
               "clamped_positions": clamped_positions}  # fmt: skip
    if seq_index is not None:
        buffers["seq_index"] = seq_index
    check_all_distinct(buffers)
    if is_checked():
        check_step_metadata_values(
            positions, seq_lens, block_table, max_model_len, block_size=block_size, seq_index=seq_index
        )
    args = (positions, seq_lens, block_table, slot_mapping, clamped_positions, block_size, max_model_len)
    if seq_index is None:
        _step_metadata_op(*args)
    else:
        _step_metadata_indexed_op(*args, seq_index)


# --------------------------------------------- checked mode's value checks (syncs)


def check_step_metadata_values(
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_model_len: int,
    *,
    block_size: int | None = None,
    seq_index: torch.Tensor | None = None,
) -> None:
    """A `step_metadata` input: positions (row 0) and seq_index non-negative, seq_lens
    >= 1, no negative block id in the rows of the batch, and no block written by two
    requests. With block_size, "written" means the block this step's token lands in
    (requests may share full prefix blocks, as prefix caching does); without it, any
    block shared by two requests is refused.

    seq_lens past max_model_len are accepted: a verify window may reach past it by K
    tokens, and the op caps them (min(seq_len + 1, max_model_len))."""
    first = (positions[0] if positions.dim() == 2 else positions).tolist()
    for b, p in enumerate(first):
        if p < 0:
            raise ValueError(f"positions[{b}] = {p} is negative")
    index = first if seq_index is None else seq_index.tolist()
    if seq_index is not None:
        for b, i in enumerate(index):
            if i < 0:
                raise ValueError(f"seq_index[{b}] = {i} is negative")
    for b, s in enumerate(seq_lens.tolist()):
        if s < 1:
            raise ValueError(f"seq_lens[{b}] = {s} must be >= 1")
    rows = block_table[: len(first)].tolist()
    owner: dict[int, int] = {}
    for b, row in enumerate(rows):
        for blk in row:
            if blk < 0:
                raise ValueError(f"block_table[{b}] holds a negative block id {blk}")
            if block_size is None and owner.setdefault(blk, b) != b:
                raise ValueError(f"block_table: block {blk} belongs to requests {owner[blk]} and {b}")
    if block_size is None:
        return
    held = {}
    for b, row in enumerate(rows):
        for blk in row:
            held.setdefault(blk, set()).add(b)
    for b, i in enumerate(index):
        new = i + 1
        if new >= max_model_len:
            continue  # clamped: writes nothing
        if new // block_size >= len(rows[b]):
            raise ValueError(
                f"block_table: request {b}'s next token at position {new} is in block column "
                f"{new // block_size}, past the table's {len(rows[b])} columns (block_size {block_size}); "
                "unchecked mode would write it into the last column's block"
            )
        blk = rows[b][new // block_size]
        others = held.get(blk, set()) - {b}
        if others:
            raise ValueError(
                f"block_table: request {b} writes block {blk} this step, which request {min(others)} also holds"
            )
