"""The registered draft_sample ops (the Triton passes on CUDA, the reference
elsewhere), the public wrapper with its argument checks, and checked mode's value
checks (they sync)."""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_choice, check_tensor_arg
from specdraft.value_checks import check_in_range, first_bad

from ...backend import NAMESPACE, cdiv, use_triton
from ...common.fastmath import FAST_LOG2
from ..noise import STREAM_DRAFT, check_request_params, check_salt, salt_key
from ..tiles import BLOCK_V, CHUNK_V, DRAFT_BLOCK_V, DRAFT_NUM_WARPS, NUM_WARPS, SPLIT_BLOCK
from .kernel import draft_finish_kernel, draft_partials_kernel
from .reference import draft_sample_reference, draft_sample_store_reference


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
    wrap_triton(draft_partials_kernel)[(num_reqs, num_splits)](
        logits, temperature, seeds, positions, cut_ptr, out_ptr, step_ptr, part_key, part_idx, part_max, part_sum,
        vocab, logits.stride(0), num_splits, num_steps,
        SALT_KEY=salt_key(salt, STREAM_DRAFT), WRITE=write, HAS_CUT=has_cut, CHUNK=CHUNK_V, BLOCK=DRAFT_BLOCK_V,
        FAST_LOG2=FAST_LOG2, num_warps=DRAFT_NUM_WARPS,
    )  # fmt: skip
    wrap_triton(draft_finish_kernel)[(num_reqs, num_splits if write == 1 else 1)](
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
