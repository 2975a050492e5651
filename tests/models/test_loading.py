"""DraftModelConfig from HF config dicts, the safetensors reader / writer, and loading
tiny random checkpoints (fixtures.checkpoints) in the published EAGLE / EAGLE-3 / MTP
layouts."""

import json
import struct

import pytest
import torch

from specdraft.models import (
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

from fixtures.checkpoints import (
    DV,
    HD,
    HF,
    KV,
    H,
    V,
    eagle1_checkpoint,
    eagle3_checkpoint,
    mtp_checkpoint,
    rand,
    tiny_batch,
    write_folder,
)

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
        model.t2d.zero_().index_fill_(0, model.draft_token_target_ids(), True)  # the loader derives t2d
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


def test_an_eagle3_config_of_more_than_one_layer_is_refused_by_its_key(tmp_path):
    """Eagle3Head has one decoder layer. Without the key's check, a folder holding
    one layer's weights under num_hidden_layers: 2 loaded silently as a one-layer
    head; one holding both layers (layers.1.*) failed only as unexpected tensors."""
    hf, t = eagle3_checkpoint()
    second = {k.replace("midlayer.", "layers.1."): v for k, v in t.items() if k.startswith("midlayer.")}
    for name, tensors in (("one_layer_of_weights", t), ("two_layers_of_weights", t | second)):
        with pytest.raises(ValueError, match=r"num_hidden_layers: 2 decoder layers .*only 1 is supported"):
            load_draft_model(write_folder(tmp_path / name, {**hf, "num_hidden_layers": 2}, tensors))
    assert isinstance(load_draft_model(write_folder(tmp_path / "one", {**hf, "num_hidden_layers": 1}, t)), Eagle3Head)
    # An MTP config's num_hidden_layers is the target's depth (its layers: num_nextn_predict_layers).
    mhf, mt = mtp_checkpoint(first=61, n=2)
    mtp = load_draft_model(write_folder(tmp_path / "mtp", {**mhf, "num_hidden_layers": 61}, mt))
    assert isinstance(mtp, MTPHead) and mtp.config.n_predict == 2
