"""After the target's rejection step, the padded path: the rejected drafts stay in
the batch as padding, and no host-side number is needed (the unpadded path, which
packs the kept tokens: prepare_eagle.py). Both ops are single-launch and
elementwise over requests:

- `prepare_inputs_padded`: per request the index of the token to sample and the
  number of rejected tokens;
- `prepare_next_token_padded`: per request the number of valid sampled tokens and
  the last valid one, else a backup token.
"""

from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import INDEX_DTYPES, at_least, check_int_range, check_tensor_arg
from specdraft.value_checks import check_in_range, draft_counts, window_lengths

from .backend import NAMESPACE, cdiv, next_power_of_2, tl, triton, use_triton

# Elementwise ops: one program per block of requests, one request per thread.
BLOCK_REQS = 128
# prepare_next_token_padded: K+1 columns read BLOCK_SAMPLED at a time, NEXT_BLOCK_REQS
# requests per program in one warp: its reductions along K never leave the warp.
BLOCK_SAMPLED = 16
NEXT_BLOCK_REQS = 32


class PaddedInputs(NamedTuple):
    token_indices_to_sample: torch.Tensor  # [B]
    num_rejected_tokens: torch.Tensor  # [B]


class NextTokens(NamedTuple):
    next_token_ids: torch.Tensor  # [B]
    valid_sampled_tokens_count: torch.Tensor  # [B], int32


# --------------------------------------------------------------------------- kernels


@triton.jit
def _prepare_inputs_padded_kernel(
    cu_draft_ptr,
    valid_count_ptr,
    query_start_loc_ptr,
    sample_out_ptr,
    rejected_out_ptr,
    num_reqs,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = r < num_reqs
    cu_draft = tl.load(cu_draft_ptr + r, mask=mask, other=0).to(tl.int64)
    cu_prev = tl.load(cu_draft_ptr + r - 1, mask=mask & (r > 0), other=0).to(tl.int64)
    num_drafts = cu_draft - cu_prev
    valid = tl.load(valid_count_ptr + r, mask=mask, other=0).to(tl.int64)
    first = tl.load(query_start_loc_ptr + r, mask=mask, other=0).to(tl.int64)
    last = tl.load(query_start_loc_ptr + r + 1, mask=mask, other=0).to(tl.int64) - 1
    # Clamped to [0, min(num_drafts, window - 1)]: in contract (1 <= valid <= drafts
    # + 1 <= window) a no-op; a discarded request with drafts (valid = 0) would
    # otherwise sample the token before its window, as vLLM's kernel does, and so
    # would a draft count larger than the window (out of contract).
    most = tl.maximum(tl.minimum(num_drafts, last - first), 0)
    rejected = tl.minimum(tl.maximum(num_drafts + 1 - valid, 0), most)
    tl.store(sample_out_ptr + r, (last - rejected).to(sample_out_ptr.dtype.element_ty), mask=mask)
    tl.store(rejected_out_ptr + r, rejected.to(rejected_out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _prepare_next_token_padded_kernel(
    sampled_ptr,
    discard_ptr,
    backup_ptr,
    next_out_ptr,
    count_out_ptr,
    vocab_size,
    num_reqs,
    num_sampled,
    stride_req,
    stride_tok,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """K+1 columns in BLOCK_K chunks (one chunk for K < BLOCK_K), so no constexpr
    depends on K: one compiled kernel for every K, also under dynamic shapes."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    req_mask = r < num_reqs
    # Every load is issued before any of their values is used (the sampled ids are
    # not masked by `discard`, which is applied afterwards): one memory round trip.
    discard = tl.load(discard_ptr + r, mask=req_mask, other=1).to(tl.int1)
    backup = tl.load(backup_ptr + r, mask=req_mask, other=0).to(tl.int64)
    row = r.to(tl.int64)[:, None] * stride_req
    count = tl.zeros([BLOCK_R], dtype=tl.int32)
    # The last valid (column, id) in one max: column in the high word, the id (in
    # [0, vocab), so non-negative) in the low word; -1 while none is valid.
    last = tl.full([BLOCK_R], -1, dtype=tl.int64)
    for k0 in range(0, num_sampled, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        tile_mask = req_mask[:, None] & (k < num_sampled)[None, :]
        ids = tl.load(sampled_ptr + row + k.to(tl.int64)[None, :] * stride_tok, mask=tile_mask, other=-1)
        ids = ids.to(tl.int64)
        # vLLM tests `id != -1`; any negative id is as invalid as -1.
        valid = (ids >= 0) & (ids < vocab_size) & tile_mask
        count += tl.sum(valid.to(tl.int32), axis=1)
        packed = tl.where(valid, (k.to(tl.int64)[None, :] << 32) | ids, -1)
        last = tl.maximum(last, tl.max(packed, axis=1))
    live = req_mask & ~discard
    next_id = tl.where(live & (last >= 0), last & 0xFFFFFFFF, backup)
    count = tl.where(live, count, 0)
    tl.store(next_out_ptr + r, next_id.to(next_out_ptr.dtype.element_ty), mask=req_mask)
    tl.store(count_out_ptr + r, count, mask=req_mask)


# ------------------------------------------------------------------------ references


def prepare_inputs_padded_reference(
    cu_num_draft_tokens: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    cu = cu_num_draft_tokens.long()
    num_drafts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    rejected = num_drafts + 1 - valid_sampled_tokens_count.long()
    last = query_start_loc[1:].long() - 1
    most = torch.minimum(num_drafts, last - query_start_loc[:-1].long()).clamp(min=0)
    rejected = torch.minimum(rejected.clamp(min=0), most)
    dtype = query_start_loc.dtype
    return (last - rejected).to(dtype), rejected.to(dtype)


def prepare_next_token_padded_reference(
    sampled_token_ids: torch.Tensor,
    discard_request_mask: torch.Tensor,
    backup_next_token_ids: torch.Tensor,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    ids = sampled_token_ids.long()
    valid = (ids >= 0) & (ids < vocab_size) & ~discard_request_mask[:, None]
    count = valid.sum(1, dtype=torch.int32)
    k = torch.arange(ids.shape[1], device=ids.device)
    last_k = torch.where(valid, k, -1).amax(1, keepdim=True)
    last_id = torch.gather(ids, 1, last_k.clamp(min=0)).squeeze(1)
    next_ids = torch.where(count > 0, last_id, backup_next_token_ids.long())
    return next_ids.to(backup_next_token_ids.dtype), count


# -------------------------------------------------------------------------- the ops


@triton_op(f"{NAMESPACE}::prepare_inputs_padded", mutates_args=())
def _prepare_inputs_padded_op(
    cu_num_draft_tokens: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(query_start_loc):
        return prepare_inputs_padded_reference(cu_num_draft_tokens, valid_sampled_tokens_count, query_start_loc)
    num_reqs = cu_num_draft_tokens.shape[0]
    sample = torch.empty(num_reqs, dtype=query_start_loc.dtype, device=query_start_loc.device)
    rejected = torch.empty(num_reqs, dtype=query_start_loc.dtype, device=query_start_loc.device)
    if num_reqs > 0:
        wrap_triton(_prepare_inputs_padded_kernel)[(cdiv(num_reqs, BLOCK_REQS),)](
            cu_num_draft_tokens, valid_sampled_tokens_count, query_start_loc, sample, rejected, num_reqs,
            BLOCK=BLOCK_REQS,
        )  # fmt: skip
    return sample, rejected


@triton_op(f"{NAMESPACE}::prepare_next_token_padded", mutates_args=())
def _prepare_next_token_padded_op(
    sampled_token_ids: torch.Tensor,
    discard_request_mask: torch.Tensor,
    backup_next_token_ids: torch.Tensor,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(sampled_token_ids):
        return prepare_next_token_padded_reference(
            sampled_token_ids, discard_request_mask, backup_next_token_ids, vocab_size
        )
    num_reqs, num_sampled = sampled_token_ids.shape
    next_ids = torch.empty_like(backup_next_token_ids)
    count = torch.empty(num_reqs, dtype=torch.int32, device=sampled_token_ids.device)
    if num_reqs > 0:
        wrap_triton(_prepare_next_token_padded_kernel)[(cdiv(num_reqs, NEXT_BLOCK_REQS),)](
            sampled_token_ids, discard_request_mask, backup_next_token_ids, next_ids, count,
            vocab_size, num_reqs, num_sampled, sampled_token_ids.stride(0), sampled_token_ids.stride(1),
            # K + 1 columns in one chunk when they fit: K is fixed per deployment, so
            # int() specializes on it (B stays symbolic) and the tile is B x (K + 1).
            BLOCK_R=NEXT_BLOCK_REQS, BLOCK_K=min(BLOCK_SAMPLED, next_power_of_2(int(num_sampled))), num_warps=1,
        )  # fmt: skip
    return next_ids, count


# ---------------------------------------------------------------- public wrappers


def prepare_inputs_padded(
    cu_num_draft_tokens: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> PaddedInputs:
    """Padded path: per request the token to sample and the number of rejected tokens,
    which stay in the batch as padding. No host-side number needed.

    rejected = drafts + 1 - valid (0 for a request without drafts), clamped to
    [0, drafts] (valid = 0, a discarded request, rejects every draft);
    token_indices_to_sample = query_start_loc[b + 1] - 1 - rejected.

    Args:
        cu_num_draft_tokens: [B] int32/int64, the *inclusive* cumulative sum of draft
            counts (entry b counts requests 0..b).
        valid_sampled_tokens_count: [B] int32/int64, 1 + accepted drafts (as returned by
            `prepare_next_token_padded`).
        query_start_loc: [B + 1] int32/int64. Request b's tokens are rows
            query_start_loc[b] .. query_start_loc[b + 1] - 1.

    Returns:
        PaddedInputs, both in the dtype of query_start_loc:
            token_indices_to_sample: [B]. The row to sample in each window.
            num_rejected_tokens: [B]. The rejected tokens at the end of each window.

    Out of contract (unchecked mode): rejected is also clamped to window - 1, so the
    sample index stays inside a non-empty window whatever the counts (e.g. an
    exclusive cumulative sum).
    """
    check_tensor_arg("query_start_loc", query_start_loc, INDEX_DTYPES, shape=(at_least(1, "B + 1"),))
    num_reqs = query_start_loc.shape[0] - 1
    check_tensor_arg(
        "cu_num_draft_tokens", cu_num_draft_tokens, INDEX_DTYPES, shape=(num_reqs,), device_of=query_start_loc
    )
    check_tensor_arg(
        "valid_sampled_tokens_count", valid_sampled_tokens_count, INDEX_DTYPES, shape=(num_reqs,),
        device_of=query_start_loc,
    )  # fmt: skip
    if is_checked():
        check_rejection_values(query_start_loc, None, cu_num_draft_tokens, valid_sampled_tokens_count)
    return PaddedInputs(*_prepare_inputs_padded_op(cu_num_draft_tokens, valid_sampled_tokens_count, query_start_loc))


def prepare_next_token_padded(
    sampled_token_ids: torch.Tensor,
    discard_request_mask: torch.Tensor,
    backup_next_token_ids: torch.Tensor,
    vocab_size: int,
) -> NextTokens:
    """Per request the count of valid sampled tokens and the last valid one.

    Args:
        sampled_token_ids: [B, K + 1] int32/int64, K + 1 >= 1. An entry is valid iff
            0 <= id < vocab_size (-1 marks a rejected slot; vLLM's kernel counted other
            negative ids as valid).
        discard_request_mask: [B] bool. A discarded request gets count 0 and its backup token.
        backup_next_token_ids: [B] int32/int64. The next token of a request without a valid
            sampled one.
        vocab_size: Python int >= 1.

    Returns:
        NextTokens:
            next_token_ids: [B], dtype of backup_next_token_ids. The last valid entry of
                row b, or backup_next_token_ids[b] when the row has none or the request is
                discarded.
            valid_sampled_tokens_count: [B] int32. Valid entries of row b (0 if discarded).
    """
    check_tensor_arg("sampled_token_ids", sampled_token_ids, INDEX_DTYPES, shape=(None, at_least(1, "K + 1")))
    num_reqs = sampled_token_ids.shape[0]
    check_tensor_arg(
        "discard_request_mask", discard_request_mask, torch.bool, shape=(num_reqs,), device_of=sampled_token_ids
    )
    check_tensor_arg(
        "backup_next_token_ids", backup_next_token_ids, INDEX_DTYPES, shape=(num_reqs,), device_of=sampled_token_ids
    )
    check_int_range("vocab_size", vocab_size, 1)
    if is_checked():
        check_next_token_values(backup_next_token_ids, vocab_size, sampled_token_ids)
    return NextTokens(
        *_prepare_next_token_padded_op(sampled_token_ids, discard_request_mask, backup_next_token_ids, vocab_size)
    )


# --------------------------------------------- checked mode's value checks (syncs)


def check_rejection_values(
    query_start_loc: torch.Tensor,
    num_rejected_tokens: torch.Tensor | None = None,
    cu_num_draft_tokens: torch.Tensor | None = None,
    valid_sampled_tokens_count: torch.Tensor | None = None,
    *,
    name: str = "query_start_loc",
    num_tokens: int | None = None,
) -> None:
    """The prepare-inputs arguments (prepare_eagle_input, prepare_inputs_padded):
    query_start_loc from 0, non-decreasing; a rejected count in [0, query length]; a
    draft count (from the *inclusive* cumulative cu_num_draft_tokens) >= 0 and below
    the query length (the window holds the drafts and the token before them); a
    valid count in [0, drafts + 1] (0: a discarded request, as
    prepare_next_token_padded reports it). name: what the caller calls
    query_start_loc. num_tokens (prepare_eagle_input's output length): at least the
    kept total, sum of (query length - rejected)."""
    lens = window_lengths(query_start_loc, name=name)
    if num_rejected_tokens is not None:
        rejected = num_rejected_tokens.tolist()
        for b, r in enumerate(rejected):
            if not 0 <= r <= lens[b]:
                raise ValueError(f"num_rejected_tokens[{b}] = {r} is outside [0, query length {lens[b]}]")
        kept = sum(lens) - sum(rejected)
        if num_tokens is not None and num_tokens < kept:
            raise ValueError(
                f"num_tokens = {num_tokens} is smaller than the {kept} tokens the requests keep "
                "(sum of query lengths minus num_rejected_tokens)"
            )
    if cu_num_draft_tokens is not None:
        drafts = draft_counts(cu_num_draft_tokens, lens)
        if valid_sampled_tokens_count is not None:
            for b, v in enumerate(valid_sampled_tokens_count.tolist()):
                if not 0 <= v <= drafts[b] + 1:
                    raise ValueError(
                        f"valid_sampled_tokens_count[{b}] = {v} is outside [0, drafts + 1 = {drafts[b] + 1}]"
                    )


def check_next_token_values(
    backup_next_token_ids: torch.Tensor, vocab_size: int, sampled_token_ids: torch.Tensor | None = None
) -> None:
    """prepare_next_token_padded: the backup tokens become next tokens, so they are
    ids; sampled ids are ids in [0, vocab_size) or the -1 placeholder after a
    rejection. (Unchecked, an id outside that counts as rejected.)"""
    check_in_range("backup_next_token_ids", backup_next_token_ids, 0, vocab_size)
    if sampled_token_ids is not None:
        check_in_range("sampled_token_ids", sampled_token_ids, 0, vocab_size, allow=-1)
