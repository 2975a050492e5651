"""MTP checkpoint layouts: each loads to the same head as this package's canonical
layout (layers.{k}.*, numbered from 0) or is refused with its reason named.

Oracles: the canonical layout's load (same weights, no renaming), and for MiMo an
independent step built from transformers' Qwen2DecoderLayer / Qwen2RMSNorm, wired
as vLLM's mimo_mtp.py wires them."""

import dataclasses

import pytest
import torch

from specdraft.models import MTPHead, load_draft_model

from fixtures.checkpoints import FF, HD, HF, KV, NH, H, V, layer_tensors, mtp_checkpoint, rand, tiny_batch, write_folder


def renumber(tensors, old_first, new_first, n):
    out = {}
    for name, value in tensors.items():
        for k in range(n):
            prefix = f"model.layers.{old_first + k}."
            if name.startswith(prefix):
                name = f"model.layers.{new_first + k}." + name[len(prefix) :]
                break
        out[name] = value
    return out


def outputs(model, n_steps):
    """(next-step state, logits) of every MTP layer on one batch, fresh caches."""
    ids, pos, md = tiny_batch()
    hidden = torch.randn(5, H, generator=torch.Generator().manual_seed(3))
    out = []
    with torch.no_grad():
        for step in range(n_steps):
            sample, feed = model(ids, pos, hidden, md, model.allocate_kv_caches(2, 4), spec_step_idx=step)
            out += [feed, model.compute_logits(sample, spec_step_idx=step)]
    return out


def assert_same_head(a, b, n_steps):
    assert type(a) is type(b) and a.config == b.config and a.per_layer_lm_head == b.per_layer_lm_head
    for x, y in zip(outputs(a, n_steps), outputs(b, n_steps), strict=True):
        assert torch.equal(x, y)


# ------------------------------------------------------------------ DeepSeek / GLM numbering


def test_deepseek_numbering_and_embedding_copies_load_as_the_canonical_layout(tmp_path):
    """Several MTP layers, each with its own shared_head.head, numbered after the
    target's 61 layers and each carrying DeepSeek's copy of the embedding."""
    hf, t = mtp_checkpoint(first=0, n=2, per_layer=True)
    canonical = load_draft_model(write_folder(tmp_path / "canonical", hf, t))
    embed = t["model.embed_tokens.weight"]
    deepseek = renumber({k: v for k, v in t.items() if k != "model.embed_tokens.weight"}, 0, 61, 2)
    deepseek |= {f"model.layers.{k}.embed_tokens.weight": embed.clone() for k in (61, 62)}
    loaded = load_draft_model(write_folder(tmp_path / "deepseek", {**hf, "num_hidden_layers": 61}, deepseek))
    assert isinstance(loaded, MTPHead) and loaded.per_layer_lm_head and loaded.missing_weights == frozenset()
    # num_hidden_layers (the target's depth) is the one config difference.
    canonical.config = dataclasses.replace(canonical.config, num_layers=61)
    assert_same_head(loaded, canonical, n_steps=2)


@pytest.mark.parametrize(
    "first, depth, message",
    [
        (5, 61, r"MTP layers are layers \[5, 6\]; they must be numbered from 0 or from num_hidden_layers \(61\)"),
        (61, 30, "num_hidden_layers"),
    ],
)
def test_mtp_numbering_must_follow_the_target(tmp_path, first, depth, message):
    hf, t = mtp_checkpoint(first=first, n=2)
    with pytest.raises(ValueError, match=message):
        load_draft_model(write_folder(tmp_path / "m", {**hf, "num_hidden_layers": depth}, t))


def test_mtp_layer_gaps_and_differing_embedding_copies_are_refused(tmp_path):
    hf, t = mtp_checkpoint(first=61, n=2)
    gap = renumber(t, 62, 63, 1)
    with pytest.raises(ValueError, match=r"layers \[61, 63\]"):
        load_draft_model(write_folder(tmp_path / "gap", {**hf, "num_hidden_layers": 61}, gap))
    copies = {**t, "model.layers.61.embed_tokens.weight": rand(V, H)}
    with pytest.raises(ValueError, match="'embed_tokens.weight' and 'layers.61.embed_tokens.weight'"):
        load_draft_model(write_folder(tmp_path / "copies", hf, copies))


# ------------------------------------------------------------------ refused layer contents


@pytest.mark.parametrize(
    "name, shape, message",
    [
        ("mlp.experts.0.gate_proj.weight", (FF, H), "a MoE MLP"),
        ("mlp.gate.weight", (8, H), r"a MoE router \(mlp.gate\)"),
        ("mlp.shared_experts.up_proj.weight", (FF, H), "a MoE shared expert"),
        ("self_attn.kv_a_proj_with_mqa.weight", (8, H), "DeepSeek's MLA attention"),
        ("self_attn.q_a_proj.weight", (8, H), "DeepSeek's MLA attention"),
        ("self_attn.g_proj.weight", (NH, H), "a gated attention output"),
        ("self_attn.q_proj.weight_scale_inv", (1, 1), "a quantized weight"),
        ("shared_head.output.weight", (V, H), "Step-3.5's MTP layout"),
    ],
)
def test_mtp_layers_the_head_cannot_compute_are_refused_by_tensor(tmp_path, name, shape, message):
    hf, t = mtp_checkpoint(first=61, n=1)
    t[f"model.layers.61.{name}"] = rand(*shape)
    with pytest.raises(ValueError, match=f"tensor 'layers.61.{name}': {message}"):
        load_draft_model(write_folder(tmp_path / "m", {**hf, "num_hidden_layers": 61}, t))


@pytest.mark.parametrize(
    "config, message",
    [
        ({"model_type": "step3p5"}, r"model_type: 'step3p5' .*zero-centred RMSNorms"),
        ({"model_type": "qwen3_next"}, r"model_type: 'qwen3_next' .*gated attention"),
        ({"model_type": "qwen3_5_moe"}, r"model_type: 'qwen3_5_moe'"),
        ({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text"}}, "model_type: 'qwen3_5'"),
        ({"text_config": {"model_type": "qwen3_5_text"}}, "model_type: 'qwen3_5_text'"),
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    ],
)
def test_mtp_families_the_head_cannot_compute_are_refused_by_model_type(tmp_path, config, message):
    hf, t = mtp_checkpoint(first=61, n=1)
    with pytest.raises(ValueError, match=message):
        load_draft_model(write_folder(tmp_path / "m", {**hf, "num_hidden_layers": 61, **config}, t))


def test_qwen3_next_mtp_layout_is_refused_by_its_names(tmp_path):
    t = {"mtp.fc.weight": rand(H, 2 * H), "mtp.norm.weight": rand(H), "mtp.pre_fc_norm_hidden.weight": rand(H)}
    t |= {"mtp.pre_fc_norm_embedding.weight": rand(H)} | layer_tensors("mtp.layers.0.")
    with pytest.raises(ValueError, match=r"tensors 'mtp\.\*': Qwen3-Next's MTP layout: zero-centred RMSNorms"):
        load_draft_model(write_folder(tmp_path / "m", {**HF, "num_nextn_predict_layers": 1}, t))


# ------------------------------------------------------------------ MiMo

MIMO_HF = {**HF, "model_type": "mimo", "architectures": ["MiMoForCausalLM"], "num_hidden_layers": 1,
           "num_nextn_predict_layers": 1, "use_sliding_window": False, "sliding_window": 32768,
           "hidden_act": "silu", "tie_word_embeddings": False}  # fmt: skip


def mimo_folder_tensors():
    """A whole MiMo folder: the target (one layer, final norm, embedding, lm_head) and
    its MTP layer under MiMo's names, with Qwen2's q / k / v biases."""
    t = {"model.embed_tokens.weight": rand(V, H), "lm_head.weight": rand(V, H), "model.norm.weight": rand(H)}
    t |= {f"model.{k}": v for k, v in layer_tensors("layers.0.").items()}
    p = "model.mtp_layers.0."
    t |= {f"model.{k}": v for k, v in layer_tensors("mtp_layers.0.").items()}
    t |= {p + f"self_attn.{x}_proj.bias": rand(n * HD) for x, n in (("q", NH), ("k", KV), ("v", KV))}
    t |= {p + "token_layernorm.weight": 1 + 0.2 * rand(H), p + "hidden_layernorm.weight": 1 + 0.2 * rand(H)}
    t |= {p + "input_proj.weight": rand(H, 2 * H), p + "final_layernorm.weight": 1 + 0.2 * rand(H)}
    return t


def test_mimo_folder_loads_as_the_canonical_layout_with_the_normed_feed(tmp_path):
    t = mimo_folder_tensors()
    mimo = load_draft_model(write_folder(tmp_path / "mimo", MIMO_HF, t))
    # The canonical twin: DeepSeek's names, input_proj's [hidden | emb] column blocks
    # as eh_proj's [emb | hidden], the normed feed and Qwen2's biases stated directly.
    m, c = "model.mtp_layers.0.", "model.layers.0."
    canonical = {k.replace(m, c): v for k, v in t.items() if k.startswith(m)}
    canonical[c + "enorm.weight"] = canonical.pop(c + "token_layernorm.weight")
    canonical[c + "hnorm.weight"] = canonical.pop(c + "hidden_layernorm.weight")
    canonical[c + "shared_head.norm.weight"] = canonical.pop(c + "final_layernorm.weight")
    hidden_cols, emb_cols = canonical.pop(c + "input_proj.weight").split(H, dim=1)
    canonical[c + "eh_proj.weight"] = torch.cat([emb_cols, hidden_cols], dim=1)
    canonical |= {k: t[k] for k in ("model.embed_tokens.weight", "lm_head.weight")}
    hf = {**HF, "num_hidden_layers": 1, "qkv_bias": True, "o_proj_bias": False, "hidden_feed": "normed"}
    twin = load_draft_model(write_folder(tmp_path / "canonical", hf, canonical))
    assert mimo.config.hidden_feed == "normed" and mimo.config.attention_bias and not mimo.config.o_proj_bias
    assert_same_head(mimo, twin, n_steps=1)


def test_mimo_matches_vllms_formula_on_transformers_modules(tmp_path):
    """Two chained steps of MiMo's MTP layer: input_proj([hidden_layernorm(hidden);
    token_layernorm(emb)]) with emb zeroed at position 0, Qwen2's decoder layer,
    final_layernorm; logits from lm_head; the next step reads final_layernorm's output."""
    pytest.importorskip("transformers", reason="transformers' Qwen2 modules are the oracle")
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RMSNorm, Qwen2RotaryEmbedding

    t = mimo_folder_tensors()
    head = load_draft_model(write_folder(tmp_path / "mimo", MIMO_HF, t))
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps")
    config = Qwen2Config(**{k: HF[k] for k in keys}, vocab_size=V, rope_theta=HF["rope_theta"], head_dim=HD)
    config._attn_implementation = "eager"
    layer, rotary = Qwen2DecoderLayer(config, layer_idx=0), Qwen2RotaryEmbedding(config)
    p = "model.mtp_layers.0."
    parts = ("input_layernorm.", "self_attn.", "post_attention_layernorm.", "mlp.")
    layer.load_state_dict({k[len(p) :]: v for k, v in t.items() if k.startswith(tuple(p + x for x in parts))})

    def norm(name):
        n = Qwen2RMSNorm(H, eps=HF["rms_norm_eps"])
        n.weight.data.copy_(t[p + name])
        return n

    ids, pos, md = tiny_batch()
    mask = torch.zeros(5, 5).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), torch.finfo(torch.float32).min)
    hidden = torch.randn(5, H, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for _ in range(2):
            emb = t["model.embed_tokens.weight"][ids.long()] * (pos != 0)[:, None]
            x = torch.cat([norm("hidden_layernorm.weight")(hidden), norm("token_layernorm.weight")(emb)], -1)
            x = (x @ t[p + "input_proj.weight"].T)[None]
            h = layer(x, attention_mask=mask[None, None], position_embeddings=rotary(x, pos[None]))
            want_feed = norm("final_layernorm.weight")((h[0] if isinstance(h, tuple) else h)[0])
            sample, feed = head(ids, pos, hidden, md, head.allocate_kv_caches(2, 4))
            torch.testing.assert_close(feed, want_feed, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                head.compute_logits(sample), want_feed @ t["lm_head.weight"].T, rtol=1e-5, atol=1e-4
            )
            hidden = feed


def test_mimo_with_an_unsupported_layer_is_refused(tmp_path):
    t = mimo_folder_tensors() | {"model.mtp_layers.0.mlp.experts.0.up_proj.weight": rand(FF, H)}
    with pytest.raises(ValueError, match="tensor 'mtp_layers.0.mlp.experts.0.up_proj.weight': a MoE MLP"):
        load_draft_model(write_folder(tmp_path / "m", MIMO_HF, t))
