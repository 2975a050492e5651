"""An independent float64 oracle of a block drafter on DeepSpec's Gemma4 backbone
(Gemma4DSparkModel's inference), written from the math as tests/models/block_oracle.py
is for the Llama / Qwen3 backbone, whose cache handling, Markov head and confidence
head it reuses: plain-w RMSNorm, the weightless v_norm, the embedding times
sqrt(hidden), proportional partial RoPE, attention scale 1, attention_k_eq_v,
gelu-tanh MLP, sandwich norms, layer_scalar, final logit soft-capping."""

from __future__ import annotations

import math

import torch

from tests.models.block_oracle import OracleDrafter


def gemma_rms(x, w, eps):
    xf = x.double()
    out = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return out if w is None else out * w.double()


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def proportional_rotate(x, pos, theta, partial, factor):
    """x [T, heads, D] rotated at pos [T]: frequency i < int(partial * D // 2) turns at
    theta ** (-2i / D) / factor, the others not at all; dims i and i + D/2 pair."""
    d = x.shape[-1]
    n = int(partial * d // 2)
    i = torch.arange(d // 2, dtype=torch.float64)
    inv = torch.where(i < n, theta ** (-2 * i / d), torch.zeros_like(i)) / factor
    ang = pos.double()[:, None] * inv[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Gemma4OracleDrafter(OracleDrafter):
    """OracleDrafter with the Gemma4 backbone (the head's `gemma` settings)."""

    def __init__(self, head):
        super().__init__(head)
        self.gemma = head.gemma

    def lin(self, name, x, bias=None):
        y = x @ self.sd[f"{name}.weight"].T
        has_bias = f"{name}.bias" in self.sd if bias is None else bias
        return y + self.sd[f"{name}.bias"] if has_bias else y

    def rope(self, x, pos):
        g = self.gemma
        return proportional_rotate(x, pos, self.cfg.rope_theta, g.partial_rotary_factor, g.rope_factor)

    def kv(self, i, x, pos):
        c, p = self.cfg, f"layers.{i}.self_attn"
        k = self.lin(f"{p}.k_proj", x).view(-1, c.num_kv_heads, c.head_dim)
        v = k if self.gemma.attention_k_eq_v else self.lin(f"{p}.v_proj", x).view(-1, c.num_kv_heads, c.head_dim)
        k = gemma_rms(k, self.sd[f"{p}.k_norm.weight"], c.rms_norm_eps)
        return self.rope(k, pos), gemma_rms(v, None, c.rms_norm_eps)

    def block_step(self, context_features, context_pos, newest_token, start):
        c, b, eps = self.cfg, self.block, self.cfg.rms_norm_eps
        s_len = b.block_size
        ctx = gemma_rms(self.lin("fc", context_features.double()), self.sd["hidden_norm.weight"], eps)
        ids = torch.full((s_len,), b.mask_token_id, dtype=torch.long)
        ids[0] = newest_token
        x = self.sd["embed_tokens.weight"][ids] * math.sqrt(c.hidden_size)
        pos = torch.arange(start, start + s_len)
        for i in range(c.num_layers):
            p = f"layers.{i}"
            kc, vc = self.kv(i, ctx, context_pos)
            if self.caches[i] is not None:
                kc, vc = torch.cat([self.caches[i][0], kc]), torch.cat([self.caches[i][1], vc])
            self.caches[i] = (kc, vc)
            h = gemma_rms(x, self.sd[f"{p}.input_layernorm.weight"], eps)
            q = self.lin(f"{p}.self_attn.q_proj", h).view(s_len, c.num_heads, c.head_dim)
            q = self.rope(gemma_rms(q, self.sd[f"{p}.self_attn.q_norm.weight"], eps), pos)
            kb, vb = self.kv(i, h, pos)
            keys, values = torch.cat([kc, kb]), torch.cat([vc, vb])
            group = c.num_heads // c.num_kv_heads
            keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
            att = torch.softmax(torch.einsum("qhd,khd->hqk", q, keys), -1)  # scale 1
            o = torch.einsum("hqk,khd->qhd", att, values).reshape(s_len, -1)
            x = x + gemma_rms(
                self.lin(f"{p}.self_attn.o_proj", o), self.sd[f"{p}.post_attention_layernorm.weight"], eps
            )
            h = gemma_rms(x, self.sd[f"{p}.pre_feedforward_layernorm.weight"], eps)
            m = self.lin(
                f"{p}.mlp.down_proj", gelu_tanh(self.lin(f"{p}.mlp.gate_proj", h)) * self.lin(f"{p}.mlp.up_proj", h)
            )
            x = (x + gemma_rms(m, self.sd[f"{p}.post_feedforward_layernorm.weight"], eps)) * self.sd[
                f"{p}.layer_scalar"
            ]
        return gemma_rms(x, self.sd["norm.weight"], eps)

    def base_logits(self, hidden):
        logits = self.lin("lm_head", hidden)
        cap = self.gemma.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
