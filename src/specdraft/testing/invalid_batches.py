"""Hypothesis strategy of *invalid* `propose()` inputs, each tagged with the one rule
it breaks (the op-level cases: invalid.py).

`invalid_draft_batches(...)` draws a valid batch (make_draft_batch: prefill or
continuation windows, distinct blocks per request) and breaks one rule. Under
`specdraft.checked()` a proposer raises a ValueError whose message starts with
`InvalidDraftBatch.argument`; without it, the proposer runs anyway, reads and writes
nothing outside its tensors, and returns vocabulary ids (the README's table says
what each argument does then).
"""

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from specdraft.config import SamplingParams
from specdraft.testing.invalid import break_windows
from specdraft.testing.op_case import FAR
from specdraft.testing.proposers import DraftBatch, make_draft_batch


@dataclass
class InvalidDraftBatch:
    """A propose() input with one rule broken. propose_kwargs: token_indices_to_sample
    / num_rejected_tokens (lists of ints) when the rule is about them."""

    batch: DraftBatch
    rule: str
    argument: str
    propose_kwargs: dict[str, Any] = field(default_factory=dict)

    def kwargs(self, device="cpu") -> dict[str, torch.Tensor]:
        return {name: torch.tensor(v, dtype=torch.int32, device=device) for name, v in self.propose_kwargs.items()}


BATCH_RULES = (
    "target_token_ids: outside the vocabulary",
    "next_token_ids: outside the vocabulary",
    "target_positions: negative",
    "target_positions: the window's last token is not at seq_lens - 1",
    "query_start_loc: not from 0",
    "query_start_loc: decreasing",
    "query_start_loc: past the tokens",
    "query_start_loc: empty window",
    "seq_lens: shorter than the window",
    "max_query_len: too small",
    "max_seq_len: too small",
    "block_table: too narrow",
    "block_table: block id outside the cache",
    "slot_mapping: outside the cache",
    "sampling.temperature: negative",
    "sampling.temperature: NaN",
    "sampling.temperature: inf",
    "target_hidden_states: not finite",
    "num_rejected_tokens: the whole window",
    "token_indices_to_sample: outside its window",
)


def _far(draw, low: int = 1) -> int:
    return draw(st.one_of(st.integers(low, low + 4), st.integers(low, FAR)))


@st.composite
def invalid_draft_batches(
    draw,
    *,
    vocab_size: int,
    target_hidden_size: int,
    block_size: int,
    blocks_per_request: int,
    num_blocks: int,
    num_speculative_tokens: int,
    max_model_len: int,
    max_requests: int = 4,
    rule: str | None = None,
) -> InvalidDraftBatch:
    """A batch for a proposer whose KV caches hold num_blocks blocks of block_size
    (each request owns blocks_per_request of the first max_requests *
    blocks_per_request), K = num_speculative_tokens, with the rule `rule` (default:
    drawn from BATCH_RULES) broken."""
    num_reqs = draw(st.integers(1, max_requests))
    reach = blocks_per_request * block_size
    query_lens = draw(st.lists(st.integers(1, 12), min_size=num_reqs, max_size=num_reqs))
    room = [max(0, min(reach, max_model_len) - n - num_speculative_tokens) for n in query_lens]
    starts = [draw(st.integers(0, r)) for r in room]
    batch = make_draft_batch(
        query_lens, vocab_size=vocab_size, target_hidden_size=target_hidden_size, block_size=block_size,
        blocks_per_request=blocks_per_request, start_positions=starts,
        temperatures=[draw(st.sampled_from([0.0, 0.5, 1.5])) for _ in range(num_reqs)], seed=draw(st.integers(0, 2**16)),
    )  # fmt: skip
    rule = rule or draw(st.sampled_from(BATCH_RULES))
    md = batch.metadata
    b = draw(st.integers(0, num_reqs - 1))
    qsl = md.query_start_loc.tolist()
    t = draw(st.integers(qsl[b], qsl[b + 1] - 1))
    kwargs: dict[str, Any] = {}
    subject, what = rule.split(": ")

    def replace(**fields):
        return dataclasses.replace(batch, **fields)

    def meta(**fields):
        return replace(metadata=dataclasses.replace(md, **fields))

    def setting(tensor, index, value):
        out = tensor.clone()
        out[index] = value
        return out

    if subject in ("target_token_ids", "next_token_ids"):
        bad = draw(st.sampled_from([vocab_size + _far(draw, 0), -_far(draw)]))
        batch = replace(**{subject: setting(getattr(batch, subject), t if subject == "target_token_ids" else b, bad)})
    elif subject == "target_positions":
        if what == "negative":
            batch = replace(target_positions=setting(batch.target_positions, t, -_far(draw)))
        else:
            shifted = batch.target_positions.clone()
            shifted[qsl[b] : qsl[b + 1]] += _far(draw)
            batch = replace(target_positions=shifted)
    elif subject == "query_start_loc":
        broken = break_windows(draw, qsl, len(batch.target_token_ids), rule)
        batch = meta(query_start_loc=torch.tensor(broken, dtype=md.query_start_loc.dtype))
    elif subject == "seq_lens":
        batch = meta(seq_lens=setting(md.seq_lens, b, qsl[b + 1] - qsl[b] - _far(draw)))
    elif subject == "max_query_len" and max(query_lens) > 1:
        batch = meta(max_query_len=draw(st.integers(1, max(query_lens) - 1)))
    elif subject == "max_seq_len" and max(md.seq_lens.tolist()) > 1:
        batch = meta(max_seq_len=draw(st.integers(1, max(md.seq_lens.tolist()) - 1)))
    elif subject in ("max_query_len", "max_seq_len"):  # every window one token at position 0: no smaller bound
        rule = "slot_mapping: outside the cache"
        batch = meta(slot_mapping=setting(md.slot_mapping, t, num_blocks * block_size + _far(draw, 0)))
    elif rule == "block_table: too narrow":
        seq = md.seq_lens.tolist()
        need = max(max(s, min(s + num_speculative_tokens - 1, max_model_len)) for s in seq)
        width = math.ceil(need / block_size) - 1
        if width >= 1:
            batch = meta(block_table=md.block_table[:, :width].contiguous(), max_seq_len=None)
        else:  # one block holds everything: break the ids instead
            rule = "block_table: block id outside the cache"
            batch = meta(block_table=setting(md.block_table, (b, 0), num_blocks + _far(draw, 0)))
    elif subject == "block_table":
        column = (batch.target_positions[qsl[b + 1] - 1].item()) // block_size
        bad = draw(st.sampled_from([num_blocks + _far(draw, 0), -_far(draw)]))
        batch = meta(block_table=setting(md.block_table, (b, column), bad))
    elif subject == "slot_mapping":
        bad = draw(st.sampled_from([num_blocks * block_size + _far(draw, 0), -1 - _far(draw)]))
        batch = meta(slot_mapping=setting(md.slot_mapping, t, bad))
    elif subject == "sampling.temperature":
        value = {"negative": -draw(st.floats(1e-3, 1e30)), "NaN": float("nan"), "inf": float("inf")}[what]
        batch = replace(sampling=SamplingParams(setting(batch.sampling.temperature, b, value), batch.sampling.seeds))
    elif subject == "target_hidden_states":
        value = draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
        column = draw(st.integers(0, target_hidden_size - 1))
        batch = replace(target_hidden_states=setting(batch.target_hidden_states, (t, column), value))
    elif subject == "num_rejected_tokens":
        rejected = [0] * num_reqs
        rejected[b] = qsl[b + 1] - qsl[b] + draw(st.integers(0, 3))
        kwargs["num_rejected_tokens"] = rejected
    else:
        samples = [q - 1 for q in qsl[1:]]
        samples[b] = draw(st.sampled_from([qsl[b] - _far(draw), qsl[b + 1] + _far(draw, 0)]))
        kwargs["token_indices_to_sample"] = samples
    return InvalidDraftBatch(batch, rule, rule.split(":")[0], kwargs)
