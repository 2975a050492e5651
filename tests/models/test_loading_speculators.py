"""EAGLE-3 heads in the speculators format (config.json with speculators_model_type,
transformer_layer_config, speculators_config; weights under layers.0.*).

Oracles: the same weights saved in the plain EAGLE-3 layout with an HF config that
states each setting directly (an independent route into the head: no translation),
and transformers' LlamaConfig / Qwen3Config for the defaults a to_diff_dict layer
config leaves out."""

import dataclasses

import pytest
import torch

from specdraft.models import DraftModelConfig, load_draft_model
from specdraft.models.formats import LAYER_CONFIG_DEFAULTS, speculators_to_hf

from fixtures.checkpoints import DV, FF, HD, HF, KV, NH, H, V, eagle3_checkpoint, rand, tiny_batch, write_folder


def layer_config(**changes):
    """A transformer_layer_config as to_diff_dict writes it: keys equal to LlamaConfig's
    defaults (rope_theta 10000, head_dim = hidden / heads) left out."""
    out = {
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": FF,
        "num_attention_heads": NH,
        "num_key_value_heads": KV,
        "vocab_size": V,
        "num_hidden_layers": 1,
        "rms_norm_eps": HF["rms_norm_eps"],
    }
    return {k: v for k, v in (out | changes).items() if v is not None}


def speculators_config(layer=None, **changes):
    out = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "draft_vocab_size": DV,
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": [2, 5, 7],
        "transformer_layer_config": layer_config() if layer is None else layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": "org/verifier", "architectures": ["LlamaForCausalLM"]},
        },
        "torch_dtype": "float32",
    }
    return {k: v for k, v in (out | changes).items() if v is not None}


def speculators_names(tensors):
    """Plain EAGLE-3 names -> the speculators library's (layers.0.*), plus the
    verifier_norm it keeps for training targets."""
    out = {("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in tensors.items()}
    return out | {"verifier_norm.weight": rand(H)}


# Each variant: (top-level speculators keys, layer-config changes, the plain HF keys
# stating the same, extra weights under plain names).
VARIANTS = {
    "llama": ({}, {}, {}, {}),
    "norm_before_residual": ({"norm_before_residual": True}, {}, {"norm_before_residual": True}, {}),
    "norm_output": ({"norm_output": True}, {}, {"hidden_feed": "normed"}, {}),
    "fc_norm": ({"fc_norm": True}, {}, {"fc_norm": True}, {f"fc_norm.{i}.weight": (H,) for i in range(3)}),
    "norm_before_fc": ({"norm_before_fc": True}, {}, {"norm_before_fc": True}, {"input_norm.weight": (3 * H,)}),
    "qwen3": (
        {},
        {"model_type": "qwen3", "head_dim": HD},
        {"model_type": "qwen3", "head_dim": HD},
        {"midlayer.self_attn.q_norm.weight": (HD,), "midlayer.self_attn.k_norm.weight": (HD,)},
    ),
}


def run_two_steps(model):
    """Logits of a first pass and of one more step fed the head's next-step state."""
    ids, pos, md = tiny_batch()
    caches = model.allocate_kv_caches(4, 4)
    aux = torch.randn(5, 3 * H, generator=torch.Generator().manual_seed(5))
    sample, feed = model(ids, pos, aux, md, caches)
    md2 = dataclasses.replace(md, slot_mapping=md.slot_mapping + 5, seq_lens=md.seq_lens + 5)
    sample2, _ = model(ids, pos + 5, feed, md2, caches)
    return model.compute_logits(sample), model.compute_logits(sample2)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_speculators_folder_equals_the_plain_layout(tmp_path, variant):
    top, layer_changes, plain_keys, extra = VARIANTS[variant]
    hf, t = eagle3_checkpoint()
    t = t | {"embed_tokens.weight": rand(V, H)} | {name: 1 + 0.3 * rand(*shape) for name, shape in extra.items()}
    plain = load_draft_model(write_folder(tmp_path / "plain", {**hf, **plain_keys}, t))
    spec_hf = speculators_config(layer_config(**layer_changes), **top)
    spec = load_draft_model(write_folder(tmp_path / "spec", spec_hf, speculators_names(t)))
    assert spec.config == plain.config
    assert spec.config.extra["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [2, 5, 7]}
    for (n1, a), (n2, b) in zip(plain.state_dict().items(), spec.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(a, b), n1
    with torch.no_grad():
        for a, b in zip(run_two_steps(plain), run_two_steps(spec), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_left_out_layer_keys_take_transformers_defaults(model_type):
    """A layer config holding only what differs from its class's defaults reads as
    transformers reads it (Qwen3Config's head_dim is 128 whatever the width; Llama's
    kv heads default to the head count)."""
    transformers = pytest.importorskip("transformers", reason="transformers is the oracle for the defaults")
    diff = {"model_type": model_type, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 32}
    diff |= {"num_hidden_layers": 1, "vocab_size": 300}
    ours = speculators_to_hf(speculators_config(diff))
    theirs = transformers.AutoConfig.for_model(**diff)
    rope = getattr(theirs, "rope_parameters", None) or {"rope_theta": theirs.rope_theta}
    assert ours["rope_theta"] == rope["rope_theta"]
    for key in ("num_key_value_heads", "rms_norm_eps", "hidden_act", "attention_bias", "max_position_embeddings"):
        assert ours[key] == getattr(theirs, key), key
    head_dim = getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    assert DraftModelConfig.from_hf_config(ours).head_dim == head_dim
    # The table itself, against the class's defaults (None: derived from the head count).
    default = transformers.AutoConfig.for_model(model_type)
    default_rope = getattr(default, "rope_parameters", None) or {"rope_theta": default.rope_theta}
    for key, value in LAYER_CONFIG_DEFAULTS[model_type].items():
        want = default_rope["rope_theta"] if key == "rope_theta" else getattr(default, key)
        if value is None:
            derived = default.hidden_size // default.num_attention_heads
            assert want in (None, default.num_attention_heads if key == "num_key_value_heads" else derived), key
        else:
            assert value == want, key


def test_transformers_5_rope_parameters_carry_the_theta(tmp_path):
    hf, t = eagle3_checkpoint()
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    spec = speculators_config(layer_config(rope_parameters=rope))
    loaded = load_draft_model(write_folder(tmp_path / "spec", spec, speculators_names(t)))
    plain = load_draft_model(write_folder(tmp_path / "plain", {**hf, "rope_theta": 500000.0}, t))
    assert loaded.config == plain.config and loaded.config.rope_theta == 500000.0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"speculators_model_type": "mtp"}, "speculators_model_type: 'mtp'"),
        ({"speculators_model_type": "dflash"}, "speculators_model_type: 'dflash'"),
        ({"transformer_layer_config": layer_config(model_type=None)}, "transformer_layer_config.model_type: missing"),
        ({"transformer_layer_config": layer_config(model_type="mistral")}, "transformer_layer_config.model_type"),
        ({"transformer_layer_config": layer_config(num_hidden_layers=2)}, "num_hidden_layers: 2"),
        ({"transformer_layer_config": layer_config(num_hidden_layers=None)}, "num_hidden_layers: 32"),
        ({"transformer_layer_config": "llama"}, "transformer_layer_config: missing or not an object"),
        ({"draft_vocab_size": None}, "draft_vocab_size: missing"),
        ({"norm_before_residual": None}, "norm_before_residual: missing"),
        ({"norm_output": 1}, "norm_output: expected true or false"),
        ({"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}, "eagle_aux_hidden_state_layer_ids"),
        ({"norm_before_fc": True, "fc_norm": True}, "fc_norm and norm_before_fc"),
        (
            {"transformer_layer_config": layer_config(sliding_window=64, use_sliding_window=True)},
            "sliding_window: sliding-window attention",
        ),
        ({"transformer_layer_config": layer_config(hidden_act="gelu")}, "hidden_act"),
    ],
)
def test_speculators_refusals_name_the_key(tmp_path, change, message):
    hf, t = eagle3_checkpoint()
    with pytest.raises(ValueError, match=message):
        load_draft_model(write_folder(tmp_path / "m", {**speculators_config(), **change}, speculators_names(t)))


def test_a_variant_the_config_does_not_carry_out_is_refused_by_its_key(tmp_path, monkeypatch):
    """If DraftModelConfig dropped a speculators setting (a version without that
    variant), loading names the speculators key instead of running the plain head."""
    hf, t = eagle3_checkpoint()
    folder = write_folder(tmp_path / "m", speculators_config(norm_output=True), speculators_names(t))
    build = DraftModelConfig.from_hf_config

    def without_hidden_feed(hf, dtype=None):
        return dataclasses.replace(build(hf, dtype), hidden_feed="prenorm")

    monkeypatch.setattr(DraftModelConfig, "from_hf_config", without_hidden_feed)
    with pytest.raises(ValueError, match="norm_output: 'normed' for hidden_feed is not supported"):
        load_draft_model(folder)


def test_speculators_folder_is_what_vllm_reads():
    """Written where vLLM's translation and the speculators library agree: the
    translated dict carries vLLM's keys (draft_vocab_size, target_hidden_size,
    norm_before_residual, the aux layer ids) and nothing of the speculators wrapper."""
    ours = speculators_to_hf(speculators_config(target_hidden_size=2 * H, norm_before_residual=True))
    assert ours["draft_vocab_size"] == DV and ours["target_hidden_size"] == 2 * H
    assert ours["norm_before_residual"] is True and ours["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        2,
        5,
        7,
    ]
    assert not {"speculators_model_type", "speculators_config", "transformer_layer_config", "norm_output"} & set(ours)
