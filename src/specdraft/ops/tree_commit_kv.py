"""`tree_commit_kv`: after tree verification, the accepted path's KV moved into the
contiguous slots a chain would have written, in place, in every layer's cache at
once (a launch per 8 caches: one per layer and a serial depth loop were 139 µs of
an 8B-shaped target's tree iteration). One program per (request, feature block);
the reference is the same moves in torch."""

from collections.abc import Sequence

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, check_tensor_arg
from specdraft.value_checks import check_in_range

from .backend import NAMESPACE, cdiv, power_of_two_tile, tl, triton, use_triton

COMMIT_BLOCK = 128  # cache features a tree_commit_kv program copies (of every depth and cache: in registers)
COMMIT_CACHES = 8  # caches one tree_commit_kv launch moves (its kernel's cache arguments)


@triton.jit
def tree_commit_kv_kernel(
    c0, c1, c2, c3, c4, c5, c6, c7, src_ptr, dst_ptr, depth, slots, features,
    NUM: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Request b's moves over one block of the features (K and V of every head) of
    NUM caches (c0 .. c{NUM-1}; the rest are not touched), each [2, slots,
    features / 2] contiguous: every source read, a barrier, every destination
    written, so a move reads the cache as it was before the commit."""
    b = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    half = features // 2
    offset = (f // half) * slots * half + f % half  # [K or V, slot 0, feature]
    d = tl.arange(0, D_PAD)
    real = d < depth
    # Clamped into the cache: a slot outside it (out of contract) never reaches memory.
    src = tl.minimum(tl.maximum(tl.load(src_ptr + b * depth + d, mask=real, other=0).to(tl.int64), 0), slots - 1)
    dst = tl.minimum(tl.maximum(tl.load(dst_ptr + b * depth + d, mask=real, other=0).to(tl.int64), 0), slots - 1)
    mask = real[:, None] & (f < features)[None, :]
    read = offset[None, :] + src[:, None] * half
    write = offset[None, :] + dst[:, None] * half
    v0 = tl.load(c0 + read, mask=mask)
    if NUM > 1:
        v1 = tl.load(c1 + read, mask=mask)
    if NUM > 2:
        v2 = tl.load(c2 + read, mask=mask)
    if NUM > 3:
        v3 = tl.load(c3 + read, mask=mask)
    if NUM > 4:
        v4 = tl.load(c4 + read, mask=mask)
    if NUM > 5:
        v5 = tl.load(c5 + read, mask=mask)
    if NUM > 6:
        v6 = tl.load(c6 + read, mask=mask)
    if NUM > 7:
        v7 = tl.load(c7 + read, mask=mask)
    tl.debug_barrier()  # one depth's destination may be another's source, read by another thread
    tl.store(c0 + write, v0, mask=mask)
    if NUM > 1:
        tl.store(c1 + write, v1, mask=mask)
    if NUM > 2:
        tl.store(c2 + write, v2, mask=mask)
    if NUM > 3:
        tl.store(c3 + write, v3, mask=mask)
    if NUM > 4:
        tl.store(c4 + write, v4, mask=mask)
    if NUM > 5:
        tl.store(c5 + write, v5, mask=mask)
    if NUM > 6:
        tl.store(c6 + write, v6, mask=mask)
    if NUM > 7:
        tl.store(c7 + write, v7, mask=mask)


def tree_commit_kv_reference(caches: list[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    """Every source read (index_select copies), then every destination written."""
    for cache in caches:
        flat = cache.view(2, -1, cache.shape[-2], cache.shape[-1])
        last = flat.shape[1] - 1
        src, dst = src_slots.long().clamp(0, last).flatten(), dst_slots.long().clamp(0, last).flatten()
        flat.index_copy_(1, dst, flat.index_select(1, src))


@triton_op(f"{NAMESPACE}::tree_commit_kv", mutates_args=("caches",))
def _tree_commit_kv_op(caches: list[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    if not use_triton(caches[0]):
        tree_commit_kv_reference(caches, src_slots, dst_slots)
        return
    batch, depth = src_slots.shape
    two, blocks, block_size, heads, dim = caches[0].shape
    features = two * heads * dim
    if batch == 0 or depth == 0:
        return
    for start in range(0, len(caches), COMMIT_CACHES):
        group = caches[start : start + COMMIT_CACHES]
        unused = [group[0]] * (COMMIT_CACHES - len(group))  # never read or written (NUM)
        wrap_triton(tree_commit_kv_kernel)[(batch, cdiv(features, COMMIT_BLOCK))](
            *group, *unused, src_slots, dst_slots, depth, blocks * block_size, features, NUM=len(group),
            D_PAD=power_of_two_tile(depth, smallest=2), BLOCK=COMMIT_BLOCK,
        )  # fmt: skip


def tree_commit_kv(
    cache: torch.Tensor | Sequence[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor
) -> None:
    """Move KV slots of paged caches in place: for each request b and depth d, slot
    src_slots[b, d] is copied to dst_slots[b, d] (K and V, every head), in one cache
    or in each of several (every layer's) alike.

    Contract: every move reads the cache as it was before the call (all sources are
    read, then all destinations written), so one depth's destination may be another's
    source; requests touch disjoint slots, and the destinations of one request are
    distinct, except that a move onto itself (a no-op, which is how a shorter accepted
    path pads its row) may share its slot with another move's source. Slots outside
    the cache raise a ValueError in checked mode (specdraft.checked_mode); outside it
    they are clamped into the cache, never written out of bounds.

    Args:
        cache: [2, num_blocks, block_size, kv_heads, head_dim], contiguous, any float
            dtype; or a non-empty list of such caches of one shape, dtype and device.
        src_slots: [B, D] int32/int64, slots in [0, num_blocks * block_size).
        dst_slots: [B, D] int32/int64, likewise.
    """
    caches = [cache] if isinstance(cache, torch.Tensor) else list(cache)
    if not caches:
        raise ValueError("cache must be a tensor or a non-empty list of tensors, got an empty list")
    check_tensor_arg("cache", caches[0], FLOAT_DTYPES, shape=(2, None, None, None, None), contiguous=True)
    for i, other in enumerate(caches[1:], start=1):
        check_tensor_arg(f"cache[{i}]", other, caches[0].dtype, shape=tuple(caches[0].shape), contiguous=True,
                         device_of=caches[0])  # fmt: skip
    check_tensor_arg("src_slots", src_slots, INDEX_DTYPES, shape=(None, None), contiguous=True, device_of=caches[0])
    check_tensor_arg("dst_slots", dst_slots, INDEX_DTYPES, shape=tuple(src_slots.shape), contiguous=True,
                     device_of=caches[0])  # fmt: skip
    if is_checked():
        num_slots = caches[0].shape[1] * caches[0].shape[2]  # num_blocks * block_size
        check_in_range("src_slots", src_slots, 0, num_slots)
        check_in_range("dst_slots", dst_slots, 0, num_slots)
    _tree_commit_kv_op(caches, src_slots, dst_slots)
