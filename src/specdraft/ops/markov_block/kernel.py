"""The Triton kernels of `markov_block_sample` (this package's docstring defines what
they compute).

Step s needs the token sampled at s - 1, an argmax over the whole vocabulary, before
it can read W2 at all; at B = 1 one program per request cannot stream W2 (V x r, 78 MB
in bf16 at V = 152k, r = 256) at the memory's bandwidth, so each step's row is split
across programs (`ROWS_PER_PROGRAM` vocabulary rows each) and the kernel boundary is
the grid-wide barrier between steps. One op, 2S + 1 launches (S + 1 for vanilla):

- `markov_latent_kernel` (gated and rnn; grid B x cdiv(r, LATENT_ROWS)): combines the
  previous step's per-program partials into its token (every program does, the
  partials are few; the first stores the token), then computes LATENT_ROWS entries of
  the step's latent, and for rnn of the next state (ping-pong slots: a launch reads
  slot (s - 1) % 2 whole and writes its entries of slot s % 2);
- `markov_bias_kernel` (grid B x cdiv(V, ROWS_PER_PROGRAM)): per tile of
  vocabulary rows, bias = W2[rows] @ latent, corrected = base + bias (stored), and
  the per-lane argmax of the greedy or Gumbel-max keys, exactly draft_sample's
  (ops/sampling/draft/), with the noise keyed by positions[b] + s. Writes one
  (key, index) partial per program. For vanilla the latent is W1[p]: this kernel
  combines the previous partials and gathers it itself, after the first W2 tile's
  load is issued, so the combine hides under it. Odd steps walk each program's tiles
  back to front, so the rows the previous step read last (the likeliest still in L2,
  which W2 outgrows) are read first; ties go to the lower index in either order;
- `markov_last_token_kernel` (grid B): the last step's token from its partials.

Partials are indexed by step, so no launch reads what it writes. Every index comes
from a clamped first token or from an argmax over [0, V), and every load and store
is masked: no value makes a kernel touch memory outside its tensors.

Jit functions are imported by name: Inductor re-emits a user Triton kernel with the
jit functions it calls, and a module attribute is not carried along.
"""

from ..backend import tl, triton
from ..common.scan import combine_argmax, lane_argmax_finish, lane_argmax_init
from ..sampling.noise import gumbel_gain, gumbel_keys, row_key

# ------------------------------------------------------------------ shared steps


@triton.jit
def previous_token(first_prev_ptr, part_key_ptr, part_idx_ptr, row, step, vocab, num_steps, num_splits,
                   SPLIT_BLOCK: tl.constexpr):  # fmt: skip
    """The token step `step` conditions on (int32): first_prev[row], clamped into
    [0, V), at step 0; else the argmax of step - 1's partials (first index on ties)."""
    prev = tl.load(first_prev_ptr + row).to(tl.int64)
    prev = tl.minimum(tl.maximum(prev, 0), vocab - 1).to(tl.int32)
    if step > 0:
        parts = (row * num_steps + step - 1) * num_splits
        _, prev = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
    return prev


@triton.jit
def store_previous_token(tokens_ptr, prev, row, step, num_steps, first_program):
    """tokens[row, step - 1] = prev, by one program of the row, from step 1 on."""
    if first_program & (step > 0):
        tl.store(tokens_ptr + row * num_steps + step - 1, prev)


@triton.jit
def tanh(x):
    """tanh in fp32 (the interpreter has no libdevice): an odd series near 0, where
    1 - e**(-2|x|) cancels, (1 - t) / (1 + t) with t = e**(-2|x|) elsewhere; within a
    few ulp."""
    a = tl.abs(x)
    t = tl.exp(-2.0 * a)
    far = (1.0 - t) / (1.0 + t)
    x2 = x * x
    near = a * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    y = tl.where(a < 0.125, near, far)
    return tl.where(x < 0, -y, y)


@triton.jit
def tile_mask(row_mask, col_mask, EVEN_R: tl.constexpr):
    """The mask of a [rows, BLOCK_R] tile. EVEN_R (r == BLOCK_R): rows only, so that the
    compiler sees whole rows and vectorises the loads (a mask against the runtime r
    makes every element a scalar load)."""
    if EVEN_R:
        return row_mask[:, None]
    else:
        return row_mask[:, None] & col_mask[None, :]


@triton.jit
def load_vector(ptr, cols, col_mask, EVEN_R: tl.constexpr):
    """ptr[cols] in fp32, 0 past r."""
    if EVEN_R:
        return tl.load(ptr + cols).to(tl.float32)
    else:
        return tl.load(ptr + cols, mask=col_mask, other=0.0).to(tl.float32)


@triton.jit
def matvec_rows(w_ptr, rows, row_mask, row_stride, col_offset, cols, col_mask, vec, EVEN_R: tl.constexpr):
    """sum_k W[rows, col_offset + k] * vec[k] in fp32, k over the masked cols."""
    offs = rows[:, None].to(tl.int64) * row_stride + col_offset + cols[None, :]
    w = tl.load(w_ptr + offs, mask=tile_mask(row_mask, col_mask, EVEN_R), other=0.0).to(tl.float32)
    return tl.sum(w * vec[None, :], 1)


@triton.jit
def joint_row(
    hidden_row, weight_ptr, out, out_mask, weight_stride, rank, cols, col_mask, state, emb, EVEN_R: tl.constexpr
):
    """rnn: entries `out` of joint_proj([state ; emb ; h]) = hidden part + the weight's
    columns [0, r) @ state + its columns [r, 2r) @ emb."""
    value = tl.load(hidden_row + out, mask=out_mask, other=0.0).to(tl.float32)
    value += matvec_rows(weight_ptr, out, out_mask, weight_stride, 0, cols, col_mask, state, EVEN_R)
    return value + matvec_rows(weight_ptr, out, out_mask, weight_stride, rank, cols, col_mask, emb, EVEN_R)


@triton.jit
def walk_tile(t, num_tiles, backward):
    """The tile visited t-th: t, or num_tiles - 1 - t walking backward."""
    return tl.where(backward, num_tiles - 1 - t, t)


@triton.jit
def lane_argmax_update_any_order(best, best_idx, keys, idx):
    """Per-lane running (max, index) whatever order the indices come in: a tie goes to
    the lower index (ops/common/scan.py's update keeps the earlier visit, the lower
    index only on a forward walk). NaN keys never win."""
    better = (keys > best) | ((keys == best) & (idx < best_idx))
    return tl.where(better, keys, best), tl.where(better, idx, best_idx)


# --------------------------------------------------------------------- kernels


@triton.jit
def markov_latent_kernel(
    first_prev_ptr, w1_ptr, hidden_ptr, weight_ptr, state_ptr, latent_ptr,
    part_key_ptr, part_idx_ptr, tokens_ptr,
    step, vocab, rank, num_steps, num_splits, weight_stride,
    RNN: tl.constexpr, LATENT_ROWS: tl.constexpr, BLOCK_R: tl.constexpr, EVEN_R: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """Entries [j, j + LATENT_ROWS) of step `step`'s latent (gated or rnn), into
    latent [B, r]; rnn: also of the next state, into slot step % 2 of state [B, 2, r]."""
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    prev = previous_token(first_prev_ptr, part_key_ptr, part_idx_ptr, row, step, vocab, num_steps, num_splits,
                          SPLIT_BLOCK)  # fmt: skip
    store_previous_token(tokens_ptr, prev, row, step, num_steps, block == 0)

    cols = tl.arange(0, BLOCK_R)
    col_mask = cols < rank
    j = block * LATENT_ROWS + tl.arange(0, LATENT_ROWS)
    j_mask = j < rank
    emb_row = w1_ptr + prev.to(tl.int64) * rank
    emb = load_vector(emb_row, cols, col_mask, EVEN_R)
    emb_j = tl.load(emb_row + j, mask=j_mask, other=0.0).to(tl.float32)
    if RNN:
        hidden_row = hidden_ptr + (row * num_steps + step) * 3 * rank
        # The state before step 0 is zero: slot (step - 1) % 2 is read from step 1 on.
        state_row = state_ptr + (row * 2 + (step + 1) % 2) * rank
        state_limit = tl.where(step > 0, rank, 0)
        state = tl.load(state_row + cols, mask=cols < state_limit, other=0.0)
        state_j = tl.load(state_row + j, mask=j < state_limit, other=0.0)
        # joint_proj rows [g | c | o] read [state ; emb]: weight columns [0, r) and [r, 2r).
        pre_gate = joint_row(hidden_row, weight_ptr, j, j_mask, weight_stride, rank, cols, col_mask, state, emb,
                             EVEN_R)  # fmt: skip
        pre_candidate = joint_row(hidden_row, weight_ptr, rank + j, j_mask, weight_stride, rank, cols, col_mask,
                                  state, emb, EVEN_R)  # fmt: skip
        pre_output = joint_row(hidden_row, weight_ptr, 2 * rank + j, j_mask, weight_stride, rank, cols, col_mask,
                               state, emb, EVEN_R)  # fmt: skip
        gate = tl.sigmoid(pre_gate)
        new_state = gate * state_j + (1.0 - gate) * tanh(pre_candidate)
        tl.store(state_ptr + (row * 2 + step % 2) * rank + j, new_state, mask=j_mask)
        latent = tanh(pre_output)
    else:
        hidden_row = hidden_ptr + (row * num_steps + step) * rank
        value = tl.load(hidden_row + j, mask=j_mask, other=0.0).to(tl.float32)
        value += matvec_rows(weight_ptr, j, j_mask, weight_stride, 0, cols, col_mask, emb, EVEN_R)
        latent = tl.sigmoid(value) * emb_j
    tl.store(latent_ptr + row * rank + j, latent, mask=j_mask)


@triton.jit
def load_tile(w2_ptr, base_row, idx, start, end, rank, cols, col_mask, EVEN_R: tl.constexpr):
    """W2[idx, :r] (0 outside [start, end)) and base[idx] (-inf there) of one tile of rows."""
    mask = (idx >= start) & (idx < end)
    offs = idx[:, None].to(tl.int64) * rank + cols[None, :]
    w = tl.load(w2_ptr + offs, mask=tile_mask(mask, col_mask, EVEN_R), other=0.0)
    return w, tl.load(base_row + idx, mask=mask, other=float("-inf"))


@triton.jit
def markov_bias_kernel(
    base_ptr, first_prev_ptr, w1_ptr, w2_ptr, latent_ptr,
    temperature_ptr, seeds_ptr, positions_ptr,
    tokens_ptr, corrected_ptr, part_key_ptr, part_idx_ptr,
    step, vocab, rank, num_steps, num_splits, base_stride_b, base_stride_s,
    SALT_KEY: tl.constexpr, GATHER: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr, ROWS_PER_TILE: tl.constexpr, BLOCK_R: tl.constexpr, EVEN_R: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, FAST_LOG2: tl.constexpr,
):  # fmt: skip
    """Vocabulary rows [start, start + ROWS_PER_PROGRAM) of step `step`: corrected =
    base + W2 @ latent stored, and the (key, index) partial of its argmax. GATHER
    (vanilla): latent = W1[previous token], found here; else read from latent [B, r]."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    start = split * ROWS_PER_PROGRAM
    end = tl.minimum(start + ROWS_PER_PROGRAM, vocab)
    cols = tl.arange(0, BLOCK_R)
    col_mask = cols < rank
    base_row = base_ptr + row * base_stride_b + step * base_stride_s
    # Issued before the latent is known (the first tile's loads do not need it).
    # Odd steps walk the tiles back to front: the ones the previous step read last, the
    # likeliest still in L2 (W2 outgrows it at V = 152k), come first.
    num_tiles = tl.cdiv(end - start, ROWS_PER_TILE)
    backward = step % 2 == 1
    lanes = tl.arange(0, ROWS_PER_TILE)
    w_next, x_next = load_tile(w2_ptr, base_row, start + walk_tile(0, num_tiles, backward) * ROWS_PER_TILE + lanes,
                               start, end, rank, cols, col_mask, EVEN_R)  # fmt: skip

    if GATHER:
        prev = previous_token(first_prev_ptr, part_key_ptr, part_idx_ptr, row, step, vocab, num_steps, num_splits,
                              SPLIT_BLOCK)  # fmt: skip
        store_previous_token(tokens_ptr, prev, row, step, num_steps, split == 0)
        latent = load_vector(w1_ptr + prev.to(tl.int64) * rank, cols, col_mask, EVEN_R)
    else:
        latent = load_vector(latent_ptr + row * rank, cols, col_mask, EVEN_R)

    temp = tl.load(temperature_ptr + row).to(tl.float32)
    greedy = temp <= 0
    gain = gumbel_gain(temp)
    key = row_key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row).to(tl.int64) + step, SALT_KEY)
    out_row = corrected_ptr + (row * num_steps + step) * vocab
    best, best_idx = lane_argmax_init(start, ROWS_PER_TILE)
    for t in range(0, num_tiles):
        idx = start + walk_tile(t, num_tiles, backward) * ROWS_PER_TILE + lanes
        w, x = w_next, x_next
        # Past the walk's last tile (either end) the next one is outside [start, end): masked.
        next_idx = start + walk_tile(t + 1, num_tiles, backward) * ROWS_PER_TILE + lanes
        w_next, x_next = load_tile(w2_ptr, base_row, next_idx, start, end, rank, cols, col_mask, EVEN_R)
        corrected = x.to(tl.float32) + tl.sum(w.to(tl.float32) * latent[None, :], 1)
        tl.store(out_row + idx, corrected, mask=idx < end)
        # draft_sample's keys: the logits for a greedy row (gain 1), Gumbel-max otherwise.
        keys = tl.where(greedy, corrected * gain, gumbel_keys(corrected, idx, gain, key, FAST_LOG2))
        best, best_idx = lane_argmax_update_any_order(best, best_idx, keys, idx)
    best, best_idx = lane_argmax_finish(best, best_idx)
    part = (row * num_steps + step) * num_splits + split
    tl.store(part_key_ptr + part, best)
    tl.store(part_idx_ptr + part, best_idx)


@triton.jit
def markov_last_token_kernel(part_key_ptr, part_idx_ptr, tokens_ptr, num_steps, num_splits,
                             SPLIT_BLOCK: tl.constexpr):  # fmt: skip
    """tokens[row, S - 1] from the last step's partials."""
    row = tl.program_id(0).to(tl.int64)
    parts = (row * num_steps + num_steps - 1) * num_splits
    _, token = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
    tl.store(tokens_ptr + row * num_steps + num_steps - 1, token)
