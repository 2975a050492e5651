"""Plain-loop oracles for specdraft.generation: the target decoding one request at a
time, one token at a time, every step recomputing the whole sequence with dense
causal attention (no KV cache, no paged attention, no slot mapping, no batching,
no drafts). Only the target's weights are shared with the code under test.

- `dense_logits(target, ids)`: [n, V] logits of a TinyTargetModel over one sequence.
- `greedy_decode(...)`: the target's own greedy output, with EOS / max_new_tokens /
  max_model_len stops.
- `sequence_distribution(...)`: the exact joint distribution of the first n tokens
  sampled at temperature T (every prefix enumerated).
"""

import torch


def _attention(layer_attn, positions, x):
    """One self-attention layer, dense and causal (the layer's weights and RoPE)."""
    n = x.shape[0]
    a = layer_attn
    q = a.q_proj(x).view(n, a.num_heads, a.head_dim)
    k = a.k_proj(x).view(n, a.num_kv_heads, a.head_dim)
    v = a.v_proj(x).view(n, a.num_kv_heads, a.head_dim)
    q, k = a.rotary(positions, q, k)
    group = a.num_heads // a.num_kv_heads
    k = k.repeat_interleave(group, dim=1).float()  # head h reads kv head h // group
    v = v.repeat_interleave(group, dim=1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * a.head_dim**-0.5
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    out = torch.einsum("hqk,khd->qhd", probs, v).reshape(n, a.num_heads * a.head_dim).to(x.dtype)
    return a.o_proj(out)


@torch.no_grad()
def dense_logits(target, ids) -> torch.Tensor:
    """[n, V] float32 logits of the target over one token sequence at positions 0 .. n-1."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    positions = torch.arange(ids.shape[0])
    h = target.embed_tokens(ids)
    for layer in target.layers:
        x = h if layer.input_layernorm is None else layer.input_layernorm(h)
        h = h + _attention(layer.self_attn, positions, x)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return target.compute_logits(target.norm(h)).float()


def greedy_decode(target, prompt, max_new_tokens: int, *, eos_token_id=None, max_model_len: int) -> list[int]:
    """The target's greedy continuation of one prompt: argmax, one token at a time,
    until EOS (included), max_new_tokens, or max_model_len total tokens."""
    seq = list(prompt)
    out: list[int] = []
    while len(out) < max_new_tokens and len(seq) < max_model_len:
        token = int(dense_logits(target, seq)[-1].argmax())
        out.append(token)
        seq.append(token)
        if token == eos_token_id:
            break
    return out


@torch.no_grad()
def sequence_distribution(target, prompt, temperature: float, num_tokens: int, truncation=None,
                          margins: list | None = None) -> torch.Tensor:  # fmt: skip
    """[V] * num_tokens float64: the probability of each continuation x1 .. xn when
    the target samples softmax(logits / temperature) token by token; truncation:
    (top_k, top_p, min_p), each step's distribution then restricted to what
    specs.truncation's plain-Python rule keeps and renormalised (margins, when given,
    collects each step's distance of a top-p decision from its boundary)."""
    from specs.truncation import kept, truncation_cut

    vocab = target.config.vocab_size
    joint = torch.zeros((vocab,) * num_tokens, dtype=torch.float64)
    prefixes = {(): 1.0}
    for _ in range(num_tokens):
        next_prefixes = {}
        for prefix, p in prefixes.items():
            logits = dense_logits(target, list(prompt) + list(prefix))[-1].double()
            if truncation is not None:
                cut, margin = truncation_cut(logits.float().tolist(), temperature, *truncation)
                keep = torch.zeros(vocab, dtype=torch.bool)
                keep[sorted(kept(logits.float().tolist(), cut))] = True
                logits = torch.where(keep, logits, float("-inf"))
                if margins is not None:
                    margins.append(margin)
            probs = torch.softmax(logits / temperature, dim=-1)
            for token in range(vocab):
                next_prefixes[prefix + (token,)] = p * float(probs[token])
        prefixes = next_prefixes
    for prefix, p in prefixes.items():
        joint[prefix] = p
    return joint


def chi_square_pvalue(samples: torch.Tensor, joint: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson's chi-square test of samples [N, n] (token ids) against the exact joint
    distribution [V] * n; cells expected fewer than min_expected times are pooled
    into one. Returns the p-value (regularised upper incomplete gamma)."""
    vocab, num = joint.shape[0], samples.shape[0]
    flat = torch.zeros(joint.numel(), dtype=torch.float64)
    weights = vocab ** torch.arange(samples.shape[1] - 1, -1, -1)
    flat.index_add_(0, (samples.long() * weights).sum(1), torch.ones(num, dtype=torch.float64))
    expected = joint.flatten() * num
    big = expected >= min_expected
    observed, pooled = flat[big], expected[~big].sum()
    expected = expected[big]
    if pooled > 0:
        observed = torch.cat([observed, flat[~big].sum()[None]])
        expected = torch.cat([expected, pooled[None]])
    stat = ((observed - expected) ** 2 / expected).sum()
    dof = torch.tensor((observed.numel() - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2))
