"""Checked mode's value-level checks of the proposers' entry points (propose,
propose_padded, propose_unpadded): what only the values can tell, read on the host
before anything is launched. Each raises a ValueError naming the argument, the
expectation and the first offending value. They sync, so the entry points call them
only when `specdraft.checked_mode.is_checked()` (never under torch.compile).
"""

import math
from typing import NamedTuple

import torch

from specdraft.layout import PADDING_SLOT_ID
from specdraft.value_checks import check_finite, check_in_range, draft_counts, first_bad, window_lengths


def check_propose_values(
    proposer, window, sampling, *, draft_steps: int, groups=None, reads_hidden: bool = True
) -> None:
    """Every value check of `propose` on its TargetWindow (the free checks have passed).

    draft_steps: KV slots each request writes past its kept tokens, beyond the
    window (EAGLE: K - 1; an autoregressive draft: K; multi-layer: 0); the block
    table must reach them (capped at max_model_len). groups: one KVGroup per
    KV-cache group (default: the metadata's one group and every cache of the
    proposer)."""
    # Unpacked under propose's argument names, which the messages use.
    (target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata, token_indices_to_sample,
     num_rejected_tokens) = window  # fmt: skip
    vocab = proposer.model.config.vocab_size
    max_model_len = proposer.config.max_model_len
    num_tokens = target_token_ids.shape[0]
    lens = window_lengths(metadata.query_start_loc, num_tokens, nonempty=True)
    qsl, seq_lens = metadata.query_start_loc.tolist(), metadata.seq_lens.tolist()
    check_in_range("target_token_ids", target_token_ids, 0, vocab)
    check_in_range("next_token_ids", next_token_ids, 0, vocab)
    first_row = target_positions[0] if target_positions.dim() == 2 else target_positions
    check_in_range("target_positions", first_row, 0, None)
    rejected = [0] * len(lens) if num_rejected_tokens is None else num_rejected_tokens.tolist()
    for b, n in enumerate(lens):
        if seq_lens[b] < n:
            raise ValueError(f"seq_lens[{b}] = {seq_lens[b]} is shorter than request {b}'s window of {n} tokens")
        if not 0 <= rejected[b] <= n - 1:
            raise ValueError(
                f"num_rejected_tokens[{b}] = {rejected[b]} is outside [0, window - 1 = {n - 1}]: every request "
                "keeps at least one token"
            )
    if target_positions.dim() == 1:
        last = [int(p) for p in target_positions[[qsl[b + 1] - 1 for b in range(len(lens))]].tolist()]
        for b, p in enumerate(last):
            if p != seq_lens[b] - 1:
                raise ValueError(
                    f"target_positions[{qsl[b + 1] - 1}] = {p}: the last token of request {b}'s window must sit "
                    f"at index seq_lens[{b}] - 1 = {seq_lens[b] - 1}"
                )
    if lens and metadata.max_query_len < max(lens):
        b = lens.index(max(lens))
        raise ValueError(f"max_query_len = {metadata.max_query_len} is below request {b}'s window of {lens[b]} tokens")
    if metadata.max_seq_len is not None and seq_lens and metadata.max_seq_len < max(seq_lens):
        b = seq_lens.index(max(seq_lens))
        raise ValueError(f"max_seq_len = {metadata.max_seq_len} is below seq_lens[{b}] = {seq_lens[b]}")
    if token_indices_to_sample is not None:
        for b, i in enumerate(token_indices_to_sample.tolist()):
            if not qsl[b] <= i < qsl[b + 1]:
                raise ValueError(f"token_indices_to_sample[{b}] = {i} is outside its window [{qsl[b]}, {qsl[b + 1]})")
    kept = [s - r for s, r in zip(seq_lens, rejected, strict=True)]
    needed = [max(s, min(k + draft_steps, max_model_len)) for s, k in zip(seq_lens, kept, strict=True)]
    if groups is None:
        groups = [KVGroup("block_table", metadata.block_table, "slot_mapping", metadata.slot_mapping,
                          proposer.config.block_size, proposer.kv_caches)]  # fmt: skip
    for group in groups:
        check_kv_reach(group, needed)
    if sampling is not None:
        temperature = sampling.temperature
        first_bad("sampling.temperature", ~(torch.isfinite(temperature) & (temperature >= 0)), temperature,
                  "must be finite and >= 0 (0 = greedy)")  # fmt: skip
    if reads_hidden:
        check_finite("target_hidden_states", target_hidden_states)


class KVGroup(NamedTuple):
    """One KV-cache group: its block table and slot mapping (with the names the
    caller knows them by), its block size and the caches of its layers."""

    table_name: str
    block_table: torch.Tensor
    slots_name: str
    slot_mapping: torch.Tensor
    block_size: int
    caches: list[torch.Tensor]


def check_kv_reach(group: KVGroup, needed: list[int]) -> None:
    """Request b's first needed[b] sequence indices have a block in the table, every
    such block is inside the KV cache, and every slot is PAD or inside the cache."""
    table_name, block_table, slots_name, slot_mapping, block_size, caches = group
    if not caches:
        return
    num_blocks = min(cache.shape[1] for cache in caches)
    width = block_table.shape[1]
    table = block_table.tolist()
    for b, n in enumerate(needed):
        columns = math.ceil(n / block_size)
        if columns > width:
            raise ValueError(
                f"{table_name} has {width} columns (reach {width * block_size} = width x block_size {block_size}) "
                f"but request {b} needs {n} positions ({columns} blocks): its window and draft steps, "
                "capped at max_model_len"
            )
        for j in range(columns):
            if not 0 <= table[b][j] < num_blocks:
                raise ValueError(
                    f"{table_name}[{b}, {j}] = {table[b][j]} is outside [0, num_blocks = {num_blocks}) of the KV cache"
                )
    check_in_range(slots_name, slot_mapping, 0, num_blocks * block_size, allow=PADDING_SLOT_ID)


def check_padded_values(proposer, sampled_token_ids, cu_num_draft_tokens, backup_next_token_ids, metadata,
                        discard_request_mask, num_tokens: int) -> None:  # fmt: skip
    """propose_padded: sampled rows are valid ids then -1s (discarded rows may hold
    anything), backup ids are ids, and cu_num_draft_tokens is the inclusive
    cumulative sum of draft counts that fits the windows and the sampled rows."""
    vocab = proposer.model.config.vocab_size
    lens = window_lengths(metadata.query_start_loc, num_tokens, nonempty=True)
    check_in_range("backup_next_token_ids", backup_next_token_ids, 0, vocab)
    discard = [False] * len(lens) if discard_request_mask is None else discard_request_mask.tolist()
    drafts = draft_counts(cu_num_draft_tokens, lens)
    for b, row in enumerate(sampled_token_ids.tolist()):
        if discard[b]:
            continue
        valid = 0
        for j, token in enumerate(row):
            if token == -1:
                continue
            if not 0 <= token < vocab:
                raise ValueError(
                    f"sampled_token_ids[{b}, {j}] = {token} is outside [0, vocab_size = {vocab}) (or -1 for a "
                    "rejected slot)"
                )
            if j > valid:
                raise ValueError(
                    f"sampled_token_ids[{b}, {j}] = {token} follows a -1: a row holds its accepted and emitted "
                    "tokens first, then -1s"
                )
            valid += 1
        if valid > drafts[b] + 1:
            raise ValueError(
                f"cu_num_draft_tokens gives request {b} {drafts[b]} drafts, but sampled_token_ids[{b}] holds "
                f"{valid} tokens (at most drafts + 1); cu_num_draft_tokens must be the inclusive cumulative sum "
                "(entry b counts requests 0..b)"
            )


def check_unpadded_values(metadata, num_rejected_tokens, num_kept_tokens: int, num_tokens: int) -> None:
    """propose_unpadded: every request keeps at least one token, and num_kept_tokens
    bounds the kept total."""
    lens = window_lengths(metadata.query_start_loc, num_tokens, nonempty=True)
    rejected = num_rejected_tokens.tolist()
    for b, n in enumerate(lens):
        if not 0 <= rejected[b] <= n - 1:
            raise ValueError(
                f"num_rejected_tokens[{b}] = {rejected[b]} is outside [0, window - 1 = {n - 1}]: every request "
                "keeps at least one token"
            )
    total = sum(lens) - sum(rejected)
    if num_kept_tokens < total:
        raise ValueError(
            f"num_kept_tokens = {num_kept_tokens} is less than the kept total {total} "
            f"(query_start_loc[-1] = {sum(lens)} minus {sum(rejected)} rejected)"
        )
