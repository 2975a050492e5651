"""Speculative settings and per-request sampling parameters. BatchMetadata (the batch
layout) lives in specdraft.layout and is re-exported here."""

from dataclasses import dataclass

import torch

from specdraft.layout import BatchMetadata

__all__ = ["BatchMetadata", "SamplingParams", "SpeculativeConfig"]

METHODS = ("eagle", "eagle3", "mtp", "block")
DRAFT_SAMPLING = ("greedy", "probabilistic")
PROBS_KINDS = (None, "probs", "logits")


@dataclass(frozen=True)
class SpeculativeConfig:
    """What a proposer drafts and how. Checked on construction: a ValueError names
    the field.

    method: "eagle" | "eagle3" | "mtp" | "block" (the head's family; EAGLE-3 fuses aux hidden
        states, MTP chooses its layer by the draft step).
    num_speculative_tokens: K >= 1 draft tokens per request.
    max_model_len: positions at or past it are clamped (position 0, PAD slot).
    block_size: KV-cache block size of the draft's layers.
    draft_sampling: "greedy" (argmax) or "probabilistic" (seeded Gumbel-max with
        each request's temperature; temperature 0 rows stay greedy).
    return_probs: None, "probs" (softmax(logits / T) per step, what rejection
        sampling needs) or "logits" (logits / T): an extra [B, K, V] fp32 output.
    parallel_drafting / parallel_drafting_token_id: draft all K tokens in one pass
        (the K - 1 extra slots carry this token id).
    salt: keeps the draft noise stream apart from the target's.
    return_draft_confidence: also return the draft's confidence at each drafted position,
        [B, K] fp32: the largest probability of its distribution there (softmax(logits
        / T) inside the request's truncation; T = 1 for greedy rows), its probability
        of its own token when it drafts greedily: the survival estimate budgeted
        verification ranks positions by.
    draft_truncation: with a request's top-k / top-p / min-p (SamplingParams),
        sample the drafts inside that truncation, from the draft's distribution
        truncated by the same parameters and renormalised (default True), or
        outside it, from the untruncated distribution (False: vLLM's choice, for
        comparison). Either way verification truncates the target, so the output
        stays lossless; drafting inside is accepted more often.
    """

    method: str = "eagle"
    num_speculative_tokens: int = 3
    max_model_len: int = 2048
    block_size: int = 16
    draft_sampling: str = "greedy"
    return_probs: str | None = None
    parallel_drafting: bool = False
    parallel_drafting_token_id: int | None = None
    salt: int = 0
    return_draft_confidence: bool = False
    draft_truncation: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        for name in ("num_speculative_tokens", "max_model_len", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise ValueError(f"draft_sampling must be one of {DRAFT_SAMPLING}, got {self.draft_sampling!r}")
        if self.return_probs not in PROBS_KINDS:
            raise ValueError(f"return_probs must be one of {PROBS_KINDS}, got {self.return_probs!r}")
        if not isinstance(self.parallel_drafting, bool):
            raise ValueError(f"parallel_drafting must be a bool, got {self.parallel_drafting!r}")
        token = self.parallel_drafting_token_id
        if self.parallel_drafting and token is None:
            raise ValueError("parallel_drafting_token_id must be set when parallel_drafting is on")
        if token is not None and (isinstance(token, bool) or not isinstance(token, int) or token < 0):
            raise ValueError(f"parallel_drafting_token_id must be a non-negative int, got {token!r}")
        if isinstance(self.salt, bool) or not isinstance(self.salt, int) or not 0 <= self.salt < 2**31:
            raise ValueError(f"salt must be an int in [0, 2**31), got {self.salt!r}")
        for name in ("return_draft_confidence", "draft_truncation"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")


@dataclass
class SamplingParams:
    """Per-request sampling: temperature [B] fp32 (0 = greedy), seeds [B] int64, and
    optionally the request's truncation (None: off for every request): top_k [B] int
    (<= 0 or >= the vocabulary: off), top_p [B] float in (0, 1] (1: off), min_p [B]
    float in [0, 1] (0: off); the rules and their order are ops.truncation_cut's."""

    temperature: torch.Tensor
    seeds: torch.Tensor
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None

    @property
    def truncated(self) -> bool:
        """Whether any truncation tensor is set (a host-side fact: no device read)."""
        return self.top_k is not None or self.top_p is not None or self.min_p is not None

    def truncation_rows(self, repeat: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(top_k int32, top_p fp32, min_p fp32), each request's `repeat` times in a row
        (rows sampled per request), unset ones filled with their off value; None
        without truncation."""
        if not self.truncated:
            return None
        like = self.temperature
        top_k = torch.zeros_like(like, dtype=torch.int32) if self.top_k is None else self.top_k.to(torch.int32)
        top_p = torch.ones_like(like, dtype=torch.float32) if self.top_p is None else self.top_p.to(torch.float32)
        min_p = torch.zeros_like(like, dtype=torch.float32) if self.min_p is None else self.min_p.to(torch.float32)
        return tuple(t.repeat_interleave(repeat) if repeat > 1 else t for t in (top_k, top_p, min_p))
