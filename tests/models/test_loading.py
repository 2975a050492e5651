"""DraftModelConfig from HF config dicts, the safetensors reader / writer, and loading
tiny random checkpoints written here in the published EAGLE / EAGLE-3 / MTP layouts."""

import json
import struct

import pytest
import torch

from specdraft.models import (
    BatchMetadata,
    DraftModelConfig,
    Eagle3Head,
    EagleHead,
    MTPHead,
    TinyTargetModel,
    load_draft_model,
    read_safetensors,
    save_draft_model,
    write_safetensors,
)

H, FF, NH, KV, HD, V, DV = 16, 24, 4, 2, 4, 40, 12
HF = {
    "hidden_size": H,
    "intermediate_size": FF,
    "num_attention_heads": NH,
    "num_key_value_heads": KV,
    "vocab_size": V,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",
}


def rand(*shape, seed=[0]):  # noqa: B006 - a counter shared by every call
    seed[0] += 1
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed[0]))


def layer_tensors(prefix, attn_in=H, input_norm=True):
    t = {
        f"{prefix}self_attn.q_proj.weight": rand(NH * HD, attn_in),
        f"{prefix}self_attn.k_proj.weight": rand(KV * HD, attn_in),
        f"{prefix}self_attn.v_proj.weight": rand(KV * HD, attn_in),
        f"{prefix}self_attn.o_proj.weight": rand(H, NH * HD),
        f"{prefix}mlp.gate_proj.weight": rand(FF, H),
        f"{prefix}mlp.up_proj.weight": rand(FF, H),
        f"{prefix}mlp.down_proj.weight": rand(H, FF),
        f"{prefix}post_attention_layernorm.weight": rand(H),
    }
    if input_norm:
        t[f"{prefix}input_layernorm.weight"] = rand(H)
    return t


def eagle3_checkpoint():
    t = {**layer_tensors("midlayer.", attn_in=2 * H), "midlayer.hidden_norm.weight": rand(H)}
    t |= {"fc.weight": rand(H, 3 * H), "norm.weight": rand(H), "lm_head.weight": rand(DV, H)}
    targets = torch.arange(DV) * 3  # draft id d -> target id 3d
    t["d2t"] = targets - torch.arange(DV)
    t["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill(0, targets, True)
    return {**HF, "draft_vocab_size": DV, "architectures": ["LlamaForCausalLMEagle3"]}, t


def eagle1_checkpoint(prefix="layers.0."):
    t = {**layer_tensors(prefix, input_norm=False), "fc.weight": rand(H, 2 * H), "fc.bias": rand(H)}
    return dict(HF), t | {"embed_tokens.weight": rand(V, H)}


def mtp_checkpoint(first=61, n=2, per_layer=True):
    t = {"model.embed_tokens.weight": rand(V, H)}
    for k in range(first, first + n):
        p = f"model.layers.{k}."
        t |= {f"model.{k2}": v for k2, v in layer_tensors(f"layers.{k}.").items()}
        t |= {p + "enorm.weight": rand(H), p + "hnorm.weight": rand(H), p + "eh_proj.weight": rand(H, 2 * H)}
        t[p + "shared_head.norm.weight"] = rand(H)
        if per_layer:
            t[p + "shared_head.head.weight"] = rand(V, H)
    return {**HF, "num_nextn_predict_layers": n}, t


def write_folder(path, hf, tensors, shards=1):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf))
    names = sorted(tensors)
    for s in range(shards):
        write_safetensors(path / f"model-{s:05d}.safetensors", {n: tensors[n] for n in names[s::shards]})
    return path


def tiny_batch(t=5):
    md = BatchMetadata(
        query_start_loc=torch.tensor([0, t], dtype=torch.int32),
        seq_lens=torch.tensor([t], dtype=torch.int32),
        block_table=torch.tensor([[0, 1]], dtype=torch.int32),
        slot_mapping=torch.arange(t),
        max_query_len=t,
    )
    return torch.arange(t, dtype=torch.int32), torch.arange(t), md


# ------------------------------------------------------------------ safetensors


def test_safetensors_round_trip_every_dtype(tmp_path):
    tensors = {
        "f32": rand(3, 4),
        "bf16": rand(5).to(torch.bfloat16),
        "f16": rand(2, 2).to(torch.float16),
        "i64": torch.tensor([-3, 2**40]),
        "i32": torch.tensor([[1, -2]], dtype=torch.int32),
        "bool": torch.tensor([True, False, True]),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(2.5),
    }
    write_safetensors(tmp_path / "x.safetensors", tensors, metadata={"format": "pt"})
    back = read_safetensors(tmp_path / "x.safetensors")
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        torch.testing.assert_close(back[k], v, rtol=0, atol=0)


def test_safetensors_reader_follows_the_format(tmp_path):
    """A file assembled by hand from the spec: header length, JSON, raw bytes."""
    data = struct.pack("<3f", 1.0, -2.0, 0.5) + struct.pack("<2q", 7, -9)
    header = json.dumps({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                         "b": {"dtype": "I64", "shape": [1, 2], "data_offsets": [12, 28]}}).encode()  # fmt: skip
    (tmp_path / "h.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data)
    back = read_safetensors(tmp_path / "h.safetensors")
    assert back["a"].tolist() == [1.0, -2.0, 0.5] and back["b"].tolist() == [[7, -9]]


# ------------------------------------------------------------------ config


def test_config_from_hf_defaults_and_mrope():
    c = DraftModelConfig.from_hf_config({**HF, "rope_scaling": {"type": "mrope", "mrope_section": [1, 0, 1]}})
    assert (c.head_dim, c.num_kv_heads, c.draft_vocab_size, c.target_hidden_size) == (HD, KV, V, H)
    assert c.mrope_section == (1, 0, 1) and c.dtype == torch.float32 and c.n_predict == 1
    assert DraftModelConfig.from_hf_config(c.to_hf_config()) == c
    assert DraftModelConfig.from_hf_config(HF, dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "change, field",
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_key_value_heads": 3}, "num_kv_heads"),
        ({"hidden_size": 18}, "head_dim"),
        ({"draft_vocab_size": V + 1}, "draft_vocab_size"),
        ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
        ({"rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 1]}}, "mrope_section"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
        ({"torch_dtype": "int8"}, "torch_dtype"),
        ({"num_nextn_predict_layers": -2}, "n_predict"),
    ],
)
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        DraftModelConfig.from_hf_config({**HF, **change})


def test_config_missing_key():
    with pytest.raises(ValueError, match="intermediate_size"):
        DraftModelConfig.from_hf_config({k: v for k, v in HF.items() if k != "intermediate_size"})


# ------------------------------------------------------------------ loading


def test_load_eagle3_published_layout(tmp_path):
    hf, t = eagle3_checkpoint()
    model = load_draft_model(write_folder(tmp_path / "e3", hf, t, shards=2))
    assert isinstance(model, Eagle3Head)
    state = model.state_dict()
    for name, value in t.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)
    assert model.missing_weights == {"embed_tokens"}
    without_t2d = load_draft_model(write_folder(tmp_path / "no_t2d", hf, {k: v for k, v in t.items() if k != "t2d"}))
    assert without_t2d.t2d.tolist() == t["t2d"].tolist()
    assert model.map_draft_to_target(torch.tensor([0, 5, 11])).tolist() == [0, 15, 33]
    model.share_from(TinyTargetModel(model.config))
    ids, pos, md = tiny_batch()
    out, _ = model(ids, pos, torch.randn(5, 3 * H), md, model.allocate_kv_caches(2, 4))
    assert model.compute_logits(out).shape == (5, V)


def test_load_eagle1_with_midlayer_names_and_bias(tmp_path):
    hf, t = eagle1_checkpoint(prefix="midlayer.")
    model = load_draft_model(write_folder(tmp_path / "e1", hf, t))
    assert isinstance(model, EagleHead)
    assert model.layers[0].input_layernorm is None and model.norm is None and model.fc.bias is not None
    torch.testing.assert_close(model.layers[0].self_attn.q_proj.weight, t["midlayer.self_attn.q_proj.weight"])
    assert model.missing_weights == {"lm_head"}


def test_load_mtp_renumbers_deepseek_layers(tmp_path):
    hf, t = mtp_checkpoint(first=61, n=2)
    model = load_draft_model(write_folder(tmp_path / "mtp", hf, t), dtype=torch.bfloat16)
    assert isinstance(model, MTPHead) and model.per_layer_lm_head and model.config.n_predict == 2
    torch.testing.assert_close(model.layers[1].eh_proj.weight, t["model.layers.62.eh_proj.weight"].to(torch.bfloat16))
    assert model.layers[0].eh_proj.weight.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "build",
    [
        lambda: EagleHead(DraftModelConfig.from_hf_config(HF), fc_bias=True),
        lambda: Eagle3Head(DraftModelConfig.from_hf_config({**HF, "draft_vocab_size": DV})),
        lambda: MTPHead(DraftModelConfig.from_hf_config({**HF, "num_nextn_predict_layers": 2})),
    ],
    ids=["eagle", "eagle3", "mtp"],
)
def test_save_load_round_trip(tmp_path, build):
    torch.manual_seed(0)
    model = build()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    if isinstance(model, Eagle3Head):
        model.d2t.copy_(torch.arange(DV) * 2)
    save_draft_model(model, tmp_path / "m")
    back = load_draft_model(tmp_path / "m")
    assert type(back) is type(model) and back.config == model.config
    for (n1, a), (n2, b) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        assert n1 == n2
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=n1)
    ids, pos, md = tiny_batch()
    hidden = torch.randn(5, 3 * H if isinstance(model, Eagle3Head) else H)
    for spec_step_idx in (0, 1) if isinstance(model, MTPHead) else (0,):
        a = model(ids, pos, hidden, md, model.allocate_kv_caches(2, 4), spec_step_idx)[0]
        b = back(ids, pos, hidden, md, back.allocate_kv_caches(2, 4), spec_step_idx)[0]
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_load_errors_name_the_tensor(tmp_path):
    hf, t = eagle3_checkpoint()
    missing = {k: v for k, v in t.items() if k != "midlayer.self_attn.k_proj.weight"}
    with pytest.raises(ValueError, match=r"'midlayer.self_attn.k_proj.weight' is missing"):
        load_draft_model(write_folder(tmp_path / "a", hf, missing))
    with pytest.raises(ValueError, match=r"'fc.weight' has shape \(16, 40\)"):
        load_draft_model(write_folder(tmp_path / "b", hf, {**t, "fc.weight": rand(H, 40)}))
    with pytest.raises(ValueError, match="unexpected tensors in the checkpoint: extra.bias"):
        load_draft_model(write_folder(tmp_path / "c", hf, {**t, "extra.bias": rand(2)}))
    with pytest.raises(ValueError, match="'d2t' maps draft id 11 to target id 40"):
        load_draft_model(
            write_folder(tmp_path / "d", hf, {**t, "d2t": t["d2t"].clone().index_fill(0, torch.tensor([11]), 29)})
        )
    with pytest.raises(ValueError, match="'lm_head.weight' is missing"):  # EAGLE-3's head cannot come from the target
        load_draft_model(write_folder(tmp_path / "e", hf, {k: v for k, v in t.items() if k != "lm_head.weight"}))
    with pytest.raises(ValueError, match="config.json"):
        load_draft_model(tmp_path / "nowhere")
    mhf, mt = mtp_checkpoint(n=2)
    with pytest.raises(ValueError, match="n_predict"):
        load_draft_model(write_folder(tmp_path / "f", {**mhf, "num_nextn_predict_layers": 3}, mt))
    with pytest.raises(ValueError, match="method"):
        load_draft_model(write_folder(tmp_path / "g", hf, t), method="medusa")
