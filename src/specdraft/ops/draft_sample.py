"""Draft-token sampling (references 002, 004).

Each request b samples one token from logits[b] [V]:
- temperature[b] == 0 (or below): greedy, argmax with the first index on ties;
- temperature[b] > 0: Gumbel-max, argmax(logits / T + g) with g = -log(-log u),
  computed in base 2 as argmax(logits * log2(e) / T - log2(-log2 u)): the same
  argmax (the base change scales every key by log2(e) and shifts it by a
  constant), one multiply-add and two hardware log2 per token.

The noise: ops/_noise.py (a pure function of seed, position, token, salt and
stream, identical in Triton and torch).

Unlike vLLM's `compute_probs_and_sample_next_token` (reference 002), which ignores
seeds, draws exponentials from the global RNG and materialises probs / q for the
argmax, the kernels here stream the vocabulary in blocks: online argmax, online
softmax, no [B, V] temporaries. Each row is split across programs (CHUNK_V tokens
each) so that small batches still fill the GPU; a second tiny pass combines the
per-program partials and, if asked, writes the probabilities. The argmax is kept
per lane (one compare and two selects per token) and reduced across the block
once per program, not once per block: at V = 152k the hash, the two logs and the
bf16 loads are then all that is left per token.

The optional buffer write stores this step's processed logits (logits / T) or
probabilities softmax(logits / T) into out[:, step, :], with `step` a device scalar
read by the kernel, so one CUDA graph replays every draft step. Greedy rows use
T = 1 for what they store. A step outside [0, K) writes nothing.
"""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_contiguous,
    check_distinct,
    check_dtype,
    check_int_range,
    check_rank,
    check_same_device,
    check_shape,
)

from ._noise import (
    SALT_LIMIT,
    STREAM_DRAFT,
    STREAM_SAMPLE,
    _combine_argmax,
    _combine_softmax,
    _gumbel_gain,
    _lane_argmax_finish,
    _lane_argmax_update,
    _load_block,
    _log2_exponential2,
    _noise_bits,
    _row_key,
    _softmax_update,
    gumbel2_torch,
    gumbel_gain_torch,
    noise_bits_torch,
    row_key_torch,
    salt_key,
    uniform_torch,
)
from .backend import NAMESPACE, TRITON_INTERPRET, cdiv, tl, triton, use_triton

if TRITON_INTERPRET:
    # The interpreter emulates every lane of a block in NumPy: small blocks keep
    # its lane fast and make small test vocabularies span several blocks and chunks.
    BLOCK_V, CHUNK_V, DRAFT_BLOCK_V = 16, 64, 16
else:
    BLOCK_V = 2048  # tokens per loop iteration of one program (rejection sampling)
    CHUNK_V = 8192  # tokens per program; a 152k vocab row spreads over 19 programs
    DRAFT_BLOCK_V = 1024  # draft_sample's loop: 8 tokens per thread (benchmarks/README.md, tiles)
SPLIT_BLOCK = 32  # partials combined per iteration of the combining loops
FAST_LOG2 = not TRITON_INTERPRET  # the interpreter has no inline PTX: exact log2 there
NUM_WARPS = 8
DRAFT_NUM_WARPS = 4

# --------------------------------------------------------------------------- kernels


@triton.jit
def _scan_chunk(
    row_ptr,
    start,
    end,
    vocab,
    gain,
    scale,
    key,
    out_row,
    out_limit,
    NOISE: tl.constexpr,
    WRITE: tl.constexpr,
    BLOCK: tl.constexpr,
    FAST_LOG2: tl.constexpr,
):
    """One program's tokens [start, end) of a row: the per-lane argmax of the keys
    (logits * gain, plus base-2 Gumbel noise if NOISE), online-softmax statistics
    of logits / scale (WRITE == 1) or their store (WRITE == 2)."""
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], 0, tl.int32) + start
    run_max = tl.full([], float("-inf"), tl.float32)
    run_sum = tl.full([], 0.0, tl.float32)
    # Prefetch: the next block's load is in flight while this block is hashed. The
    # per-lane accumulators cost registers, so occupancy alone cannot keep enough
    # bytes in flight (Little's law); a second load per thread does.
    x_next = _load_block(row_ptr, start + tl.arange(0, BLOCK), end, float("-inf"))
    for off in range(start, end, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        x = x_next.to(tl.float32)
        x_next = _load_block(row_ptr, idx + BLOCK, end, float("-inf"))
        if NOISE:
            keys = x * gain - _log2_exponential2(_noise_bits(key, idx), FAST_LOG2)  # one FFMA
        else:
            keys = x * gain
        best, best_idx = _lane_argmax_update(best, best_idx, keys, idx)
        if WRITE == 1:
            run_max, run_sum = _softmax_update(run_max, run_sum, x / scale)
        if WRITE == 2:
            tl.store(out_row + idx, x / scale, mask=idx < out_limit)
    best, best_idx = _lane_argmax_finish(best, best_idx)
    return best, best_idx, run_max, run_sum


@triton.jit
def _draft_partials_kernel(
    logits_ptr,
    temperature_ptr,
    seeds_ptr,
    positions_ptr,
    out_ptr,
    step_ptr,
    part_key_ptr,
    part_idx_ptr,
    part_max_ptr,
    part_sum_ptr,
    vocab,
    num_splits,
    num_steps,
    SALT_KEY: tl.constexpr,
    WRITE: tl.constexpr,  # 0: nothing, 1: probs (stats here, values in pass 2), 2: logits
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    FAST_LOG2: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temp = tl.load(temperature_ptr + row).to(tl.float32)
    greedy = temp <= 0
    scale = tl.where(greedy, 1.0, temp)
    gain = _gumbel_gain(temp)
    key = _row_key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row), SALT_KEY)
    row_ptr = logits_ptr + row * vocab
    out_row, out_limit = out_ptr, 0
    if WRITE == 2:
        step = tl.load(step_ptr).to(tl.int64)
        # A step outside [0, K) stores nothing: every store index fails idx < 0.
        out_limit = tl.where((step >= 0) & (step < num_steps), vocab, 0)
        out_row = out_ptr + (row * num_steps + step) * vocab

    start = split * CHUNK
    end = tl.minimum(start + CHUNK, vocab)
    # The greedy / random branch outside the token loop: each loop body is straight-line code.
    if greedy:
        best, best_idx, run_max, run_sum = _scan_chunk(
            row_ptr, start, end, vocab, gain, scale, key, out_row, out_limit, False, WRITE, BLOCK, FAST_LOG2
        )
    else:
        best, best_idx, run_max, run_sum = _scan_chunk(
            row_ptr, start, end, vocab, gain, scale, key, out_row, out_limit, True, WRITE, BLOCK, FAST_LOG2
        )

    part = row * num_splits + split
    tl.store(part_key_ptr + part, best)
    tl.store(part_idx_ptr + part, best_idx)
    if WRITE == 1:
        tl.store(part_max_ptr + part, run_max)
        tl.store(part_sum_ptr + part, run_sum)


@triton.jit
def _draft_finish_kernel(
    logits_ptr,
    temperature_ptr,
    tokens_ptr,
    out_ptr,
    step_ptr,
    part_key_ptr,
    part_idx_ptr,
    part_max_ptr,
    part_sum_ptr,
    vocab,
    num_splits,
    num_steps,
    WRITE_PROBS: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    parts = row * num_splits
    if split == 0:
        _, token = _combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
        tl.store(tokens_ptr + row, token)
    if WRITE_PROBS:
        step = tl.load(step_ptr).to(tl.int64)
        # A step outside [0, K) stores nothing: every store index fails idx < 0.
        out_limit = tl.where((step >= 0) & (step < num_steps), vocab, 0)
        out_row = out_ptr + (row * num_steps + step) * vocab
        run_max, run_sum = _combine_softmax(part_max_ptr + parts, part_sum_ptr + parts, num_splits, SPLIT_BLOCK)
        temp = tl.load(temperature_ptr + row).to(tl.float32)
        scale = tl.where(temp <= 0, 1.0, temp)
        row_ptr = logits_ptr + row * vocab
        for off in range(split * CHUNK, tl.minimum(split * CHUNK + CHUNK, vocab), BLOCK):
            idx = off + tl.arange(0, BLOCK)
            mask = idx < vocab
            z = tl.load(row_ptr + idx, mask=mask, other=float("-inf")).to(tl.float32) / scale
            tl.store(out_row + idx, tl.exp(z - run_max) / run_sum, mask=idx < out_limit)


@triton.jit
def _noise_bits_kernel(seeds_ptr, positions_ptr, bits_ptr, vocab, SALT_KEY: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key = _row_key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row), SALT_KEY)
    tl.store(bits_ptr + row * vocab + idx, _noise_bits(key, idx).to(tl.int64), mask=idx < vocab)


# ------------------------------------------------------------------------ references


def _scaled_logits(logits: torch.Tensor, temperature: torch.Tensor):
    """(logits / T in fp32, greedy mask); greedy rows are divided by 1."""
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    return logits.float() / scale[:, None], greedy


def draft_sample_reference(logits, temperature, seeds, positions, salt: int = 0) -> torch.Tensor:
    token = torch.arange(logits.shape[-1], device=logits.device)
    bits = noise_bits_torch(row_key_torch(seeds, positions, salt_key(salt, STREAM_DRAFT))[:, None], token)
    keys = logits.float() * gumbel_gain_torch(temperature)[:, None]
    keys = torch.where((temperature <= 0)[:, None], keys, keys + gumbel2_torch(bits))
    return keys.argmax(-1).to(torch.int32)


def store_step_reference(out: torch.Tensor, step: torch.Tensor, values: torch.Tensor) -> None:
    """out[:, step] = values when 0 <= step < K, else nothing; no host sync.

    A whole-buffer select rather than index_copy_ at a clamped step: under
    Inductor (torch 2.13, CPU) the index_copy_ form was miscompiled, a later op in
    the same graph read the buffer's old values."""
    steps = torch.arange(out.shape[1], device=out.device)
    out.copy_(torch.where((steps == step)[None, :, None], values.unsqueeze(1).to(out.dtype), out))


def draft_sample_store_reference(logits, temperature, seeds, positions, out, step, salt: int, write_probs: bool):
    tokens = draft_sample_reference(logits, temperature, seeds, positions, salt)
    z, _ = _scaled_logits(logits, temperature)
    store_step_reference(out, step, torch.softmax(z, -1) if write_probs else z)
    return tokens


def noise_bits_reference(seeds, positions, vocab: int, salt: int, stream: int) -> torch.Tensor:
    token = torch.arange(vocab, device=seeds.device)
    return noise_bits_torch(row_key_torch(seeds, positions, salt_key(salt, stream))[:, None], token)


# -------------------------------------------------------------------------- the ops


def _partials(num_reqs: int, num_splits, device, with_softmax: bool):
    key = torch.empty((num_reqs, num_splits), dtype=torch.float32, device=device)
    idx = torch.empty((num_reqs, num_splits), dtype=torch.int32, device=device)
    if not with_softmax:
        return key, idx, key, key  # unused pointers
    return key, idx, torch.empty_like(key), torch.empty_like(key)


def _launch_draft(logits, temperature, seeds, positions, out, step, salt: int, write: int) -> torch.Tensor:
    num_reqs, vocab = logits.shape
    tokens = torch.empty((num_reqs,), dtype=torch.int32, device=logits.device)
    if num_reqs == 0:
        return tokens
    num_splits = cdiv(vocab, CHUNK_V)
    part_key, part_idx, part_max, part_sum = _partials(num_reqs, num_splits, logits.device, write == 1)
    out_ptr = logits if out is None else out
    step_ptr = seeds if step is None else step
    num_steps = 1 if out is None else out.shape[1]
    wrap_triton(_draft_partials_kernel)[(num_reqs, num_splits)](
        logits, temperature, seeds, positions, out_ptr, step_ptr, part_key, part_idx, part_max, part_sum,
        vocab, num_splits, num_steps,
        SALT_KEY=salt_key(salt, STREAM_DRAFT), WRITE=write, CHUNK=CHUNK_V, BLOCK=DRAFT_BLOCK_V, FAST_LOG2=FAST_LOG2,
        num_warps=DRAFT_NUM_WARPS,
    )  # fmt: skip
    wrap_triton(_draft_finish_kernel)[(num_reqs, num_splits if write == 1 else 1)](
        logits, temperature, tokens, out_ptr, step_ptr, part_key, part_idx, part_max, part_sum,
        vocab, num_splits, num_steps,
        WRITE_PROBS=write == 1, CHUNK=CHUNK_V, BLOCK=BLOCK_V, SPLIT_BLOCK=SPLIT_BLOCK, num_warps=NUM_WARPS,
    )  # fmt: skip
    return tokens


@triton_op(f"{NAMESPACE}::draft_sample", mutates_args=())
def _draft_sample_op(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    salt: int,
) -> torch.Tensor:
    if not use_triton(logits):
        return draft_sample_reference(logits, temperature, seeds, positions, salt)
    return _launch_draft(logits, temperature, seeds, positions, None, None, salt, 0)


@triton_op(f"{NAMESPACE}::draft_sample_store", mutates_args=("out",))
def _draft_sample_store_op(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    out: torch.Tensor,
    step: torch.Tensor,
    salt: int,
    write_probs: bool,
) -> torch.Tensor:
    if not use_triton(logits):
        return draft_sample_store_reference(logits, temperature, seeds, positions, out, step, salt, write_probs)
    return _launch_draft(logits, temperature, seeds, positions, out, step, salt, 1 if write_probs else 2)


@triton_op(f"{NAMESPACE}::noise_bits", mutates_args=())
def _noise_bits_op(seeds: torch.Tensor, positions: torch.Tensor, vocab: int, salt: int, stream: int) -> torch.Tensor:
    if not use_triton(seeds):
        return noise_bits_reference(seeds, positions, vocab, salt, stream)
    bits = torch.empty((seeds.shape[0], vocab), dtype=torch.int64, device=seeds.device)
    if seeds.shape[0] > 0 and vocab > 0:
        wrap_triton(_noise_bits_kernel)[(seeds.shape[0], cdiv(vocab, BLOCK_V))](
            seeds, positions, bits, vocab, SALT_KEY=salt_key(salt, stream), BLOCK=BLOCK_V
        )
    return bits


# ---------------------------------------------------------------- public wrappers


def check_request_params(num_reqs: int, temperature, seeds, positions) -> None:
    """temperature fp32 [B]; seeds, positions int32/int64 [B]."""
    check_dtype("temperature", temperature, (torch.float32,))
    check_shape("temperature", temperature, (num_reqs,))
    for name, tensor in (("seeds", seeds), ("positions", positions)):
        check_dtype(name, tensor, INDEX_DTYPES)
        check_shape(name, tensor, (num_reqs,))
        check_contiguous(name, tensor)
    check_contiguous("temperature", temperature)


def check_salt(salt: int) -> None:
    check_int_range("salt", salt, 0, SALT_LIMIT - 1)


def draft_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    salt: int = 0,
    probs_out: torch.Tensor | None = None,
    step: torch.Tensor | None = None,
    write: str = "probs",
) -> torch.Tensor:
    """Sample one draft token per request; returns token ids [B] int32.

    logits [B, V] (fp32 / bf16 / fp16, contiguous); temperature [B] fp32: 0 means
    greedy (argmax, first index on ties), T > 0 samples softmax(logits / T) by
    Gumbel-max with noise from the counter-based hash of (seeds[b], positions[b],
    token, salt) — the same token on CPU and CUDA (up to float near-ties).
    Negative temperatures are a contract violation (`check_draft_sample_values`
    in specdraft.testing finds them); the op treats them as greedy.

    probs_out [B, K, V] fp32 with step (0-dim int tensor on the device): also
    store this step's softmax(logits / T) (write="probs") or logits / T
    (write="logits") into probs_out[:, step, :]; greedy rows store with T = 1.
    """
    check_dtype("logits", logits, FLOAT_DTYPES)
    check_rank("logits", logits, 2)
    check_contiguous("logits", logits)
    num_reqs, vocab = logits.shape
    if vocab < 1:
        raise ValueError(f"logits must have a vocabulary of at least 1 token, got shape {tuple(logits.shape)}")
    check_request_params(num_reqs, temperature, seeds, positions)
    check_salt(salt)
    tensors = {"logits": logits, "temperature": temperature, "seeds": seeds, "positions": positions}
    if probs_out is None:
        if step is not None:
            raise ValueError("step is only used with probs_out; pass probs_out too")
        check_same_device(tensors)
        return _draft_sample_op(logits, temperature, seeds, positions, salt)

    if write not in ("probs", "logits"):
        raise ValueError(f"write must be 'probs' or 'logits', got {write!r}")
    check_dtype("probs_out", probs_out, (torch.float32,))
    check_rank("probs_out", probs_out, 3)
    check_contiguous("probs_out", probs_out)
    check_distinct("probs_out", probs_out, "logits", logits)
    if probs_out.shape[0] != num_reqs or probs_out.shape[2] != vocab:
        raise ValueError(f"probs_out must have shape ({num_reqs}, K, {vocab}), got {tuple(probs_out.shape)}")
    if probs_out.shape[1] < 1:
        raise ValueError(f"probs_out must hold K >= 1 steps, got shape {tuple(probs_out.shape)}")
    if step is None:
        raise ValueError("step (a 0-dim int tensor on the device) is required with probs_out")
    check_dtype("step", step, INDEX_DTYPES)
    check_rank("step", step, 0)
    check_same_device({**tensors, "probs_out": probs_out, "step": step})
    return _draft_sample_store_op(logits, temperature, seeds, positions, probs_out, step, salt, write == "probs")


def noise_uniform(
    seeds: torch.Tensor, positions: torch.Tensor, vocab: int, *, salt: int = 0, stream: int = STREAM_DRAFT
) -> torch.Tensor:
    """The uniforms u [B, vocab] (fp32, in (0, 1)) that the samplers draw for
    (seeds[b], positions[b], token, salt, stream): for tests and for users who
    want to reproduce a draw. The hash runs in Triton on CUDA, in torch on CPU."""
    check_dtype("seeds", seeds, INDEX_DTYPES)
    check_rank("seeds", seeds, 1)
    check_dtype("positions", positions, INDEX_DTYPES)
    check_shape("positions", positions, tuple(seeds.shape))
    check_int_range("vocab", vocab, 0)
    check_salt(salt)
    check_int_range("stream", stream, 0, STREAM_SAMPLE)
    check_same_device({"seeds": seeds, "positions": positions})
    return uniform_torch(_noise_bits_op(seeds.contiguous(), positions.contiguous(), vocab, salt, stream))
