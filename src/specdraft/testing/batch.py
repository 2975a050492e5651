"""Hypothesis strategies for the batch-preparation ops
(`prepare_eagle_input`, `prepare_inputs_padded`, `prepare_next_token_padded`,
`step_metadata`); their value checkers are checked mode's (beside each op in specdraft.ops).

Layouts are plain Python data, so a failing example prints readably; each has a
`tensors(device)` method that builds what the ops take.
"""

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

# ------------------------------------------------------------------ after rejection


@dataclass(frozen=True)
class RejectionLayout:
    """A verified batch: prefill requests (no drafts, any query length) mixed with
    decode requests (query length = drafts + 1), and per request how many sampled
    tokens were valid (1 + accepted drafts)."""

    query_lens: list[int]
    num_draft_tokens: list[int]  # 0 for prefill requests
    valid_counts: list[int]  # in [1, drafts + 1]

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    @property
    def query_start_loc(self) -> list[int]:
        out = [0]
        for n in self.query_lens:
            out.append(out[-1] + n)
        return out

    @property
    def cu_num_draft_tokens(self) -> list[int]:
        """Inclusive cumulative sum (entry b counts requests 0..b), as vLLM passes it."""
        out, total = [], 0
        for d in self.num_draft_tokens:
            total += d
            out.append(total)
        return out

    @property
    def num_rejected_tokens(self) -> list[int]:
        return [d + 1 - v if d > 0 else 0 for d, v in zip(self.num_draft_tokens, self.valid_counts, strict=True)]

    @property
    def num_kept_tokens(self) -> int:
        return sum(self.query_lens) - sum(self.num_rejected_tokens)

    def tensors(self, device="cpu", index_dtype=torch.int32) -> dict[str, torch.Tensor]:
        def idx(values):
            return torch.tensor(values, dtype=index_dtype, device=device)

        return {
            "query_start_loc": idx(self.query_start_loc),
            "cu_num_draft_tokens": idx(self.cu_num_draft_tokens),
            "valid_sampled_tokens_count": idx(self.valid_counts),
            "num_rejected_tokens": idx(self.num_rejected_tokens),
        }


@st.composite
def rejection_layouts(
    draw,
    max_requests: int = 12,
    max_drafts: int = 7,
    max_prefill: int = 300,
) -> RejectionLayout:
    """Mixed prefill (1..max_prefill tokens, no drafts) and decode requests (0..K drafts
    with one fixed K per batch, as an engine schedules), rejected <= drafts."""
    num_reqs = draw(st.integers(0, max_requests))
    k = draw(st.integers(1, max_drafts))
    query_lens, drafts, valid = [], [], []
    for _ in range(num_reqs):
        if draw(st.booleans()):  # decode: all K drafts, or fewer near the length limit
            d = draw(st.one_of(st.just(k), st.integers(0, k)))
            query_lens.append(d + 1)
            drafts.append(d)
            valid.append(draw(st.integers(1, d + 1)))
        else:
            query_lens.append(draw(st.one_of(st.integers(1, 4), st.integers(1, max_prefill))))
            drafts.append(0)
            valid.append(1)
    return RejectionLayout(query_lens, drafts, valid)


@dataclass(frozen=True)
class SampledLayout:
    """Output of a rejection sampler: [B, K+1] ids, -1 for rejected slots, and at
    times ids >= vocab_size (invalid, e.g. a draft-vocab placeholder)."""

    sampled_token_ids: list[list[int]]
    discard: list[bool]
    backup: list[int]
    vocab_size: int

    @property
    def num_reqs(self) -> int:
        return len(self.sampled_token_ids)

    def tensors(self, device="cpu", id_dtype=torch.int32, num_sampled: int = 1) -> dict[str, torch.Tensor]:
        width = len(self.sampled_token_ids[0]) if self.sampled_token_ids else num_sampled
        return {
            "sampled_token_ids": torch.tensor(self.sampled_token_ids, dtype=id_dtype, device=device).reshape(
                self.num_reqs, width
            ),
            "discard_request_mask": torch.tensor(self.discard, dtype=torch.bool, device=device),
            "backup_next_token_ids": torch.tensor(self.backup, dtype=id_dtype, device=device),
        }


@st.composite
def sampled_layouts(draw, max_requests: int = 12, max_drafts: int = 9) -> SampledLayout:
    """Rows are mostly a valid prefix then -1s (what a sampler returns); some rows
    mix -1, ids >= vocab_size and valid ids freely."""
    num_reqs = draw(st.integers(0, max_requests))
    width = draw(st.integers(1, max_drafts + 1))
    vocab = draw(st.sampled_from([1, 7, 32000, 150000]))
    token = st.integers(0, vocab - 1)
    rows = []
    for _ in range(num_reqs):
        if draw(st.integers(0, 3)):
            n_valid = draw(st.integers(0, width))
            rows.append([draw(token) for _ in range(n_valid)] + [-1] * (width - n_valid))
        else:
            anything = st.one_of(token, st.just(-1), st.integers(vocab, vocab + 5))
            rows.append(draw(st.lists(anything, min_size=width, max_size=width)))
    discard = draw(st.lists(st.integers(0, 4).map(lambda x: x == 0), min_size=num_reqs, max_size=num_reqs))
    backup = draw(st.lists(token, min_size=num_reqs, max_size=num_reqs))
    return SampledLayout(rows, discard, backup, vocab)


# ---------------------------------------------------------------------- draft steps


@dataclass(frozen=True)
class StepLayout:
    """A decode batch about to run a draft step: running positions (row 0; M-RoPE rows
    1 and 2 add per-request offsets), seq_lens, a block table whose rows hold
    distinct blocks, and a slot_mapping buffer padded for CUDA graphs."""

    positions: list[int]
    seq_lens: list[int]
    block_table: list[list[int]]
    num_slots: int  # >= B
    block_size: int
    max_model_len: int
    mrope_offsets: list[int] | None = None  # rows 1, 2 = row 0 + offset, row 0 - offset

    @property
    def num_reqs(self) -> int:
        return len(self.positions)

    def position_rows(self) -> list[list[int]]:
        if self.mrope_offsets is None:
            return [list(self.positions)]
        return [
            list(self.positions),
            [p + o for p, o in zip(self.positions, self.mrope_offsets, strict=True)],
            [p - o for p, o in zip(self.positions, self.mrope_offsets, strict=True)],
        ]

    def tensors(self, device="cpu", position_dtype=torch.int64, index_dtype=torch.int32) -> dict[str, torch.Tensor]:
        rows = self.position_rows()
        positions = torch.tensor(rows, dtype=position_dtype, device=device).reshape(len(rows), self.num_reqs)
        width = len(self.block_table[0]) if self.block_table else 1
        return {
            "positions": positions[0].clone() if self.mrope_offsets is None else positions,
            "seq_lens": torch.tensor(self.seq_lens, dtype=index_dtype, device=device),
            "block_table": torch.tensor(self.block_table, dtype=index_dtype, device=device).reshape(
                self.num_reqs, width
            ),
        }


@st.composite
def step_layouts(draw, max_requests: int = 10, max_padding: int = 5, mrope: bool | None = None) -> StepLayout:
    """Positions anywhere in [0, max_model_len), bunched near the limit (and a few
    already past it, as running positions are after a clamp); block tables of
    distinct blocks per request, at times narrower than max_model_len needs (the
    block number is then clamped to the last column)."""
    block_size = draw(st.sampled_from([1, 4, 16]))
    max_model_len = draw(st.integers(1, 12 * block_size))
    num_reqs = draw(st.integers(0, max_requests))
    full_width = -(-max_model_len // block_size)
    width = draw(st.one_of(st.just(full_width), st.integers(1, full_width)))
    near_limit = st.integers(max(0, max_model_len - 3), max_model_len + 2)
    positions = draw(
        st.lists(st.one_of(st.integers(0, max_model_len - 1), near_limit), min_size=num_reqs, max_size=num_reqs)
    )
    seq_lens = [min(p + 1, max_model_len) if p + 1 < max_model_len else draw(st.sampled_from([1, max_model_len]))
                for p in positions]  # fmt: skip
    spare = draw(st.integers(0, 8))
    blocks = draw(st.permutations(range(num_reqs * width + spare)))
    table = [list(blocks[b * width : (b + 1) * width]) for b in range(num_reqs)]
    num_slots = num_reqs + draw(st.integers(0, max_padding))
    if mrope is None:
        mrope = draw(st.booleans())
    offsets = draw(st.lists(st.integers(0, 50), min_size=num_reqs, max_size=num_reqs)) if mrope else None
    return StepLayout(positions, seq_lens, table, num_slots, block_size, max_model_len, offsets)
