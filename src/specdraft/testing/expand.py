"""Hypothesis strategies of parallel-drafting batch layouts, for
`copy_and_expand_inputs`, `extend_queries_by_n` and `new_slot_mapping`.

A layout is plain Python data (lists of ints), so a failing example prints readably;
`ExpandLayout.tensors(device)` turns one into the tensors the ops take.
"""

import random
from dataclasses import dataclass

import torch
from hypothesis import strategies as st


@dataclass(frozen=True)
class ExpandLayout:
    """A valid batch after rejection sampling, ready to be expanded.

    Request r owns input tokens [query_start_loc[r], query_start_loc[r+1]) (at least
    one); the last num_rejected[r] of them were rejected drafts (at most the
    window's drafts: window - 1 for a decode request, 0 for a prefill chunk).
    `num_tokens` may exceed query_start_loc[-1] (CUDA-graph padding). Positions run
    consecutively from first_positions[r]; every input position is below
    max_model_len, expanded ones may reach past it. block_table rows hold distinct
    blocks (no block shared between or inside requests).
    """

    query_start_loc: list[int]
    num_tokens: int
    num_rejected: list[int]
    first_positions: list[int]
    num_padding_slots_per_request: int
    shift_input_ids: bool
    block_size: int
    max_model_len: int
    block_table: list[list[int]]

    @property
    def num_reqs(self) -> int:
        return len(self.query_start_loc) - 1

    @property
    def window_lens(self) -> list[int]:
        qsl = self.query_start_loc
        return [qsl[r + 1] - qsl[r] for r in range(self.num_reqs)]

    @property
    def max_query_len(self) -> int:
        return max(self.window_lens, default=0)

    @property
    def growth(self) -> int:
        """Slots each request gains: P - 1 with the shift, P without."""
        return self.num_padding_slots_per_request - int(self.shift_input_ids)

    @property
    def num_out(self) -> int:
        return self.num_tokens + self.num_reqs * self.growth

    @property
    def seq_lens(self) -> list[int]:
        return [self.first_positions[r] + n for r, n in enumerate(self.window_lens)]

    def positions(self) -> list[int]:
        """Consecutive positions inside each window; padding tokens get 0."""
        out = [0] * self.num_tokens
        for r, n in enumerate(self.window_lens):
            for i in range(n):
                out[self.query_start_loc[r] + i] = self.first_positions[r] + i
        return out

    def tensors(self, device="cpu", index_dtype=torch.int32, seed: int = 0) -> dict[str, torch.Tensor]:
        """Metadata tensors, plus random target_token_ids [T] / next_token_ids [B]."""
        gen = torch.Generator().manual_seed(seed)

        def idx(values, dtype=index_dtype):
            return torch.tensor(values, dtype=dtype, device=device)

        width = len(self.block_table[0]) if self.block_table else 1
        return {
            "query_start_loc": idx(self.query_start_loc),
            "num_rejected_tokens": idx(self.num_rejected),
            "seq_lens": idx(self.seq_lens),
            "target_positions": idx(self.positions(), torch.int64),
            "block_table": idx(self.block_table or [], torch.int32).reshape(self.num_reqs, width),
            "target_token_ids": torch.randint(1, 1 << 20, (self.num_tokens,), generator=gen, dtype=torch.int32).to(
                device
            ),
            "next_token_ids": torch.randint(1, 1 << 20, (self.num_reqs,), generator=gen, dtype=torch.int32).to(device),
        }


@st.composite
def expand_layouts(
    draw,
    max_requests: int = 6,
    max_prefill: int = 400,
    max_drafts: int = 5,
    max_slots: int = 6,
    max_padding: int = 3,
    shift_input_ids: bool | None = None,
) -> ExpandLayout:
    """Mixed decode (1 + K tokens, up to K rejected) and prefill-chunk (up to
    `max_prefill` tokens: several kernel token blocks, none rejected) requests; P in
    1..max_slots new slots; block sizes 1..32; first positions often right below
    max_model_len so that expanded positions cross it; block tables sometimes one
    block narrower than max_model_len needs (the lookup must clamp)."""
    slots = draw(st.integers(1, max_slots))
    shift = draw(st.booleans()) if shift_input_ids is None else shift_input_ids
    drafts = draw(st.integers(0, max_drafts))
    num_reqs = draw(st.integers(0, max_requests))
    prefill = st.integers(1, max_prefill)
    lens = draw(st.lists(st.one_of(st.just(drafts + 1), prefill), min_size=num_reqs, max_size=num_reqs))
    rejected = [draw(st.integers(0, n - 1)) if n == drafts + 1 else 0 for n in lens]

    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    num_tokens = qsl[-1] + draw(st.integers(0, max_padding))

    longest = max(lens, default=1)
    max_model_len = draw(st.integers(longest, max(longest, 600)))
    first_positions = []
    for n in lens:
        top = max_model_len - n  # the last input position stays below max_model_len
        near = st.integers(max(0, top - slots - 2), top)
        first_positions.append(draw(st.one_of(st.just(0), st.just(top), near, st.integers(0, top))))

    block_size = draw(st.sampled_from([1, 2, 4, 16, 32]))
    width = -(-max_model_len // block_size)
    if width > 1 and draw(st.booleans()):
        width -= 1
    spare = draw(st.integers(0, 8))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    blocks = rng.sample(range(num_reqs * width + spare), num_reqs * width)
    block_table = [blocks[r * width : (r + 1) * width] for r in range(num_reqs)]
    return ExpandLayout(
        qsl, num_tokens, rejected, first_positions, slots, shift, block_size, max_model_len, block_table
    )
