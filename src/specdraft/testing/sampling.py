"""Hypothesis strategies for draft sampling and rejection sampling (their value
checkers are checked mode's, beside their ops: ops/sampling/draft/op.py, rejection/op.py).

A `SamplingBatch` is plain Python data (per-request temperature, seed, position,
number of drafts) plus one integer that seeds the logits, so a failing example
prints readably; `SamplingBatch.tensors(device)` builds the op inputs.
"""

from dataclasses import dataclass

import torch
from hypothesis import strategies as st


@dataclass(frozen=True)
class SamplingBatch:
    """Inputs for `draft_sample` and `rejection_sample`: B requests, vocab V, K
    drafts per request (num_draft[b] <= K real ones, the rest -1). Greedy and
    random requests mix (temperature 0 or > 0)."""

    vocab: int
    num_spec: int
    temperature: list[float]
    seeds: list[int]
    positions: list[int]
    num_draft: list[int]
    data_seed: int
    logit_scale: float = 3.0

    @property
    def num_reqs(self) -> int:
        return len(self.temperature)

    def tensors(
        self, device="cpu", logits_dtype=torch.float32, index_dtype=torch.int64, with_draft_probs=True
    ) -> dict[str, torch.Tensor | None]:
        """logits [B, V] (draft), draft_probs [B, K, V] (softmax of random draft
        logits), target_logits [B, K+1, V], draft_tokens [B, K] (a mix of target
        argmaxes, draft argmaxes and random ids, so greedy chains run long and
        random ones both accept and reject), and the per-request tensors."""
        gen = torch.Generator().manual_seed(self.data_seed)
        b, k, v = self.num_reqs, self.num_spec, self.vocab
        logits = torch.randn(b, v, generator=gen) * self.logit_scale
        target = torch.randn(b, k + 1, v, generator=gen) * self.logit_scale
        draft_logits = torch.randn(b, k, v, generator=gen) * self.logit_scale
        # Half the target rows lean towards the draft: acceptance is likely there.
        lean = torch.rand(b, k, 1, generator=gen) < 0.5
        target[:, :k] = torch.where(lean, 0.5 * target[:, :k] + draft_logits, target[:, :k])
        choice = torch.randint(0, 3, (b, k), generator=gen)
        drafts = torch.where(
            choice == 0,
            target[:, :k].argmax(-1),
            torch.where(choice == 1, draft_logits.argmax(-1), torch.randint(0, v, (b, k), generator=gen)),
        )
        n = torch.tensor(self.num_draft, dtype=torch.int64).reshape(b)
        drafts = torch.where(torch.arange(k) < n[:, None], drafts, -1)
        return {
            "logits": logits.to(logits_dtype).to(device),
            "target_logits": target.to(logits_dtype).to(device),
            "draft_probs": torch.softmax(draft_logits, -1).to(device) if with_draft_probs else None,
            "draft_tokens": drafts.to(index_dtype).to(device),
            "num_draft_tokens": n.to(index_dtype).to(device),
            "temperature": torch.tensor(self.temperature, dtype=torch.float32, device=device).reshape(b),
            "seeds": torch.tensor(self.seeds, dtype=torch.int64, device=device).reshape(b),
            "positions": torch.tensor(self.positions, dtype=torch.int64, device=device).reshape(b),
        }


@st.composite
def sampling_batches(
    draw, max_requests: int = 6, max_vocab: int = 300, max_spec: int = 4, min_requests: int = 0
) -> SamplingBatch:
    """Mixed greedy / random requests; seeds and positions over the full int64
    range now and then (negative seeds, positions past 2**32) to exercise both
    32-bit words of the hash; vocabularies from 1 token."""
    num_reqs = draw(st.integers(min_requests, max_requests))
    vocab = draw(st.one_of(st.integers(1, 8), st.integers(1, max_vocab)))
    num_spec = draw(st.integers(1, max_spec))

    def per_request(strategy):
        return draw(st.lists(strategy, min_size=num_reqs, max_size=num_reqs))

    temperature = per_request(st.one_of(st.just(0.0), st.floats(0.0625, 4.0, width=32)))
    wide = st.integers(-(2**63), 2**63 - 1)
    seeds = per_request(st.one_of(st.integers(0, 2**20), wide))
    positions = per_request(st.one_of(st.integers(0, 1 << 16), st.integers(0, 2**62)))
    num_draft = per_request(st.integers(0, num_spec))
    return SamplingBatch(vocab, num_spec, temperature, seeds, positions, num_draft, draw(st.integers(0, 2**16)))
