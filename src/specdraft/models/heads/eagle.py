"""EAGLE-1 and EAGLE-3 heads: one decoder layer over the token's embedding and the
previous hidden state."""

from __future__ import annotations

import torch
from torch import nn

from specdraft.models.config import DraftModelConfig
from specdraft.models.heads.base import DraftHead
from specdraft.models.layers import DecoderLayer, RMSNorm
from specdraft.models.linear import Linear


class EagleHead(DraftHead):
    """EAGLE-1: h = fc([embed(ids); hidden]) -> one decoder layer (no input norm by
    default, as published) -> optional final norm. Returns (norm(h) or h, h), or
    (norm(h), norm(h)) when config.hidden_feed == "normed"."""

    method = "eagle"

    def __init__(
        self, config: DraftModelConfig, fc_bias: bool = False, input_norm: bool = False, final_norm: bool = True
    ) -> None:
        super().__init__(config)
        self._refuse_config("norm_before_residual", "fc_norm", "norm_before_fc", "logits_norm")
        self._refuse_depth()
        if config.hidden_feed == "normed" and not final_norm:
            raise ValueError("hidden_feed: 'normed' needs the final norm, and this EAGLE head has none")
        h = config.hidden_size
        self.fc = Linear(2 * h, h, bias=fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(config, input_norm=input_norm)])
        self.norm = RMSNorm(h, config.rms_norm_eps) if final_norm else None
        self.lm_head = Linear(h, config.vocab_size, bias=False)
        self.to(config.dtype)

    @property
    def num_kv_layers(self) -> int:
        return 1

    def step_layer(self, step: int) -> DecoderLayer:
        return self.layers[0]

    def step_input(self, layer, emb, hidden, positions) -> tuple[torch.Tensor, torch.Tensor]:
        return layer.attention_input(self.fc(torch.cat([emb, hidden], dim=-1)))

    def compute_logits(self, hidden: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        self._check_ready()
        return self.lm_head(hidden)


class Eagle3DecoderLayer(DecoderLayer):
    """EAGLE-3's midlayer: attention over [input_layernorm(emb); hidden_norm(hidden)]
    (width 2H), residual = hidden, or hidden_norm(hidden) with
    config.norm_before_residual (vLLM's and speculators' option)."""

    def __init__(self, config: DraftModelConfig) -> None:
        super().__init__(config, attn_input_size=2 * config.hidden_size)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm_before_residual = config.norm_before_residual

    def step_input(self, emb, hidden) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input, residual) of the embedding and the hidden state."""
        normed_hidden = self.hidden_norm(hidden)
        attn_input = torch.cat([self.input_layernorm(emb), normed_hidden], dim=-1)
        return attn_input, (normed_hidden if self.norm_before_residual else hidden)

    def forward(self, positions, emb, hidden, attend) -> torch.Tensor:
        attn_input, residual = self.step_input(emb, hidden)
        return self.attend_and_mlp(positions, attn_input, residual, attend)


class Eagle3Head(DraftHead):
    """EAGLE-3: fuses three target layers' hidden states (fc: [T, 3 * target_hidden]
    -> [T, H], after fc_norm / input_norm when configured), one midlayer, final norm,
    lm_head over the draft vocabulary; draft id d maps to target id d + d2t[d].
    Returns (norm(h), h); (h, h) with config.logits_norm False (SpecForge's
    norm_output: false: norm.weight is still loaded, unused); (norm(h), norm(h)) with
    config.hidden_feed "normed"."""

    shares_lm_head_by_default = False
    method = "eagle3"
    hidden_width_note = "3 x target_hidden_size: EAGLE-3 fuses three aux layers"

    def __init__(self, config: DraftModelConfig) -> None:
        super().__init__(config)
        self._refuse_depth()
        h, dv, th = config.hidden_size, config.draft_vocab_size, config.target_hidden_size
        eps = config.rms_norm_eps
        # SpecForge / speculators EAGLE-3.1: one norm per aux layer; speculators'
        # norm_before_fc: one norm over the concatenation (its checkpoint name).
        self.fc_norm = nn.ModuleList([RMSNorm(th, eps) for _ in range(3)]) if config.fc_norm else None
        self.input_norm = RMSNorm(3 * th, eps) if config.norm_before_fc else None
        self.fc = Linear(3 * th, h, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = Linear(h, dv, bias=False)
        self.register_buffer("d2t", torch.zeros(dv, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool) if dv == config.vocab_size
                             else torch.zeros(config.vocab_size, dtype=torch.bool))  # fmt: skip
        self.to(config.dtype)

    @property
    def num_kv_layers(self) -> int:
        return 1

    @property
    def hidden_width(self) -> int:
        return 3 * self.config.target_hidden_size

    @property
    def reads_aux_hidden_states(self) -> bool:
        return True

    @property
    def draft_vocab_size(self) -> int:
        return self.config.draft_vocab_size

    @property
    def vocab_map(self) -> torch.Tensor | None:
        return self.d2t if self.config.draft_vocab_size != self.config.vocab_size else None

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[T, 3 * target_hidden] (aux layers concatenated) -> [T, H]."""
        x = hidden_states.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:
            x = torch.cat([norm(part) for norm, part in zip(self.fc_norm, x.chunk(3, dim=-1), strict=True)], dim=-1)
        return self.fc(x)

    def step_layer(self, step: int) -> DecoderLayer:
        return self.midlayer

    def step_hidden(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # The first step may pass the raw aux states (a static shape test, as vLLM does).
        if hidden_states.shape[-1] != self.config.hidden_size:
            return self.combine_hidden_states(hidden_states)
        return hidden_states

    def step_input(self, layer, emb, hidden, positions) -> tuple[torch.Tensor, torch.Tensor]:
        return layer.step_input(emb, hidden)

    def draft_logits(self, hidden: torch.Tensor, step: int) -> torch.Tensor:
        return self.compute_draft_logits(hidden)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        draft_ids = draft_ids.to(torch.int64)
        return draft_ids if self.vocab_map is None else self.map_draft_to_target(draft_ids)

    def compute_draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, draft_vocab_size] logits over the draft vocabulary."""
        return self.lm_head(hidden)

    def draft_token_target_ids(self) -> torch.Tensor:
        """[draft_vocab_size] int64: the target id of every draft id."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def map_draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target ids of draft ids (same dtype as draft_ids)."""
        return (draft_ids.to(torch.int64) + self.d2t[draft_ids.to(torch.int64)]).to(draft_ids.dtype)

    def compute_logits(self, hidden: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        self._check_ready()
        draft = self.compute_draft_logits(hidden)
        if self.config.draft_vocab_size == self.config.vocab_size:
            return draft  # vLLM's convention: an equal-size draft vocabulary needs no map
        full = draft.new_full((draft.shape[0], self.config.vocab_size), float("-inf"))
        return full.index_copy(1, self.draft_token_target_ids(), draft)
