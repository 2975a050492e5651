"""Draft heads and the tiny target model against dense oracles written here from the
published formulas (a per-request causal attention loop, no paged cache), plus the
EAGLE-3 vocabulary map, MTP layer selection and weight sharing."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from specdraft.models import (
    BatchMetadata,
    DraftModelConfig,
    Eagle3Head,
    EagleHead,
    MTPHead,
    TinyTargetModel,
    default_aux_layers,
)

CFG = DraftModelConfig(
    hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, vocab_size=61, draft_vocab_size=23, num_layers=4
)
HEAD_CFG = dataclasses.replace(CFG, num_layers=1)  # EAGLE heads have one layer; num_layers is the target's
LENS = [5, 1, 7]  # three requests, whole sequences in one call
BLOCK = 4


def batch(device, lens=LENS, cfg=CFG, seed=0, mrope=False):
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    width = max(-(-n // BLOCK) for n in lens)
    table = [[b * width + i for i in range(width)] for b in range(len(lens))]
    slots = [table[b][p // BLOCK] * BLOCK + p % BLOCK for b, n in enumerate(lens) for p in range(n)]
    pos = torch.tensor([p for n in lens for p in range(n)])
    if mrope:  # text rows equal, then perturb h / w rows so the sections matter
        pos = torch.stack([pos, pos * 2 + 1, pos * 3 + 2])
    md = BatchMetadata(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32).to(device),
        seq_lens=torch.tensor(lens, dtype=torch.int32).to(device),
        block_table=torch.tensor(table, dtype=torch.int32).to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device),
        max_query_len=max(lens),
    )
    return {
        "input_ids": torch.randint(0, cfg.vocab_size, (t,), generator=g, dtype=torch.int32).to(device),
        "positions": pos.to(device),
        "hidden": torch.randn(t, cfg.hidden_size, generator=g).to(device),
        "aux": torch.randn(t, 3 * cfg.target_hidden_size, generator=g).to(device),
        "md": md,
        "num_blocks": len(lens) * width,
        "qsl": qsl,
    }


def randomise(module, seed=1):
    """Non-trivial norm weights too (they start at ones)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return module


# --------------------------------------------------------------- dense oracles


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def dense_attention(attn, positions, x, qsl):
    t = x.shape[0]
    q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(t, attn.num_heads, -1)
    k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(t, attn.num_kv_heads, -1)
    v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(t, attn.num_kv_heads, -1)
    q, k = attn.rotary(positions, q, k)  # RoPE itself is checked in test_models_rope
    group = attn.num_heads // attn.num_kv_heads
    out = torch.zeros_like(q)
    for b in range(len(qsl) - 1):
        s, e = qsl[b], qsl[b + 1]
        qb = q[s:e].transpose(0, 1)
        kb = k[s:e].repeat_interleave(group, dim=1).transpose(0, 1)
        vb = v[s:e].repeat_interleave(group, dim=1).transpose(0, 1)
        out[s:e] = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True).transpose(0, 1)
    return F.linear(out.reshape(t, -1), attn.o_proj.weight)


def dense_layer_body(layer, positions, attn_in, residual, qsl, eps):
    h = residual + dense_attention(layer.self_attn, positions, attn_in, qsl)
    m = layer.mlp
    x = rms(h, layer.post_attention_layernorm.weight, eps)
    return h + F.linear(F.silu(F.linear(x, m.gate_proj.weight)) * F.linear(x, m.up_proj.weight), m.down_proj.weight)


def dense_target(model, inp, aux_layers):
    eps, h = model.config.rms_norm_eps, model.embed_tokens.weight[inp["input_ids"].long()]
    states = []
    for layer in model.layers:
        states.append(h)
        h = dense_layer_body(layer, inp["positions"], rms(h, layer.input_layernorm.weight, eps), h, inp["qsl"], eps)
    return rms(h, model.norm.weight, eps), torch.cat([states[i] for i in aux_layers], -1)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------- tests


@pytest.mark.kernel
@pytest.mark.parametrize("mrope", [False, True])
def test_target_matches_dense_and_returns_aux(device, mrope):
    cfg = CFG if not mrope else DraftModelConfig(**{**CFG.__dict__, "mrope_section": (1, 1, 2), "extra": {}})
    model = randomise(TinyTargetModel(cfg)).to(device)
    inp = batch(device, cfg=cfg, mrope=mrope)
    aux_layers = default_aux_layers(cfg.num_layers)
    hidden, aux = model(
        inp["input_ids"], inp["positions"], inp["md"], model.allocate_kv_caches(inp["num_blocks"], BLOCK), aux_layers
    )
    want_hidden, want_aux = dense_target(model, inp, aux_layers)
    close(hidden, want_hidden)
    close(aux, want_aux)


@pytest.mark.kernel
def test_target_incremental_decode_matches_prefill(device):
    """Prefill a prefix, then feed the rest one token per step through the cache."""
    model = randomise(TinyTargetModel(CFG)).to(device)
    full = batch(device, lens=[9])
    caches = model.allocate_kv_caches(full["num_blocks"], BLOCK)
    want, _ = model(
        full["input_ids"], full["positions"], full["md"], model.allocate_kv_caches(full["num_blocks"], BLOCK)
    )
    md = full["md"]
    prefix = 4
    got = [model(full["input_ids"][:prefix], full["positions"][:prefix],
                 BatchMetadata(torch.tensor([0, prefix], dtype=torch.int32, device=device),
                                   torch.tensor([prefix], dtype=torch.int32, device=device),
                                   md.block_table, md.slot_mapping[:prefix], prefix), caches)[0]]  # fmt: skip
    for p in range(prefix, 9):
        step = BatchMetadata(
            torch.tensor([0, 1], dtype=torch.int32, device=device),
            torch.tensor([p + 1], dtype=torch.int32, device=device),
            md.block_table,
            md.slot_mapping[p : p + 1],
            1,
        )
        got.append(model(full["input_ids"][p : p + 1], full["positions"][p : p + 1], step, caches)[0])
    close(torch.cat(got), want)


@pytest.mark.kernel
@pytest.mark.parametrize("final_norm", [False, True])
def test_eagle1_matches_dense(device, final_norm):
    head = randomise(EagleHead(HEAD_CFG, fc_bias=True, final_norm=final_norm)).to(device)
    inp = batch(device)
    out, nxt = head(
        inp["input_ids"], inp["positions"], inp["hidden"], inp["md"], head.allocate_kv_caches(inp["num_blocks"], BLOCK)
    )
    emb = head.embed_tokens.weight[inp["input_ids"].long()]
    x = F.linear(torch.cat([emb, inp["hidden"]], -1), head.fc.weight, head.fc.bias)
    h = dense_layer_body(head.layers[0], inp["positions"], x, x, inp["qsl"], CFG.rms_norm_eps)  # no input norm
    close(nxt, h)
    close(out, rms(h, head.norm.weight, CFG.rms_norm_eps) if final_norm else h)
    close(head.compute_logits(out), F.linear(out, head.lm_head.weight))


@pytest.mark.kernel
def test_eagle3_matches_dense(device):
    head = randomise(Eagle3Head(HEAD_CFG)).to(device)
    inp = batch(device)
    caches = head.allocate_kv_caches(inp["num_blocks"], BLOCK)
    out, nxt = head(inp["input_ids"], inp["positions"], inp["aux"], inp["md"], caches)
    eps, layer = CFG.rms_norm_eps, head.midlayer
    fused = F.linear(inp["aux"], head.fc.weight)
    close(head.combine_hidden_states(inp["aux"]), fused)
    emb = head.embed_tokens.weight[inp["input_ids"].long()]
    attn_in = torch.cat([rms(emb, layer.input_layernorm.weight, eps), rms(fused, layer.hidden_norm.weight, eps)], -1)
    h = dense_layer_body(layer, inp["positions"], attn_in, fused, inp["qsl"], eps)
    close(nxt, h)
    close(out, rms(h, head.norm.weight, eps))
    # Already-fused hidden states give the same result (the shape decides).
    again, _ = head(
        inp["input_ids"], inp["positions"], fused, inp["md"], head.allocate_kv_caches(inp["num_blocks"], BLOCK)
    )
    close(again, out)


@pytest.mark.kernel
def test_eagle3_vocabulary_map(device):
    head = randomise(Eagle3Head(HEAD_CFG)).to(device)
    g = torch.Generator().manual_seed(3)
    targets = torch.randperm(CFG.vocab_size, generator=g)[: CFG.draft_vocab_size].sort().values
    head.d2t.copy_((targets - torch.arange(CFG.draft_vocab_size)).to(device))
    hidden = torch.randn(6, CFG.hidden_size, generator=g).to(device)
    logits, draft = head.compute_logits(hidden).cpu(), head.compute_draft_logits(hidden).cpu()
    for n in range(6):
        for v in range(CFG.vocab_size):
            if v in targets.tolist():
                assert logits[n, v] == draft[n, targets.tolist().index(v)]
            else:
                assert logits[n, v] == float("-inf")
    draft_ids = draft.argmax(-1).to(torch.int32)
    mapped = head.map_draft_to_target(draft_ids.to(device)).cpu()
    assert mapped.dtype == torch.int32
    assert mapped.tolist() == [int(targets[d]) for d in draft_ids.tolist()]
    assert mapped.tolist() == logits.argmax(-1).tolist()


@pytest.mark.kernel
@pytest.mark.parametrize("per_layer", [False, True])
def test_mtp_step_selects_layer(device, per_layer):
    cfg = DraftModelConfig(**{**CFG.__dict__, "n_predict": 3, "extra": {}})
    head = randomise(MTPHead(cfg, per_layer_lm_head=per_layer)).to(device)
    inp = batch(device)
    eps = cfg.rms_norm_eps
    for step in (0, 1, 4):  # 4 wraps to layer 1, as vLLM's step % n_predict
        caches = head.allocate_kv_caches(inp["num_blocks"], BLOCK)
        out, nxt = head(inp["input_ids"], inp["positions"], inp["hidden"], inp["md"], caches, spec_step_idx=step)
        layer = head.layers[step % 3]
        emb = head.embed_tokens.weight[inp["input_ids"].long()]
        emb = torch.where((inp["positions"] == 0)[:, None], 0, emb)  # DeepSeek zeroes position 0
        x = F.linear(
            torch.cat([rms(emb, layer.enorm.weight, eps), rms(inp["hidden"], layer.hnorm.weight, eps)], -1),
            layer.eh_proj.weight,
        )
        h = dense_layer_body(layer, inp["positions"], rms(x, layer.input_layernorm.weight, eps), x, inp["qsl"], eps)
        close(out, h)
        assert out is nxt
        for i, c in enumerate(caches):  # only the chosen layer's cache is written
            assert bool(c.abs().sum() > 0) == (i == step % 3)
        w = layer.shared_head.head.weight if per_layer else head.lm_head.weight
        close(head.compute_logits(out, spec_step_idx=step), F.linear(rms(out, layer.shared_head.norm.weight, eps), w))
    with pytest.raises(ValueError, match="spec_step_idx"):
        head.layer_index(-1)


def test_share_from_target():
    target = TinyTargetModel(CFG)
    eagle = EagleHead(HEAD_CFG)
    eagle.share_from(target)
    assert eagle.embed_tokens is target.embed_tokens and eagle.lm_head is target.lm_head
    eagle3 = Eagle3Head(HEAD_CFG)
    eagle3.share_from(target)  # lm_head stays: it covers the draft vocabulary
    assert eagle3.embed_tokens is target.embed_tokens and eagle3.lm_head is not target.lm_head
    with pytest.raises(ValueError, match="lm_head: shapes differ"):
        eagle3.share_from(target, lm_head=True)
    with pytest.raises(ValueError, match="lm_head"):
        MTPHead(CFG, per_layer_lm_head=True).share_from(target, lm_head=True)
    wide = TinyTargetModel(DraftModelConfig(**{**CFG.__dict__, "hidden_size": 64, "extra": {}}))
    with pytest.raises(ValueError, match="embed_tokens: shapes differ"):
        EagleHead(HEAD_CFG).share_from(wide)
    with pytest.raises(ValueError, match="embed_tokens: dtypes differ"):
        EagleHead(HEAD_CFG).share_from(TinyTargetModel(CFG.with_dtype(torch.bfloat16)))


def test_missing_weights_block_until_shared():
    head = Eagle3Head(HEAD_CFG)
    head.missing_weights = frozenset({"embed_tokens"})
    inp = batch("cpu")
    with pytest.raises(RuntimeError, match="embed_tokens"):
        head(
            inp["input_ids"], inp["positions"], inp["aux"], inp["md"], head.allocate_kv_caches(inp["num_blocks"], BLOCK)
        )
    head.share_from(TinyTargetModel(CFG))
    assert head.missing_weights == frozenset()
