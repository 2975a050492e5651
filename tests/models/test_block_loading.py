"""Loading and saving block drafters in DeepSpec's layout
(specdraft.models.block_loading): checkpoints written here by hand from DeepSpec's
layout (config keys and tensor names as its save_pretrained writes them, not from the
head's state_dict) load with every weight in place; save -> load is exact, sharded
too; weights left out for the target are recorded; and every refusal is a ValueError
naming the key or tensor. (DeepSpec's own save_pretrained / from_pretrained are
checked against these in scripts/check_against_deepspec.py, outside CI.)"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import specdraft
from specdraft.models import load_draft_model
from specdraft.models.block_config import block_settings_from_hf
from specdraft.models.block_loading import load_block_drafter
from specdraft.models.block_saving import block_hf_config, save_block_drafter
from specdraft.models.config import DraftModelConfig
from specdraft.models.heads.block import BlockConfig, BlockDraftHead
from specdraft.models.heads.block_gemma4 import Gemma4BlockDraftHead, Gemma4Settings
from specdraft.models.safetensors_io import INDEX, write_safetensors

V, H, HEADS, KV, D, FFN, LAYERS, RANK = 40, 16, 4, 2, 8, 24, 2, 4
IDS = [-1, 1, 2]


def deepspec_keys(markov=None, confidence=False, with_markov=False):
    keys = {"block_size": 4, "mask_token_id": 3, "target_layer_ids": IDS, "num_target_layers": 4, "num_anchors": 512,
            "markov_rank": RANK if markov else 0, "enable_confidence_head": confidence}  # fmt: skip
    if markov:
        keys["markov_head_type"] = markov
    if confidence:
        keys["confidence_head_with_markov"] = with_markov
    return keys


def qwen3_config_json(**block):
    """A released DeepSpec Qwen3 config.json's keys (the target's Qwen3Config copy,
    DeepSpec's additions)."""
    return {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "dtype": "float32", "head_dim": D,
        "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02, "intermediate_size": FFN,
        "layer_types": ["full_attention"] * LAYERS, "max_position_embeddings": 40960, "max_window_layers": 36,
        "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "num_key_value_heads": KV, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}, "sliding_window": None,
        "tie_word_embeddings": False, "transformers_version": "5.10.2", "use_cache": True,
        "use_sliding_window": False, "vocab_size": V, **deepspec_keys(**block),
    }  # fmt: skip


def gemma4_config_json(k_eq_v=True, **block):
    """A DeepSpec Gemma4 config.json's keys (the target's text config, DeepSpec's
    additions)."""
    return {
        "architectures": ["Gemma4DSparkModel"], "model_type": "gemma4_text", "target_model_type": "gemma4",
        "target_text_model_type": "gemma4_text", "attention_bias": False, "attention_dropout": 0.0,
        "attention_k_eq_v": k_eq_v, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "dtype": "float32",
        "enable_moe_block": False, "final_logit_softcapping": 30.0, "global_head_dim": D, "head_dim": 4,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": H, "hidden_size_per_layer_input": 0,
        "initializer_range": 0.02, "intermediate_size": FFN, "layer_types": ["full_attention"] * LAYERS,
        "max_position_embeddings": 131072, "moe_intermediate_size": None, "num_attention_heads": HEADS,
        "num_experts": None, "num_global_key_value_heads": 1, "num_hidden_layers": LAYERS, "num_key_value_heads": KV,
        "num_kv_shared_layers": 0, "rms_norm_eps": 1e-6, "sliding_window": 512, "top_k_experts": None,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "tie_word_embeddings": False, "transformers_version": "5.10.2", "use_bidirectional_attention": None,
        "use_cache": True, "use_double_wide_mlp": False, "vocab_size": V, "vocab_size_per_layer_input": 262144,
        **deepspec_keys(**block),
    }  # fmt: skip


def deepspec_tensors(hf, seed=0):
    """The tensors DeepSpec's save_pretrained writes for `hf`, named and shaped from
    its modules (deepspec/modeling/dspark/{qwen3,gemma4}/modeling.py, markov_head.py,
    common.py)."""
    gen = torch.Generator().manual_seed(seed)
    gemma = hf["architectures"] == ["Gemma4DSparkModel"]
    d = hf["global_head_dim"] if gemma else hf["head_dim"]
    kv = hf["num_global_key_value_heads"] if gemma and hf["attention_k_eq_v"] else hf["num_key_value_heads"]
    shapes = {"embed_tokens.weight": (V, H), "lm_head.weight": (V, H), "fc.weight": (H, len(IDS) * H),
              "hidden_norm.weight": (H,), "norm.weight": (H,)}  # fmt: skip
    for i in range(LAYERS):
        p = f"layers.{i}."
        shapes |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                   p + "self_attn.q_proj.weight": (HEADS * d, H), p + "self_attn.k_proj.weight": (kv * d, H),
                   p + "self_attn.o_proj.weight": (H, HEADS * d), p + "self_attn.q_norm.weight": (d,),
                   p + "self_attn.k_norm.weight": (d,), p + "mlp.gate_proj.weight": (FFN, H),
                   p + "mlp.up_proj.weight": (FFN, H), p + "mlp.down_proj.weight": (H, FFN)}  # fmt: skip
        if not (gemma and hf["attention_k_eq_v"]):
            shapes[p + "self_attn.v_proj.weight"] = (kv * d, H)
        if gemma:
            shapes |= {p + "pre_feedforward_layernorm.weight": (H,), p + "post_feedforward_layernorm.weight": (H,),
                       p + "layer_scalar": (1,)}  # fmt: skip
    r = hf["markov_rank"]
    if r:
        shapes |= {"markov_head.markov_w1.weight": (V, r), "markov_head.markov_w2.weight": (V, r)}
        if hf["markov_head_type"] == "gated":
            shapes |= {"markov_head.gate_proj.weight": (r, H + r), "markov_head.gate_proj.bias": (r,)}
        if hf["markov_head_type"] == "rnn":
            shapes |= {"markov_head.joint_proj.weight": (3 * r, 2 * r + H), "markov_head.joint_proj.bias": (3 * r,)}
    if hf["enable_confidence_head"]:
        width = H + (r if hf["confidence_head_with_markov"] else 0)
        shapes |= {"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)}
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def write_folder(folder, hf, tensors):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf))
    write_safetensors(folder / "model.safetensors", tensors, {"format": "pt"})
    return folder


CHECKPOINTS = [
    pytest.param(qwen3_config_json, {}, id="qwen3-dflash"),
    pytest.param(qwen3_config_json, {"markov": "gated", "confidence": True, "with_markov": True}, id="qwen3-dspark"),
    pytest.param(qwen3_config_json, {"markov": "rnn", "confidence": True}, id="qwen3-dspark-rnn"),
    pytest.param(gemma4_config_json, {"markov": "vanilla", "confidence": True, "with_markov": True}, id="gemma4"),
    pytest.param(gemma4_config_json, {"k_eq_v": False}, id="gemma4-v_proj"),
]


@pytest.mark.parametrize("make_config,kwargs", CHECKPOINTS)
def test_deepspec_layout_loads_every_weight_by_name(tmp_path, make_config, kwargs):
    hf = make_config(**kwargs)
    tensors = deepspec_tensors(hf)
    head = load_block_drafter(write_folder(tmp_path / "ckpt", hf, tensors))
    assert isinstance(head, Gemma4BlockDraftHead if "gemma4" in hf["model_type"] else BlockDraftHead)
    state = head.state_dict()
    assert set(state) == set(tensors)
    for name, value in tensors.items():
        assert torch.equal(state[name], value), name
    b = head.block
    assert (b.block_size, b.mask_token_id, b.target_layer_ids, b.num_target_layers) == (4, 3, tuple(IDS), 4)
    assert (b.markov_rank, b.markov_head_type) == (hf["markov_rank"], hf.get("markov_head_type"))
    assert (b.confidence_head, b.confidence_with_markov) == (
        hf["enable_confidence_head"], hf.get("confidence_head_with_markov", False))  # fmt: skip
    assert b.aux_layers == (0, 2, 3)
    assert head.missing_weights == frozenset()
    if isinstance(head, Gemma4BlockDraftHead):
        assert head.gemma == Gemma4Settings(0.25, 1.0, hf["attention_k_eq_v"], 30.0)
        assert head.config.head_dim == D and head.config.num_kv_heads == (1 if hf["attention_k_eq_v"] else KV)
        assert head.attention_scale == 1.0
    else:
        assert head.config.qk_norm and head.config.rope_theta == 1000000
    # load_draft_model tells a block drafter by its architectures (its fc.weight would say EAGLE).
    auto = load_draft_model(tmp_path / "ckpt")
    assert type(auto) is type(head) and all(torch.equal(auto.state_dict()[k], v) for k, v in tensors.items())


def make_head(kind: str, markov=None, confidence=False, with_markov=False, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = DraftModelConfig(hidden_size=H, intermediate_size=FFN, num_heads=HEADS, num_kv_heads=KV, head_dim=D,
                           vocab_size=V, num_layers=LAYERS, qk_norm=kind != "llama", rope_theta=5000.0,
                           target_hidden_size=12, dtype=dtype)  # fmt: skip
    block = BlockConfig(block_size=4, mask_token_id=3, target_layer_ids=tuple(IDS), num_target_layers=4,
                        markov_rank=RANK if markov else 0, markov_head_type=markov, confidence_head=confidence,
                        confidence_with_markov=with_markov)  # fmt: skip
    if kind == "gemma4":
        head = Gemma4BlockDraftHead(cfg, block, Gemma4Settings(0.5, 2.0, True, 15.0))
    else:
        head = BlockDraftHead(cfg, block)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p))
        for b in head.buffers():
            b.copy_(torch.rand_like(b))
    return head


ROUND_TRIPS = [
    pytest.param("qwen3", {}, id="qwen3-dflash"),
    pytest.param("qwen3", {"markov": "rnn", "confidence": True, "with_markov": True}, id="qwen3-dspark"),
    pytest.param("llama", {"markov": "vanilla"}, id="llama-dspark"),
    pytest.param("gemma4", {"markov": "gated", "confidence": True}, id="gemma4-dspark"),
    pytest.param("qwen3", {"dtype": torch.bfloat16}, id="qwen3-bf16"),
]


@pytest.mark.parametrize("kind,kwargs", ROUND_TRIPS)
@pytest.mark.parametrize("shard", [None, 2000], ids=["one-file", "sharded"])
def test_save_then_load_is_exact(tmp_path, kind, kwargs, shard):
    head = make_head(kind, **kwargs)
    save_block_drafter(head, tmp_path, max_shard_bytes=shard)
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    if shard is None:
        assert files == ["model.safetensors"] and not (tmp_path / INDEX).exists()
    else:
        assert len(files) > 2 and (tmp_path / INDEX).is_file()
        index = json.loads((tmp_path / INDEX).read_text())
        assert set(index["weight_map"]) == set(head.state_dict()) and set(index["weight_map"].values()) == set(files)
    loaded = load_block_drafter(tmp_path)
    assert type(loaded) is type(head)
    assert (loaded.config, loaded.block, getattr(loaded, "gemma", None)) == (
        head.config, head.block, getattr(head, "gemma", None))  # fmt: skip
    mine, theirs = head.state_dict(), loaded.state_dict()
    assert set(mine) == set(theirs)
    for name, value in mine.items():
        assert value.dtype == theirs[name].dtype and torch.equal(value, theirs[name]), name
    # The written config.json is the one this head describes, and reads back the same.
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf == json.loads(json.dumps(block_hf_config(head)))
    assert hf["architectures"] == [{"qwen3": "Qwen3DSparkModel", "llama": "LlamaDSparkModel",
                                    "gemma4": "Gemma4DSparkModel"}[kind]]  # fmt: skip
    # Saving again in the other layout leaves no stale weight file behind.
    save_block_drafter(head, tmp_path, max_shard_bytes=None if shard else 2000)
    assert load_block_drafter(tmp_path).block == head.block


class Target(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, H)
        self.lm_head = nn.Linear(H, V, bias=False)


def test_checkpoints_without_embedding_and_lm_head_take_the_targets(tmp_path):
    hf = qwen3_config_json(markov="vanilla")
    tensors = {k: v for k, v in deepspec_tensors(hf).items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    head = load_block_drafter(write_folder(tmp_path, hf, tensors))
    assert head.missing_weights == {"embed_tokens", "lm_head"}
    with pytest.raises(RuntimeError, match="share_from"):
        head.block_hidden(torch.zeros(4, dtype=torch.long), torch.arange(4), lambda i: None)
    target = Target()
    head.share_from(target)
    assert head.missing_weights == frozenset() and head.lm_head is target.lm_head
    # save_block_drafter leaves out what it was asked to (vLLM style) and what it never had.
    save_block_drafter(head, tmp_path / "shared", shared=("embed_tokens", "lm_head"))
    assert load_block_drafter(tmp_path / "shared").missing_weights == {"embed_tokens", "lm_head"}
    with pytest.raises(ValueError, match="shared"):
        save_block_drafter(head, tmp_path / "bad", shared=("fc",))


def test_legacy_dspark_draft_model_reads_its_dflash_config(tmp_path):
    hf = qwen3_config_json(markov="vanilla", confidence=True, with_markov=True)
    tensors = deepspec_tensors(hf)
    legacy = {k: v for k, v in hf.items() if k not in ("mask_token_id", "target_layer_ids", "num_target_layers")}
    legacy |= {"architectures": ["DSparkDraftModel"], "projector_type": "dspark", "attention_mode": "gqa",
               "dflash_config": {"mask_token_id": 3, "target_layer_ids": IDS, "markov_rank": RANK,
                                 "projector_type": "dspark"}}  # fmt: skip
    with pytest.raises(ValueError, match="num_target_layers"):
        load_block_drafter(write_folder(tmp_path, legacy, tensors))
    head = load_block_drafter(tmp_path, num_target_layers=4)
    assert head.block == load_block_drafter(write_folder(tmp_path / "new", hf, tensors)).block
    # A legacy config renamed to Qwen3DSparkModel by hand, its dflash_config kept, reads the same.
    renamed = edit(legacy, architectures=["Qwen3DSparkModel"], num_target_layers=4)
    assert load_block_drafter(write_folder(tmp_path / "renamed", renamed, tensors)).block == head.block
    with pytest.raises(ValueError, match="num_target_layers"):
        load_block_drafter(tmp_path / "new", num_target_layers=5)


def vllm_flat_config():
    """vLLM's dspark keys on top of DeepSpec's."""
    hf = qwen3_config_json(markov="vanilla")
    del hf["markov_head_type"]  # vLLM reads a missing type as vanilla
    return hf | {"sample_from_anchor": True, "draft_vocab_size": V, "dspark_draft_topk": None}


def test_vllm_flat_dspark_keys_load(tmp_path):
    hf = vllm_flat_config()
    head = load_block_drafter(write_folder(tmp_path, hf, deepspec_tensors(qwen3_config_json(markov="vanilla"))))
    assert head.block.markov_head_type == "vanilla"


def edit(base, **changes):
    out = dict(base)
    for key, value in changes.items():
        if value is DELETE:
            out.pop(key, None)
        else:
            out[key] = value
    return out


DELETE = object()
Q = qwen3_config_json(markov="gated")
G = gemma4_config_json()
CONFIG_REFUSALS = [
    pytest.param(edit(Q, quantization_config={"quant_method": "fp8"}), "quantization_config", id="quantized"),
    pytest.param(edit(Q, some_new_key=1), "some_new_key", id="unknown-key"),
    pytest.param(
        edit(Q, architectures=["DFlashDraftModel"], dflash_config={"mask_token_id": 3}), "z-lab", id="zlab-dflash"
    ),  # fmt: skip
    pytest.param(edit(Q, architectures=["Qwen3ForCausalLM"]), "architectures", id="not-a-block-drafter"),
    pytest.param(edit(Q, sample_from_anchor=False), "sample_from_anchor", id="sample_from_anchor-false"),
    pytest.param(edit(Q, dspark_draft_topk=64), "dspark_draft_topk", id="vllm-topk"),
    pytest.param(edit(Q, draft_vocab_size=V // 2), "draft_vocab_size", id="reduced-vocab"),
    pytest.param(edit(Q, model_type="llama"), "model_type", id="model_type"),
    pytest.param(edit(Q, layer_types=["sliding_attention"] * LAYERS), "layer_types", id="sliding-layers"),
    pytest.param(edit(Q, use_sliding_window=True, sliding_window=64), "sliding_window", id="sliding-window"),
    pytest.param(edit(Q, hidden_act="gelu"), "hidden_act", id="hidden_act"),
    pytest.param(
        edit(Q, rope_parameters={"rope_theta": 1e6, "rope_type": "default", "partial_rotary_factor": 0.5}),
        "partial_rotary_factor",
        id="partial-rope",
    ),  # fmt: skip
    pytest.param(edit(Q, markov_head_type="lstm"), "markov_head_type", id="markov-type"),
    pytest.param(edit(Q, markov_rank=True), "markov_rank", id="markov-rank-bool"),
    pytest.param(edit(Q, block_size=DELETE), "block_size", id="no-block_size"),
    pytest.param(edit(Q, target_layer_ids=[0, 3]), "target_layer_ids", id="last-target-layer"),
    pytest.param(edit(Q, enable_confidence_head="yes"), "enable_confidence_head", id="confidence-flag"),
    pytest.param(edit(Q, tie_word_embeddings=True), "tie_word_embeddings", id="tied-with-weights"),
    pytest.param(edit(Q, mask_token_id=V), "mask_token_id", id="mask-outside-vocab"),
    pytest.param(
        edit(Q, architectures=["DSparkDraftModel"], model_type="deepseek_v4"), "DeepSeek-V4", id="legacy-deepseek-v4"
    ),  # fmt: skip
    pytest.param(
        edit(Q, architectures=["DSparkDraftModel"], dflash_config={"mask_token_id": 4}),
        "dflash_config.mask_token_id",
        id="legacy-disagrees",
    ),  # fmt: skip
    pytest.param(
        edit(Q, architectures=["DSparkDraftModel"], dflash_config={"shift_label": True}),
        "dflash_config.shift_label",
        id="legacy-unknown",
    ),  # fmt: skip
    pytest.param(
        edit(Q, architectures=["DSparkDraftModel"], projector_type="domino"), "projector_type", id="legacy-projector"
    ),  # fmt: skip
    pytest.param(edit(G, enable_moe_block=True), "enable_moe_block", id="gemma-moe"),
    pytest.param(edit(G, hidden_size_per_layer_input=256), "hidden_size_per_layer_input", id="gemma-ple"),
    pytest.param(edit(G, hidden_activation="gelu"), "hidden_activation", id="gemma-act"),
    pytest.param(edit(G, use_double_wide_mlp=True, num_kv_shared_layers=1), "use_double_wide_mlp", id="gemma-wide"),
    pytest.param(edit(G, num_global_key_value_heads=None), "num_global_key_value_heads", id="gemma-k_eq_v-heads"),
    pytest.param(edit(G, global_head_dim=DELETE), "global_head_dim", id="gemma-global_head_dim"),
    pytest.param(
        edit(G, rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1e6}}),
        "rope type 'yarn'",
        id="gemma-rope-type",
    ),  # fmt: skip
    pytest.param(
        edit(G, rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
        "head_dim != global_head_dim",
        id="gemma-default-rope-ambiguous",
    ),  # fmt: skip
    pytest.param(edit(G, final_logit_softcapping=-1.0), "final_logit_softcapping", id="gemma-softcap"),
    pytest.param(edit(G, attn_logit_softcapping=50.0), "attn_logit_softcapping", id="gemma-attn-softcap"),
]


@pytest.mark.parametrize("hf,word", CONFIG_REFUSALS)
def test_config_refusals_name_the_key(tmp_path, hf, word):
    tensors = deepspec_tensors(Q if hf.get("model_type") != "gemma4_text" else G)
    with pytest.raises(ValueError, match=word):
        load_block_drafter(write_folder(tmp_path, hf, tensors))


def test_tensor_refusals_name_the_tensor(tmp_path):
    tensors = deepspec_tensors(Q)
    cases = [
        ({k: v for k, v in tensors.items() if k != "layers.1.mlp.up_proj.weight"}, "layers.1.mlp.up_proj.weight"),
        (tensors | {"mask_embedding": torch.zeros(H)}, "mask_embedding"),
        (tensors | {"fc.weight": torch.zeros(H, 2 * H)}, "fc.weight"),
        (tensors | {"markov_head.markov_w1.weight": torch.zeros(V, RANK, dtype=torch.int32)}, "markov_w1"),
        (tensors | {"model.norm.weight": tensors["norm.weight"]}, "norm.weight"),
    ]
    for i, (bad, word) in enumerate(cases):
        with pytest.raises(ValueError, match=word):
            load_block_drafter(write_folder(tmp_path / str(i), Q, bad))
    # A gated head declared vanilla: its gate_proj is unexpected, not silently dropped.
    with pytest.raises(ValueError, match="gate_proj"):
        load_block_drafter(write_folder(tmp_path / "vanilla", edit(Q, markov_head_type="vanilla"), tensors))


def test_scaled_rope_of_a_qwen3_config_reads_and_round_trips(tmp_path):
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    hf = edit(Q, rope_parameters=rope)
    head = load_block_drafter(write_folder(tmp_path / "yarn", hf, deepspec_tensors(Q)))
    scaling = head.config.rope_scaling
    assert (scaling.rope_type, scaling.factor, scaling.original_max_position_embeddings) == ("yarn", 4.0, 32768)
    # Without a factor, YaRN's is max_position_embeddings / original (transformers' rule).
    derived = block_settings_from_hf(edit(hf, rope_parameters={k: v for k, v in rope.items() if k != "factor"}))
    assert derived.config.rope_scaling.factor == 40960 / 32768
    save_block_drafter(head, tmp_path / "again")
    assert load_block_drafter(tmp_path / "again").config == head.config


def test_deepspec_defaults_and_ignored_keys():
    # No Markov head: a stray markov_head_type is ignored (DeepSpec ignores it); no
    # confidence head: confidence_head_with_markov is ignored; rope_parameters None
    # is Gemma4's default proportional RoPE.
    hf = edit(qwen3_config_json(), markov_head_type="gated", confidence_head_with_markov=True)
    settings = block_settings_from_hf(hf)
    assert settings.block.markov_head_type is None and not settings.block.confidence_with_markov
    gemma = block_settings_from_hf(edit(G, rope_parameters=None))
    assert gemma.gemma.partial_rotary_factor == 0.25 and gemma.config.rope_theta == 1_000_000.0
    assert block_settings_from_hf(G, dtype=torch.bfloat16).config.dtype == torch.bfloat16


def test_checked_mode_names_a_nan_weight_and_its_shard(tmp_path):
    head = make_head("qwen3", markov="vanilla")
    with torch.no_grad():
        head.layers[1].mlp.down_proj.weight[2, 3] = float("nan")
    save_block_drafter(head, tmp_path, max_shard_bytes=2000)
    shard = json.loads((tmp_path / INDEX).read_text())["weight_map"]["layers.1.mlp.down_proj.weight"]
    with specdraft.checked(), pytest.raises(ValueError, match=f"'layers.1.mlp.down_proj.weight' in '{shard}'"):
        load_block_drafter(tmp_path)
    with specdraft.checked(False):
        assert load_block_drafter(tmp_path).layers[1].mlp.down_proj.weight[2, 3].isnan()
