"""`masked_paged_attention`, the registered op and its public wrapper: CUDA tensors
run kernel.py's kernels, CPU tensors reference.py's torch."""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.value_checks import check_in_range

from ..backend import NAMESPACE, TRITON_INTERPRET, cdiv, power_of_two_tile, use_triton
from .kernel import combine_kernel, split_kernel
from .reference import masked_paged_attention_reference

# Keys per tile, and per pass-1 program (a split): at L = 1,040, 9 splits, so B = 1
# with 8 kv heads runs 72 programs instead of 8. The interpreter emulates every lane
# in NumPy: small tiles keep it fast and make test sequences span several splits.
BLOCK_L = 16 if TRITON_INTERPRET else 64
SPLIT_LEN = 32 if TRITON_INTERPRET else 128
MAX_ROWS = 64  # query rows (group x queries) per program: the fp32 accumulator's height


def launch_shape(num_queries, heads, kv_heads, seq_len, dim) -> tuple:
    """(rows per program, row blocks, splits over the keys, padded head dim): tiles
    are ints (backend.power_of_two_tile), counts plain arithmetic on the sizes
    (SymInts under dynamic shapes)."""
    group = heads // kv_heads
    rows = power_of_two_tile(group * num_queries, 16, MAX_ROWS)  # tl.dot needs 16 rows at least
    row_blocks = cdiv(group * num_queries, rows)
    splits = cdiv(seq_len, SPLIT_LEN)
    return rows, row_blocks, splits, power_of_two_tile(dim, 16)


@triton_op(f"{NAMESPACE}::masked_paged_attention", mutates_args=())
def _masked_paged_attention_op(
    query: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    if not use_triton(query):
        return masked_paged_attention_reference(query, kv_cache, slots, visible, scale)
    batch, num_queries, heads, dim = query.shape
    kv_heads, seq_len = kv_cache.shape[3], slots.shape[1]
    group = heads // kv_heads
    if batch == 0 or num_queries == 0 or heads == 0:
        return torch.empty_like(query)
    if seq_len == 0:
        return torch.zeros_like(query)  # no keys: every row sees none
    rows, row_blocks, splits, block_d = launch_shape(num_queries, heads, kv_heads, seq_len, dim)
    out = torch.empty_like(query)
    programs = batch * kv_heads * row_blocks * splits
    parts = torch.empty((programs, rows, block_d), dtype=torch.float32, device=query.device)
    stats = torch.empty((programs, rows, 2), dtype=torch.float32, device=query.device)
    ieee = query.dtype == torch.float32
    wrap_triton(split_kernel)[(batch * kv_heads, row_blocks, splits)](
        query, kv_cache, slots, visible, parts, stats,
        num_queries, kv_heads, group, seq_len, dim, scale, kv_cache.shape[1] * kv_cache.shape[2],
        query.stride(0), query.stride(1), query.stride(2),
        kv_cache.stride(0), kv_cache.stride(2), kv_cache.stride(3),
        slots.stride(0), visible.stride(0), visible.stride(1),
        ROWS=rows, BLOCK_L=BLOCK_L, BLOCK_D=block_d, SPLIT_LEN=SPLIT_LEN, IEEE=ieee,
    )  # fmt: skip
    wrap_triton(combine_kernel)[(batch * kv_heads, row_blocks)](
        parts, stats, out, num_queries, kv_heads, group, dim, splits,
        out.stride(0), out.stride(1), out.stride(2),
        ROWS=rows, BLOCK_D=block_d,
    )  # fmt: skip
    return out


@_masked_paged_attention_op.register_fake
def _masked_paged_attention_fake(query, kv_cache, slots, visible, scale):
    return torch.empty_like(query)


def masked_paged_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of query [B, Q, heads, D] over L keys per request read from the paged
    kv_cache [2, num_blocks, block_size, kv_heads, D] at slots [B, L] (flat slot =
    block * block_size + offset, each in bounds), query q of request b seeing key l
    where visible[b, q, l]. Returns [B, Q, heads, D] in query's dtype; a query that
    sees no key gets zeros. GQA when heads is a multiple of kv_heads. A slot outside
    [0, num_blocks * block_size) is a contract violation (checked mode refuses it),
    which the op clamps into the cache."""
    if query.dim() != 4 or kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(
            f"query must be [B, Q, heads, D] and kv_cache [2, num_blocks, block_size, kv_heads, D], got "
            f"{tuple(query.shape)} and {tuple(kv_cache.shape)}"
        )
    batch, num_queries, heads, dim = query.shape
    kv_heads = kv_cache.shape[3]
    if heads % kv_heads or kv_cache.shape[4] != dim:
        raise ValueError(f"query must be [B, Q, k * {kv_heads}, {kv_cache.shape[4]}], got {tuple(query.shape)}")
    if slots.dim() != 2 or slots.shape[0] != batch or slots.dtype != torch.int64:
        raise ValueError(f"slots must be int64 [{batch}, L], got {slots.dtype} {tuple(slots.shape)}")
    if visible.dtype != torch.bool or tuple(visible.shape) != (batch, num_queries, slots.shape[1]):
        raise ValueError(f"visible must be bool [{batch}, {num_queries}, {slots.shape[1]}], got "
                         f"{visible.dtype} {tuple(visible.shape)}")  # fmt: skip
    if kv_cache.dtype != query.dtype:
        raise ValueError(f"kv_cache's dtype must be query's ({query.dtype}), got {kv_cache.dtype}")
    if kv_cache.stride(1) != kv_cache.shape[2] * kv_cache.stride(2) or kv_cache.stride(4) != 1:
        raise ValueError("kv_cache's blocks must be contiguous slots (flat slot = block * block_size + offset)")
    if is_checked():
        check_masked_paged_attention_values(kv_cache, slots)
    return _masked_paged_attention_op(query.contiguous(), kv_cache, slots.contiguous(), visible.contiguous(), scale)


# --------------------------------------------- checked mode's value checks (syncs)


def check_masked_paged_attention_values(kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """masked_paged_attention: every slot inside the cache."""
    check_in_range("slots", slots, 0, kv_cache.shape[1] * kv_cache.shape[2])
