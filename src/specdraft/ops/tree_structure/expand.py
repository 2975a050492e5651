"""`tree_expand`: one EAGLE-2 expansion step: the children's cumulative scores (their
parent's plus their own log-probability) and the best k of them (ties: the lower
index), the next frontier. One program per request; the reference is the same
computation in torch."""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import FLOAT_DTYPES, at_least, check_int_range, check_tensor_arg

from ..backend import NAMESPACE, power_of_two_tile, tl, triton, use_triton
from .ranking import rows_of_rank, stable_rank


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


def tree_expand_reference(frontier_scores: torch.Tensor, child_logprobs: torch.Tensor, k: int):
    batch, width, fanout = child_logprobs.shape
    scores = (frontier_scores.float()[:, :, None] + child_logprobs.float()).reshape(batch, width * fanout)
    return scores, rows_of_rank(stable_rank(scores), k)


@triton_op(f"{NAMESPACE}::tree_expand", mutates_args=())
def _tree_expand_op(
    frontier_scores: torch.Tensor, child_logprobs: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(frontier_scores):
        return tree_expand_reference(frontier_scores, child_logprobs, k)
    batch, width, fanout = child_logprobs.shape
    count = width * fanout
    scores = torch.empty((batch, count), dtype=torch.float32, device=frontier_scores.device)
    best = torch.empty((batch, k), dtype=torch.int64, device=frontier_scores.device)
    if batch > 0:
        wrap_triton(tree_expand_kernel)[(batch,)](
            frontier_scores, child_logprobs, scores, best, fanout, count, k, PAD=power_of_two_tile(count, smallest=16)
        )  # fmt: skip
    return scores, best


def tree_expand(
    frontier_scores: torch.Tensor, child_logprobs: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One EAGLE-2 expansion step: each frontier node's children scored, the best k kept.

    Args:
        frontier_scores: [B, F] fp32/bf16/fp16, the frontier nodes' cumulative scores.
        child_logprobs: [B, F, C] fp32/bf16/fp16, each frontier node's C children's
            log-probabilities (row f: frontier node f's children).
        k: Python int in [1, F * C], how many to keep.

    Returns:
        (scores, best): scores [B, F * C] fp32, child f * C + c's cumulative score
        (frontier_scores[f] + child_logprobs[f, c]); best [B, k] int64, the indices of the
        k highest scores, highest first, ties to the lower index (NaN ranks as -inf).
    """
    check_tensor_arg("frontier_scores", frontier_scores, FLOAT_DTYPES, shape=(None, at_least(1, "F")),
                     contiguous=True)  # fmt: skip
    batch, width = frontier_scores.shape
    check_tensor_arg("child_logprobs", child_logprobs, FLOAT_DTYPES, shape=(batch, width, at_least(1, "C")),
                     contiguous=True, device_of=frontier_scores)  # fmt: skip
    check_int_range("k", k, 1, width * child_logprobs.shape[2])
    return _tree_expand_op(frontier_scores, child_logprobs, k)
