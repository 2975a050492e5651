"""Multi-token prediction heads (DeepSeek-V3's MTP, and several layers as in
MiMo / Step3.5)."""

from __future__ import annotations

import torch
from torch import nn

from specdraft.models.config import DraftModelConfig
from specdraft.models.heads.base import DraftHead
from specdraft.models.layers import DecoderLayer, RMSNorm
from specdraft.models.linear import Linear


class MTPLayer(DecoderLayer):
    """One DeepSeek-style MTP predictor: eh_proj([enorm(emb); hnorm(hidden)]) -> decoder
    layer; shared_head.norm (and shared_head.head when heads are per layer)."""

    def __init__(self, config: DraftModelConfig, own_head: bool) -> None:
        super().__init__(config)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = RMSNorm(h, eps)
        self.hnorm = RMSNorm(h, eps)
        self.eh_proj = Linear(2 * h, h, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(h, eps)
        self.shared_head.head = Linear(h, config.vocab_size, bias=False) if own_head else None

    def step_input(self, emb, hidden) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input, residual) of the embedding and the hidden state."""
        return self.attention_input(self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(hidden)], dim=-1)))


class MTPHead(DraftHead):
    """Multi-token prediction: n_predict = config.n_predict layers; draft step k runs
    layer k % n_predict (vLLM's rule) with kv_caches[k % n_predict]. n_predict = 1 is
    DeepSeek-V3's MTP. per_layer_lm_head=True gives each layer its own
    shared_head.head (Step3.5); otherwise one lm_head serves all layers.

    DeepSeek's MTP module returns one tensor (forward_hidden); forward returns it
    twice to fit the common interface. With config.hidden_feed "normed" (MiMo-style:
    the layer's final norm is part of the step) that tensor is shared_head.norm(h)
    and compute_logits applies only the head. Embeddings at position 0 are zeroed
    (mask_position_zero), as DeepSeek's MTP does, with torch.where instead of a
    boolean-mask write."""

    method = "mtp"

    def __init__(self, config: DraftModelConfig, per_layer_lm_head: bool = False, mask_position_zero: bool = True):
        super().__init__(config)
        self._refuse_config("norm_before_residual", "fc_norm", "norm_before_fc", "logits_norm")
        self.per_layer_lm_head = per_layer_lm_head
        self.mask_position_zero = mask_position_zero
        self.shares_lm_head_by_default = not per_layer_lm_head
        self.layers = nn.ModuleList([MTPLayer(config, per_layer_lm_head) for _ in range(config.n_predict)])
        self.lm_head = None if per_layer_lm_head else Linear(config.hidden_size, config.vocab_size, bias=False)
        self.to(config.dtype)

    @property
    def num_kv_layers(self) -> int:
        return self.config.n_predict

    @property
    def draft_loop(self) -> str:
        return "multi_layer" if self.config.n_predict > 1 else "eagle"

    def check_loop(self, loop: str) -> None:
        if loop == "eagle" and self.config.n_predict > 1:
            # In EAGLE's loop draft step k runs layer k % n_predict against that layer's own
            # KV cache, which the first pass (layer 0) never fills: there is no context a
            # training unroll could reproduce. Such heads draft with the multi-layer loop.
            raise ValueError(
                f"head is an MTPHead with n_predict = {self.config.n_predict}: use loop='multi_layer' "
                "(EAGLE's loop needs n_predict = 1)"
            )

    def _own_lm_heads(self) -> dict[str, nn.Linear]:
        return {} if self.per_layer_lm_head else {"lm_head": self.lm_head}

    def layer_index(self, spec_step_idx: int) -> int:
        if isinstance(spec_step_idx, bool) or not isinstance(spec_step_idx, int) or spec_step_idx < 0:
            raise ValueError(f"spec_step_idx must be a non-negative Python int, got {spec_step_idx!r}")
        return spec_step_idx % self.config.n_predict

    def kv_layer(self, step: int) -> int:
        return self.layer_index(step)

    def step_layer(self, step: int) -> DecoderLayer:
        return self.layers[self.layer_index(step)]

    def step_input(self, layer, emb, hidden, positions) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mask_position_zero:
            pos = positions if positions.dim() == 1 else positions[0]
            emb = torch.where((pos == 0)[:, None], 0, emb)
        return layer.step_input(emb, hidden)

    def step_outputs(self, layer, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = layer.shared_head.norm(h) if self.config.hidden_feed == "normed" else h
        return h, h

    def forward_hidden(
        self, input_ids, positions, hidden_states, attn_metadata, kv_caches, spec_step_idx: int = 0, inputs_embeds=None
    ) -> torch.Tensor:
        """The one tensor DeepSeek's MTP module returns."""
        return self(input_ids, positions, hidden_states, attn_metadata, kv_caches, spec_step_idx, inputs_embeds)[0]

    def compute_logits(self, hidden: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        self._check_ready()
        layer = self.layers[self.layer_index(spec_step_idx)]
        head = layer.shared_head.head if self.per_layer_lm_head else self.lm_head
        if self.config.hidden_feed == "normed":  # forward already normed it
            return head(hidden)
        return head(layer.shared_head.norm(hidden))
