"""The walk of tree verification (tree_verify.py, whose module docstring states the
rule; the reference there is its torch twin): `tree_walk_kernel`, per (request,
vocab chunk), one ascending pass over the nodes (a node's children come after it;
recomputed by every chunk program, chunk 0 writes the path), then the partial race
over that chunk of the last node's row. The statistics it reads and the finish that
combines its races are verify_kernels.py's, shared with chain verification.

Jit functions are imported by name: Inductor re-emits a user Triton kernel with the
jit functions it calls, and a module attribute (noise.x) is not carried along.
"""

from ..backend import tl, triton
from ..common.fastmath import exp2, rcp
from ..common.scan import (
    combine_argmax,
    combine_softmax,
    lane_argmax_finish,
    lane_argmax_init,
    lane_argmax_update,
    scan_vocab,
)
from .noise import exponential2, gumbel_gain, noise_bits, row_key, uniform
from .verify_kernels import gumbel_step, row_cut

# ------------------------------------------------------------------- walk pieces


@triton.jit
def node_stats(part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr, parts, greedy, num_splits,
               SPLIT_BLOCK: tl.constexpr):  # fmt: skip
    """(argmax, softmax max, softmax sum) of one node's target row from the statistics
    kernel's partials at `parts`: the argmax for a greedy request, the softmax
    statistics (natural units) for a sampled one; the other stays a placeholder."""
    target = tl.full([], -1, tl.int32)
    run_max = tl.full([], 0.0, tl.float32)
    run_sum = tl.full([], 1.0, tl.float32)
    if greedy:
        _, target = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
    else:
        run_max, run_sum = combine_softmax(part_max_ptr + parts, part_sum_ptr + parts, num_splits, SPLIT_BLOCK)
    return target, run_max, run_sum


@triton.jit
def tree_residual_step(acc, x, side, idx, args, FLAGS: tl.constexpr):
    """Every child of node `cur` rejected: the exponential races r / E over the
    residual r (p with the children's tokens zeroed) and, as the fallback, over p.
    p in base 2 as rejection/kernel.py's residual_race_step computes it. The children are the
    nodes k in [first_kid, last_kid] whose parent is `cur` (with EAGLE-2's layout, the
    topk siblings side by side); a token outside [0, V) matches no index. FLAGS: FAST,
    CUT (logits below the node row's cut count as -inf)."""
    FAST: tl.constexpr = FLAGS[0]  # annotated: a plain assignment would make a runtime value
    CUT: tl.constexpr = FLAGS[1]
    race, race_idx, fall, fall_idx = acc
    gain, max2, inv_sum, key, end, cur, first_kid, last_kid, parents_row, tokens_row, cut = args
    mask = idx < end
    if CUT:  # p = 0 below the cut
        x = tl.where(x < cut, float("-inf"), x)
    p = exp2(x * gain - max2, FAST) * inv_sum
    r = p
    for k in range(first_kid, last_kid + 1):
        if tl.load(parents_row + k).to(tl.int64) == cur:
            r = tl.where(idx == tl.load(tokens_row + k).to(tl.int64), 0.0, r)
    # 1 / (E / ln 2): the races rank r / E, and a common factor ln 2 changes no winner.
    inv_e = rcp(exponential2(noise_bits(key, idx), FAST), FAST)
    race, race_idx = lane_argmax_update(race, race_idx, tl.where(mask, r * inv_e, float("-inf")), idx)
    fall, fall_idx = lane_argmax_update(fall, fall_idx, tl.where(mask, p * inv_e, float("-inf")), idx)
    return race, race_idx, fall, fall_idx


# ----------------------------------------------------------------------- kernels


@triton.jit
def tree_walk_kernel(
    logits_ptr, tree_tokens_ptr, parents_ptr, temperature_ptr, seeds_ptr, positions_ptr,
    cut_ptr,  # [B, N], read with HAS_CUT
    nodes_ptr, tokens_ptr, counts_ptr, ranks_ptr,  # out
    part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,  # in: the statistics kernel's partials
    race_key_ptr, race_idx_ptr, fall_key_ptr, fall_idx_ptr,  # out: per (request, chunk)
    vocab, req_stride, row_stride, num_nodes, max_depth, num_splits,
    ACCEPT_KEY: tl.constexpr, SAMPLE_KEY: tl.constexpr, HAS_CUT: tl.constexpr, NODE_BLOCK: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, SPLIT_BLOCK: tl.constexpr, FAST_LOG2: tl.constexpr,
):  # fmt: skip
    req = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temp = tl.load(temperature_ptr + req).to(tl.float32)
    greedy = temp <= 0
    seed = tl.load(seeds_ptr + req).to(tl.int64)
    position = tl.load(positions_ptr + req).to(tl.int64)
    tree_tok_row = tree_tokens_ptr + req * num_nodes
    parents_row = parents_ptr + req * num_nodes
    lane = tl.arange(0, NODE_BLOCK)
    lane_tok = tl.load(tree_tok_row + lane, mask=lane < num_nodes, other=-1).to(tl.int64)
    lane_par = tl.load(parents_row + lane, mask=lane < num_nodes, other=-1).to(tl.int64)

    cur = tl.full([], 0, tl.int64)
    count = tl.full([], 0, tl.int32)
    rank = tl.full([], 0, tl.int32)
    rejected = tl.full([], 0.0, tl.float32)
    first_kid = tl.full([], 0, tl.int32)  # the children of `cur` tried so far lie in [first_kid, last_kid]
    last_kid = tl.full([], 0, tl.int32)  # 0: none tried (node 0 is nobody's child)
    path = tl.where(lane == 0, 0, -1)
    path_tok = tl.full([NODE_BLOCK], -1, tl.int64)
    path_rank = tl.full([NODE_BLOCK], -1, tl.int32)
    target, run_max, run_sum = node_stats(
        part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr, (req * num_nodes) * num_splits, greedy, num_splits,
        SPLIT_BLOCK,
    )  # fmt: skip
    key = row_key(seed, position, ACCEPT_KEY)
    cut = row_cut(cut_ptr, req * num_nodes, HAS_CUT)  # of the current node's row
    for j in range(1, num_nodes):
        if (tl.load(parents_row + j).to(tl.int64) == cur) & (count < max_depth):
            tok = tl.load(tree_tok_row + j).to(tl.int64)
            valid = (tok >= 0) & (tok < vocab)
            r = tl.full([], 0.0, tl.float32)
            if greedy:
                accept = valid & (tok == target)
            else:
                earlier = (lane_par == cur) & (lane > cur) & (lane < j) & (lane_tok == tok)
                fresh = valid & (tl.max(earlier.to(tl.int32), 0) == 0)
                x = tl.load(logits_ptr + req * req_stride + cur * row_stride + tok, mask=fresh, other=float("-inf"))
                x = x.to(tl.float32)
                x = tl.where(x < cut, float("-inf"), x)  # cut = -inf without truncation
                r = tl.where(fresh, tl.exp(x / temp - run_max) / run_sum, 0.0)
                u = uniform(noise_bits(key, rank))
                accept = (r > 0) & (u * (1.0 - rejected) <= r)
            if accept:
                count += 1
                path = tl.where(lane == count, j, path)
                path_tok = tl.where(lane == count - 1, tok, path_tok)
                path_rank = tl.where(lane == count - 1, rank, path_rank)
                cur = tl.full([], 0, tl.int64) + j
                rank = tl.full([], 0, tl.int32)
                rejected = tl.full([], 0.0, tl.float32)
                first_kid = tl.full([], 0, tl.int32)
                last_kid = tl.full([], 0, tl.int32)
                target, run_max, run_sum = node_stats(
                    part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr, (req * num_nodes + cur) * num_splits,
                    greedy, num_splits, SPLIT_BLOCK,
                )  # fmt: skip
                key = row_key(seed, position + count, ACCEPT_KEY)
                cut = row_cut(cut_ptr, req * num_nodes + cur, HAS_CUT)
            else:
                rank += 1
                rejected += r
                first_kid = tl.where(last_kid == 0, j, first_kid)
                last_kid = tl.full([], 0, tl.int32) + j

    if split == 0:
        emitted = tl.where(greedy, target, -1)  # sampled requests: filled in by the finish kernel
        out_tok = tl.where(lane == count, emitted, path_tok)
        tl.store(nodes_ptr + req * (max_depth + 1) + lane, path, mask=lane <= max_depth)
        tl.store(tokens_ptr + req * (max_depth + 1) + lane, out_tok.to(tl.int32), mask=lane <= max_depth)
        tl.store(ranks_ptr + req * max_depth + lane, path_rank, mask=lane < max_depth)
        tl.store(counts_ptr + req, count)

    if not greedy:
        sample_key = row_key(seed, position + count, SAMPLE_KEY)
        row_ptr = logits_ptr + req * req_stride + cur * row_stride
        start = split * CHUNK
        end = tl.minimum(start + CHUNK, vocab)
        race, race_idx = lane_argmax_init(start, BLOCK)
        fall, fall_idx = race, race_idx
        gain = gumbel_gain(temp)
        if last_kid > 0:  # every child rejected: race over the residual, p as the fallback
            args = (gain, run_max * 1.4426950408889634, 1.0 / run_sum, sample_key, end, cur, first_kid, last_kid,
                    parents_row, tree_tok_row, cut)  # fmt: skip
            race, race_idx, fall, fall_idx = scan_vocab(
                row_ptr, row_ptr, start, end, (race, race_idx, fall, fall_idx), args, tree_residual_step,
                (FAST_LOG2, HAS_CUT), False, BLOCK,
            )  # fmt: skip
        else:  # a leaf: Gumbel-max over the logits, its own fallback
            race, race_idx = scan_vocab(
                row_ptr, row_ptr, start, end, (race, race_idx), (gain, sample_key, cut), gumbel_step,
                (FAST_LOG2, HAS_CUT), False, BLOCK,
            )  # fmt: skip
            fall, fall_idx = race, race_idx
        race, race_idx = lane_argmax_finish(race, race_idx)
        fall, fall_idx = lane_argmax_finish(fall, fall_idx)
        part = req * num_splits + split
        tl.store(race_key_ptr + part, race)
        tl.store(race_idx_ptr + part, race_idx)
        tl.store(fall_key_ptr + part, fall)
        tl.store(fall_idx_ptr + part, fall_idx)
