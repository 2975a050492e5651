"""Hypothesis strategies for the shift-and-cache ops (their value checker is checked
mode's, specdraft.ops.shift_and_cache.window.check_shift_and_cache_values).

Layouts are plain Python data (lists of ints), so a failing example prints readably;
`ShiftLayout.tensors(device)` turns one into the metadata tensors the ops take.
"""

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

from specdraft.ops import MAX_SHIFT_LIMIT


@dataclass(frozen=True)
class ShiftLayout:
    """A valid input for `shift_plan` and `shift_and_cache_*`.

    Request b owns tokens [query_start_loc[b], query_start_loc[b+1]); `num_tokens`
    may exceed query_start_loc[-1] (padding tokens past the batch, which the ops
    must leave alone). Positions run consecutively inside each window.
    """

    query_start_loc: list[int]
    num_tokens: int
    max_shift: int
    cached_lens: list[int]  # 0 <= cached_len <= max_shift
    shift: list[int]  # 0 <= shift <= cached_len; 0 for empty windows
    token_indices_to_sample: list[int]  # inside the window; start - 1 if empty
    first_positions: list[int]  # position of each window's first token
    seq_lens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.query_start_loc) - 1

    @property
    def window_lens(self) -> list[int]:
        qsl = self.query_start_loc
        return [qsl[b + 1] - qsl[b] for b in range(self.num_reqs)]

    @property
    def max_query_len(self) -> int:
        return max(self.window_lens, default=0)

    def positions(self) -> list[int]:
        """Consecutive positions inside each window; padding tokens get 0."""
        out = [0] * self.num_tokens
        for b in range(self.num_reqs):
            start = self.query_start_loc[b]
            for i in range(self.window_lens[b]):
                out[start + i] = self.first_positions[b] + i
        return out

    def tensors(self, device="cpu", index_dtype=torch.int32) -> dict[str, torch.Tensor]:
        def idx(values):
            return torch.tensor(values, dtype=index_dtype, device=device)

        return {
            "query_start_loc": idx(self.query_start_loc),
            "token_indices_to_sample": idx(self.token_indices_to_sample),
            "shift": idx(self.shift),
            "cached_lens": idx(self.cached_lens),
            "seq_lens": idx(self.seq_lens),
            "positions": torch.tensor(self.positions(), dtype=torch.int64, device=device),
        }


@st.composite
def shift_layouts(
    draw,
    max_requests: int = 6,
    max_window: int = 700,
    max_shift: int | None = None,
    max_padding: int = 3,
) -> ShiftLayout:
    """Mixed decode-sized and prefill-sized windows (up to `max_window` tokens,
    i.e. several kernel token blocks), empty windows included, MAX_SHIFT in 1..8."""
    if max_shift is None:
        max_shift = draw(st.integers(1, MAX_SHIFT_LIMIT))
    num_reqs = draw(st.integers(0, max_requests))
    window = st.one_of(st.integers(0, 4), st.integers(0, max_window))
    lens = draw(st.lists(window, min_size=num_reqs, max_size=num_reqs))
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    num_tokens = qsl[-1] + draw(st.integers(0, max_padding))

    cached_lens, shifts, samples, first_positions, seq_lens = [], [], [], [], []
    for b, n in enumerate(lens):
        cached = draw(st.integers(0, max_shift))
        cached_lens.append(cached)
        shifts.append(draw(st.integers(0, cached)) if n > 0 else 0)
        samples.append(draw(st.integers(qsl[b], qsl[b] + n - 1)) if n > 0 else qsl[b] - 1)
        first = draw(st.one_of(st.just(0), st.integers(0, 10_000)))
        first_positions.append(first)
        seq_lens.append(first + n)
    return ShiftLayout(qsl, num_tokens, max_shift, cached_lens, shifts, samples, first_positions, seq_lens)
