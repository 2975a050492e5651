"""`top_logprobs`: the k likeliest entries of each row of logits and their
log-probabilities, in one pass over the row.

A draft tree expands every frontier node to its k likeliest draft tokens at every
step. Done in torch that is a log-softmax over the vocabulary, then k argmax passes
(a sort of the row is far more work), each its own kernel: on an 8B-shaped EAGLE-3
head at depth 7 they were about 36 µs of every tree step and most of what a tree
iteration spent beyond its model calls (benchmarks/README.md, "Llama-3-8B-shaped
target, all 32 layers, B = 1"). The kernel reads each row once: an online
log-sum-exp, and a running list of the k best entries merged block by block (a
block that cannot beat the list's last entry is skipped after one max).

Order: by logit, highest first, ties to the lower index; NaN ranks as -inf (as
`tree_expand` and `tree_select` rank scores). A row's log-probabilities are its
logits minus its log-sum-exp in fp32: a row holding NaN gives NaN log-probabilities,
as torch.log_softmax does.

One program per row; the reference is the same computation in torch.
"""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import FLOAT_DTYPES, at_least, check_int_range, check_tensor_arg

from .backend import NAMESPACE, power_of_two_tile, tl, triton, use_triton

MAX_K = 8
ROW_BLOCK = 4096  # logits a program reads per step of its row loop
NOT_AN_ENTRY = 2**62  # the index of an empty list slot (EMPTY): loses every tie to a real entry


@triton.jit
def top_logprobs_kernel(logits_ptr, ids_ptr, logprobs_ptr, vocab, row_stride, K: tl.constexpr,
                        K_PAD: tl.constexpr, BLOCK: tl.constexpr, EMPTY: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    lane = tl.arange(0, K_PAD)
    empty = tl.full([K_PAD], EMPTY, tl.int64)
    best_v = tl.full([K_PAD], float("-inf"), tl.float32)
    best_i = empty
    # Online log-sum-exp, one running (max, sum) per block lane, combined at the end.
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK], tl.float32)
    lane_nan = tl.zeros([BLOCK], tl.int1)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        valid = offs < vocab
        x = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32)
        lane_nan = lane_nan | (x != x)
        key = tl.where(x != x, float("-inf"), x)
        new_max = tl.maximum(lane_max, key)
        finite = new_max != float("-inf")
        scale = tl.where(finite, tl.exp(lane_max - new_max), 0.0)
        lane_sum = lane_sum * scale + tl.where(finite, tl.exp(key - new_max), 0.0)
        lane_max = new_max
        # The list's last entry is the bar: a block whose best is below it adds nothing
        # (a tie loses too: every index here is above the list's).
        kth_v = tl.sum(tl.where(lane == K - 1, best_v, 0.0), axis=0)
        kth_i = tl.sum(tl.where(lane == K - 1, best_i, 0), axis=0)
        block_best = tl.max(tl.where(valid, key, float("-inf")), axis=0)
        if (block_best > kth_v) | (kth_i == EMPTY):
            avail = valid
            list_v, list_i = best_v, best_i
            new_v = tl.full([K_PAD], float("-inf"), tl.float32)
            new_i = empty
            for j in tl.static_range(K):
                # The best of the block's remaining entries and of the list's remaining
                # ones, each with its lowest index among ties; the higher of the two.
                bv = tl.max(tl.where(avail, key, float("-inf")), axis=0)
                bi = tl.min(tl.where(avail & (key == bv), offs, EMPTY), axis=0)
                lv = tl.max(list_v, axis=0)
                li = tl.min(tl.where(list_v == lv, list_i, EMPTY + 1), axis=0)
                take_block = (bv > lv) | ((bv == lv) & (bi < li))
                v = tl.where(take_block, bv, lv)
                i = tl.where(take_block, bi, li)
                new_v = tl.where(lane == j, v, new_v)
                new_i = tl.where(lane == j, i, new_i)
                avail = avail & (offs != i)
                taken = list_i == i
                list_v = tl.where(taken, float("-inf"), list_v)
                list_i = tl.where(taken, EMPTY + 1, list_i)
            best_v, best_i = new_v, new_i
    row_max = tl.max(lane_max, axis=0)
    row_sum = tl.sum(tl.where(lane_max != float("-inf"), lane_sum * tl.exp(lane_max - row_max), 0.0), axis=0)
    any_nan = tl.max(lane_nan.to(tl.int32), axis=0) > 0
    log_norm = tl.where(any_nan, float("nan"), row_max + tl.log(row_sum))  # NaN anywhere: every entry NaN
    kept = lane < K
    picked = tl.load(base + best_i, mask=kept & (best_i < vocab), other=float("nan")).to(tl.float32)
    tl.store(ids_ptr + row * K + lane, best_i, mask=kept)
    tl.store(logprobs_ptr + row * K + lane, picked - log_norm, mask=kept)


def top_logprobs_reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    # k argmax passes (argmax takes the first maximum: the lower index), each taking
    # its pick out as -inf. In float64, NaN and -inf entries rank as one value below
    # every float32 logit (-1e300; +inf stays above all), so a pick taken out never
    # comes back, even in a row with fewer than k entries above -inf. Few ops: the
    # eager tree runs this at every draft step.
    values = logits.float()
    key = torch.nan_to_num(values.double(), nan=-1e300, neginf=-1e300, posinf=float("inf"))
    picks = [key.argmax(dim=-1, keepdim=True)]
    for _ in range(k - 1):
        key = key.scatter(-1, picks[-1], float("-inf"))
        picks.append(key.argmax(dim=-1, keepdim=True))
    ids = picks[0] if k == 1 else torch.cat(picks, dim=-1)
    return ids, torch.log_softmax(values, dim=-1).gather(-1, ids)


@triton_op(f"{NAMESPACE}::top_logprobs", mutates_args=())
def _top_logprobs_op(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(logits):
        return top_logprobs_reference(logits, k)
    rows, vocab = logits.shape
    ids = torch.empty((rows, k), dtype=torch.int64, device=logits.device)
    logprobs = torch.empty((rows, k), dtype=torch.float32, device=logits.device)
    if rows > 0:
        wrap_triton(top_logprobs_kernel)[(rows,)](
            logits, ids, logprobs, vocab, logits.stride(0), K=k, K_PAD=power_of_two_tile(k),
            BLOCK=power_of_two_tile(vocab, largest=ROW_BLOCK), EMPTY=NOT_AN_ENTRY, num_warps=8,
        )  # fmt: skip
    return ids, logprobs


def top_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k likeliest entries of every row and their log-probabilities.

    Args:
        logits: [R, V] fp32/bf16/fp16, stride 1 along V.
        k: Python int in [1, min(8, V)].

    Returns:
        (ids, logprobs): ids [R, k] int64, the k highest logits of each row, highest
        first, ties to the lower index, NaN ranked as -inf; logprobs [R, k] fp32, their
        log-softmax values (computed in fp32).
    """
    check_tensor_arg("logits", logits, FLOAT_DTYPES, shape=(None, at_least(1, "V")), contiguous="rows")
    check_int_range("k", k, 1, min(MAX_K, logits.shape[1]))
    return _top_logprobs_op(logits, k)
