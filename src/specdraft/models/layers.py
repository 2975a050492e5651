"""Llama-style building blocks shared by the draft heads and the tiny target model:
RMSNorm, self-attention, SwiGLU MLP, and the decoder layer. Parameter names follow
the Hugging Face Llama names so checkpoints load by name.

A layer does not know which attention it runs: its forward takes `attend(q, k, v) ->
[T, heads, head_dim]` (before o_proj), the way gpt-fast's TransformerBlock takes its
mask. The callables over the paged KV cache (serving, the target's verify over draft
trees) are specdraft.models.cache_attention's; the tree drafter and the training
unroll pass their own. One body serves them all: project (q, k, v with RoPE) ->
attend -> finish (o_proj, residual, MLP).

Under torch.compile the paged attention (specdraft.models.cache_attention) and the
MLP are nested compile regions (specdraft.models.regions), compiled once and called
by every layer and draft step with the same shapes; inside regions.layer_regions()
(SpeculativeDecoder's compiled calls) the parts before and after the attention are
regions too (normed_qkv or qkv, finish_region), so N target layers and K draft
steps compile one layer's code (benchmarks/README.md, "By target depth").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.models.config import DraftModelConfig
from specdraft.models.linear import Linear
from specdraft.models.regions import compile_region, layer_regions_on
from specdraft.models.rope import RotaryEmbedding

# attend(q [T, heads, D], k [T, kv_heads, D], v [T, kv_heads, D]) -> [T, heads, D]:
# the attention a layer is handed, before o_proj.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class TokenEmbedding(nn.Embedding):
    """nn.Embedding without its renorm arguments in the call. nn.Embedding.forward
    hands F.embedding its float norm_type even when max_norm is None;
    torch.compile(dynamic=True) traces that float as a symbol which the op's
    argument parser then pins to 2.0, and Dynamo throws the whole trace away to
    start again with it constant (a doubled cold compile). Same weights, same
    state-dict key, same lookup."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight, self.padding_idx)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 (as HF Llama does), scale in the weight's dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class SelfAttention(nn.Module):
    """q/k/v/o projections (biases per config.attention_bias / o_proj_bias), Qwen3's
    per-head q / k RMSNorm when config.qk_norm, RoPE / scaled RoPE / M-RoPE; the
    attention between them is the caller's `attend`. `input_size` is the projection
    input (2 * hidden for EAGLE-3)."""

    def __init__(self, config: DraftModelConfig, input_size: int | None = None) -> None:
        super().__init__()
        c = config
        input_size = c.hidden_size if input_size is None else input_size
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = Linear(input_size, c.num_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = Linear(input_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = Linear(input_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_proj_bias)
        # Qwen3: RMSNorm over each head's head_dim, on q and k, before RoPE.
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta, c.mrope_section, c.rope_scaling, c.mrope_interleaved)

    def project(self, positions, x) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, heads, D], k and v [T, kv_heads, D]: the projections, Qwen3's per-head
        norm, RoPE at `positions`."""
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        return q, k, v

    def project_kv(self, positions, x) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v [T, kv_heads, D] of rows that are keys only (a block drafter's
        context: the target's projected features), with the same norm and RoPE as
        `project`'s."""
        t = x.shape[0]
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return self.rotary.rotate(positions, k), v

    def output(self, attn_out: torch.Tensor) -> torch.Tensor:
        """o_proj of the attention output [T, heads, D] -> [T, hidden]."""
        return self.o_proj(attn_out.reshape(attn_out.shape[0], self.num_heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    @compile_region
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.swiglu(x)

    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """forward outside its compile region (for a caller inside one of its own)."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Llama layer (Qwen3's with config.qk_norm). `input_norm=False` drops
    input_layernorm (EAGLE-1's first layer has none); `attn_input_size` widens the
    attention input (EAGLE-3)."""

    def __init__(self, config: DraftModelConfig, attn_input_size: int | None = None, input_norm: bool = True) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps) if input_norm else None
        self.self_attn = SelfAttention(config, attn_input_size)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = SwiGLU(h, config.intermediate_size)

    def forward(self, positions, x, attend: Attend) -> torch.Tensor:
        if layer_regions_on():
            q, k, v = self.normed_qkv(positions, x)
            return self.finish_region(attend(q, k, v), x)
        attn_input, residual = self.attention_input(x)
        return self.attend_and_mlp(positions, attn_input, residual, attend)

    @compile_region
    def normed_qkv(self, positions, x) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, heads, D], k and v [T, kv_heads, D] of the layer's input x: the input
        norm, the projections, Qwen3's per-head norm, RoPE."""
        return self.self_attn.project(positions, self.attention_input(x)[0])

    @compile_region
    def qkv(self, positions, attn_input) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of an input already normed (a draft head's step input)."""
        return self.self_attn.project(positions, attn_input)

    @compile_region
    def finish_region(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """`finish`, its MLP not a region of its own: a region nested in another that a
        graph also calls outside it (the draft head's MLP beside the target's) breaks
        Inductor's lookup of the inner one (torch 2.13: "no attribute
        'repeated_subgraph2.repeated_subgraph0'")."""
        h = residual + self.self_attn.output(attn_out)
        return h + self.mlp.swiglu(self.post_attention_layernorm(h))

    def attention_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(what attention reads, the residual) of the layer's input x."""
        return (x if self.input_layernorm is None else self.input_layernorm(x)), x

    def attend_and_mlp(self, positions, attn_input, residual, attend: Attend) -> torch.Tensor:
        """The layer after its input norm: q, k, v of attn_input at `positions`, the
        caller's attention over them, then `finish`."""
        if layer_regions_on():
            q, k, v = self.qkv(positions, attn_input)
            return self.finish_region(attend(q, k, v), residual)
        q, k, v = self.self_attn.project(positions, attn_input)
        return self.finish(attend(q, k, v), residual)

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn_out [T, heads, D] -> o_proj, + residual, then + MLP."""
        return self.mlp_block(residual + self.self_attn.output(attn_out))

    def mlp_block(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(self.post_attention_layernorm(h))
