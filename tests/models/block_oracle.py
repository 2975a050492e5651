"""An independent plain-torch oracle of a block drafter's inference (DeepSpec's
evaluator: batch 1, a dense cache of the context's keys and values that grows by the
accepted tokens and is cropped after every block), written from the math, reading
the head's weights as plain tensors. tests/models/test_block_head.py checks the
serving proposer (paged cache, ragged batch) against it; docs/development.md says how
it was checked once against DeepSpec's own modules."""

from __future__ import annotations

import torch


def rms(x, w, eps):
    xf = x.double()
    return w.double() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, pos, theta):
    """HF's rotate_half RoPE of x [T, heads, D] at pos [T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos.double()[:, None] * inv[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class OracleDrafter:
    """The head's math in float64 from its state dict (`sd`), its DraftModelConfig
    (`cfg`) and BlockConfig (`block`)."""

    def __init__(self, head):
        self.sd = {k: v.detach().double() for k, v in head.state_dict().items()}
        self.cfg, self.block = head.config, head.block
        self.caches = [None] * head.config.num_layers  # per layer (K, V) [L, kv_heads, D]

    def lin(self, name, x, bias=False):
        y = x @ self.sd[f"{name}.weight"].T
        return y + self.sd[f"{name}.bias"] if bias else y

    def kv(self, i, x, pos):
        c, p = self.cfg, f"layers.{i}.self_attn"
        k = self.lin(f"{p}.k_proj", x).view(-1, c.num_kv_heads, c.head_dim)
        v = self.lin(f"{p}.v_proj", x).view(-1, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            k = rms(k, self.sd[f"{p}.k_norm.weight"], c.rms_norm_eps)
        return rotate(k, pos, c.rope_theta), v

    def block_step(self, context_features, context_pos, newest_token, start):
        """One DeepSpec block: the new context rows (features [n, width] at context_pos)
        join the cache; the block [newest, mask...] at start .. start + S - 1 attends to
        the cache and to itself. Returns the final-normed hidden [S, H]."""
        c, b = self.cfg, self.block
        s_len = b.block_size
        ctx = rms(self.lin("fc", context_features.double()), self.sd["hidden_norm.weight"], c.rms_norm_eps)
        ids = torch.full((s_len,), b.mask_token_id, dtype=torch.long)
        ids[0] = newest_token
        x = self.sd["embed_tokens.weight"][ids]
        pos = torch.arange(start, start + s_len)
        for i in range(c.num_layers):
            p = f"layers.{i}"
            kc, vc = self.kv(i, ctx, context_pos)
            if self.caches[i] is not None:
                kc, vc = torch.cat([self.caches[i][0], kc]), torch.cat([self.caches[i][1], vc])
            self.caches[i] = (kc, vc)  # cropped to the context: the block's keys are never kept
            h = rms(x, self.sd[f"{p}.input_layernorm.weight"], c.rms_norm_eps)
            q = self.lin(f"{p}.self_attn.q_proj", h).view(s_len, c.num_heads, c.head_dim)
            if c.qk_norm:
                q = rms(q, self.sd[f"{p}.self_attn.q_norm.weight"], c.rms_norm_eps)
            q = rotate(q, pos, c.rope_theta)
            kb, vb = self.kv(i, h, pos)
            keys, values = torch.cat([kc, kb]), torch.cat([vc, vb])
            group = c.num_heads // c.num_kv_heads
            keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
            att = torch.softmax(torch.einsum("qhd,khd->hqk", q, keys) * c.head_dim**-0.5, -1)
            o = torch.einsum("hqk,khd->qhd", att, values).reshape(s_len, -1)
            x = x + self.lin(f"{p}.self_attn.o_proj", o)
            h = rms(x, self.sd[f"{p}.post_attention_layernorm.weight"], c.rms_norm_eps)
            m = self.lin(f"{p}.mlp.gate_proj", h)
            x = x + self.lin(f"{p}.mlp.down_proj", torch.nn.functional.silu(m) * self.lin(f"{p}.mlp.up_proj", h))
        return rms(x, self.sd["norm.weight"], c.rms_norm_eps)

    def markov_latent(self, prev, hidden_row, state):
        kind, r = self.block.markov_head_type, self.block.markov_rank
        e = self.sd["markov_head.markov_w1.weight"][prev]
        if kind == "vanilla":
            return e, state
        if kind == "gated":
            g = torch.sigmoid(self.lin("markov_head.gate_proj", torch.cat([hidden_row, e]), bias=True))
            return g * e, state
        z = self.lin("markov_head.joint_proj", torch.cat([state, e, hidden_row]), bias=True)
        g, cand, out = z[:r], z[r : 2 * r], z[2 * r :]
        g = torch.sigmoid(g)
        return torch.tanh(out), g * state + (1 - g) * torch.tanh(cand)

    def base_logits(self, hidden):
        """[S, V] the block rows' logits before the Markov head."""
        return self.lin("lm_head", hidden)

    def draft(self, hidden, newest_token):
        """Greedy drafts of a block: (base logits [S, V], corrected logits [S, V],
        tokens [S], confidence logits [S] or None), the Markov head applied in order."""
        base = self.base_logits(hidden)
        corrected, tokens, conf = [], [], []
        prev = int(newest_token)
        state = torch.zeros(self.block.markov_rank, dtype=torch.float64)
        for s in range(hidden.shape[0]):
            row = base[s]
            if self.block.markov_rank:
                latent, state = self.markov_latent(prev, hidden[s], state)
                row = row + latent @ self.sd["markov_head.markov_w2.weight"].T
            if self.block.confidence_head:
                feat = hidden[s]
                if self.block.confidence_with_markov:
                    feat = torch.cat([feat, self.sd["markov_head.markov_w1.weight"][prev]])
                conf.append(self.lin("confidence_head.proj", feat, bias=True)[0])
            corrected.append(row)
            prev = int(row.argmax())
            tokens.append(prev)
        confidence = torch.stack(conf) if conf else None
        return base, torch.stack(corrected), torch.tensor(tokens), confidence
