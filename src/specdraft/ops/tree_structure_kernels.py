"""The Triton kernels of the draft-tree structure ops (tree_structure.py, which
documents what each computes): one program per request for tree_expand, tree_select
and tree_ancestors, one per root row for tree_positions, one per (request, feature
block) for tree_commit_kv, over up to 8 caches at once."""

from .backend import tl, triton


@triton.jit
def tree_select_kernel(
    tokens_ptr, scores_ptr, parents_ptr, depths_ptr, roots_ptr,
    out_tokens_ptr, out_parents_ptr, out_depths_ptr, out_scores_ptr, index_ptr,  # index: [B, P] scratch
    pool, keep, POOL_PAD: tl.constexpr, SCAN: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, POOL_PAD)
    in_pool = i < pool
    row = b * pool
    s_i = tl.load(scores_ptr + row + i, mask=in_pool, other=float("-inf")).to(tl.float32)
    s_i = tl.where(s_i != s_i, float("-inf"), s_i)  # NaN ranks as -inf
    # Rank by counting: pool node j is ahead of i with a higher score, or an equal one
    # and a lower index.
    rank = tl.zeros([POOL_PAD], tl.int32)
    for j0 in range(0, pool, SCAN):
        j = j0 + tl.arange(0, SCAN)
        s_j = tl.load(scores_ptr + row + j, mask=j < pool, other=float("-inf")).to(tl.float32)
        s_j = tl.where(s_j != s_j, float("-inf"), s_j)
        ahead = (s_j[None, :] > s_i[:, None]) | ((s_j[None, :] == s_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & (j < pool)[None, :]).to(tl.int32), axis=1)
    chosen = in_pool & (rank < keep)
    tl.store(index_ptr + row + i, chosen.to(tl.int32), mask=in_pool)
    tl.debug_barrier()
    # A kept node's tree index: 1 + the kept nodes before it in pool order.
    before = tl.zeros([POOL_PAD], tl.int32)
    for j0 in range(0, pool, SCAN):
        j = j0 + tl.arange(0, SCAN)
        kept_j = tl.load(index_ptr + row + j, mask=j < pool, other=0)
        before += tl.sum(((kept_j[None, :] != 0) & (j[None, :] < i[:, None])).to(tl.int32), axis=1)
    tree_index = tl.where(chosen, before + 1, -1)
    tl.debug_barrier()  # every program thread has read the chosen flags
    tl.store(index_ptr + row + i, tree_index, mask=in_pool)
    tl.debug_barrier()
    pool_parent = tl.load(parents_ptr + row + i, mask=in_pool, other=-1).to(tl.int64)
    has_parent = chosen & (pool_parent >= 0) & (pool_parent < pool)
    parent = tl.load(index_ptr + row + pool_parent, mask=has_parent, other=0).to(tl.int64)
    n = keep + 1
    dest = b * n + tree_index
    tl.store(out_tokens_ptr + dest, tl.load(tokens_ptr + row + i, mask=chosen, other=0).to(tl.int64), mask=chosen)
    tl.store(out_parents_ptr + dest, parent, mask=chosen)
    tl.store(out_depths_ptr + dest, tl.load(depths_ptr + row + i, mask=chosen, other=0).to(tl.int64), mask=chosen)
    tl.store(out_scores_ptr + dest, s_i, mask=chosen)
    root = tl.arange(0, 1)
    tl.store(out_tokens_ptr + b * n + root, tl.load(roots_ptr + b + root).to(tl.int64))
    tl.store(out_parents_ptr + b * n + root, tl.full([1], -1, tl.int64))
    tl.store(out_depths_ptr + b * n + root, tl.zeros([1], tl.int64))
    tl.store(out_scores_ptr + b * n + root, tl.zeros([1], tl.float32))


@triton.jit
def tree_expand_kernel(frontier_ptr, children_ptr, scores_ptr, best_ptr, fanout, count, k, PAD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, PAD)
    inside = i < count
    parent = tl.load(frontier_ptr + b * (count // fanout) + i // fanout, mask=inside, other=0.0).to(tl.float32)
    own = tl.load(children_ptr + b * count + i, mask=inside, other=0.0).to(tl.float32)
    score = parent + own
    tl.store(scores_ptr + b * count + i, score, mask=inside)
    key = tl.where(score != score, float("-inf"), score)  # NaN ranks as -inf
    key_j = tl.where(inside, key, float("-inf"))
    ahead = (key_j[None, :] > key[:, None]) | ((key_j[None, :] == key[:, None]) & (i[None, :] < i[:, None]))
    rank = tl.sum((ahead & inside[None, :]).to(tl.int32), axis=1)
    tl.store(best_ptr + b * k + rank, i.to(tl.int64), mask=inside & (rank < k))


@triton.jit
def tree_ancestors_kernel(parents_ptr, out_ptr, n, N_PAD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    nodes = tl.arange(0, N_PAD)
    in_tree = nodes < n
    block = out_ptr + b * n * n
    tl.store(block + nodes[:, None] * n + nodes[None, :], tl.zeros([N_PAD, N_PAD], tl.int1),
             mask=in_tree[:, None] & in_tree[None, :])  # fmt: skip
    tl.debug_barrier()
    # Lane i walks from node i up to the root, marking each node it passes; a parent
    # outside [0, n) ends the walk as the root's -1 does. n steps cover any path.
    # int64 throughout: a loop-carried value must keep one type (a compiled kernel
    # refuses int32 -> int64; the interpreter does not check).
    current = nodes.to(tl.int64)
    live = in_tree
    for _ in range(0, n):
        tl.store(block + nodes * n + current, tl.full([N_PAD], 1, tl.int1), mask=live)
        up = tl.load(parents_ptr + b * n + current, mask=live, other=-1).to(tl.int64)
        live = live & (up >= 0) & (up < n)
        current = tl.where(live, up, 0)


@triton.jit
def tree_positions_kernel(roots_ptr, depths_ptr, out_ptr, batch, n, last, N_PAD: tl.constexpr):
    # Program r: root row r (M-RoPE row r // batch of request r % batch).
    r = tl.program_id(0).to(tl.int64)
    b = r % batch
    nodes = tl.arange(0, N_PAD)
    in_tree = nodes < n
    root = tl.load(roots_ptr + r).to(tl.int64)
    depth = tl.load(depths_ptr + b * n + nodes, mask=in_tree, other=0).to(tl.int64)
    tl.store(out_ptr + r * n + nodes, tl.minimum(root + depth, last), mask=in_tree)


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
