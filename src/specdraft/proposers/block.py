"""Block proposer (DFlash, DSpark: specdraft.models.heads.block): every request's
drafts come from one forward of the head over a block, not K single-token steps.

    propose   write context -> block forward -> sample the block -> confidence

- **write context**: the target's window rows become context: each draft layer
  projects their keys and values from hidden_norm(fc(aux)) and writes them to its
  paged KV cache at the window's slots (rejected rows too: they sit past the
  request's seq_len, unread, and the next window rewrites them);
- **block forward**: [newest token, mask x (block_size - 1)] at the positions after
  the request's seq_len; each layer's queries attend to the request's cached context
  and to the whole block (bidirectional); the block's own keys never enter the cache;
- **sample**: DFlash samples every block row at once (`DraftSampler`, each draft's
  noise keyed by its own position); DSpark runs its Markov head over the block in
  order, sampling as it goes, in one op (`ops.markov_block_sample`);
- **confidence**: DSpark's survival logit per drafted position, returned as a
  tensor (the budgeted verification reads it).

num_speculative_tokens K <= block_size: the first K drafts are returned (verified).
No host sync: every shape comes from B, block_size and Python-int bounds.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.draft_confidence import row_confidence
from specdraft.layout import BatchMetadata
from specdraft.models.attention import prefix_and_tree_attention
from specdraft.models.kv_cache import write_kv_cache
from specdraft.ops import markov_block_sample
from specdraft.proposers.base import Proposer
from specdraft.proposers.checks import check_method
from specdraft.proposers.draft_sampling import DraftSampler, sample_per_request
from specdraft.proposers.loop import TargetWindow, clamp_ids, sample_rows


class BlockDraftOutput(NamedTuple):
    draft_tokens: torch.Tensor  # [B, K] int32
    draft_probs: torch.Tensor | None  # [B, K, V] fp32, when config.return_probs is set
    confidence_logits: torch.Tensor | None  # [B, K] fp32: DSpark's survival logit per draft, else None
    draft_confidence: torch.Tensor | None = None  # [B, K] fp32, when config.return_draft_confidence is set


def write_context(model, kv_caches, window: TargetWindow) -> None:
    """Every window row's keys and values, each draft layer's, into its cache."""
    context = model.project_context(window.hidden_states)
    for i, cache in enumerate(kv_caches):
        k, v = model.context_kv(i, window.positions, context)
        write_kv_cache(cache, k, v, window.metadata.slot_mapping)


def block_attention(kv_cache, metadata: BatchMetadata, context_lens, num_reqs: int, block_size: int, scale: float):
    """One layer's attention for the B * block_size block rows: the request's first
    context_lens cached keys and every key of its own block."""

    def attend(q, k, v):
        visible = torch.ones(num_reqs, block_size, block_size, dtype=torch.bool, device=q.device)
        out = prefix_and_tree_attention(
            q.view(num_reqs, block_size, *q.shape[1:]), kv_cache, context_lens, metadata.block_table,
            metadata.max_seq_len, k.view(num_reqs, block_size, *k.shape[1:]),
            v.view(num_reqs, block_size, *v.shape[1:]), visible, scale=scale,
        )  # fmt: skip
        return out.reshape(num_reqs * block_size, *out.shape[2:])

    return attend


def block_forward(model, kv_caches, newest_tokens, context_lens, metadata: BatchMetadata):
    """hidden [B, block_size, H] of each request's block, which sits at positions
    context_lens .. context_lens + block_size - 1."""
    num_reqs, size = newest_tokens.shape[0], model.block_size
    ids = clamp_ids(model.block_input_ids(newest_tokens), model.config.vocab_size).reshape(-1)
    positions = (context_lens.long()[:, None] + torch.arange(size, device=ids.device)).reshape(-1)
    scale = model.attention_scale

    def attend_for_layer(i):
        return block_attention(kv_caches[i], metadata, context_lens, num_reqs, size, scale)

    return model.block_hidden(ids, positions, attend_for_layer).view(num_reqs, size, -1)


def sample_markov_block(model, config: SpeculativeConfig, logits, hidden, newest_tokens, draft_positions, sampling,
                        num_drafts: int):  # fmt: skip
    """DSpark: tokens [B, block_size], the draft probs [B, K, V] (or None) of the
    Markov-corrected logits, sampled in order over the block in one op, and the
    draft's confidence at each drafted position [B, K] (draft_confidence.row_confidence; None
    without config.return_draft_confidence)."""
    markov = model.markov_head
    temperature, seeds = DraftSampler(config, sampling, None).row_params(logits.shape[0], logits.device)
    hidden_part, latent_weight = markov_op_weights(markov, hidden)
    tokens, corrected = markov_block_sample(
        logits, newest_tokens, markov.markov_w1.weight, markov.markov_w2.weight, kind=markov.kind,
        hidden_part=hidden_part, latent_weight=latent_weight, temperature=temperature, seeds=seeds,
        positions=draft_positions, salt=config.salt,
    )  # fmt: skip
    confidence = None
    if config.return_draft_confidence:
        rows = corrected[:, :num_drafts].reshape(-1, corrected.shape[-1])
        confidence = row_confidence(rows, temperature.repeat_interleave(num_drafts)).view(-1, num_drafts)
    if config.return_probs is None:
        return tokens, None, confidence
    scaled = corrected[:, :num_drafts] / torch.where(temperature > 0, temperature, 1.0)[:, None, None]
    return tokens, (torch.softmax(scaled, dim=-1) if config.return_probs == "probs" else scaled), confidence


def markov_op_weights(markov, hidden):
    """The Markov head's weights split the way ops.markov_block_sample reads them: the
    part of gate_proj / joint_proj that reads the block row's hidden state, applied to
    the whole block at once (with the bias), and the part that reads the latent
    (gated: [r, r], the previous token's embedding; rnn: [3r, 2r], the state and the
    embedding)."""
    if markov.kind == "vanilla":
        return None, None
    proj = markov.gate_proj if markov.kind == "gated" else markov.joint_proj
    weight, h = proj.weight, hidden.shape[-1]
    if markov.kind == "gated":  # gate_proj reads [h; e]
        hidden_weight, latent_weight = weight[:, :h], weight[:, h:]
    else:  # joint_proj reads [state; e; h]
        hidden_weight, latent_weight = weight[:, 2 * markov.rank :], weight[:, : 2 * markov.rank]
    hidden_part = torch.nn.functional.linear(hidden.to(weight.dtype), hidden_weight, proj.bias)
    return hidden_part, latent_weight


def sample_plain_block(config: SpeculativeConfig, logits, draft_positions, sampling, num_drafts: int, vocab: int):
    """DFlash: the first K rows of every block at once, each draft's noise keyed by
    its own position. tokens [B, K], probs [B, K, V] or None."""
    num_reqs = logits.shape[0]
    rows = logits[:, :num_drafts].reshape(num_reqs * num_drafts, -1)
    positions = (draft_positions.long()[:, None] + torch.arange(num_drafts, device=logits.device)).reshape(-1)
    return sample_per_request(config, sampling, rows, positions, num_reqs, vocab)


class BlockProposer(Proposer):
    """Drafts K <= block_size tokens per request with a BlockDraftHead (DFlash or
    DSpark) in one forward over a block: `propose`, or after verification
    `propose_padded` / `propose_unpadded` (specdraft.proposers.base.Proposer). Returns
    a BlockDraftOutput (draft tokens, draft probs, DSpark's confidence logits)."""

    drafts_fewer = True

    def __init__(self, model: torch.nn.Module, config: SpeculativeConfig, kv_caches: list[torch.Tensor]) -> None:
        super().__init__(model, config, kv_caches)
        check_method(model, config.method)
        model.check_loop("block")
        if config.num_speculative_tokens > model.block_size:
            raise ValueError(
                f"num_speculative_tokens = {config.num_speculative_tokens} exceeds the head's block_size "
                f"{model.block_size}: a block drafts at most block_size tokens"
            )
        if config.parallel_drafting:
            raise ValueError("parallel_drafting: a block drafter drafts its block in one pass already")

    @property
    def draft_steps(self) -> int:
        return 0  # the block's keys stay out of the cache: nothing past the window is written

    @torch.no_grad()
    def propose(
        self,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        metadata: BatchMetadata,
        sampling: SamplingParams | None = None,
        *,
        token_indices_to_sample: torch.Tensor | None = None,
        num_rejected_tokens: torch.Tensor | None = None,
    ) -> BlockDraftOutput:
        """Draft K tokens for each of the B requests: the same arguments as
        EagleProposer.propose (target_hidden_states: the head's aux layers
        concatenated, [T, len(target_layer_ids) * target_hidden]). Each request's
        context is its seq_lens minus num_rejected_tokens tokens; next_token_ids [B]
        (the target's newest token) opens its block."""
        if target_positions.dim() != 1:
            raise ValueError("target_positions: block drafters take 1-D positions (no M-RoPE)")
        window = self.checked_window(
            TargetWindow(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata,
                         token_indices_to_sample, num_rejected_tokens),
            sampling,
        )  # fmt: skip
        model, config, k = self.model, self.config, self.num_speculative_tokens
        _, context_lens = sample_rows(window.metadata, window.token_indices_to_sample, window.num_rejected_tokens)
        write_context(model, self.kv_caches, window)
        hidden = block_forward(model, self.kv_caches, next_token_ids, context_lens, window.metadata)
        logits = model.compute_logits(hidden)
        draft_positions = context_lens.long() + 1  # draft 0 is the token after the newest one
        if model.markov_head is None:
            tokens, probs, row_confidences = sample_plain_block(config, logits, draft_positions, sampling, k,
                                                            model.config.vocab_size)  # fmt: skip
            full = tokens
        else:
            full, probs, row_confidences = sample_markov_block(model, config, logits, hidden, next_token_ids,
                                                           draft_positions, sampling, k)  # fmt: skip
            tokens = full[:, :k]
        confidence = None
        if model.confidence_head is not None:
            prev = torch.cat([next_token_ids.long()[:, None], full[:, :-1].long()], dim=1)
            confidence = model.confidence_logits(hidden[:, :k], prev[:, :k])
        return BlockDraftOutput(tokens.to(torch.int32).contiguous(), probs, confidence, row_confidences)
