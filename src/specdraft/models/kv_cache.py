"""Paged KV cache: one tensor per attention layer, [2, num_blocks, block_size,
num_kv_heads, head_dim] (keys at [0], values at [1]), the layout vLLM's engines hand
to their layers. A token's slot is block_id * block_size + offset; PADDING_SLOT_ID
(-1) means "do not store".
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
    return (2, num_blocks, block_size, num_kv_heads, head_dim)


def allocate_kv_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
) -> list[torch.Tensor]:
    """Zero-filled caches, one per layer (zeros: an unwritten slot is finite, although
    attention never reads one)."""
    for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    shape = kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]


def check_kv_cache(name: str, kv_cache: torch.Tensor) -> None:
    if not isinstance(kv_cache, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(kv_cache).__name__}")
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(
            f"{name} must have shape [2, num_blocks, block_size, kv_heads, head_dim], got {tuple(kv_cache.shape)}"
        )
    if not kv_cache.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def flat_slots(kv_cache: torch.Tensor) -> torch.Tensor:
    """[2, num_blocks * block_size, kv_heads, head_dim] view: a slot indexes dim 1."""
    two, blocks, block_size, heads, dim = kv_cache.shape
    return kv_cache.view(two, blocks * block_size, heads, dim)


class SlotWrites(NamedTuple):
    """Where a pass's T rows of keys / values go in caches of one shape
    (`plan_slot_writes`), computed once and used by every layer's write
    (`write_planned`): the index_put_ indices [2, T] (K or V, block, offset), which
    row each write carries [T], and whether any row was valid []."""

    half: torch.Tensor
    block: torch.Tensor
    offset: torch.Tensor
    source_row: torch.Tensor
    any_valid: torch.Tensor


def plan_slot_writes(slot_mapping: torch.Tensor, num_blocks: int, block_size: int) -> SlotWrites:
    """The writes of rows to slot_mapping [T] in caches of num_blocks blocks of
    block_size slots. Slots that are negative (PADDING_SLOT_ID) or past the cache are
    skipped, without a mask that changes shapes: such rows are redirected to the slot
    of the first valid row *carrying that row's own key and value*, so the duplicate
    writes all store identical bytes and the result does not depend on which write
    lands last. With no valid row at all every row rewrites slot 0 with its current
    contents (write_planned)."""
    slots = slot_mapping.to(torch.int64)
    valid = (slots >= 0) & (slots < num_blocks * block_size)
    # index_select with a [1] tensor, not slots[first]: a 0-d index would be read on
    # the host (a data-dependent int under torch.compile).
    first = torch.argmax(valid.to(torch.int32)).view(1)  # 0 when no row is valid
    any_valid = valid.any()
    index = torch.where(valid, slots, torch.where(any_valid, slots.index_select(0, first), 0))
    source_row = torch.where(valid, torch.arange(slots.shape[0], device=slots.device), first)
    half = torch.arange(2, device=slots.device)[:, None].expand(2, slots.shape[0])
    block, offset = (index // block_size).expand(2, -1), (index % block_size).expand(2, -1)
    return SlotWrites(half, block, offset, source_row, any_valid)


def write_planned(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, writes: SlotWrites) -> None:
    """Store key / value [T, kv_heads, head_dim] where `writes` (plan_slot_writes,
    for this cache's shape) sends them, in place."""
    rows = torch.stack([key, value]).to(kv_cache.dtype).index_select(1, writes.source_row)  # [2, T, heads, dim]
    # index_select, not kv_cache[:, :1]: torch 2.11's Inductor cannot lower a slice
    # view of the buffer this function then writes into (NotImplementedError: SliceView).
    zero = torch.zeros(1, dtype=torch.int64, device=kv_cache.device)
    slot_zero = kv_cache.index_select(1, zero).index_select(2, zero).view(2, 1, *kv_cache.shape[3:])
    source = torch.where(writes.any_valid, rows, slot_zero)
    # One index_put_ on the cache itself, not index_copy_ on a reshaped view of it:
    # Inductor rewrites a view's mutation as "compute a new cache, copy it all back",
    # a full-cache copy per compiled call; an index_put_ on the input stays a scatter.
    kv_cache.index_put_((writes.half, writes.block, writes.offset), source)


def check_kv_write(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """ValueErrors naming the argument for write_kv_cache's inputs."""
    check_kv_cache("kv_cache", kv_cache)
    if key.shape != value.shape or key.dim() != 3 or tuple(key.shape[1:]) != tuple(kv_cache.shape[3:]):
        raise ValueError(
            f"key and value must both have shape [T, {kv_cache.shape[3]}, {kv_cache.shape[4]}], "
            f"got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping must have shape [{key.shape[0]}], got {tuple(slot_mapping.shape)}")


def write_kv_cache(
    kv_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    writes: SlotWrites | None = None,
) -> None:
    """Store key / value [T, kv_heads, head_dim] at slot_mapping [T], in place; rows
    whose slot is negative (PADDING_SLOT_ID) or past the cache are skipped (see
    plan_slot_writes for how, without a data-dependent shape). `writes`: the plan of
    slot_mapping for this cache's shape where the caller made it once for several
    caches (a pass's layers); None plans here."""
    check_kv_write(kv_cache, key, value, slot_mapping)
    if key.shape[0] == 0:
        return
    if writes is None:
        writes = plan_slot_writes(slot_mapping, *kv_cache.shape[1:3])
    write_planned(kv_cache, key, value, writes)
