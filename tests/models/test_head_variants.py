"""Draft-head variants against oracles built from transformers' own modules
(LlamaDecoderLayer, Qwen3DecoderLayer with its q/k norm, LlamaRMSNorm, the rotary
embeddings of every RoPE type) and wired as the upstream code wires them:

- EAGLE-3 (vLLM llama_eagle3.py, speculators' Eagle3FirstLayerMixin, SpecForge's
  LlamaForCausalLMEagle3): q/k/v read [input_layernorm(emb); hidden_norm(hidden)];
  the residual is hidden, or hidden_norm(hidden) with norm_before_residual; fc_norm
  norms each aux layer (SpecForge / speculators EAGLE-3.1), norm_before_fc the
  concatenation (speculators); SpecForge's norm_output: false gives lm_head the
  un-normed state; speculators' norm_output: true feeds the normed state onward;
- EAGLE-1 (vLLM llama_eagle.py / the EAGLE repository's cnets1.py): fc, then a Llama
  layer without input_layernorm; qkv_bias puts biases on q / k / v only,
  attention_bias on q / k / v and o_proj;
- MTP with the normed feed (MiMo-style): DeepSeek's layer, then shared_head.norm
  as part of the step.

Each request runs alone, dense and causal, in the oracle; specdraft runs them packed
through the paged cache, at large position offsets so scaled RoPE matters. fp32."""

import pytest
import torch
from torch import nn

from specdraft.models import DraftModelConfig, Eagle3Head, EagleHead, MTPHead
from specdraft.testing import CompileCounts, fresh_compile

from fixtures.hf_oracle import causal_mask, eager, packed_batch, randomise

transformers = pytest.importorskip(
    "transformers", minversion="5", reason="transformers >= 5 is the oracle (a test-only dependency: the test extra)"
)
from transformers import LlamaConfig, Qwen3Config  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer  # noqa: E402

H, TH, V, DV = 32, 24, 61, 40
HF = {"hidden_size": H, "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
      "vocab_size": V, "draft_vocab_size": DV, "target_hidden_size": TH, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "max_position_embeddings": 16384, "hidden_act": "silu"}  # fmt: skip
LENS, OFFSETS = [5, 1, 7], [0, 9000, 3000]
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 512, "rope_theta": 10000.0}  # fmt: skip
YARN = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 512, "mscale": 1.0, "mscale_all_dim": 0.8}
SPECULATORS_31 = {
    "speculators_model_type": "eagle3",
    "norm_before_residual": True,
    "fc_norm": True,
    "norm_output": True,
}

EAGLE3_VARIANTS = {
    "published": {},
    "norm_before_residual": {"norm_before_residual": True},
    "fc_norm": {"fc_norm": True},
    "norm_before_fc": {"norm_before_fc": True},
    "specforge_norm_output_false": {"norm_output": False},
    "specforge_eagle3_1": {"fc_norm": True, "norm_output": True},
    "speculators_eagle3_1": SPECULATORS_31,
    "speculators_qwen3_layer": {"model_type": "qwen3", "speculators_model_type": "eagle3", "norm_before_fc": True},
    "attention_bias": {"attention_bias": True},
    "llama3_rope_transformers5": {"rope_parameters": LLAMA3},
    "yarn_rope_transformers4": {"rope_scaling": YARN},
    "everything": {**SPECULATORS_31, "model_type": "qwen3", "attention_bias": True, "rope_scaling": YARN},
}


def transformers_layer(hf: dict, config: DraftModelConfig, attn_input: int):
    """A transformers decoder layer of the head's type, q/k/v widened to attn_input as
    speculators' Eagle3FirstLayerMixin does, and its rotary embedding."""
    keys = {k: v for k, v in hf.items() if k != "model_type"}
    tf_config = eager((Qwen3Config if config.qk_norm else LlamaConfig)(**keys))
    layer = (Qwen3DecoderLayer if config.qk_norm else LlamaDecoderLayer)(tf_config, layer_idx=0)
    attn = layer.self_attn
    for name, heads in (("q_proj", config.num_heads), ("k_proj", config.num_kv_heads), ("v_proj", config.num_kv_heads)):
        setattr(attn, name, nn.Linear(attn_input, heads * config.head_dim, bias=tf_config.attention_bias))
    return layer, LlamaRotaryEmbedding(tf_config)


def rms(weight: torch.Tensor, eps: float) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(weight.shape[0], eps=eps)
    norm.weight.data.copy_(weight)
    return norm


def eagle3_oracle(head: Eagle3Head, hf: dict, inp: dict):
    """(draft-vocabulary logits, hidden for the next step), request by request."""
    c = head.config
    layer, rotary = transformers_layer(hf, c, 2 * H)
    state = {k: v for k, v in head.midlayer.state_dict().items() if not k.startswith("hidden_norm.")}
    layer.load_state_dict(state, strict=True)
    hidden_norm, final_norm = (
        rms(head.midlayer.hidden_norm.weight, c.rms_norm_eps),
        rms(head.norm.weight, c.rms_norm_eps),
    )
    logits, feeds = [], []
    for r in inp["requests"]:
        aux = inp["aux"][r]
        if c.norm_before_fc:  # speculators: one norm over the concatenation
            aux = rms(head.input_norm.weight, c.rms_norm_eps)(aux)
        if c.fc_norm:  # SpecForge / speculators EAGLE-3.1: one norm per aux layer
            parts = aux.chunk(3, dim=-1)
            aux = torch.cat([rms(n.weight, c.rms_norm_eps)(p) for n, p in zip(head.fc_norm, parts, strict=True)], -1)
        hidden = (aux @ head.fc.weight.T)[None]
        emb = head.embed_tokens.weight[inp["ids"][r].long()][None]
        normed_hidden = hidden_norm(hidden)
        residual = normed_hidden if c.norm_before_residual else hidden  # vLLM's _norm_before_residual
        x = torch.cat([layer.input_layernorm(emb), normed_hidden], dim=-1)
        cos_sin = rotary(x, inp["positions"][r][None])
        attn, _ = layer.self_attn(x, position_embeddings=cos_sin, attention_mask=causal_mask(x.shape[1]))
        h = residual + attn
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        normed = final_norm(h)
        norm_output = hf.get("norm_output", True) if "speculators_model_type" not in hf else True
        logits.append((normed if norm_output else h)[0] @ head.lm_head.weight.T)
        speculators_normed_feed = "speculators_model_type" in hf and hf.get("norm_output", False)
        feeds.append((normed if speculators_normed_feed else h)[0])
    return torch.cat(logits), torch.cat(feeds)


def close(got, want):
    """fp32 agreement to ~1e-5 of the values' scale (un-normed states grow past 1)."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * max(1.0, want.abs().max().item()))


def run_head(head, inp, hidden):
    caches = head.allocate_kv_caches(inp["num_blocks"], 4)
    with torch.no_grad():
        return head(inp["ids"], inp["positions"], hidden, inp["md"], caches)


@pytest.mark.parametrize("name", sorted(EAGLE3_VARIANTS))
def test_eagle3_variant_matches_upstream_layer(name):
    hf = {**HF, **EAGLE3_VARIANTS[name]}
    head = randomise(Eagle3Head(DraftModelConfig.from_hf_config(hf)).eval())
    inp = packed_batch(LENS, OFFSETS, V, {"aux": 3 * TH})
    out, feed = run_head(head, inp, inp["aux"])
    with torch.no_grad():
        want_logits, want_feed = eagle3_oracle(head, hf, inp)
        got_logits = head.compute_draft_logits(out)
    close(got_logits, want_logits)
    close(feed, want_feed)


def test_the_variants_change_the_numbers():
    """Each switch is live: the published head's oracle differs from the variant's."""
    inp = packed_batch(LENS, OFFSETS, V, {"aux": 3 * TH})
    base = randomise(Eagle3Head(DraftModelConfig.from_hf_config(HF)).eval())
    with torch.no_grad():
        base_logits, base_feed = eagle3_oracle(base, HF, inp)
    for name in (
        "norm_before_residual",
        "specforge_norm_output_false",
        "llama3_rope_transformers5",
        "yarn_rope_transformers4",
    ):
        hf = {**HF, **EAGLE3_VARIANTS[name]}
        head = Eagle3Head(DraftModelConfig.from_hf_config(hf)).eval()
        head.load_state_dict(base.state_dict())
        out, feed = run_head(head, inp, inp["aux"])
        assert (head.compute_draft_logits(out) - base_logits).abs().max() > 1e-3, name
    speculators = Eagle3Head(
        DraftModelConfig.from_hf_config({**HF, "speculators_model_type": "eagle3", "norm_output": True})
    )
    speculators.load_state_dict(base.state_dict())
    assert (run_head(speculators.eval(), inp, inp["aux"])[1] - base_feed).abs().max() > 1e-3


# ------------------------------------------------------------------ EAGLE-1


@pytest.mark.parametrize("bias", [{"qkv_bias": True}, {"attention_bias": True}, {}])
def test_eagle1_biases_match_upstream_layer(bias):
    hf = {**HF, **bias, "draft_vocab_size": None, "target_hidden_size": None}
    config = DraftModelConfig.from_hf_config(hf)
    assert config.attention_bias == bool(bias) and config.o_proj_bias == ("attention_bias" in bias)
    head = randomise(EagleHead(config, input_norm=False, final_norm=False).eval())
    inp = packed_batch(LENS, OFFSETS, V, {"hidden": H})
    out, feed = run_head(head, inp, inp["hidden"])

    layer, rotary = transformers_layer({**hf, "attention_bias": True}, config, H)
    state = head.layers[0].state_dict()
    if not config.o_proj_bias:  # the oracle layer has every bias; q/k/v-only means o_proj's is zero
        state["self_attn.o_proj.bias"] = torch.zeros(H)
    if not config.attention_bias:
        state |= {f"self_attn.{p}_proj.bias": torch.zeros(n) for p, n in (("q", 32), ("k", 16), ("v", 16))}
    layer.input_layernorm = nn.Identity()  # EAGLE-1's first layer has no input norm (vLLM, cnets1.py)
    layer.load_state_dict(state, strict=True)
    want = []
    with torch.no_grad():
        for r in inp["requests"]:
            emb = head.embed_tokens.weight[inp["ids"][r].long()]
            x = (torch.cat([emb, inp["hidden"][r]], dim=-1) @ head.fc.weight.T)[None]
            want.append(
                layer(
                    x, attention_mask=causal_mask(x.shape[1]), position_embeddings=rotary(x, inp["positions"][r][None])
                )[0]
            )
        want = torch.cat(want)
        close(out, want)
        close(feed, want)
        close(head.compute_logits(out), want @ head.lm_head.weight.T)


# ------------------------------------------------------------------ MTP with the normed feed


def test_mtp_normed_feed_matches_spec():
    hf = {**HF, "draft_vocab_size": None, "target_hidden_size": None, "hidden_feed": "normed"}
    config = DraftModelConfig.from_hf_config(hf)
    head = randomise(MTPHead(config).eval())
    inp = packed_batch(LENS, OFFSETS, V, {"hidden": H})
    out, feed = run_head(head, inp, inp["hidden"])
    mtp = head.layers[0]
    layer, rotary = transformers_layer(hf, config, H)
    layer.load_state_dict({k: v for k, v in mtp.state_dict().items() if k.split(".")[0] in
                           ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")})  # fmt: skip
    eps, want = config.rms_norm_eps, []
    with torch.no_grad():
        for r in inp["requests"]:
            pos = inp["positions"][r]
            emb = head.embed_tokens.weight[inp["ids"][r].long()] * (pos != 0)[:, None]  # DeepSeek zeroes position 0
            x = torch.cat([rms(mtp.enorm.weight, eps)(emb), rms(mtp.hnorm.weight, eps)(inp["hidden"][r])], -1)
            x = (x @ mtp.eh_proj.weight.T)[None]
            h = layer(x, attention_mask=causal_mask(x.shape[1]), position_embeddings=rotary(x, pos[None]))[0]
            want.append(rms(mtp.shared_head.norm.weight, eps)(h))
        want = torch.cat(want)
        close(feed, want)
        close(head.compute_logits(out), want @ head.lm_head.weight.T)


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    "change, key",
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"logit_scale": 2.0}, "logit_scale"),
        ({"qk_layernorm": True}, "qk_layernorm"),
        ({"model_type": "llama4", "use_qk_norm": True}, "use_qk_norm"),
        ({"fc_norm": True, "norm_before_fc": True}, "fc_norm and norm_before_fc"),
        ({"norm_output": False, "hidden_feed": "normed"}, "hidden_feed"),
        ({"hidden_feed": "post"}, "hidden_feed"),
        ({"norm_before_residual": "yes"}, "norm_before_residual"),
        ({"qkv_bias": 1}, "qkv_bias"),
    ],
)
def test_refused_variant_keys_name_themselves(change, key):
    with pytest.raises(ValueError, match=key):
        DraftModelConfig.from_hf_config({**HF, **change})


@pytest.mark.parametrize("key", ["norm_before_residual", "fc_norm", "norm_before_fc"])
def test_eagle3_only_variants_are_refused_by_other_heads(key):
    config = DraftModelConfig.from_hf_config({**HF, key: True})
    for build in (lambda: EagleHead(config), lambda: MTPHead(config)):
        with pytest.raises(ValueError, match=key):
            build()
    with pytest.raises(ValueError, match="logits_norm"):
        MTPHead(DraftModelConfig.from_hf_config({**HF, "norm_output": False}))
    with pytest.raises(ValueError, match="hidden_feed"):
        EagleHead(DraftModelConfig.from_hf_config({**HF, "hidden_feed": "normed"}), final_norm=False)


def test_variant_config_round_trips_through_config_json():
    for name, change in EAGLE3_VARIANTS.items():
        config = DraftModelConfig.from_hf_config({**HF, **change})
        assert DraftModelConfig.from_hf_config(config.to_hf_config()) == config, name
    qkv_only = DraftModelConfig.from_hf_config({**HF, "qkv_bias": True})
    assert DraftModelConfig.from_hf_config(qkv_only.to_hf_config()) == qkv_only


# ------------------------------------------------------------------ compiled


def test_every_variant_at_once_compiles_fullgraph_and_equals_eager():
    """Qwen3 q/k norm, YaRN inside Qwen3-VL's interleaved M-RoPE, biases,
    norm_before_residual, fc_norm, the normed feed: one graph, no break."""
    rope = {**YARN, "mrope_section": [2, 1, 1], "mrope_interleaved": True}
    hf = {**HF, **SPECULATORS_31, "model_type": "qwen3", "attention_bias": True, "rope_scaling": rope}
    head = randomise(Eagle3Head(DraftModelConfig.from_hf_config(hf)).eval())
    inp = packed_batch(LENS, OFFSETS, V, {"aux": 3 * TH})
    positions = torch.stack([inp["positions"], inp["positions"] * 2 + 1, inp["positions"] // 3])
    caches = head.allocate_kv_caches(inp["num_blocks"], 4)

    def step(ids, pos, hidden, md, kv):
        out, feed = head(ids, pos, hidden, md, kv)
        return head.compute_logits(out), feed

    with torch.no_grad():
        want = step(inp["ids"], positions, inp["aux"], inp["md"], [c.clone() for c in caches])
        compiled = fresh_compile(step, fullgraph=True)
        with CompileCounts.measure() as counts:
            got = compiled(inp["ids"], positions, inp["aux"], inp["md"], caches)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert counts.graph_breaks == 0 and counts.compiles == 1
