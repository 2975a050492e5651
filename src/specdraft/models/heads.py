"""Reference draft heads behind one interface the proposers call.

Every head (EagleHead, Eagle3Head, MTPHead) implements::

    forward(input_ids [T] int, positions [T] or [3, T] int64, hidden_states [T, Hin],
            attn_metadata, kv_caches, spec_step_idx: int = 0, inputs_embeds=None)
        -> (hidden_for_sampling [T, H], hidden_for_next_step [T, H])
    compute_logits(hidden [N, H], spec_step_idx: int = 0) -> [N, vocab_size]

- hidden_for_sampling goes to compute_logits; hidden_for_next_step is what the next
  draft step receives as `hidden_states`: the pre-norm residual stream, or the final
  norm's output when config.hidden_feed == "normed" (see DraftModelConfig).
- compute_logits always returns logits over the *target* vocabulary, so proposers
  sample the same way for every head (EAGLE-3 places its draft-vocabulary logits at
  their target ids and puts -inf elsewhere; the cheaper path is
  compute_draft_logits + map_draft_to_target).
- attn_metadata: a BatchMetadata (or any object with its attributes), or a
  list / tuple of them indexed by layer (several KV-cache groups, Step3.5-style).
- kv_caches: one [2, num_blocks, block_size, kv_heads, head_dim] tensor per layer
  (`num_kv_layers` of them; allocate_kv_caches makes them). Layer i writes kv_caches[i].
- spec_step_idx is a Python int (static per compiled call); only MTPHead uses it.
- combine_hidden_states(h) maps target hidden states to the head's input width
  (EAGLE-3's fusion of three aux layers; identity for the others).
- share_from(target) reuses the target's embed_tokens / lm_head modules.
"""

from __future__ import annotations

import torch
from torch import nn

from specdraft.models.config import DraftModelConfig
from specdraft.models.kv_cache import allocate_kv_caches, kv_cache_shape
from specdraft.models.layers import DecoderLayer, RMSNorm


def metadata_for_layer(attn_metadata, layer: int):
    if isinstance(attn_metadata, list | tuple):
        return attn_metadata[layer]
    return attn_metadata


class DraftHead(nn.Module):
    """Shared machinery: embedding, KV-cache allocation, weight sharing."""

    shares_lm_head_by_default = True

    def __init__(self, config: DraftModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        # Names of weights neither loaded nor shared yet (set by the loader when a
        # checkpoint relies on the target's embedding / lm_head).
        self.missing_weights: frozenset[str] = frozenset()

    @property
    def num_kv_layers(self) -> int:
        raise NotImplementedError

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return kv_cache_shape(num_blocks, block_size, self.config.num_kv_heads, self.config.head_dim)

    def allocate_kv_caches(self, num_blocks: int, block_size: int, device=None, dtype=None) -> list[torch.Tensor]:
        """Zeroed caches, one per draft layer; device and dtype default to the head's
        weights' (so a head moved with .to() gets matching caches)."""
        weight = self.embed_tokens.weight
        dtype = weight.dtype if dtype is None else dtype
        device = weight.device if device is None else device
        c = self.config
        return allocate_kv_caches(self.num_kv_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, dtype, device)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states

    def _refuse_config(self, *names: str) -> None:
        """A config variant this head has no place for is an error, not ignored."""
        defaults = {"norm_before_residual": False, "fc_norm": False, "norm_before_fc": False, "logits_norm": True}
        for name in names:
            if getattr(self.config, name) != defaults[name]:
                raise ValueError(f"{name}: {type(self).__name__} has no such variant (it is EAGLE-3's)")

    def _check_ready(self) -> None:
        # A Python-level check: free at run time, a constant under torch.compile.
        if self.missing_weights:
            raise RuntimeError(
                f"{type(self).__name__} has no {', '.join(sorted(self.missing_weights))}: the checkpoint "
                "did not include them; call share_from(target) first"
            )

    def _embed(self, input_ids, inputs_embeds):
        return self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds

    def _own_lm_heads(self) -> dict[str, nn.Linear]:
        """The lm_head module(s) share_from may replace, by attribute path."""
        return {"lm_head": self.lm_head}

    def share_from(self, target: nn.Module, embedding: bool = True, lm_head: bool | None = None) -> None:
        """Reuse target.embed_tokens (and target.lm_head) when shapes and dtypes match;
        ValueError naming the module otherwise. lm_head=None means this head's
        default: True for EAGLE / MTP with one shared head, False for EAGLE-3 (its
        head is over the draft vocabulary) and for per-layer MTP heads."""
        lm_head = self.shares_lm_head_by_default if lm_head is None else lm_head
        missing = set(self.missing_weights)
        if embedding:
            check_shareable("embed_tokens", self.embed_tokens.weight, getattr(target, "embed_tokens", None))
            self.embed_tokens = target.embed_tokens
            missing.discard("embed_tokens")
        if lm_head:
            heads = self._own_lm_heads()
            if not heads:
                raise ValueError(f"lm_head: {type(self).__name__} has per-layer heads; they are not shared")
            for path, module in heads.items():
                check_shareable("lm_head", module.weight, getattr(target, "lm_head", None))
                _set_path(self, path, target.lm_head)
            missing.discard("lm_head")
        self.missing_weights = frozenset(missing)


def check_shareable(name: str, own: torch.Tensor, theirs: nn.Module | None) -> None:
    """`theirs` (a target module) can stand in for the weight `own`: same shape and
    dtype. A ValueError naming the weight otherwise."""
    if theirs is None or not isinstance(getattr(theirs, "weight", None), torch.Tensor):
        raise ValueError(f"{name}: the target has no {name} module with a weight")
    if theirs.weight.shape != own.shape:
        raise ValueError(
            f"{name}: shapes differ (draft {tuple(own.shape)}, target {tuple(theirs.weight.shape)}); cannot share"
        )
    if theirs.weight.dtype != own.dtype:
        raise ValueError(f"{name}: dtypes differ (draft {own.dtype}, target {theirs.weight.dtype}); cannot share")


def _set_path(root: nn.Module, path: str, module: nn.Module) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        root = getattr(root, p)
    setattr(root, leaf, module)


class EagleHead(DraftHead):
    """EAGLE-1: h = fc([embed(ids); hidden]) -> one decoder layer (no input norm by
    default, as published) -> optional final norm. Returns (norm(h) or h, h), or
    (norm(h), norm(h)) when config.hidden_feed == "normed"."""

    def __init__(
        self, config: DraftModelConfig, fc_bias: bool = False, input_norm: bool = False, final_norm: bool = True
    ) -> None:
        super().__init__(config)
        self._refuse_config("norm_before_residual", "fc_norm", "norm_before_fc", "logits_norm")
        if config.hidden_feed == "normed" and not final_norm:
            raise ValueError("hidden_feed: 'normed' needs the final norm, and this EAGLE head has none")
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(config, input_norm=input_norm)])
        self.norm = RMSNorm(h, config.rms_norm_eps) if final_norm else None
        self.lm_head = nn.Linear(h, config.vocab_size, bias=False)
        self.to(config.dtype)

    @property
    def num_kv_layers(self) -> int:
        return 1

    def forward(
        self, input_ids, positions, hidden_states, attn_metadata, kv_caches, spec_step_idx: int = 0, inputs_embeds=None
    ):
        self._check_ready()
        emb = self._embed(input_ids, inputs_embeds)
        h = self.fc(torch.cat([emb, hidden_states.to(emb.dtype)], dim=-1))
        h = self.layers[0](positions, h, kv_caches[0], metadata_for_layer(attn_metadata, 0))
        if self.norm is None:
            return h, h
        normed = self.norm(h)
        return normed, (normed if self.config.hidden_feed == "normed" else h)

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

    def forward(self, positions, emb, hidden, kv_cache, attn_metadata) -> torch.Tensor:
        normed_hidden = self.hidden_norm(hidden)
        attn_input = torch.cat([self.input_layernorm(emb), normed_hidden], dim=-1)
        residual = normed_hidden if self.norm_before_residual else hidden
        return self.attend_and_mlp(positions, attn_input, residual, kv_cache, attn_metadata)


class Eagle3Head(DraftHead):
    """EAGLE-3: fuses three target layers' hidden states (fc: [T, 3 * target_hidden]
    -> [T, H], after fc_norm / input_norm when configured), one midlayer, final norm,
    lm_head over the draft vocabulary; draft id d maps to target id d + d2t[d].
    Returns (norm(h), h); (h, h) with config.logits_norm False (SpecForge's
    norm_output: false: norm.weight is still loaded, unused); (norm(h), norm(h)) with
    config.hidden_feed "normed"."""

    shares_lm_head_by_default = False

    def __init__(self, config: DraftModelConfig) -> None:
        super().__init__(config)
        h, dv, th = config.hidden_size, config.draft_vocab_size, config.target_hidden_size
        eps = config.rms_norm_eps
        # SpecForge / speculators EAGLE-3.1: one norm per aux layer; speculators'
        # norm_before_fc: one norm over the concatenation (its checkpoint name).
        self.fc_norm = nn.ModuleList([RMSNorm(th, eps) for _ in range(3)]) if config.fc_norm else None
        self.input_norm = RMSNorm(3 * th, eps) if config.norm_before_fc else None
        self.fc = nn.Linear(3 * th, h, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, dv, bias=False)
        self.register_buffer("d2t", torch.zeros(dv, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool) if dv == config.vocab_size
                             else torch.zeros(config.vocab_size, dtype=torch.bool))  # fmt: skip
        self.to(config.dtype)

    @property
    def num_kv_layers(self) -> int:
        return 1

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[T, 3 * target_hidden] (aux layers concatenated) -> [T, H]."""
        x = hidden_states.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:
            x = torch.cat([norm(part) for norm, part in zip(self.fc_norm, x.chunk(3, dim=-1), strict=True)], dim=-1)
        return self.fc(x)

    def forward(
        self, input_ids, positions, hidden_states, attn_metadata, kv_caches, spec_step_idx: int = 0, inputs_embeds=None
    ):
        self._check_ready()
        emb = self._embed(input_ids, inputs_embeds)
        # The first step may pass the raw aux states (a static shape test, as vLLM does).
        if hidden_states.shape[-1] != self.config.hidden_size:
            hidden_states = self.combine_hidden_states(hidden_states)
        h = self.midlayer(
            positions, emb, hidden_states.to(emb.dtype), kv_caches[0], metadata_for_layer(attn_metadata, 0)
        )
        if not self.config.logits_norm:
            return h, h
        normed = self.norm(h)
        return normed, (normed if self.config.hidden_feed == "normed" else h)

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


class MTPLayer(DecoderLayer):
    """One DeepSeek-style MTP predictor: eh_proj([enorm(emb); hnorm(hidden)]) -> decoder
    layer; shared_head.norm (and shared_head.head when heads are per layer)."""

    def __init__(self, config: DraftModelConfig, own_head: bool) -> None:
        super().__init__(config)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = RMSNorm(h, eps)
        self.hnorm = RMSNorm(h, eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(h, eps)
        self.shared_head.head = nn.Linear(h, config.vocab_size, bias=False) if own_head else None

    def predict(self, positions, emb, hidden, kv_cache, attn_metadata) -> torch.Tensor:
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(hidden)], dim=-1))
        return self(positions, x, kv_cache, attn_metadata)


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

    def __init__(self, config: DraftModelConfig, per_layer_lm_head: bool = False, mask_position_zero: bool = True):
        super().__init__(config)
        self._refuse_config("norm_before_residual", "fc_norm", "norm_before_fc", "logits_norm")
        self.per_layer_lm_head = per_layer_lm_head
        self.mask_position_zero = mask_position_zero
        self.shares_lm_head_by_default = not per_layer_lm_head
        self.layers = nn.ModuleList([MTPLayer(config, per_layer_lm_head) for _ in range(config.n_predict)])
        self.lm_head = None if per_layer_lm_head else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.to(config.dtype)

    @property
    def num_kv_layers(self) -> int:
        return self.config.n_predict

    def _own_lm_heads(self) -> dict[str, nn.Linear]:
        return {} if self.per_layer_lm_head else {"lm_head": self.lm_head}

    def layer_index(self, spec_step_idx: int) -> int:
        if isinstance(spec_step_idx, bool) or not isinstance(spec_step_idx, int) or spec_step_idx < 0:
            raise ValueError(f"spec_step_idx must be a non-negative Python int, got {spec_step_idx!r}")
        return spec_step_idx % self.config.n_predict

    def forward_hidden(
        self, input_ids, positions, hidden_states, attn_metadata, kv_caches, spec_step_idx: int = 0, inputs_embeds=None
    ) -> torch.Tensor:
        self._check_ready()
        i = self.layer_index(spec_step_idx)
        emb = self._embed(input_ids, inputs_embeds)
        if self.mask_position_zero:
            pos = positions if positions.dim() == 1 else positions[0]
            emb = torch.where((pos == 0)[:, None], 0, emb)
        h = self.layers[i].predict(
            positions, emb, hidden_states.to(emb.dtype), kv_caches[i], metadata_for_layer(attn_metadata, i)
        )
        return self.layers[i].shared_head.norm(h) if self.config.hidden_feed == "normed" else h

    def forward(
        self, input_ids, positions, hidden_states, attn_metadata, kv_caches, spec_step_idx: int = 0, inputs_embeds=None
    ):
        h = self.forward_hidden(
            input_ids, positions, hidden_states, attn_metadata, kv_caches, spec_step_idx, inputs_embeds
        )
        return h, h

    def compute_logits(self, hidden: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        self._check_ready()
        layer = self.layers[self.layer_index(spec_step_idx)]
        head = layer.shared_head.head if self.per_layer_lm_head else self.lm_head
        if self.config.hidden_feed == "normed":  # forward already normed it
            return head(hidden)
        return head(layer.shared_head.norm(hidden))
