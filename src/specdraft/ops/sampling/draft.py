"""Draft-token sampling.

Each request b samples one token from logits[b] [V]:
- temperature[b] == 0 (or below): greedy, argmax with the first index on ties;
- temperature[b] > 0: Gumbel-max, argmax(logits / T + g) with g = -log E, E the
  noise's Exp(1) draw (-log u, or its series in the far tail: noise.py), computed
  in base 2 as argmax(logits * log2(e) / T - log2(E * log2(e))): the same argmax
  (the base change scales every key by log2(e) and shifts it by a constant), one
  multiply-add and two hardware log2 per token.

The noise: noise.py (a pure function of seed, position, token, salt and stream,
identical in Triton and torch).

Unlike vLLM's `compute_probs_and_sample_next_token`, which ignores seeds, draws
exponentials from the global RNG and materialises probs / q for the argmax, the
kernels here stream the vocabulary (ops/common/scan.py): online argmax, online
softmax, no [B, V] temporaries. Each row is split across programs (CHUNK_V tokens each); a
second tiny pass combines the per-program partials and, if asked, writes the
probabilities. At V = 152k the hash, the two logs and the bf16 loads are then all
that is left per token.

Truncation (top-k / top-p / min-p, ops/sampling/truncation): with a per-row
`logit_cut`, a sampled row's tokens with logit < cut have probability 0: the row
samples softmax(logits / T) restricted to {i : logits[i] >= cut}, renormalised. The
mask replaces those logits by -inf as they are loaded (one compare per token, no
extra pass), so the Gumbel noise is the same as without a cut and truncation only
masks: a token kept by the cut wins exactly where it won the untruncated race among
the kept tokens. Greedy rows do not read the cut (the argmax is kept by any cut that
keeps anything). A cut of -inf (or NaN: no logit compares below it) masks nothing;
a cut above a sampled row's largest logit keeps nothing, a contract violation
(checked mode refuses it; the op then gives some id in [0, V) and NaN probabilities).

The optional buffer write stores this step's processed logits (logits / T, -inf
below the cut) or probabilities softmax(logits / T) (truncated, renormalised) into
out[:, step, :], with `step` a device scalar
read by the kernel, so one CUDA graph replays every draft step. Greedy rows use
T = 1 for what they store. A step outside [0, K) writes nothing.
"""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_choice, check_tensor_arg
from specdraft.value_checks import check_in_range, first_bad

from ..backend import NAMESPACE, cdiv, tl, triton, use_triton

# Imported by name: Inductor re-emits a user Triton kernel with the jit functions it
# calls, and a module attribute (noise.x) is not carried along.
from ..common.fastmath import FAST_LOG2
from ..common.scan import (
    combine_argmax,
    combine_softmax,
    lane_argmax_finish,
    lane_argmax_init,
    lane_argmax_update,
    scan_vocab,
    softmax_update,
)
from .noise import (
    STREAM_DRAFT,
    check_request_params,
    check_salt,
    gumbel2_torch,
    gumbel_gain,
    gumbel_gain_torch,
    gumbel_keys,
    noise_bits_torch,
    row_key,
    row_key_torch,
    salt_key,
)
from .tiles import BLOCK_V, CHUNK_V, DRAFT_BLOCK_V, DRAFT_NUM_WARPS, NUM_WARPS, SPLIT_BLOCK

# --------------------------------------------------------------------------- kernels


@triton.jit
def _draft_step(acc, x, side, idx, args, FLAGS: tl.constexpr):
    """One block of scan_vocab: the per-lane argmax of the keys (logits * gain, plus
    base-2 Gumbel noise if NOISE), online-softmax statistics of logits / scale
    (WRITE == 1) or their store (WRITE == 2); with CUT, logits below the row's cut
    count as -inf in all three."""
    NOISE: tl.constexpr = FLAGS[0]  # annotated: a plain assignment would make a runtime value
    WRITE: tl.constexpr = FLAGS[1]
    FAST: tl.constexpr = FLAGS[2]
    CUT: tl.constexpr = FLAGS[3]
    best, best_idx, run_max, run_sum = acc
    gain, key, scale, out_row, out_limit, cut = args
    if CUT:
        x = tl.where(x < cut, float("-inf"), x)
    if NOISE:
        keys = gumbel_keys(x, idx, gain, key, FAST)
    else:
        keys = x * gain
    best, best_idx = lane_argmax_update(best, best_idx, keys, idx)
    if WRITE == 1:
        run_max, run_sum = softmax_update(run_max, run_sum, x / scale)
    if WRITE == 2:
        tl.store(out_row + idx, x / scale, mask=idx < out_limit)
    return best, best_idx, run_max, run_sum


@triton.jit
def _draft_partials_kernel(
    logits_ptr, temperature_ptr, seeds_ptr, positions_ptr, cut_ptr,  # cut_ptr: read with HAS_CUT
    out_ptr, step_ptr,  # WRITE == 2: logits / T stored at out[:, step]
    part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,  # out: per (request, chunk)
    vocab, row_stride, num_splits, num_steps,
    SALT_KEY: tl.constexpr,
    WRITE: tl.constexpr,  # 0: nothing, 1: probs (stats here, values in pass 2), 2: logits
    HAS_CUT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, FAST_LOG2: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temp = tl.load(temperature_ptr + row).to(tl.float32)
    greedy = temp <= 0
    cut = tl.full([], float("-inf"), tl.float32)
    if HAS_CUT:
        cut = tl.load(cut_ptr + row)
    scale = tl.where(greedy, 1.0, temp)
    gain = gumbel_gain(temp)
    key = row_key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row), SALT_KEY)
    row_ptr = logits_ptr + row * row_stride
    out_row, out_limit = out_ptr, 0
    if WRITE == 2:
        step = tl.load(step_ptr).to(tl.int64)
        # A step outside [0, K) stores nothing: every store index fails idx < 0.
        out_limit = tl.where((step >= 0) & (step < num_steps), vocab, 0)
        out_row = out_ptr + (row * num_steps + step) * vocab

    start = split * CHUNK
    end = tl.minimum(start + CHUNK, vocab)
    best, best_idx = lane_argmax_init(start, BLOCK)
    acc = (best, best_idx, tl.full([], float("-inf"), tl.float32), tl.full([], 0.0, tl.float32))
    args = (gain, key, scale, out_row, out_limit, cut)
    # The greedy / random branch outside the token loop: each loop body is straight-line code.
    # Greedy rows ignore the cut.
    if greedy:
        best, best_idx, run_max, run_sum = scan_vocab(
            row_ptr, row_ptr, start, end, acc, args, _draft_step, (False, WRITE, FAST_LOG2, False), False, BLOCK
        )
    else:
        best, best_idx, run_max, run_sum = scan_vocab(
            row_ptr, row_ptr, start, end, acc, args, _draft_step, (True, WRITE, FAST_LOG2, HAS_CUT), False, BLOCK
        )
    best, best_idx = lane_argmax_finish(best, best_idx)

    part = row * num_splits + split
    tl.store(part_key_ptr + part, best)
    tl.store(part_idx_ptr + part, best_idx)
    if WRITE == 1:
        tl.store(part_max_ptr + part, run_max)
        tl.store(part_sum_ptr + part, run_sum)


@triton.jit
def _draft_finish_kernel(
    logits_ptr, temperature_ptr, cut_ptr, tokens_ptr, out_ptr, step_ptr,
    part_key_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,  # in: the partials kernel's
    vocab, row_stride, num_splits, num_steps,
    WRITE_PROBS: tl.constexpr, HAS_CUT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    parts = row * num_splits
    if split == 0:
        _, token = combine_argmax(part_key_ptr + parts, part_idx_ptr + parts, num_splits, SPLIT_BLOCK)
        tl.store(tokens_ptr + row, token)
    if WRITE_PROBS:
        step = tl.load(step_ptr).to(tl.int64)
        # A step outside [0, K) stores nothing: every store index fails idx < 0.
        out_limit = tl.where((step >= 0) & (step < num_steps), vocab, 0)
        out_row = out_ptr + (row * num_steps + step) * vocab
        run_max, run_sum = combine_softmax(part_max_ptr + parts, part_sum_ptr + parts, num_splits, SPLIT_BLOCK)
        temp = tl.load(temperature_ptr + row).to(tl.float32)
        scale = tl.where(temp <= 0, 1.0, temp)
        cut = tl.full([], float("-inf"), tl.float32)
        if HAS_CUT:
            cut = tl.where(temp <= 0, float("-inf"), tl.load(cut_ptr + row))  # greedy rows: untruncated
        row_ptr = logits_ptr + row * row_stride
        for off in range(split * CHUNK, tl.minimum(split * CHUNK + CHUNK, vocab), BLOCK):
            idx = off + tl.arange(0, BLOCK)
            mask = idx < vocab
            x = tl.load(row_ptr + idx, mask=mask, other=float("-inf")).to(tl.float32)
            if HAS_CUT:
                x = tl.where(x < cut, float("-inf"), x)
            z = x / scale
            tl.store(out_row + idx, tl.exp(z - run_max) / run_sum, mask=idx < out_limit)


# ------------------------------------------------------------------------ references


def argmax_skipping_nan(keys: torch.Tensor) -> torch.Tensor:
    """keys.argmax(-1) with NaN ranked as -inf, as the kernels' argmax ranks it
    (ops/common/scan.py): torch.argmax takes NaN for the max, and a NaN logit is never
    among the tokens a cut keeps. The references' argmaxes all go through it."""
    return torch.where(torch.isnan(keys), float("-inf"), keys).argmax(-1)


def truncate_logits(logits: torch.Tensor, temperature: torch.Tensor, logit_cut: torch.Tensor | None) -> torch.Tensor:
    """logits in fp32, -inf where below the row's cut in sampled rows (T > 0); greedy
    rows and a None cut: unchanged. logits [..., V], temperature [B], logit_cut
    [B, ...] (one cut per row of logits)."""
    x = logits.float()
    if logit_cut is None:
        return x
    sampled = (temperature > 0).view(-1, *([1] * (logit_cut.dim() - 1)))
    below = (x < logit_cut[..., None]) & sampled[..., None]
    return torch.where(below, float("-inf"), x)


def _scaled_logits(logits: torch.Tensor, temperature: torch.Tensor):
    """(logits / T in fp32, greedy mask); greedy rows are divided by 1."""
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    return logits.float() / scale[:, None], greedy


def draft_sample_reference(logits, temperature, seeds, positions, salt: int = 0, logit_cut=None) -> torch.Tensor:
    token = torch.arange(logits.shape[-1], device=logits.device)
    key = row_key_torch(seeds, positions, salt_key(salt, STREAM_DRAFT))
    bits = noise_bits_torch(key[:, None], token)
    keys = truncate_logits(logits, temperature, logit_cut) * gumbel_gain_torch(temperature)[:, None]
    keys = torch.where((temperature <= 0)[:, None], keys, keys + gumbel2_torch(bits))
    return argmax_skipping_nan(keys).to(torch.int32)


def store_step_reference(out: torch.Tensor, step: torch.Tensor, values: torch.Tensor) -> None:
    """out[:, step] = values when 0 <= step < K, else nothing; no host sync.

    A whole-buffer select rather than index_copy_ at a clamped step: under
    Inductor (torch 2.13, CPU) the index_copy_ form was miscompiled, a later op in
    the same graph read the buffer's old values."""
    steps = torch.arange(out.shape[1], device=out.device)
    out.copy_(torch.where((steps == step)[None, :, None], values.unsqueeze(1).to(out.dtype), out))


def draft_sample_store_reference(
    logits, temperature, seeds, positions, out, step, salt: int, write_probs: bool, logit_cut=None
):
    tokens = draft_sample_reference(logits, temperature, seeds, positions, salt, logit_cut)
    z, _ = _scaled_logits(truncate_logits(logits, temperature, logit_cut), temperature)
    store_step_reference(out, step, torch.softmax(z, -1) if write_probs else z)
    return tokens


# -------------------------------------------------------------------------- the ops


def _partials(num_reqs: int, num_splits, device, with_softmax: bool):
    key = torch.empty((num_reqs, num_splits), dtype=torch.float32, device=device)
    idx = torch.empty((num_reqs, num_splits), dtype=torch.int32, device=device)
    if not with_softmax:
        return key, idx, key, key  # unused pointers
    return key, idx, torch.empty_like(key), torch.empty_like(key)


def _launch_draft(logits, temperature, seeds, positions, out, step, salt: int, write: int, logit_cut) -> torch.Tensor:
    num_reqs, vocab = logits.shape
    tokens = torch.empty((num_reqs,), dtype=torch.int32, device=logits.device)
    if num_reqs == 0:
        return tokens
    num_splits = cdiv(vocab, CHUNK_V)
    part_key, part_idx, part_max, part_sum = _partials(num_reqs, num_splits, logits.device, write == 1)
    out_ptr = logits if out is None else out
    step_ptr = seeds if step is None else step
    num_steps = 1 if out is None else out.shape[1]
    cut_ptr = temperature if logit_cut is None else logit_cut  # unread without a cut
    has_cut = logit_cut is not None
    wrap_triton(_draft_partials_kernel)[(num_reqs, num_splits)](
        logits, temperature, seeds, positions, cut_ptr, out_ptr, step_ptr, part_key, part_idx, part_max, part_sum,
        vocab, logits.stride(0), num_splits, num_steps,
        SALT_KEY=salt_key(salt, STREAM_DRAFT), WRITE=write, HAS_CUT=has_cut, CHUNK=CHUNK_V, BLOCK=DRAFT_BLOCK_V,
        FAST_LOG2=FAST_LOG2, num_warps=DRAFT_NUM_WARPS,
    )  # fmt: skip
    wrap_triton(_draft_finish_kernel)[(num_reqs, num_splits if write == 1 else 1)](
        logits, temperature, cut_ptr, tokens, out_ptr, step_ptr, part_key, part_idx, part_max, part_sum,
        vocab, logits.stride(0), num_splits, num_steps,
        WRITE_PROBS=write == 1, HAS_CUT=has_cut, CHUNK=CHUNK_V, BLOCK=BLOCK_V, SPLIT_BLOCK=SPLIT_BLOCK, num_warps=NUM_WARPS,
    )  # fmt: skip
    return tokens


@triton_op(f"{NAMESPACE}::draft_sample", mutates_args=())
def _draft_sample_op(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    salt: int,
    logit_cut: torch.Tensor | None = None,
) -> torch.Tensor:
    if not use_triton(logits):
        return draft_sample_reference(logits, temperature, seeds, positions, salt, logit_cut)
    return _launch_draft(logits, temperature, seeds, positions, None, None, salt, 0, logit_cut)


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
    logit_cut: torch.Tensor | None = None,
) -> torch.Tensor:
    if not use_triton(logits):
        return draft_sample_store_reference(
            logits, temperature, seeds, positions, out, step, salt, write_probs, logit_cut
        )
    write = 1 if write_probs else 2
    return _launch_draft(logits, temperature, seeds, positions, out, step, salt, write, logit_cut)


# ---------------------------------------------------------------- public wrapper


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
    logit_cut: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sample one draft token per request.

    temperature 0 means greedy (argmax, first index on ties); T > 0 samples
    softmax(logits / T) by Gumbel-max with noise from the counter-based hash of
    (seeds[b], positions[b], token, salt), the same token on CPU and CUDA (up to float
    near-ties). Negative temperatures are a contract violation (checked mode refuses
    them); the op treats them as greedy. A NaN temperature gives some id in [0, V).

    Args:
        logits: [B, V] fp32 / bf16 / fp16; rows contiguous, any row stride (e.g. rows of a
            wider buffer, as vLLM's sampler takes them).
        temperature: [B] fp32, contiguous.
        seeds: [B] int32/int64, contiguous.
        positions: [B] int32/int64, contiguous.
        salt: Python int in [0, 2**31 - 1], default 0; part of the noise's hash.
        probs_out: [B, K, V] fp32, contiguous, or None. With step: also store this step's
            softmax(logits / T) or logits / T (see write) into probs_out[:, step, :]; greedy
            rows store with T = 1.
        step: 0-dim int32/int64 tensor on the device, required with probs_out (and only
            with it); a step outside [0, K) stores nothing.
        write: "probs" (softmax(logits / T)) or "logits" (logits / T): what probs_out gets.
        logit_cut: [B] fp32, contiguous, or None (no truncation, no extra work): each
            row's logit cut (ops.truncation_cut's output, for the request's top-k /
            top-p / min-p). A sampled row samples softmax(logits / T) over {i :
            logits[i] >= cut}, renormalised, and stores that truncated distribution
            (write="probs") or logits / T with -inf below the cut (write="logits").
            Greedy rows ignore it; -inf keeps every token; a cut above a sampled
            row's largest logit keeps none (checked mode refuses it).

    Returns:
        tokens: [B] int32, the sampled token ids.
    """
    check_tensor_arg("logits", logits, FLOAT_DTYPES, shape=(None, at_least(1, "V")), contiguous="rows")
    num_reqs, vocab = logits.shape
    check_request_params(num_reqs, temperature, seeds, positions, device_of=logits)
    check_salt(salt)
    check_logit_cut_arg(logit_cut, (num_reqs,), logits)
    if is_checked():
        check_draft_sample_values(temperature, probs_out, step, positions)
        if logit_cut is not None:
            check_logit_cut_values(logit_cut, logits, temperature)
    if probs_out is None:
        if step is not None:
            raise ValueError("step is only used with probs_out; pass probs_out too")
        return _draft_sample_op(logits, temperature, seeds, positions, salt, logit_cut)

    check_choice("write", write, ("probs", "logits"))
    check_tensor_arg(
        "probs_out", probs_out, torch.float32, shape=(num_reqs, at_least(1, "K"), vocab), contiguous=True,
        distinct_from={"logits": logits}, device_of=logits,
    )  # fmt: skip
    if step is None:
        raise ValueError("step (a 0-dim int tensor on the device) is required with probs_out")
    check_tensor_arg("step", step, INDEX_DTYPES, rank=0, device_of=logits)
    return _draft_sample_store_op(
        logits, temperature, seeds, positions, probs_out, step, salt, write == "probs", logit_cut
    )


def check_logit_cut_arg(logit_cut: torch.Tensor | None, rows: tuple[int, ...], logits: torch.Tensor) -> None:
    """The samplers' optional logit_cut: fp32, one per row of logits (shape `rows`),
    contiguous, on the logits' device."""
    check_tensor_arg("logit_cut", logit_cut, torch.float32, shape=rows, contiguous=True, device_of=logits,
                     optional=True)  # fmt: skip


# --------------------------------------------- checked mode's value checks (syncs)


def check_draft_sample_values(
    temperature: torch.Tensor,
    probs_out: torch.Tensor | None = None,
    step: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> None:
    """draft_sample: temperature finite and >= 0; step inside [0, K); positions (the
    noise's counter) non-negative."""
    first_bad("temperature", ~(torch.isfinite(temperature) & (temperature >= 0)), temperature,
              "must be finite and >= 0 (0 = greedy)")  # fmt: skip
    if positions is not None:
        check_in_range("positions", positions, 0, None)
    if probs_out is not None and step is not None:
        s, num_steps = int(step), probs_out.shape[1]
        if not 0 <= s < num_steps:
            raise ValueError(f"step = {s} is outside [0, K={num_steps}) of probs_out")


def check_logit_cut_values(logit_cut: torch.Tensor, logits: torch.Tensor, temperature: torch.Tensor) -> None:
    """logit_cut of the samplers: not NaN, and in a sampled row (T > 0) not above the
    row's largest logit (NaN logits left out), where it would keep no token.
    truncation_cut's cuts always pass. logit_cut [B, ...] for logits [B, ..., V]."""
    first_bad("logit_cut", torch.isnan(logit_cut), logit_cut, "is NaN (-inf: keep every token)")
    top = torch.where(torch.isnan(logits), float("-inf"), logits.float()).amax(-1)
    sampled = (temperature > 0).view(-1, *([1] * (logit_cut.dim() - 1)))
    first_bad("logit_cut", sampled & (logit_cut > top), logit_cut,
              "is above its row's largest logit: a sampled row would keep no token")  # fmt: skip
