"""`vocab_metrics`, the registered op and its public wrapper: CUDA tensors run
kernel.py's kernel, CPU tensors reference.py's torch."""

from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_bool, check_tensor_arg, number_tensor

from ..backend import NAMESPACE, TRITON_INTERPRET, use_triton
from ..common.fastmath import FAST_LOG2
from .kernel import vocab_metrics_kernel
from .reference import vocab_metrics_reference

# The interpreter emulates every lane in NumPy: small blocks keep it fast and make
# small test vocabularies span several tiles (and pass 2's reversed order matter).
BLOCK_V = 16 if TRITON_INTERPRET else 2048
NUM_WARPS = 8


class VocabMetrics(NamedTuple):
    """Per-row outputs of `vocab_metrics` (see the package docstring)."""

    draft_token: torch.Tensor  # [N] int32, a target id
    target_token: torch.Tensor  # [N] int32
    draft_lse: torch.Tensor  # [N] fp32
    target_lse: torch.Tensor  # [N] fp32
    accept: torch.Tensor  # [N] fp32, sum_i min(p, q)
    cross_entropy: torch.Tensor  # [N] fp32, or [0] without divergence
    kl: torch.Tensor  # [N] fp32, or [0] without divergence


def _outputs(rows, device, divergence: bool):
    tokens = [torch.empty((rows,), dtype=torch.int32, device=device) for _ in range(2)]
    floats = [torch.empty((rows,), dtype=torch.float32, device=device) for _ in range(3)]
    extra = [torch.empty((rows if divergence else 0,), dtype=torch.float32, device=device) for _ in range(2)]
    return (*tokens, *floats, *extra)


@triton_op(f"{NAMESPACE}::vocab_metrics", mutates_args=())
def _vocab_metrics_op(
    draft_logits: torch.Tensor,
    target: torch.Tensor,
    temperature: torch.Tensor,
    d2t: torch.Tensor | None,
    target_is_probs: bool,
    divergence: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not use_triton(draft_logits):
        return vocab_metrics_reference(draft_logits, target, temperature, d2t, target_is_probs, divergence)
    rows, draft_vocab = draft_logits.shape
    outs = _outputs(rows, draft_logits.device, divergence)
    if rows == 0:
        return outs
    draft_token, target_token, draft_lse, target_lse, accept, ce, kl = outs
    wrap_triton(vocab_metrics_kernel)[(rows,)](
        draft_logits, target, temperature, draft_logits if d2t is None else d2t,
        draft_token, target_token, draft_lse, target_lse, accept,
        ce if divergence else accept, kl if divergence else accept,  # unused pointers without divergence
        draft_vocab, target.shape[1], draft_logits.stride(0), target.stride(0), temperature.stride(0),
        HAS_MAP=d2t is not None, PROBS=target_is_probs, DIVERGENCE=divergence, BLOCK=BLOCK_V, FAST=FAST_LOG2,
        num_warps=NUM_WARPS,
    )  # fmt: skip
    return outs


@_vocab_metrics_op.register_fake
def _vocab_metrics_fake(draft_logits, target, temperature, d2t, target_is_probs, divergence):
    return _outputs(draft_logits.shape[0], draft_logits.device, divergence)


# ------------------------------------------------------------------ public wrapper


def vocab_metrics(
    draft_logits: torch.Tensor,
    target: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    *,
    d2t: torch.Tensor | None = None,
    target_is_probs: bool = False,
    divergence: bool = False,
) -> VocabMetrics:
    """Per-row draft/target metrics over the vocabulary in one kernel (the package docstring).

    No host sync; under torch.compile the CPU path is the reference, fused by Inductor.

    Args:
        draft_logits: [N, Vd] fp32 / bf16 / fp16, rows contiguous, any row stride (rows of
            a wider buffer, or a [K, T, V] slice).
        target: [N, V] logits, or probabilities with target_is_probs; dtypes and strides as
            draft_logits.
        temperature: a Python number or a 0-dim fp32 tensor (all rows), or an fp32 tensor
            [N] (one per row, any stride); T <= 0 is greedy.
        d2t: [Vd] int32/int64, or None (requires Vd == V). Draft id i is target id i + d2t[i].
        target_is_probs: bool. target holds probabilities, not logits.
        divergence: bool. Also the cross-entropy and KL per row.

    Returns:
        VocabMetrics: draft_token, target_token [N] int32 (target ids); draft_lse,
        target_lse, accept [N] fp32; cross_entropy, kl [N] fp32 ([0] without divergence).
    """
    check_tensor_arg("draft_logits", draft_logits, FLOAT_DTYPES, shape=(None, at_least(1, "Vd")), contiguous="rows")
    rows, draft_vocab = draft_logits.shape
    check_tensor_arg(
        "target", target, FLOAT_DTYPES, shape=(rows, at_least(1, "V")), contiguous="rows", device_of=draft_logits
    )
    check_tensor_arg(
        "d2t", d2t, INDEX_DTYPES, shape=(draft_vocab,), contiguous=True, device_of=draft_logits, optional=True
    )
    if d2t is None and draft_vocab != target.shape[1]:
        raise ValueError(
            f"d2t is required when the draft vocabulary ({draft_vocab}) differs from the target's ({target.shape[1]})"
        )
    check_bool("target_is_probs", target_is_probs)
    check_bool("divergence", divergence)
    temperature = _row_temperatures(temperature, rows, draft_logits)
    return VocabMetrics(*_vocab_metrics_op(draft_logits, target, temperature, d2t, target_is_probs, divergence))


def _row_temperatures(temperature, rows, like: torch.Tensor) -> torch.Tensor:
    """temperature as an fp32 tensor [rows]; one value for all rows is expanded (stride 0), not copied."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float | torch.Tensor):
        raise ValueError(f"temperature must be a number or an fp32 tensor, got {type(temperature).__name__}")
    if not isinstance(temperature, torch.Tensor):
        return number_tensor(temperature, torch.float32, like.device).expand(rows)
    check_tensor_arg("temperature", temperature, torch.float32, shape=[(), (rows,)], device_of=like)
    return temperature.expand(rows)
