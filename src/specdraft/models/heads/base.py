"""DraftHead: the machinery every draft head shares (embedding, KV caches, weight
sharing), its one draft step (`step`, with the attention passed in), the pieces
that step is built from, and `forward`, the step over the paged KV cache (see
specdraft.models.heads)."""

from __future__ import annotations

import torch
from torch import nn

from specdraft.models.cache_attention import cache_attention, metadata_for_layer
from specdraft.models.config import DraftModelConfig
from specdraft.models.kv_cache import allocate_kv_caches, kv_cache_shape
from specdraft.models.layers import Attend, DecoderLayer, TokenEmbedding


class DraftHead(nn.Module):
    """Shared machinery (embedding, KV-cache allocation, weight sharing) and the one
    draft step every head runs, `step(..., attend)`, from pieces each head kind
    defines:

        layer = step_layer(step)                    the decoder layer of draft step `step`
        attn_input, residual = step_input(layer, embed(ids), step_hidden(hidden), positions)
        h = layer.attend_and_mlp(positions, attn_input, residual, attend)
        hidden_for_sampling, hidden_for_next = step_outputs(layer, h)
        draft_logits(hidden, step), draft_to_target(ids)

    The attention is the caller's: `forward` passes paged attention over
    kv_caches[kv_layer(step)] (serving), the training unroll its chain attention,
    the tree drafter its prefix + tree-buffer attention.

    `method` is the config.method a proposer pairs the head with, `draft_loop` the
    proposer loop it drafts with ("eagle", or "multi_layer" for MTP heads with
    several layers)."""

    shares_lm_head_by_default = True
    method: str = ""
    hidden_width_note = "the head's hidden_size"

    def __init__(self, config: DraftModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = TokenEmbedding(config.vocab_size, config.hidden_size)
        # Names of weights neither loaded nor shared yet (set by the loader when a
        # checkpoint relies on the target's embedding / lm_head).
        self.missing_weights: frozenset[str] = frozenset()

    @property
    def num_kv_layers(self) -> int:
        raise NotImplementedError

    # ------------------------------------------------------------- the step's pieces

    @property
    def draft_loop(self) -> str:
        return "eagle"

    @property
    def hidden_width(self) -> int:
        """Width of the target hidden states the head reads."""
        return self.config.hidden_size

    @property
    def reads_aux_hidden_states(self) -> bool:
        """Whether the head reads the target's aux layers' hidden states (EAGLE-3),
        rather than its final hidden state."""
        return False

    def aux_layers_for(self, num_target_layers: int, requested=None) -> tuple[int, ...] | None:
        """The target layers whose entering residual this head reads, when the head
        names them itself (a block drafter's target_layer_ids); None when the caller
        chooses (requested, or EAGLE-3's default: models.default_aux_layers). A head
        that names them raises ValueError for a target it was not built for, or for
        requested layers (not None) other than its own."""
        return None

    @property
    def draft_vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def vocab_map(self) -> torch.Tensor | None:
        """d2t when the head drafts over a smaller vocabulary than the target's (draft id
        i is target id i + d2t[i]); None when its logits are over the target's."""
        return None

    def check_loop(self, loop: str) -> None:
        """A ValueError naming `head` when the head cannot draft with `loop`."""
        if loop == "multi_layer":
            raise ValueError(f"head must be an MTPHead for loop='multi_layer', got {type(self).__name__}")

    def kv_layer(self, step: int) -> int:
        """The KV cache (and layer) index of draft step `step`."""
        return 0

    def step_layer(self, step: int) -> DecoderLayer:
        raise NotImplementedError

    def step_hidden(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The hidden states a step reads, from what the caller passed."""
        return hidden_states

    def step_input(self, layer, emb, hidden, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input, residual) of one step's rows."""
        raise NotImplementedError

    def step_outputs(self, layer, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden for sampling, hidden for the next step) of the layer's output: the
        final norm's output and the pre-norm stream, or the norm's output twice with
        config.hidden_feed "normed"; (h, h) without a final norm."""
        if self.norm is None or not self.config.logits_norm:
            return h, h
        normed = self.norm(h)
        return normed, (normed if self.config.hidden_feed == "normed" else h)

    def draft_logits(self, hidden: torch.Tensor, step: int) -> torch.Tensor:
        """Logits over the head's draft vocabulary (draft_vocab_size wide)."""
        return self.compute_logits(hidden, spec_step_idx=step)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """int64 target-vocabulary ids of draft-vocabulary ids."""
        return draft_ids.to(torch.int64)

    def step(
        self, input_ids, positions, hidden_states, step: int, attend: Attend, inputs_embeds=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft step `step` of the rows fed (input_ids [T], positions [T] or [3, T],
        hidden_states [T, Hin]) with the attention `attend(q, k, v) -> [T, heads, D]`
        (models.layers). Returns (hidden for sampling, hidden for the next step)."""
        layer = self.step_layer(step)
        emb = self._embed(input_ids, inputs_embeds)
        attn_input, residual = self.step_input(layer, emb, self.step_hidden(hidden_states).to(emb.dtype), positions)
        return self.step_outputs(layer, layer.attend_and_mlp(positions, attn_input, residual, attend))

    def forward(
        self, input_ids, positions, hidden_states, attn_metadata, kv_caches, spec_step_idx: int = 0, inputs_embeds=None
    ):
        self._check_ready()
        i = self.kv_layer(spec_step_idx)
        attend = cache_attention(kv_caches[i], metadata_for_layer(attn_metadata, i))
        return self.step(input_ids, positions, hidden_states, spec_step_idx, attend, inputs_embeds)

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

    def _refuse_depth(self) -> None:
        """EAGLE heads have one decoder layer; config.num_layers is the tiny target's
        depth. A head built from a deeper config would save num_hidden_layers that its
        loader refuses, and would silently be one layer: refused here instead."""
        if self.config.num_layers != 1:
            raise ValueError(
                f"num_layers: {type(self).__name__} has one decoder layer, got num_layers = "
                f"{self.config.num_layers} (num_layers is the tiny target's depth)"
            )

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
