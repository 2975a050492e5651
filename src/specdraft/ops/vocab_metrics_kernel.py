"""The Triton kernel of `vocab_metrics` (vocab_metrics.py): rows split into vocabulary
chunks, worked through by a fixed set of programs that take numbered work items.

Why: a sampled row needs both normalisers before sum_i min(p, q), so every token is
read twice. One program per row reads a whole row (up to 512 KB for two 128k bf16
rows) before it reads it again; with two such programs per SM the rows in flight
exceed L2 and the second read comes from HBM. Here each row is split into
`num_chunks` chunks, and the second read of a chunk follows its first by about one
chunk per program in flight, which L2 holds.

Work items, taken in ticket order from one atomic counter:
- pass 1 of (row, chunk): the chunk's argmax and online-softmax statistics of both
  rows (and, for the divergences with a d2t map, of the target on the draft ids),
  stored in a workspace slot of the row; then the row's `arrived` count is raised;
- pass 2 of (row, chunk): waits until all the row's pass-1 items have arrived, merges
  their statistics into the normalisers, sums min(p, q) (and the divergences' terms)
  over its chunk and stores the partial sums; the row's last pass-2 item adds the
  partials in chunk order (deterministic), writes the row's outputs and frees the
  slot (`released`).
Tickets run through "pseudo-rows" j = 0, 1, ...: pass 1 of row j's chunks, then pass
2 of row j - lag's chunks. With lag about programs / (2 chunks), a pass-2 item rarely
waits, and its chunk was read about `programs` items earlier.

No deadlock, whatever the scheduling: an item waits only on items with earlier
tickets, and an item with a ticket is held by a running program. The workspace is a
ring of `ring` row slots (ring > lag); pass 1 of a row waits for the slot's previous
row to be released. In the Triton interpreter, which runs programs one after
another, program 0 takes every ticket and no wait ever spins.

Memory: the ring (ring x chunks x 13 words) and 1 + 3 x ring counters, whatever N.
"""

from .backend import tl, triton

# Imported by name: Inductor re-emits a user Triton kernel with the jit functions it
# calls, and a module attribute is not carried along.
from .common.fastmath import exp2
from .common.scan import lane_argmax_init, lane_argmax_update, lane_softmax_init, lane_softmax_update
from .vocab_metrics_tiles import draft_tile, load_target, target_log2

# Per (slot, chunk), written into the jit code as literals (a kernel reads no Python
# globals): 8 fp32 statistics (draft, target and target-on-draft-ids (max, sum), then
# the draft's and the target's best value), 2 int32 indices (their argmaxes) and 3 fp32
# partial sums (min(p, q), cross-entropy, KL).
STATS, INDICES, PARTIALS = 8, 2, 3


# ---------------------------------------------------------------- waits and signals


@triton.jit
def _wait_until(counter_ptr, at_least):
    """Spin until *counter_ptr >= at_least (acquire: what was written before the
    matching releases is visible after)."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    while seen < at_least:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire")


@triton.jit
def _signal(counter_ptr):
    """Raise *counter_ptr by one after this program's stores (all its threads'):
    returns the count before."""
    tl.debug_barrier()
    return tl.atomic_add(counter_ptr, 1, sem="acq_rel")


# ------------------------------------------------------------------------- pass 1


@triton.jit
def _chunk_softmax(lane_max, lane_sum):
    """(max, sum of 2**(z - max)) of a chunk from its per-lane statistics (base 2)."""
    top = tl.max(lane_max, 0)
    return top, tl.sum(lane_sum * tl.exp2(lane_max - top), 0)


@triton.jit
def _chunk_argmax(best, best_idx):
    top = tl.max(best, 0)
    return top, tl.min(tl.where(best == top, best_idx, 2147483647), 0)


@triton.jit
def _first_pass(
    draft_row, target_row, d2t_ptr, stats_ptr, idx_ptr, chunk, draft_vocab, vocab, d_chunk, t_chunk,
    draft_gain, target_gain,
    HAS_MAP: tl.constexpr, PROBS: tl.constexpr, DIVERGENCE: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """One chunk's statistics, stored at stats_ptr[0:8] and idx_ptr[0:2]. Draft
    ids [chunk * d_chunk, +d_chunk); with a map, the target's own statistics over
    target ids [chunk * t_chunk, +t_chunk), else over the draft ids."""
    lanes = tl.arange(0, BLOCK)
    DRAFT_IDS_TARGET: tl.constexpr = DIVERGENCE or not HAS_MAP
    d_start = chunk * d_chunk
    d_end = tl.minimum(d_start + d_chunk, draft_vocab)
    d_max, d_sum = lane_softmax_init(BLOCK)
    t_max, t_sum = lane_softmax_init(BLOCK)
    o_max, o_sum = lane_softmax_init(BLOCK)
    d_best, d_idx = lane_argmax_init(d_start, BLOCK)
    if HAS_MAP:
        t_start = chunk * t_chunk
        t_end = tl.minimum(t_start + t_chunk, vocab)
        t_best, t_idx = lane_argmax_init(t_start, BLOCK)
        target_next = load_target(target_row, t_start + lanes, t_start + lanes < t_end, PROBS)
        for off in range(t_start, t_end, BLOCK):
            idx = off + lanes
            xt = target_next.to(tl.float32)
            target_next = load_target(target_row, idx + BLOCK, idx + BLOCK < t_end, PROBS)
            t_best, t_idx = lane_argmax_update(t_best, t_idx, xt, idx)
            t_max, t_sum = lane_softmax_update(t_max, t_sum, target_log2(xt, target_gain, PROBS), FAST)
    else:
        t_best, t_idx = lane_argmax_init(d_start, BLOCK)
    # Draft tiles past the chunk's end read as -inf: draft_tile masks by id < draft_vocab only.
    tile = draft_tile(draft_row, target_row, d2t_ptr, d_start + lanes, d_end, vocab, DRAFT_IDS_TARGET,
                      HAS_MAP, PROBS)  # fmt: skip
    for off in range(d_start, d_end, BLOCK):
        idx = off + lanes
        x, xt = tile
        tile = draft_tile(draft_row, target_row, d2t_ptr, idx + BLOCK, d_end, vocab, DRAFT_IDS_TARGET,
                          HAS_MAP, PROBS)  # fmt: skip
        x = x.to(tl.float32)
        d_best, d_idx = lane_argmax_update(d_best, d_idx, x, idx)
        d_max, d_sum = lane_softmax_update(d_max, d_sum, x * draft_gain, FAST)
        if HAS_MAP:
            if DIVERGENCE:
                o_max, o_sum = lane_softmax_update(o_max, o_sum, target_log2(xt.to(tl.float32), target_gain, PROBS),
                                                   FAST)  # fmt: skip
        else:
            xt = xt.to(tl.float32)
            t_best, t_idx = lane_argmax_update(t_best, t_idx, xt, idx)
            t_max, t_sum = lane_softmax_update(t_max, t_sum, target_log2(xt, target_gain, PROBS), FAST)
    d_top, d_total = _chunk_softmax(d_max, d_sum)
    t_top, t_total = _chunk_softmax(t_max, t_sum)
    o_top, o_total = _chunk_softmax(o_max, o_sum)
    d_key, d_arg = _chunk_argmax(d_best, d_idx)
    t_key, t_arg = _chunk_argmax(t_best, t_idx)
    tl.store(stats_ptr + 0, d_top)
    tl.store(stats_ptr + 1, d_total)
    tl.store(stats_ptr + 2, t_top)
    tl.store(stats_ptr + 3, t_total)
    tl.store(stats_ptr + 4, o_top)
    tl.store(stats_ptr + 5, o_total)
    tl.store(stats_ptr + 6, d_key)
    tl.store(stats_ptr + 7, t_key)
    tl.store(idx_ptr + 0, d_arg)
    tl.store(idx_ptr + 1, t_arg)


# --------------------------------------------------------------------- merging


@triton.jit
def _merged_lse2(stats_ptr, k, chunks, mask):
    """log2 sum 2**z of a row from its chunks' (max, sum) at stats k, k + 1; -inf for no mass."""
    maxes = tl.load(stats_ptr + chunks * 8 + k, mask=mask, other=-3.4028234663852886e38, cache_modifier=".cg")
    sums = tl.load(stats_ptr + chunks * 8 + k + 1, mask=mask, other=0.0, cache_modifier=".cg")
    top = tl.max(maxes, 0)
    return top + tl.log2(tl.sum(sums * tl.exp2(maxes - top), 0))


@triton.jit
def _merged_argmax(stats_ptr, idx_ptr, k, chunks, mask):
    """First index of the row's max from its chunks' (best, index): chunks cover
    increasing id ranges and each keeps its first index, so the lowest index of a
    tied best is the row's first."""
    keys = tl.load(stats_ptr + chunks * 8 + 6 + k, mask=mask, other=float("-inf"), cache_modifier=".cg")
    idxs = tl.load(idx_ptr + chunks * 2 + k, mask=mask, other=2147483647, cache_modifier=".cg")
    top = tl.max(keys, 0)
    return tl.min(tl.where(mask & (keys == top), idxs, 2147483647), 0)


# ------------------------------------------------------------------------- pass 2


@triton.jit
def _second_pass(
    draft_row, target_row, d2t_ptr, chunk, draft_vocab, vocab, d_chunk, draft_gain, target_gain,
    d_lse2, t_lse2, o_lse2,
    HAS_MAP: tl.constexpr, PROBS: tl.constexpr, DIVERGENCE: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """(sum min(p, q), cross-entropy, KL) over one chunk's draft ids, base-2 normalisers known."""
    # A normaliser of -inf (an empty row) becomes +inf: that row's probabilities are 0, not NaN.
    d_norm = tl.where(d_lse2 == float("-inf"), float("inf"), d_lse2)
    t_norm = tl.where(t_lse2 == float("-inf"), float("inf"), t_lse2)
    o_norm = tl.where(o_lse2 == float("-inf"), float("inf"), o_lse2)
    lanes = tl.arange(0, BLOCK)
    d_start = chunk * d_chunk
    d_end = tl.minimum(d_start + d_chunk, draft_vocab)
    min_lane = tl.zeros([BLOCK], tl.float32)
    ce_lane = tl.zeros([BLOCK], tl.float32)
    kl_lane = tl.zeros([BLOCK], tl.float32)
    tile = draft_tile(draft_row, target_row, d2t_ptr, d_start + lanes, d_end, vocab, True, HAS_MAP, PROBS)
    for off in range(d_start, d_end, BLOCK):
        idx = off + lanes
        x, xt = tile
        tile = draft_tile(draft_row, target_row, d2t_ptr, idx + BLOCK, d_end, vocab, True, HAS_MAP, PROBS)
        zt = target_log2(xt.to(tl.float32), target_gain, PROBS)
        log_q = x.to(tl.float32) * draft_gain - d_norm
        log_p = zt - t_norm
        if DIVERGENCE:
            log_pd = zt - o_norm
            pd = exp2(log_pd, FAST)
            if HAS_MAP:
                p = exp2(log_p, FAST)
            else:
                p = pd  # without a map the draft vocabulary is the whole vocabulary: pd is p
            min_lane += tl.minimum(p, exp2(log_q, FAST))
            counted = pd > 0
            ce_lane += tl.where(counted, -pd * log_q, 0.0)
            kl_lane += tl.where(counted, pd * (log_pd - log_q), 0.0)
        else:
            # min(p, q) = 2**min(log2 p, log2 q): one exp2 per token pair.
            min_lane += exp2(tl.minimum(log_p, log_q), FAST)
    ln2 = 0.6931471805599453
    return tl.sum(min_lane, 0), tl.sum(ce_lane, 0) * ln2, tl.sum(kl_lane, 0) * ln2


# ---------------------------------------------------------------------- the kernel


@triton.jit
def vocab_metrics_kernel(
    draft_ptr, target_ptr, temperature_ptr, d2t_ptr,
    draft_token_ptr, target_token_ptr, draft_lse_ptr, target_lse_ptr, accept_ptr, ce_ptr, kl_ptr,  # out
    stats_ws, idx_ws, partial_ws, counters,  # workspace: the ring, the ticket and per-slot counters
    rows, draft_vocab, vocab, draft_stride, target_stride, temperature_stride,
    num_chunks, d_chunk, t_chunk, lag, ring,
    HAS_MAP: tl.constexpr, PROBS: tl.constexpr, DIVERGENCE: tl.constexpr, BLOCK: tl.constexpr,
    CHUNKS_PAD: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    arrived = counters + 1
    left = arrived + ring
    released = left + ring
    chunks = tl.arange(0, CHUNKS_PAD)
    in_row = chunks < num_chunks
    tickets = (rows + lag) * 2 * num_chunks
    ticket = tl.atomic_add(counters, 1)
    while ticket < tickets:
        pseudo_row = ticket // (2 * num_chunks)
        second = (ticket // num_chunks) % 2 == 1
        chunk = ticket % num_chunks
        row = tl.where(second, pseudo_row - lag, pseudo_row)
        if (row >= 0) & (row < rows):
            slot = row % ring
            generation = row // ring
            row64 = row.to(tl.int64)
            temp = tl.load(temperature_ptr + row64 * temperature_stride).to(tl.float32)
            sampled = temp > 0  # anything else (T <= 0, NaN) is greedy
            scale = tl.where(sampled, temp, 1.0)
            draft_gain = 1.4426950408889634 / scale  # log2(e) / s: base-2 logits
            if PROBS:
                target_gain = 1.0 / scale
            else:
                target_gain = draft_gain
            draft_row = draft_ptr + row64 * draft_stride
            target_row = target_ptr + row64 * target_stride
            slot_stats = stats_ws + slot * num_chunks * 8
            slot_idx = idx_ws + slot * num_chunks * 2
            if second:
                _wait_until(arrived + slot, (generation + 1) * num_chunks)
                d_lse2 = _merged_lse2(slot_stats, 0, chunks, in_row)
                t_lse2 = _merged_lse2(slot_stats, 2, chunks, in_row)
                o_lse2 = t_lse2
                if HAS_MAP:
                    if DIVERGENCE:
                        o_lse2 = _merged_lse2(slot_stats, 4, chunks, in_row)
                min_sum = tl.zeros([], tl.float32)
                ce = tl.zeros([], tl.float32)
                kl = tl.zeros([], tl.float32)
                if DIVERGENCE:
                    min_sum, ce, kl = _second_pass(
                        draft_row, target_row, d2t_ptr, chunk, draft_vocab, vocab, d_chunk, draft_gain, target_gain,
                        d_lse2, t_lse2, o_lse2, HAS_MAP, PROBS, DIVERGENCE, BLOCK, FAST,
                    )  # fmt: skip
                else:
                    if sampled:  # a greedy row needs no second pass without the divergences
                        min_sum, ce, kl = _second_pass(
                            draft_row, target_row, d2t_ptr, chunk, draft_vocab, vocab, d_chunk, draft_gain,
                            target_gain, d_lse2, t_lse2, o_lse2, HAS_MAP, PROBS, DIVERGENCE, BLOCK, FAST,
                        )  # fmt: skip
                slot_partials = partial_ws + slot * num_chunks * 3
                tl.store(slot_partials + chunk * 3 + 0, min_sum)
                tl.store(slot_partials + chunk * 3 + 1, ce)
                tl.store(slot_partials + chunk * 3 + 2, kl)
                d_arg = _merged_argmax(slot_stats, slot_idx, 0, chunks, in_row)
                t_arg = _merged_argmax(slot_stats, slot_idx, 1, chunks, in_row)
                before = _signal(left + slot)
                if before == (generation + 1) * num_chunks - 1:  # the row's last pass-2 item
                    draft_token = d_arg.to(tl.int64)
                    if HAS_MAP:
                        draft_token += tl.load(d2t_ptr + d_arg).to(tl.int64)
                    part = slot_partials + chunks * 3
                    min_total = tl.sum(tl.load(part + 0, mask=in_row, other=0.0, cache_modifier=".cg"), 0)
                    # Greedy: p and q are one-hot, sum min(p, q) is the match.
                    accept = tl.where(sampled, min_total, (draft_token == t_arg).to(tl.float32))
                    ln2 = 0.6931471805599453
                    tl.store(draft_token_ptr + row64, draft_token.to(tl.int32))
                    tl.store(target_token_ptr + row64, t_arg)
                    tl.store(draft_lse_ptr + row64, d_lse2 * ln2)
                    tl.store(target_lse_ptr + row64, t_lse2 * ln2)
                    tl.store(accept_ptr + row64, accept)
                    if DIVERGENCE:
                        ce_total = tl.sum(tl.load(part + 1, mask=in_row, other=0.0, cache_modifier=".cg"), 0)
                        kl_total = tl.sum(tl.load(part + 2, mask=in_row, other=0.0, cache_modifier=".cg"), 0)
                        tl.store(ce_ptr + row64, ce_total)
                        tl.store(kl_ptr + row64, kl_total)
                    _signal(released + slot)
            else:
                _wait_until(released + slot, generation)  # the slot's previous row is done
                _first_pass(
                    draft_row, target_row, d2t_ptr, slot_stats + chunk * 8, slot_idx + chunk * 2, chunk,
                    draft_vocab, vocab, d_chunk, t_chunk, draft_gain, target_gain,
                    HAS_MAP, PROBS, DIVERGENCE, BLOCK, FAST,
                )  # fmt: skip
                _signal(arrived + slot)
        ticket = tl.atomic_add(counters, 1)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def work_plan(rows: int, draft_vocab: int, vocab: int, programs: int, chunk_tokens: int, block: int):
    """(num_chunks, d_chunk, t_chunk, lag, ring) for a launch of `programs` programs:
    chunks of about chunk_tokens tokens of the longer vocabulary (whole blocks), a lag
    of about programs / (2 chunks) pseudo-rows, and a ring that outlasts it."""
    num_chunks = max(1, _ceil_div(max(draft_vocab, vocab), chunk_tokens))

    def per_chunk(n: int) -> int:
        return max(block, _ceil_div(_ceil_div(n, num_chunks), block) * block)

    lag = max(1, _ceil_div(programs, 2 * num_chunks))
    ring = min(lag + programs + 1, rows + lag + 1)  # > lag: see the module docstring
    return num_chunks, per_chunk(draft_vocab), per_chunk(vocab), lag, ring
