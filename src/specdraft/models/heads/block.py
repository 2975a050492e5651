"""Block drafters: DFlash and DSpark (DeepSeek's DeepSpec names them so; DFlash is
DSpark without its two small heads).

A block drafter drafts a whole block of `block_size` tokens in one forward of a few
decoder layers. The block is the newest token (the target's own, not yet in any
cache) followed by block_size - 1 copies of `mask_token_id`, at consecutive
positions; the output at block row s predicts the token one position after it, so a
block gives block_size drafts. Inside the block attention is bidirectional; the
block also attends to the *context*: every earlier token, whose keys and values each
layer projects (its own k_proj / v_proj, k_norm and RoPE, no input norm) from the
target's features `hidden_norm(fc(aux))`, the aux layers concatenated. The context's
keys and values are what a serving proposer keeps in the paged KV cache; the block's
own are never cached.

DSpark adds
- a Markov head: a low-rank logit bias from the previous token (the block's first
  row: the newest token; then each drafted token), applied in order over the block
  (`vanilla`, `gated`, `rnn`; serving samples through ops.markov_block_sample, training
  reads the true previous tokens, `markov_bias`);
- a confidence head: a per-row survival logit from the final hidden state (and the
  previous token's Markov embedding with `confidence_with_markov`).

Parameter names follow DeepSpec's modules, so its checkpoints load by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from specdraft.models.config import DraftModelConfig
from specdraft.models.heads.base import DraftHead
from specdraft.models.layers import Attend, DecoderLayer, RMSNorm, TokenEmbedding
from specdraft.models.linear import Linear

MARKOV_KINDS = ("vanilla", "gated", "rnn")


@dataclass(frozen=True)
class BlockConfig:
    """What a block drafter adds to its backbone's DraftModelConfig.

    target_layer_ids: the target layers whose outputs the drafter reads, DeepSpec's
    numbering (layer L's output; -1 the embeddings), strictly increasing, never the
    target's last layer (its output is the final norm's input, which no aux capture
    returns). num_target_layers: the target's depth. markov_rank 0 means no Markov
    head (markov_head_type then None); confidence_with_markov feeds the confidence
    head the previous token's Markov embedding too (needs a Markov head)."""

    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    markov_rank: int = 0
    markov_head_type: str | None = None
    confidence_head: bool = False
    confidence_with_markov: bool = False

    def __post_init__(self) -> None:
        for name in ("block_size", "num_target_layers"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.mask_token_id, bool) or not isinstance(self.mask_token_id, int) or self.mask_token_id < 0:
            raise ValueError(f"mask_token_id must be a non-negative int, got {self.mask_token_id!r}")
        if not isinstance(self.target_layer_ids, Sequence) or isinstance(self.target_layer_ids, str):
            raise ValueError(f"target_layer_ids must be a non-empty sequence of ints, got {self.target_layer_ids!r}")
        ids = tuple(self.target_layer_ids)
        if not ids or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise ValueError(f"target_layer_ids must be a non-empty sequence of ints, got {self.target_layer_ids!r}")
        last = self.num_target_layers - 1
        for i in ids:
            if i != -1 and not 0 <= i < last:
                raise ValueError(
                    f"target_layer_ids: {i} is outside {{-1}} U [0, {last - 1}] for a {self.num_target_layers}-layer "
                    "target (-1 is the embeddings; the last layer's output is not an aux state)"
                )
        if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
            raise ValueError(f"target_layer_ids must be strictly increasing, got {ids}")
        object.__setattr__(self, "target_layer_ids", ids)
        if isinstance(self.markov_rank, bool) or not isinstance(self.markov_rank, int) or self.markov_rank < 0:
            raise ValueError(f"markov_rank must be a non-negative int, got {self.markov_rank!r}")
        if self.markov_rank and self.markov_head_type not in MARKOV_KINDS:
            raise ValueError(f"markov_head_type must be one of {MARKOV_KINDS} with markov_rank > 0, "
                             f"got {self.markov_head_type!r}")  # fmt: skip
        if not self.markov_rank and self.markov_head_type is not None:
            raise ValueError(f"markov_head_type: {self.markov_head_type!r} given with markov_rank 0 (no Markov head)")
        for name in ("confidence_head", "confidence_with_markov"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.confidence_with_markov and not (self.confidence_head and self.markov_rank):
            raise ValueError("confidence_with_markov: needs a confidence head and a Markov head (markov_rank > 0)")

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """The target's aux layers to capture, in specdraft's convention (the residual
        stream *entering* layer i, models.target): DeepSpec's layer L output enters
        layer L + 1, its -1 (the embeddings) enters layer 0."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @property
    def kind(self) -> str:
        """ "dspark" with a Markov or confidence head, else "dflash"."""
        return "dspark" if self.markov_rank or self.confidence_head else "dflash"


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class MarkovHead(nn.Module):
    """DSpark's low-rank Markov head: e = markov_w1[previous token] ([r]), then
    - vanilla: bias = markov_w2(e);
    - gated:   bias = markov_w2(sigmoid(gate_proj([h; e])) * e);
    - rnn:     (g, c, o) = joint_proj([state; e; h]); state = sigmoid(g) * state +
               (1 - sigmoid(g)) * tanh(c); bias = markov_w2(tanh(o)), state 0 at the
               block's start,
    h the block row's final hidden state."""

    def __init__(self, kind: str, vocab_size: int, rank: int, hidden_size: int) -> None:
        super().__init__()
        self.kind, self.rank = kind, rank
        self.markov_w1 = TokenEmbedding(vocab_size, rank)
        self.markov_w2 = Linear(rank, vocab_size, bias=False)
        if kind == "gated":
            self.gate_proj = Linear(hidden_size + rank, rank)
        if kind == "rnn":
            self.joint_proj = Linear(2 * rank + hidden_size, 3 * rank)

    def prev_embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(token_ids.long())

    def latents(self, prev_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """[..., S, r]: what markov_w2 reads at each block row, given each row's true
        previous token (prev_tokens [..., S]) and hidden [..., S, H]."""
        if self.kind != "rnn":  # memoryless: every row at once
            return self.latent_step(prev_tokens, hidden, None)[0]
        state, outs = None, []
        for s in range(prev_tokens.shape[-1]):
            latent, state = self.latent_step(prev_tokens[..., s], hidden[..., s, :], state)
            outs.append(latent)
        return torch.stack(outs, dim=-2)

    def latent_step(self, prev_tokens: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None):
        """(latent [..., r], state after it) of block rows given each row's previous
        token [...], its hidden [..., H] and, for `rnn`, the state before it (None at
        the block's start: zeros). The state is None for the memoryless kinds. A
        drafting loop calls it row by row with the tokens it drafted (the training
        evaluation's greedy chain)."""
        e = self.prev_embeddings(prev_tokens).to(hidden.dtype)
        if self.kind == "vanilla":
            return e, None
        if self.kind == "gated":
            return torch.sigmoid(self.gate_proj(torch.cat([hidden, e], dim=-1))) * e, None
        state = e.new_zeros(e.shape[:-1] + (self.rank,)) if state is None else state
        gate, cand, out = self.joint_proj(torch.cat([state, e, hidden], dim=-1)).chunk(3, -1)
        gate = torch.sigmoid(gate)
        return torch.tanh(out), gate * state + (1 - gate) * torch.tanh(cand)

    def bias(self, prev_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """[..., S, V]: the logit bias of every block row (teacher forced)."""
        return self.markov_w2(self.latents(prev_tokens, hidden))


class ConfidenceHead(nn.Module):
    """DSpark's confidence head (DeepSpec's AcceptRatePredictor): one linear map of a
    row's features to a survival logit."""

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.proj = Linear(input_size, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1).float()


# attend_for_layer(i) -> the attention of decoder layer i over (context, block).
AttendForLayer = Callable[[int], Attend]


class BlockDraftHead(DraftHead):
    """A DFlash / DSpark drafter on a Llama or Qwen3 backbone (config.qk_norm):
    config.num_layers decoder layers, fc ([T, len(target_layer_ids) *
    target_hidden_size] -> [T, H]), hidden_norm, final norm, lm_head (usually the
    target's: `share_from`), the optional Markov and confidence heads.

    The forward of a block is `block_hidden(input_ids, positions, attend_for_layer)`;
    the caller passes each layer's attention over the context and the block (the
    serving proposer: paged context + the block; training: one masked attention over
    a packed sequence), and computes the context's keys and values with
    `context_kv`."""

    method = "block"
    hidden_width_note = "len(target_layer_ids) x target_hidden_size: the aux layers concatenated"

    def __init__(self, config: DraftModelConfig, block: BlockConfig) -> None:
        super().__init__(config)
        if not isinstance(block, BlockConfig):
            raise ValueError(f"block must be a BlockConfig, got {type(block).__name__}")
        if block.mask_token_id >= config.vocab_size:
            raise ValueError(
                f"mask_token_id = {block.mask_token_id} is outside the vocabulary [0, {config.vocab_size})"
            )
        if config.draft_vocab_size != config.vocab_size:
            raise ValueError("draft_vocab_size: block drafters draft over the target's vocabulary")
        if config.mrope_section is not None:
            raise ValueError("mrope_section: block drafters take 1-D positions (no M-RoPE)")
        self.block = block
        h = config.hidden_size
        self.layers = nn.ModuleList([self.build_layer(config) for _ in range(config.num_layers)])
        self.norm = self.build_norm(h)
        self.fc = Linear(len(block.target_layer_ids) * config.target_hidden_size, h, bias=False)
        self.hidden_norm = self.build_norm(h)
        self.lm_head = Linear(h, config.vocab_size, bias=False)
        self.markov_head = (
            MarkovHead(block.markov_head_type, config.vocab_size, block.markov_rank, h) if block.markov_rank else None
        )
        width = h + (block.markov_rank if block.confidence_with_markov else 0)
        self.confidence_head = ConfidenceHead(width) if block.confidence_head else None
        self.to(config.dtype)

    # ------------------------------------------------------------------ backbone

    def build_layer(self, config: DraftModelConfig) -> nn.Module:
        """One decoder layer of the backbone: forward(positions, x, attend) and
        self_attn.project_kv(positions, x) (a Gemma4 head builds its own)."""
        return DecoderLayer(config)

    def build_norm(self, size: int) -> nn.Module:
        """The backbone's RMSNorm (final norm, hidden_norm)."""
        return RMSNorm(size, self.config.rms_norm_eps)

    # ------------------------------------------------------------------ identity

    def aux_layers_for(self, num_target_layers: int, requested=None) -> tuple[int, ...]:
        """The aux layers its target_layer_ids name (BlockConfig.aux_layers), for a
        target as deep as the one it was built for; requested ones must be those."""
        block = self.block
        if block.num_target_layers != num_target_layers:
            raise ValueError(
                f"proposer: the block head was built for a {block.num_target_layers}-layer target "
                f"(BlockConfig.num_target_layers); this target has {num_target_layers} layers"
            )
        if requested is not None and tuple(requested) != block.aux_layers:
            raise ValueError(
                f"aux_layers: {tuple(requested)} differs from the block head's, {block.aux_layers} (its "
                f"target_layer_ids {block.target_layer_ids}: layer L's output enters layer L + 1)"
            )
        return block.aux_layers

    @property
    def num_kv_layers(self) -> int:
        return self.config.num_layers

    @property
    def draft_loop(self) -> str:
        return "block"

    @property
    def block_size(self) -> int:
        return self.block.block_size

    @property
    def hidden_width(self) -> int:
        return len(self.block.target_layer_ids) * self.config.target_hidden_size

    @property
    def reads_aux_hidden_states(self) -> bool:
        return True

    @property
    def attention_scale(self) -> float:
        return self.config.head_dim**-0.5

    def check_loop(self, loop: str) -> None:
        if loop != "block":
            raise ValueError(f"head: a {type(self).__name__} drafts whole blocks (loop 'block'), not {loop!r}")

    def forward(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} has no single-token step: use block_hidden (proposers.block)")

    # ------------------------------------------------------------------- context

    def project_context(self, aux_hidden_states: torch.Tensor) -> torch.Tensor:
        """[T, H]: the context features every layer projects keys and values from,
        hidden_norm(fc(aux)) of the target's aux states [T, hidden_width]."""
        return self.hidden_norm(self.fc(aux_hidden_states.to(self.fc.weight.dtype)))

    combine_hidden_states = project_context

    def context_kv(self, layer: int, positions: torch.Tensor, context: torch.Tensor):
        """(k, v) [T, kv_heads, D] of layer `layer` for context rows at `positions`."""
        return self.layers[layer].self_attn.project_kv(positions, context)

    # --------------------------------------------------------------------- block

    def block_input_ids(self, newest_tokens: torch.Tensor) -> torch.Tensor:
        """[B, block_size] int64: each request's newest token, then mask tokens."""
        ids = torch.full((newest_tokens.shape[0], self.block_size), self.block.mask_token_id,
                         dtype=torch.int64, device=newest_tokens.device)  # fmt: skip
        ids[:, 0] = newest_tokens.long()
        return ids

    def block_hidden(self, input_ids, positions, attend_for_layer: AttendForLayer, inputs_embeds=None) -> torch.Tensor:
        """The final-normed hidden states [N, H] of the block rows fed (input_ids [N],
        positions [N]), layer i attending with attend_for_layer(i)."""
        self._check_ready()
        x = self._embed(input_ids, inputs_embeds)
        for i, layer in enumerate(self.layers):
            x = layer(positions, x, attend_for_layer(i))
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        self._check_ready()
        return self.lm_head(hidden)

    def markov_bias(self, prev_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
        """[..., S, V] Markov bias of block rows given their true previous tokens
        (training, evaluation); None without a Markov head."""
        return None if self.markov_head is None else self.markov_head.bias(prev_tokens, hidden)

    def confidence_logits(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor | None:
        """[...] fp32 survival logits of block rows (hidden [..., H], each row's previous
        token [...]); None without a confidence head."""
        if self.confidence_head is None:
            return None
        features = hidden
        if self.block.confidence_with_markov:
            e = self.markov_head.prev_embeddings(prev_tokens).to(hidden.dtype)
            features = torch.cat([hidden, e], dim=-1)
        return self.confidence_head(features)
