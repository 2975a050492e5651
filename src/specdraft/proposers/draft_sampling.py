"""Draft sampling for the propose loops (loop.py) and the block drafters (block.py):
`DraftSampler` samples one draft token per row of logits (greedy argmax, or the
seeded Gumbel draft_sample with each request's temperature, seed and truncation) and
fills the draft-probability buffer and keeps each row's confidence
(specdraft.draft_confidence), which budgeted verification ranks positions by;
`sample_per_request` samples K drafts per request in one call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.draft_confidence import row_confidence
from specdraft.ops import draft_sample, truncation_cut

if TYPE_CHECKING:
    from .loop import StepState


class DraftOutput(NamedTuple):
    draft_tokens: torch.Tensor  # [B, K] int32 (target vocabulary)
    draft_probs: torch.Tensor | None  # [B, K, V] fp32, when config.return_probs is set
    draft_confidence: torch.Tensor | None = None  # [B, K] fp32, when config.return_draft_confidence is set


def first_row(positions: torch.Tensor) -> torch.Tensor:
    return positions[0] if positions.dim() == 2 else positions


def allocate_draft_probs(config: SpeculativeConfig, vocab_size: int, num_reqs: int, device) -> torch.Tensor | None:
    if config.return_probs is None:
        return None
    return torch.zeros(num_reqs, config.num_speculative_tokens, vocab_size, dtype=torch.float32, device=device)


@dataclass
class DraftSampler:
    """Samples one draft token per row of logits: argmax when greedy (and no buffer to
    fill), else draft_sample with each request's temperature and seed, storing this
    step's probs / logits into probs[:, step_index] when a buffer is given. With
    config.return_draft_confidence it also keeps each row's confidence (`row_confidence`),
    read back by `confidences`.

    A token's noise is keyed by its own position, so a request drafts the same tokens
    whatever batch it is in.
    """

    config: SpeculativeConfig
    sampling: SamplingParams | None
    probs: torch.Tensor | None  # [B, K, V] fp32 or None
    kept: list[torch.Tensor] | None = None  # one [rows] fp32 per call, with return_draft_confidence

    def __post_init__(self) -> None:
        if self.config.return_draft_confidence and self.kept is None:
            self.kept = []

    def __call__(self, logits, token_positions, step_index: torch.Tensor | None, repeat: int = 1, probs=None):
        """repeat: rows per request (parallel drafting samples K rows per request);
        probs: the buffer viewed as those rows (default self.probs)."""
        probs = self.probs if probs is None else probs
        config = self.config
        if config.draft_sampling == "greedy" and probs is None:
            tokens = logits.argmax(dim=-1).to(torch.int32)
            self.keep_confidence(logits, None)
            return tokens
        temperature, seeds = self.row_params(logits.shape[0], logits.device, repeat)
        kwargs = {"salt": config.salt}
        if probs is not None:
            kwargs.update(probs_out=probs, step=step_index, write=config.return_probs)
        cut = self.row_cut(logits, temperature, repeat)
        if cut is not None:
            kwargs["logit_cut"] = cut
        tokens = draft_sample(logits.contiguous(), temperature, seeds, token_positions.long(), **kwargs)
        self.keep_confidence(logits, temperature, cut)
        return tokens

    def row_cut(self, logits, temperature, repeat: int) -> torch.Tensor | None:
        """Each sampled row's logit cut for its request's top-k / top-p / min-p
        (ops.truncation_cut, over the draft's own vocabulary), or None without
        truncation: the draft samples inside the request's truncation, as the target's
        tokens are verified against it. None too with config.draft_truncation False
        (drafts from the untruncated distribution; verify still truncates the target)."""
        if self.sampling is None or self.config.draft_sampling == "greedy" or not self.config.draft_truncation:
            return None
        rows = self.sampling.truncation_rows(repeat)
        if rows is None:
            return None
        return truncation_cut(logits.contiguous(), temperature, *rows)

    def keep_confidence(self, logits, temperature: torch.Tensor | None, cut: torch.Tensor | None = None) -> None:
        if self.kept is not None:
            self.kept.append(row_confidence(logits, temperature, cut))

    def confidences(self, num_reqs: int) -> torch.Tensor | None:
        """[B, K] fp32: the kept confidences, request-major (None without
        return_draft_confidence). One call per step gives a [B] column each; one call over
        B * K rows (parallel drafting, a block) gives them all at once."""
        if self.kept is None:
            return None
        return torch.stack(self.kept, dim=1).view(num_reqs, -1)

    def row_params(self, num_rows: int, device, repeat: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(temperature [num_rows] fp32, seeds [num_rows] int64) of the rows sampled,
        `repeat` rows per request: zeros (greedy) without sampling or with greedy drafts."""
        if self.sampling is None or self.config.draft_sampling == "greedy":
            temperature = torch.zeros(num_rows, dtype=torch.float32, device=device)
            return temperature, torch.zeros(num_rows, dtype=torch.int64, device=device)
        temperature = self.sampling.temperature.repeat_interleave(repeat)
        # Not > 0 (negative, NaN: out of contract) samples greedily, as 0 does.
        return torch.where(temperature > 0, temperature, 0.0), self.sampling.seeds.repeat_interleave(repeat)

    def step(self, logits, state: StepState, step_index: torch.Tensor | None):
        """Draft token of one step: the fed token's position + 1 keys its noise."""
        return self(logits, first_row(state.positions) + 1, step_index)


def sample_per_request(config: SpeculativeConfig, sampling: SamplingParams | None, logits, token_positions,
                       num_reqs: int, vocab_size: int) -> DraftOutput:  # fmt: skip
    """K drafts per request in one call (parallel drafting, a block drafter's block):
    logits [B * K, V] request-major, token_positions [B * K] (each draft's own
    position keys its noise); the [B, K, V] buffer is filled as B * K requests of one
    step each."""
    k = logits.shape[0] // num_reqs
    sample = DraftSampler(config, sampling, allocate_draft_probs(config, vocab_size, num_reqs, logits.device))
    as_rows = None if sample.probs is None else sample.probs.view(num_reqs * k, 1, -1)
    step = step_counter(sample.probs, 0, logits.device)
    tokens = sample(logits, token_positions, step, repeat=k, probs=as_rows)
    return DraftOutput(tokens.view(num_reqs, k), sample.probs, sample.confidences(num_reqs))


def step_counter(probs: torch.Tensor | None, step: int, device) -> torch.Tensor | None:
    """The buffer row a step writes, as a 0-dim device tensor (None without a buffer)."""
    return None if probs is None else torch.full((), step, dtype=torch.int64, device=device)
