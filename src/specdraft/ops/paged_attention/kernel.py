"""The Triton kernels of `masked_paged_attention` (this package's docstring defines
the op): split-KV attention (flash decoding) over keys read through their slots.

A kv head's `group` query heads of a request are rows of one query matrix [group *
Q, D] (row r = g * Q + q), so keys and values are read once per kv head, never
expanded. The keys are split into chunks of SPLIT_LEN: at B = 1 an 8B-shaped model
has 8 kv heads, and one program per (request, kv head) would leave most of the GPU
idle (cuDNN's SDPA there: 8 thread blocks, 28.6 us a layer for 4 MB of KV on an
H200). Pass 1 (`split_kernel`): each (request, kv head, row block, chunk) program
runs an online softmax over its chunk in tiles of BLOCK_L keys and stores its
unnormalised output, running max and sum (fp32). Pass 2 (`combine_kernel`): each
(request, kv head, row block) merges its chunks.

Keys no row of a tile sees are loaded as 0 (an unwritten slot may hold NaN, and 0 *
NaN would leak through the p @ V product); a row that sees no key gets zeros.
"""

from ..backend import tl, triton


@triton.jit
def split_kernel(
    q_ptr, cache_ptr, slots_ptr, visible_ptr, out_ptr, stats_ptr,
    num_queries, kv_heads, group, seq_len, head_dim, scale, num_slots,
    q_stride_b, q_stride_q, q_stride_h,
    cache_stride_kv, cache_stride_slot, cache_stride_head,
    slots_stride_b, visible_stride_b, visible_stride_q,
    ROWS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_LEN: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    pair = tl.program_id(0).to(tl.int64)  # request * kv_heads + kv head
    row_block = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    num_row_blocks = tl.num_programs(1)
    b = pair // kv_heads
    kv_head = pair % kv_heads

    rows = row_block * ROWS + tl.arange(0, ROWS)
    row_ok = rows < group * num_queries
    query = rows % num_queries
    head = kv_head * group + rows // num_queries
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    q = tl.load(q_ptr + b * q_stride_b + query[:, None] * q_stride_q + head[:, None] * q_stride_h + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # fmt: skip

    row_max = tl.full([ROWS], float("-inf"), tl.float32)
    row_sum = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    start = split * SPLIT_LEN
    for offset in range(0, SPLIT_LEN, BLOCK_L):
        keys = start + offset + tl.arange(0, BLOCK_L)
        key_ok = keys < seq_len
        sees = tl.load(visible_ptr + b * visible_stride_b + query[:, None] * visible_stride_q + keys[None, :],
                       mask=row_ok[:, None] & key_ok[None, :], other=0) != 0  # fmt: skip
        seen = tl.max(sees.to(tl.int32), 0) > 0
        slot = tl.load(slots_ptr + b * slots_stride_b + keys, mask=seen, other=0)
        slot = tl.minimum(tl.maximum(slot, 0), num_slots - 1)  # a contract violation reads inside the cache
        at = slot[:, None] * cache_stride_slot + kv_head * cache_stride_head + dims[None, :]
        load_ok = seen[:, None] & dim_ok[None, :]
        k = tl.load(cache_ptr + at, mask=load_ok, other=0.0)
        v = tl.load(cache_ptr + cache_stride_kv + at, mask=load_ok, other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        # .to: Inductor passes a float argument as fp64, which would make the loop's
        # carried max fp64.
        scores = tl.where(sees, (scores * scale).to(tl.float32), float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        base = tl.where(new_max == float("-inf"), 0.0, new_max)  # no -inf - -inf
        p = tl.exp(scores - base[:, None])
        alpha = tl.exp(row_max - base)
        row_sum = row_sum * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        row_max = new_max

    part = (pair * num_row_blocks + row_block) * num_splits + split
    tl.store(out_ptr + part * ROWS * BLOCK_D + tl.arange(0, ROWS)[:, None] * BLOCK_D + dims[None, :], acc)
    tl.store(stats_ptr + part * ROWS * 2 + tl.arange(0, ROWS) * 2, row_max)
    tl.store(stats_ptr + part * ROWS * 2 + tl.arange(0, ROWS) * 2 + 1, row_sum)


@triton.jit
def combine_kernel(
    parts_ptr, stats_ptr, o_ptr,
    num_queries, kv_heads, group, head_dim, num_splits,
    o_stride_b, o_stride_q, o_stride_h,
    ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pair = tl.program_id(0).to(tl.int64)
    row_block = tl.program_id(1)
    num_row_blocks = tl.num_programs(1)
    b = pair // kv_heads
    kv_head = pair % kv_heads
    local = tl.arange(0, ROWS)
    dims = tl.arange(0, BLOCK_D)
    first = (pair * num_row_blocks + row_block) * num_splits

    top = tl.full([ROWS], float("-inf"), tl.float32)
    for split in range(0, num_splits):
        top = tl.maximum(top, tl.load(stats_ptr + (first + split) * ROWS * 2 + local * 2))
    base = tl.where(top == float("-inf"), 0.0, top)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for split in range(0, num_splits):
        stats = stats_ptr + (first + split) * ROWS * 2 + local * 2
        weight = tl.exp(tl.load(stats) - base)
        total += weight * tl.load(stats + 1)
        acc += weight[:, None] * tl.load(parts_ptr + (first + split) * ROWS * BLOCK_D + local[:, None] * BLOCK_D
                                         + dims[None, :])  # fmt: skip
    out = tl.where(total[:, None] > 0.0, acc / tl.where(total > 0.0, total, 1.0)[:, None], 0.0)

    rows = row_block * ROWS + local
    row_ok = rows < group * num_queries
    query = rows % num_queries
    head = kv_head * group + rows // num_queries
    tl.store(o_ptr + b * o_stride_b + query[:, None] * o_stride_q + head[:, None] * o_stride_h + dims[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (dims < head_dim)[None, :])  # fmt: skip
