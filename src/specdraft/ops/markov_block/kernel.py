"""The Triton kernels of `markov_block_sample` (this package's docstring defines what
they compute).

Step s needs the token sampled at s - 1, an argmax over the whole vocabulary, before
it can read W2 at all; at B = 1 one program per request cannot stream W2 (V x r, 78 MB
in bf16 at V = 152k, r = 256) at the memory's bandwidth, so each step's rows are split
across programs (`ROWS_PER_PROGRAM` vocabulary rows each) and the kernel boundary is
the grid-wide barrier between steps. One op, 2S + 1 launches (S + 1 for vanilla):

- `markov_latent_kernel` (gated and rnn; grid B x cdiv(r, LATENT_ROWS)): combines the
  previous step's per-program partials into its token (every program does, the
  partials are few; the first stores the token), then computes LATENT_ROWS entries of
  the step's latent, and for rnn of the next state (ping-pong slots: a launch reads
  slot (s - 1) % 2 whole and writes its entries of slot s % 2);
- `markov_bias_kernel` (grid cdiv(B, BLOCK_B) x cdiv(V, ROWS_PER_PROGRAM)): a program
  serves BLOCK_B requests (a request group) over its vocabulary rows, so W2 is read
  once per step for the whole group, not once per request. Per tile of rows the bias
  of every request of the group is one matrix product, W2[rows] @ [latent_b]_b
  ([rows, r] x [r, BLOCK_B], `tile_bias`), then corrected = base + bias (stored) and
  the per-(row, request) argmax of the greedy or Gumbel-max keys, exactly
  draft_sample's (ops/sampling/draft.py), with the noise keyed by positions[b] + s.
  Writes one (key, index) partial per request and program. For vanilla the latent is
  W1[p]: this kernel combines the previous partials and gathers it itself. Odd steps
  walk each program's tiles back to front, so the rows the previous step read last
  (the likeliest still in L2, which W2 outgrows) are read first; ties go to the lower
  index in either order;
- `markov_last_token_kernel` (grid B): the last step's token from its partials.

The bias product: with bf16 W2 (`TENSOR_CORES`) on tensor cores. A bf16 x bf16
product is exact in fp32, and an fp32 latent is exactly the sum of three bf16 pieces
(hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid): x has 24 significant
bits, each rounding to nearest takes 8 of them and leaves at most 16, then 8, then
none; for |x| from 2**-100, where lo stays above bf16's subnormals, up to 2**127), so
W2 @ latent is the fp32 sum of exact products, in three products (one where the
latent is W1's own bf16 row: vanilla with bf16 weights), accumulated in fp32. Other
weight dtypes: the same product in fp32 FMAs (input_precision "ieee"). Either way the
sums run in fp32, in the product's order, which is not the torch reference's: results
agree with it to fp32 rounding, as any two fp32 matrix products do. The interpreter's tl.dot reads bf16 operands as
integers, so there (`EMULATE_BF16`) the pieces are multiplied in fp32, exactly too.

Streaming W2: its tiles reach shared memory through Triton's software pipeline
(num_stages - 1 in flight while one is multiplied); the latent's operand, when the
whole rank is one block of K, is built once per program, before the loop. Before a
program knows its latent (for vanilla, after combining the previous partials) it asks
L2 for its first tiles (`prefetch_first_tiles`), so the step's first loads do not wait
behind that. A group of greedy requests draws no noise.

Partials are indexed by step, so no launch reads what it writes. Every index comes
from a clamped first token or from an argmax over [0, V), and every load and store
is masked: no value makes a kernel touch memory outside its tensors.

Jit functions are imported by name: Inductor re-emits a user Triton kernel with the
jit functions it calls, and a module attribute is not carried along.
"""

from dataclasses import dataclass

from ..backend import TRITON_INTERPRET, next_power_of_2, tl, triton
from ..common.scan import combine_argmax
from ..sampling.noise import gumbel_gain, gumbel_keys, row_key

# ------------------------------------------------------------------------ sizes

SPLIT_BLOCK = 4 if TRITON_INTERPRET else 1024  # partials combined per iteration, all rows of a group together


@dataclass(frozen=True)
class MarkovTiles:
    """The kernels' sizes (kernel.py says what each program does). Plain constants, no
    autotuning: the op runs inside one CUDA graph, and a shape's best values are
    measured once (benchmarks/bench_markov_block.py) and written into TILES_BY_SHAPE.

    requests_per_program: BLOCK_B, the requests a bias program serves, the bias
        product's N; a static batch of fewer takes the next power of two that holds it.
    rows_per_tile: the product's M (64: one Hopper warpgroup MMA over 4 warps).
    rows_per_program: vocabulary rows per bias program (a multiple of rows_per_tile):
        the programs of a step and, for vanilla, the partials every program combines.
    block_k: the product's K per W2 load; a rank up to it is one product per tile, its
        latent operand a loop invariant, larger ranks loop over blocks of K. The fp32
        FMA product (weights that are not bf16) keeps its own, smaller one: it holds a
        tile's K in registers.
    num_warps, num_stages: the bias kernel's; num_stages - 1 W2 tiles are in flight
        while one is multiplied (Triton's software pipeline).
    prefetch_tiles: W2 tiles each program asks of L2 before it knows its latent.
    latent_rows, latent_warps: latent entries per program of the latent kernel (gated,
        rnn), and its warps."""

    requests_per_program: int = 8
    rows_per_tile: int = 64
    rows_per_program: int = 512
    block_k: int = 256
    fma_block_k: int = 32
    num_warps: int = 4
    num_stages: int = 3
    prefetch_tiles: int = 2
    latent_rows: int = 8
    latent_warps: int = 4


# At V = 152k, r = 256 (Qwen3-8B's DSpark head), as compiled for sm_90: a W2 tile of 64
# rows is 32 KB of bf16; a program holds 3 of them in shared memory (2 in flight) plus
# the latent's pieces (12 KB) at B = 8 (warpgroup MMA): 2 programs an SM; 2 tiles (1 in
# flight) at B = 1: 3 an SM. 768 rows a program (12 tiles) make 198 programs, one wave
# on the 132 SMs of an H100 / H200 either way (512 rows would make 297: a second, thin
# wave at B = 8), with 6 MB (B = 1) to 13 MB (B = 8) of W2 in flight, above the ~4 MB
# that 4.3 TB/s needs at ~1 us of latency.
TILES_BY_SHAPE: dict[tuple[int, int], MarkovTiles] = {(256, 151936): MarkovTiles(rows_per_program=768)}
DEFAULT_TILES = MarkovTiles()
# The interpreter emulates every lane in NumPy: small tiles keep it fast and make small
# test vocabularies span several tiles, programs and blocks of K, and small batches
# several request groups.
INTERPRETER_TILES = MarkovTiles(requests_per_program=2, rows_per_tile=4, rows_per_program=8, block_k=16,
                                fma_block_k=16, prefetch_tiles=0, latent_rows=4)  # fmt: skip
MIN_BLOCK_K = 16  # tl.dot's smallest K


def markov_tiles(rank: int, vocab: int) -> MarkovTiles:
    """The sizes for rank r and vocabulary V (both model constants)."""
    if TRITON_INTERPRET:
        return INTERPRETER_TILES
    return TILES_BY_SHAPE.get((rank, vocab), DEFAULT_TILES)


def requests_per_program(num_reqs, most: int) -> int:
    """BLOCK_B for a batch of num_reqs: the smallest power of two that holds a static
    batch, up to `most`; `most` for a batch size traced as a symbol (no guard on it)."""
    if isinstance(num_reqs, int):
        return min(most, next_power_of_2(num_reqs))
    return most


def rank_blocks(rank: int, block_k: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_K): the rank padded to a power of two (and to tl.dot's smallest
    K), and the product's K per load."""
    block_r = max(MIN_BLOCK_K, next_power_of_2(rank))
    return block_r, min(block_r, max(MIN_BLOCK_K, block_k))


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


# ------------------------------------------------------ the bias kernel's steps


@triton.jit
def combine_argmax_rows(key_ptr, idx_ptr, parts, row_mask, num_splits, SPLIT_BLOCK: tl.constexpr):
    """combine_argmax (ops/common/scan.py) for several rows at once: per row r the
    (max, first index) of partials [parts[r], parts[r] + num_splits). SPLIT_BLOCK
    partials per iteration in all, a row's share each (SPLIT_BLOCK >= rows)."""
    ROWS: tl.constexpr = parts.shape[0]
    COLS: tl.constexpr = SPLIT_BLOCK // ROWS
    best = tl.full([ROWS], float("-inf"), tl.float32)
    best_idx = tl.full([ROWS], 0, tl.int32)
    for s0 in range(0, num_splits, COLS):
        offs = s0 + tl.arange(0, COLS)
        mask = row_mask[:, None] & (offs < num_splits)[None, :]
        keys = tl.load(key_ptr + parts[:, None] + offs[None, :], mask=mask, other=float("-inf"))
        idxs = tl.load(idx_ptr + parts[:, None] + offs[None, :], mask=mask, other=2147483647)
        block_best = tl.max(keys, 1)
        block_idx = tl.min(tl.where(mask & (keys == block_best[:, None]), idxs, 2147483647), 1)
        better = block_best > best
        best = tl.where(better, block_best, best)
        best_idx = tl.where(better, block_idx, best_idx)
    return best, best_idx


@triton.jit
def previous_tokens(first_prev_ptr, part_key_ptr, part_idx_ptr, reqs, req_mask, step, vocab, num_steps, num_splits,
                    SPLIT_BLOCK: tl.constexpr):  # fmt: skip
    """previous_token for a request group [BLOCK_B] (0 for requests past the batch)."""
    prev = tl.load(first_prev_ptr + reqs, mask=req_mask, other=0).to(tl.int64)
    prev = tl.minimum(tl.maximum(prev, 0), vocab - 1).to(tl.int32)
    if step > 0:
        parts = (reqs * num_steps + step - 1) * num_splits
        _, prev = combine_argmax_rows(part_key_ptr, part_idx_ptr, parts, req_mask, num_splits, SPLIT_BLOCK)
    return prev


@triton.jit
def store_previous_tokens(tokens_ptr, prev, reqs, req_mask, step, num_steps, first_program):
    """tokens[b, step - 1] = prev[b] for the group's requests, by one program of the
    group, from step 1 on."""
    if first_program & (step > 0):
        tl.store(tokens_ptr + reqs * num_steps + step - 1, prev, mask=req_mask)


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the lines at ptrs (one instruction each, nothing waits for them):
    the first tiles' W2 rows are on their way while the program finds its latent.
    The interpreter has no inline PTX: callers skip this there."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)  # fmt: skip


@triton.jit
def prefetch_first_tiles(w2_ptr, start, end, rank, num_tiles, backward, ROWS_PER_TILE: tl.constexpr,
                         TILES: tl.constexpr, LINES: tl.constexpr, LINE: tl.constexpr):  # fmt: skip
    """prefetch_l2 of the walk's first TILES tiles of W2 rows: LINES addresses per row,
    LINE elements (one 128-byte line) apart."""
    lines = tl.arange(0, LINES) * LINE
    for t in tl.static_range(TILES):
        rows = start + walk_tile(t, num_tiles, backward) * ROWS_PER_TILE + tl.arange(0, ROWS_PER_TILE)
        rows = tl.minimum(tl.maximum(rows, start), end - 1)
        cols = tl.minimum(lines, rank - 1)
        prefetch_l2(w2_ptr + rows[:, None].to(tl.int64) * rank + cols[None, :])


@triton.jit
def load_latents(lat_rows, kc, ks, rank, req_mask, EVEN_R: tl.constexpr):
    """[BLOCK_K, BLOCK_B]: entry (k, b) = lat_rows[b][kc + k] (0 past r and past the
    batch), the right-hand side of the bias product, in the latents' own dtype."""
    k = kc + ks
    mask = req_mask[None, :] if EVEN_R else (k < rank)[:, None] & req_mask[None, :]
    return tl.load(lat_rows[None, :] + k[:, None], mask=mask, other=0.0)


@triton.jit
def latent_pieces(lat, TENSOR_CORES: tl.constexpr, PIECES: tl.constexpr):
    """The bias product's right-hand operands: with TENSOR_CORES, bf16 pieces whose
    sum is exactly lat (the module docstring: three for an fp32 latent, lat itself
    when it is bf16, PIECES == 1); else lat in fp32 (the other two unused)."""
    if TENSOR_CORES:
        if PIECES == 1:
            hi = lat.to(tl.bfloat16)
            return hi, hi, hi
        else:
            lat = lat.to(tl.float32)
            hi = lat.to(tl.bfloat16)
            rest = lat - hi.to(tl.float32)
            mid = rest.to(tl.bfloat16)
            lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
            return hi, mid, lo
    else:
        lat = lat.to(tl.float32)
        return lat, lat, lat


@triton.jit
def exact_dot(w, piece, acc, EMULATE_BF16: tl.constexpr):
    """acc + w @ piece, bf16 x bf16 products (exact in fp32) accumulated in fp32."""
    if EMULATE_BF16:
        return tl.dot(w.to(tl.float32), piece.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(w, piece, acc)


@triton.jit
def tile_bias(w, hi, mid, lo, acc, TENSOR_CORES: tl.constexpr, PIECES: tl.constexpr,
              EMULATE_BF16: tl.constexpr):  # fmt: skip
    """acc + W2[rows, k] @ latents[k, :] for one tile of rows and one block of k, from
    latent_pieces: the small pieces first."""
    if TENSOR_CORES:
        if PIECES == 3:
            acc = exact_dot(w, lo, acc, EMULATE_BF16)
            acc = exact_dot(w, mid, acc, EMULATE_BF16)
        return exact_dot(w, hi, acc, EMULATE_BF16)
    else:
        return tl.dot(w.to(tl.float32), hi, acc, input_precision="ieee")


@triton.jit
def load_w2_tile(w2_ptr, idx, row_mask, kc, ks, rank, EVEN_R: tl.constexpr):
    """W2[idx, kc + k] [rows, BLOCK_K], 0 outside the program's rows and past r."""
    offs = idx[:, None].to(tl.int64) * rank + kc + ks[None, :]
    return tl.load(w2_ptr + offs, mask=tile_mask(row_mask, kc + ks < rank, EVEN_R), other=0.0)


@triton.jit
def sample_keys(corrected, idx, greedy, gain, key, any_sampled, FAST_LOG2: tl.constexpr):
    """draft_sample's keys of a [rows, BLOCK_B] tile: the logits for a greedy request
    (gain 1), Gumbel-max otherwise. A group of greedy requests skips the noise (its
    keys are the same numbers: x * 1.0 == x)."""
    if any_sampled:
        return tl.where(greedy[None, :], corrected * gain[None, :],
                        gumbel_keys(corrected, idx[:, None], gain[None, :], key[None, :], FAST_LOG2))  # fmt: skip
    else:
        return corrected


@triton.jit
def rows_argmax_finish(best, best_idx):
    """lane_argmax_finish along axis 0 of [rows, BLOCK_B]: per request (max, first
    index of the max)."""
    top = tl.max(best, 0)
    return top, tl.min(tl.where(best == top[None, :], best_idx, 2147483647), 0)


@triton.jit
def markov_bias_kernel(
    base_ptr, first_prev_ptr, w1_ptr, w2_ptr, latent_ptr,
    temperature_ptr, seeds_ptr, positions_ptr,
    tokens_ptr, corrected_ptr, part_key_ptr, part_idx_ptr,
    step, num_reqs, vocab, rank, num_steps, num_splits, base_stride_b, base_stride_s,
    SALT_KEY: tl.constexpr, GATHER: tl.constexpr, BLOCK_B: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr, ROWS_PER_TILE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
    EVEN_R: tl.constexpr, TENSOR_CORES: tl.constexpr, PIECES: tl.constexpr, EMULATE_BF16: tl.constexpr,
    PREFETCH_TILES: tl.constexpr, LINES: tl.constexpr, LINE: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    FAST_LOG2: tl.constexpr,
):  # fmt: skip
    """Vocabulary rows [start, start + ROWS_PER_PROGRAM) of step `step` for requests
    [g * BLOCK_B, (g + 1) * BLOCK_B): corrected = base + W2 @ latent stored, and each
    request's (key, index) partial of its argmax. GATHER (vanilla): latent = W1[previous
    token], found here; else read from latent [B, r]."""
    group = tl.program_id(0)
    split = tl.program_id(1)
    reqs = group * BLOCK_B + tl.arange(0, BLOCK_B)
    req_mask = reqs < num_reqs
    reqs = reqs.to(tl.int64)
    start = split * ROWS_PER_PROGRAM
    end = tl.minimum(start + ROWS_PER_PROGRAM, vocab)
    num_tiles = tl.cdiv(end - start, ROWS_PER_TILE)
    # Odd steps walk the tiles back to front: the ones the previous step read last, the
    # likeliest still in L2 (W2 outgrows it at V = 152k), come first.
    backward = step % 2 == 1
    if PREFETCH_TILES > 0:
        prefetch_first_tiles(w2_ptr, start, end, rank, num_tiles, backward, ROWS_PER_TILE, PREFETCH_TILES, LINES,
                             LINE)  # fmt: skip

    if GATHER:
        prev = previous_tokens(first_prev_ptr, part_key_ptr, part_idx_ptr, reqs, req_mask, step, vocab, num_steps,
                               num_splits, SPLIT_BLOCK)  # fmt: skip
        store_previous_tokens(tokens_ptr, prev, reqs, req_mask, step, num_steps, split == 0)
        lat_rows = w1_ptr + prev.to(tl.int64) * rank
    else:
        lat_rows = latent_ptr + reqs * rank
    ks = tl.arange(0, BLOCK_K)
    ONE_BLOCK_K: tl.constexpr = BLOCK_K >= BLOCK_R
    if ONE_BLOCK_K:  # the whole rank in one product: its operands are loop invariants
        hi, mid, lo = latent_pieces(load_latents(lat_rows, 0, ks, rank, req_mask, EVEN_R), TENSOR_CORES, PIECES)

    temp = tl.load(temperature_ptr + reqs, mask=req_mask, other=0.0).to(tl.float32)
    greedy = temp <= 0
    any_sampled = tl.max((req_mask & (temp > 0)).to(tl.int32), 0) > 0
    gain = gumbel_gain(temp)
    seeds = tl.load(seeds_ptr + reqs, mask=req_mask, other=0)
    positions = tl.load(positions_ptr + reqs, mask=req_mask, other=0).to(tl.int64) + step
    key = row_key(seeds, positions, SALT_KEY)
    base_rows = base_ptr + reqs * base_stride_b + step * base_stride_s
    out_rows = corrected_ptr + (reqs * num_steps + step) * vocab
    rows = tl.arange(0, ROWS_PER_TILE)
    best = tl.full([ROWS_PER_TILE, BLOCK_B], float("-inf"), tl.float32)
    best_idx = tl.full([ROWS_PER_TILE, BLOCK_B], 0, tl.int32) + start
    for t in range(0, num_tiles):
        idx = start + walk_tile(t, num_tiles, backward) * ROWS_PER_TILE + rows
        row_mask = idx < end
        bias = tl.zeros([ROWS_PER_TILE, BLOCK_B], tl.float32)
        if ONE_BLOCK_K:
            bias = tile_bias(load_w2_tile(w2_ptr, idx, row_mask, 0, ks, rank, EVEN_R), hi, mid, lo, bias,
                             TENSOR_CORES, PIECES, EMULATE_BF16)  # fmt: skip
        else:
            for kc in range(0, BLOCK_R, BLOCK_K):
                k_hi, k_mid, k_lo = latent_pieces(load_latents(lat_rows, kc, ks, rank, req_mask, EVEN_R),
                                                  TENSOR_CORES, PIECES)  # fmt: skip
                bias = tile_bias(load_w2_tile(w2_ptr, idx, row_mask, kc, ks, rank, EVEN_R), k_hi, k_mid, k_lo, bias,
                                 TENSOR_CORES, PIECES, EMULATE_BF16)  # fmt: skip
        mask = row_mask[:, None] & req_mask[None, :]
        x = tl.load(base_rows[None, :] + idx[:, None], mask=mask, other=float("-inf"))
        corrected = x.to(tl.float32) + bias
        tl.store(out_rows[None, :] + idx[:, None], corrected, mask=mask)
        keys = sample_keys(corrected, idx, greedy, gain, key, any_sampled, FAST_LOG2)
        best, best_idx = lane_argmax_update_any_order(best, best_idx, keys, idx[:, None])
    best, best_idx = rows_argmax_finish(best, best_idx)
    part = (reqs * num_steps + step) * num_splits + split
    tl.store(part_key_ptr + part, best, mask=req_mask)
    tl.store(part_idx_ptr + part, best_idx, mask=req_mask)


@triton.jit
def markov_last_token_kernel(part_key_ptr, part_idx_ptr, tokens_ptr, num_steps, num_splits,
                             SPLIT_BLOCK: tl.constexpr):  # fmt: skip
    """tokens[row, S - 1] from the last step's partials."""
    row = tl.program_id(0).to(tl.int64)
    parts = (row * num_steps + num_steps - 1) * num_splits
    _, token = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
    tl.store(tokens_ptr + row * num_steps + num_steps - 1, token)
