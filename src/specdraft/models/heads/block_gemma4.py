"""The Gemma4 backbone of a block drafter (DeepSpec's Gemma4DSparkModel; the block,
the context, the Markov and confidence heads are BlockDraftHead's,
specdraft.models.heads.block).

What differs from the Llama / Qwen3 backbone:

- RMSNorm scales by the plain weight w (not 1 + w), in float32, then casts back;
  the values' norm (v_norm) has no weight at all;
- the token embedding is multiplied by sqrt(hidden_size), rounded to the weight's
  dtype first;
- attention: per-head q_norm and k_norm, v = v_norm(v_proj(x)), or with
  attention_k_eq_v v = v_norm(k_proj(x)) (the raw key projection; there is no
  v_proj); proportional partial RoPE (the first partial_rotary_factor * head_dim / 2
  frequencies of theta ** (-2i / head_dim), the rest zero, NeoX half-split over the
  whole head_dim); attention scale 1.0 (the norms set the logits' size);
- MLP down(gelu_tanh(gate(x)) * up(x));
- sandwich norms: x + post_attention_layernorm(attn(input_layernorm(x))), then
  x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x))), and the
  layer's output times `layer_scalar` (a one-element buffer the checkpoint holds);
- optional final_logit_softcapping: logits = cap * tanh(logits / cap), before the
  Markov head's bias.

DraftModelConfig carries the shapes (num_kv_heads and head_dim are the full-attention
layers' global ones: num_global_key_value_heads with attention_k_eq_v, and
global_head_dim); Gemma4Settings the rest. Parameter names follow DeepSpec's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.models.config import DraftModelConfig
from specdraft.models.heads.block import BlockConfig, BlockDraftHead
from specdraft.models.layers import Attend
from specdraft.models.linear import Linear
from specdraft.models.regions import compile_region
from specdraft.models.rope import RotaryEmbedding, inverse_frequencies


@dataclass(frozen=True)
class Gemma4Settings:
    """The Gemma4 backbone's constants DraftModelConfig has no field for."""

    partial_rotary_factor: float = 0.25
    rope_factor: float = 1.0
    attention_k_eq_v: bool = False
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        p = self.partial_rotary_factor
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {p!r}")
        f = self.rope_factor
        if isinstance(f, bool) or not isinstance(f, int | float) or f <= 0:
            raise ValueError(f"rope_factor must be a positive number, got {f!r}")
        if not isinstance(self.attention_k_eq_v, bool):
            raise ValueError(f"attention_k_eq_v must be a bool, got {self.attention_k_eq_v!r}")
        cap = self.final_logit_softcapping
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | float) or cap <= 0):
            raise ValueError(f"final_logit_softcapping must be a positive number or None, got {cap!r}")


class GemmaRMSNorm(nn.Module):
    """x * (mean(x^2) + eps) ** -0.5 * w, all in float32, cast back to x's dtype;
    with_scale=False has no weight (Gemma4's v_norm)."""

    def __init__(self, size: int, eps: float, with_scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        # pow(., -0.5), not rsqrt: the op transformers' Gemma4RMSNorm uses.
        out = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            out = out * self.weight.float()
        return out.to(x.dtype)


class ProportionalRotaryEmbedding(RotaryEmbedding):
    """Gemma4's proportional RoPE: int(partial_rotary_factor * head_dim // 2)
    frequencies theta ** (-2i / head_dim) (the full head_dim in the exponent), the
    other head_dim / 2 - that many zero (those dims pass unrotated), all divided by
    factor; the rotation is the usual half-split over the whole head_dim."""

    def __init__(self, head_dim: int, theta: float, partial_rotary_factor: float, factor: float = 1.0) -> None:
        super().__init__(head_dim, theta)
        self.num_rotated = int(partial_rotary_factor * head_dim // 2)
        self.factor = float(factor)

    def inverse_frequencies(self, device: torch.device | str | None = None) -> torch.Tensor:
        inv = inverse_frequencies(self.head_dim, self.theta, device)
        keep = torch.arange(self.head_dim // 2, device=device) < self.num_rotated
        return torch.where(keep, inv, torch.zeros_like(inv)) / self.factor


class Gemma4Attention(nn.Module):
    """q / k / (v) / o projections (biases per config.attention_bias /
    o_proj_bias), q_norm, k_norm, the weightless v_norm, proportional RoPE; the
    attention itself is the caller's `attend` (scale 1.0: the head's
    attention_scale)."""

    def __init__(self, config: DraftModelConfig, gemma: Gemma4Settings) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = (
            None
            if gemma.attention_k_eq_v
            else Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        )
        self.o_proj = Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_proj_bias)
        self.q_norm = GemmaRMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(c.head_dim, c.rms_norm_eps)
        self.v_norm = GemmaRMSNorm(c.head_dim, c.rms_norm_eps, with_scale=False)
        self.rotary = ProportionalRotaryEmbedding(
            c.head_dim, c.rope_theta, gemma.partial_rotary_factor, gemma.rope_factor
        )

    def _kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) before RoPE: k_norm of the key projection, v_norm of the value
        projection (of the raw key projection with attention_k_eq_v)."""
        t = x.shape[0]
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = k if self.v_proj is None else self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        return self.k_norm(k), self.v_norm(v)

    def project(self, positions, x) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, heads, D], k and v [T, kv_heads, D] of rows x at `positions`."""
        q = self.q_norm(self.q_proj(x).view(x.shape[0], self.num_heads, self.head_dim))
        k, v = self._kv(x)
        q, k = self.rotary(positions, q, k)
        return q, k, v

    def project_kv(self, positions, x) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v [T, kv_heads, D] of rows that are keys only (the context)."""
        k, v = self._kv(x)
        return self.rotary.rotate(positions, k), v

    def output(self, attn_out: torch.Tensor) -> torch.Tensor:
        return self.o_proj(attn_out.reshape(attn_out.shape[0], self.num_heads * self.head_dim))


class GeluMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    @compile_region
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Gemma4DecoderLayer(nn.Module):
    """Gemma4's sandwich-norm layer; forward(positions, x, attend) as
    specdraft.models.layers.DecoderLayer's."""

    def __init__(self, config: DraftModelConfig, gemma: Gemma4Settings) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.self_attn = Gemma4Attention(config, gemma)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.mlp = GeluMLP(h, config.intermediate_size)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, positions, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        q, k, v = self.self_attn.project(positions, self.input_layernorm(x))
        x = x + self.post_attention_layernorm(self.self_attn.output(attend(q, k, v)))
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x * self.layer_scalar


class Gemma4BlockDraftHead(BlockDraftHead):
    """A DFlash / DSpark drafter on DeepSpec's Gemma4 backbone (see the module
    docstring); everything else is BlockDraftHead's."""

    def __init__(self, config: DraftModelConfig, block: BlockConfig, gemma: Gemma4Settings | None = None) -> None:
        gemma = Gemma4Settings() if gemma is None else gemma
        if not isinstance(gemma, Gemma4Settings):
            raise ValueError(f"gemma must be a Gemma4Settings, got {type(gemma).__name__}")
        # Set before BlockDraftHead.__init__, whose build_layer reads it (a plain
        # attribute: nn.Module accepts it before its own __init__).
        self.gemma = gemma
        super().__init__(config, block)

    def build_layer(self, config: DraftModelConfig) -> nn.Module:
        return Gemma4DecoderLayer(config, self.gemma)

    def build_norm(self, size: int) -> nn.Module:
        return GemmaRMSNorm(size, self.config.rms_norm_eps)

    @property
    def attention_scale(self) -> float:
        return 1.0

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """E[ids] * sqrt(hidden_size), the scale rounded to the weight's dtype first.
        Read through the weight, so a shared embedding module is never scaled twice."""
        weight = self.embed_tokens.weight
        # A fill, not torch.tensor: no host-to-device copy per call.
        scale = torch.full((), float(self.config.hidden_size) ** 0.5, dtype=torch.float32, device=weight.device)
        return F.embedding(input_ids, weight) * scale.to(weight.dtype)

    def _embed(self, input_ids, inputs_embeds):
        # inputs_embeds, when given, are taken as already scaled.
        return self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds

    def compute_logits(self, hidden: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        logits = super().compute_logits(hidden, spec_step_idx)
        cap = self.gemma.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
