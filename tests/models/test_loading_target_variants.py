"""Target folders with the variants TinyTargetModel computes (scaled RoPE in both
spellings, Llama's attention_bias, Qwen3 with its q/k-norm and default head_dim)
through load_target_model, against transformers' AutoModelForCausalLM reading the
same folder; and save_target_model's folder read back by both."""

import json

import pytest
import torch

from specdraft.models import BatchMetadata, write_safetensors
from specdraft.models.target_loading import load_target_model, save_target_model

transformers = pytest.importorskip(
    "transformers", minversion="5", reason="transformers >= 5 is the oracle (a test-only dependency)"
)

H, FF, NH, KV, HD, V = 32, 48, 4, 2, 8, 50
BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": FF,
        "num_hidden_layers": 2, "num_attention_heads": NH, "num_key_value_heads": KV, "head_dim": HD,
        "vocab_size": V, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 500.0,
        "max_position_embeddings": 64, "tie_word_embeddings": False, "torch_dtype": "float32"}  # fmt: skip
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "use_sliding_window": False}
# original_max_position_embeddings 16 with theta 500: positions below 20 cross every
# frequency band the scalings treat differently.
VARIANTS = {
    "llama3_rope_parameters": {"rope_parameters": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                                   "rope_theta": 500.0}},
    "yarn_rope_scaling": {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
    "linear_rope_scaling": {"rope_scaling": {"rope_type": "linear", "factor": 3.0}},
    "llama_attention_bias": {"attention_bias": True},
    "qwen3": QWEN3,
    "qwen3_default_head_dim_bias_yarn": {**QWEN3, "head_dim": None, "attention_bias": True,
                                         "rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                                                          "original_max_position_embeddings": 16}},
}  # fmt: skip


def config_of(variant):
    return {k: v for k, v in {**BASE, **VARIANTS[variant]}.items() if v is not None}


def random_folder(path, hf, seed):
    """HF-named random weights for the config (biases and q/k norms as it implies)."""
    g = torch.Generator().manual_seed(seed)
    head_dim = hf.get("head_dim", 128)
    bias, qk_norm = hf.get("attention_bias", False), hf["model_type"] == "qwen3"

    def w(*shape, scale=0.15, mean=0.0):
        return mean + torch.randn(*shape, generator=g) * scale

    t = {
        "model.embed_tokens.weight": w(V, H, scale=1.0),
        "model.norm.weight": w(H, mean=1.0),
        "lm_head.weight": w(V, H),
    }
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": w(H, mean=1.0), p + "post_attention_layernorm.weight": w(H, mean=1.0)}
        t |= {
            p + f"mlp.{n}.weight": w(*s)
            for n, s in (("gate_proj", (FF, H)), ("up_proj", (FF, H)), ("down_proj", (H, FF)))
        }
        for name, rows in (("q", NH), ("k", KV), ("v", KV)):
            t[p + f"self_attn.{name}_proj.weight"] = w(rows * head_dim, H)
            if bias:
                t[p + f"self_attn.{name}_proj.bias"] = w(rows * head_dim, scale=0.5)
        t[p + "self_attn.o_proj.weight"] = w(H, NH * head_dim)
        if bias:
            t[p + "self_attn.o_proj.bias"] = w(H, scale=0.5)
        if qk_norm:
            t |= {p + f"self_attn.{n}_norm.weight": w(head_dim, mean=1.0) for n in ("q", "k")}
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(hf))
    write_safetensors(path / "model.safetensors", t)
    return path


def our_logits(model, ids):
    """One sequence, one prefill through the paged cache (blocks in reverse order)."""
    n, block = ids.shape[0], 4
    blocks = -(-n // block)
    table = torch.arange(blocks - 1, -1, -1, dtype=torch.int32)[None]
    pos = torch.arange(n)
    md = BatchMetadata(
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_table=table,
        slot_mapping=table[0, pos // block].long() * block + pos % block,
        max_query_len=n,
        max_seq_len=n,
    )
    hidden, _ = model(ids.to(torch.int32), pos, md, model.allocate_kv_caches(blocks, block))
    return model.compute_logits(hidden)


def assert_matches_transformers(model, folder):
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = torch.randint(0, V, (19,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(our_logits(model, ids), reference(ids[None]).logits[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_target_variant_matches_transformers_and_round_trips(tmp_path, variant):
    hf = config_of(variant)
    folder = random_folder(tmp_path / "in", hf, seed=len(variant))
    model = load_target_model(folder).eval()
    assert model.config.qk_norm == (hf["model_type"] == "qwen3")
    assert model.config.o_proj_bias == hf.get("attention_bias", False)
    assert_matches_transformers(model, folder)
    save_target_model(model, tmp_path / "out")
    back = load_target_model(tmp_path / "out").eval()
    assert back.config == model.config
    for (n1, a), (n2, b) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(a, b), n1
    assert_matches_transformers(back, tmp_path / "out")
