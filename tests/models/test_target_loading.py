"""load_target_model / save_target_model against an independent oracle: a plain dense
causal Llama forward written here from the raw HF-named tensors (embedding, RMSNorm,
rotate-half RoPE, GQA attention under a causal mask, SiLU MLP), compared with
TinyTargetModel run over a batch of prompts through its paged KV cache, in two
passes (a prefill chunk, then the rest) with scattered block tables."""

import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F

from specdraft.models import BatchMetadata, TinyTargetModel, write_safetensors
from specdraft.models.target_loading import load_target_model, save_target_model

from fixtures.checkpoints import write_indexed_folder

H, FF, NH, KV, HD, V, N = 32, 48, 4, 2, 8, 50, 3
HF = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": H,
    "intermediate_size": FF,
    "num_hidden_layers": N,
    "num_attention_heads": NH,
    "num_key_value_heads": KV,
    "vocab_size": V,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500.0,  # small theta: positions 0..20 turn every frequency visibly
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
QWEN2 = {**HF, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False,
         "sliding_window": 4096, "max_window_layers": 2}  # fmt: skip
PROMPT_LENS = (7, 13, 4)


def random_weights(hf, seed=0, bias=False, tied=False):
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.15):
        return torch.randn(*shape, generator=g) * scale

    def norm():
        return 1.0 + w(H, scale=0.1)

    t = {"model.embed_tokens.weight": w(V, H, scale=1.0), "model.norm.weight": norm()}
    if not tied:
        t["lm_head.weight"] = w(V, H, scale=0.3)
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {
            p + "input_layernorm.weight": norm(),
            p + "post_attention_layernorm.weight": norm(),
            p + "self_attn.q_proj.weight": w(NH * HD, H),
            p + "self_attn.k_proj.weight": w(KV * HD, H),
            p + "self_attn.v_proj.weight": w(KV * HD, H),
            p + "self_attn.o_proj.weight": w(H, NH * HD),
            p + "mlp.gate_proj.weight": w(FF, H),
            p + "mlp.up_proj.weight": w(FF, H),
            p + "mlp.down_proj.weight": w(H, FF),
        }
        if bias:
            t |= {p + f"self_attn.{x}_proj.bias": w(n * HD, scale=0.5) for x, n in (("q", NH), ("k", KV), ("v", KV))}
    return t


# ----------------------------------------------------------------------- the oracle


def rms_norm(x, weight, eps):
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def oracle_logits(hf, t, ids):
    """Dense causal Llama / Qwen2 forward of one sequence [L] -> logits [L, V]."""
    eps, length = hf["rms_norm_eps"], ids.shape[0]
    heads, kv_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
    dim = hf["hidden_size"] // heads
    inv_freq = 1.0 / hf["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1).float()[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1).float()[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool).tril()

    def proj(x, name):
        out = x @ t[name + ".weight"].T
        return out + t[name + ".bias"] if name + ".bias" in t else out

    x = t["model.embed_tokens.weight"][ids]
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, t[p + "input_layernorm.weight"], eps)
        q = proj(h, p + "self_attn.q_proj").view(length, heads, dim)
        k = proj(h, p + "self_attn.k_proj").view(length, kv_heads, dim)
        v = proj(h, p + "self_attn.v_proj").view(length, kv_heads, dim)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / dim**0.5
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + proj(torch.einsum("hqk,khd->qhd", probs, v).reshape(length, heads * dim), p + "self_attn.o_proj")
        h = rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
        x = x + proj(F.silu(proj(h, p + "mlp.gate_proj")) * proj(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return rms_norm(x, t["model.norm.weight"], eps) @ head.T


# ------------------------------------------------------------------- paged batches


def prompts(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g) for n in PROMPT_LENS]


def paged_logits(model, seqs, block_size=4, first_chunk=5):
    """Every request's logits [L, V], computed in two passes through the paged cache:
    tokens [0, first_chunk) (a prefill), then the rest; block ids are shuffled so a
    request's blocks are not contiguous."""
    blocks_per_req = max(-(-len(s) // block_size) for s in seqs) + 1
    num_blocks = blocks_per_req * len(seqs) + 2
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(7))
    block_table = perm[: blocks_per_req * len(seqs)].view(len(seqs), blocks_per_req).to(torch.int32)
    caches = model.allocate_kv_caches(num_blocks, block_size)
    out = [[] for _ in seqs]
    for lo, hi in ((0, first_chunk), (first_chunk, None)):
        chunks = [(min(lo, len(s)), min(len(s), hi or len(s))) for s in seqs]  # the short prompt idles
        ids = torch.cat([s[a:b] for s, (a, b) in zip(seqs, chunks, strict=True)]).to(torch.int32)
        pos = torch.cat([torch.arange(a, b) for a, b in chunks])
        owner = torch.cat([torch.full((b - a,), r) for r, (a, b) in enumerate(chunks)])
        slots = block_table[owner, pos // block_size].to(torch.int64) * block_size + pos % block_size
        lens = torch.tensor([b - a for a, b in chunks])
        md = BatchMetadata(
            query_start_loc=torch.cat([torch.zeros(1), lens.cumsum(0)]).to(torch.int32),
            seq_lens=torch.tensor([b for _, b in chunks], dtype=torch.int32),
            block_table=block_table,
            slot_mapping=slots,
            max_query_len=int(lens.max()),
            max_seq_len=max(b for _, b in chunks),
        )
        hidden, _ = model(ids, pos, md, caches)
        logits = model.compute_logits(hidden)
        for r, part in enumerate(logits.split(lens.tolist())):
            out[r].append(part)
    return [torch.cat(parts) for parts in out]


def write_folder(path, hf, tensors, shards=1):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf))
    if shards == 1:
        write_safetensors(path / "model.safetensors", tensors)
        return path
    return write_indexed_folder(path, hf, tensors, shards)[0]


def check_against_oracle(model, hf, t):
    seqs = prompts()
    with torch.no_grad():
        got = paged_logits(model, seqs)
    for seq, logits in zip(seqs, got, strict=True):
        torch.testing.assert_close(logits, oracle_logits(hf, t, seq), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------- loading


def test_llama_matches_the_oracle_through_the_paged_cache(tmp_path):
    t = random_weights(HF)
    model = load_target_model(write_folder(tmp_path / "llama", HF, t, shards=3))
    assert isinstance(model, TinyTargetModel) and not model.tied_embeddings
    assert model.config.num_layers == N and model.config.num_kv_heads == KV and not model.config.attention_bias
    assert model.max_position_embeddings == 64
    check_against_oracle(model, HF, t)


def test_tied_embeddings(tmp_path):
    hf = {**HF, "tie_word_embeddings": True}
    t = random_weights(hf, seed=2, tied=True)
    model = load_target_model(write_folder(tmp_path / "tied", hf, t))
    assert model.tied_embeddings
    check_against_oracle(model, hf, t)
    # A checkpoint that stores the tied head anyway loads when it is the same tensor.
    same = {**t, "lm_head.weight": t["model.embed_tokens.weight"].clone()}
    assert load_target_model(write_folder(tmp_path / "stored", hf, same)).tied_embeddings
    other = {**t, "lm_head.weight": t["model.embed_tokens.weight"] + 1}
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_target_model(write_folder(tmp_path / "differs", hf, other))


def test_qwen2_qkv_bias(tmp_path):
    t = random_weights(QWEN2, seed=3, bias=True)
    model = load_target_model(write_folder(tmp_path / "qwen2", QWEN2, t))
    layer = model.layers[0].self_attn
    assert layer.q_proj.bias is not None and layer.v_proj.bias is not None and layer.o_proj.bias is None
    check_against_oracle(model, QWEN2, t)


def test_save_round_trip_and_dtype(tmp_path):
    for hf, t in ((HF, random_weights(HF, seed=4)), (QWEN2, random_weights(QWEN2, seed=5, bias=True))):
        model = load_target_model(write_folder(tmp_path / hf["model_type"], hf, t))
        save_target_model(model, tmp_path / (hf["model_type"] + "_saved"))
        saved = json.loads((tmp_path / (hf["model_type"] + "_saved") / "config.json").read_text())
        assert saved["model_type"] == hf["model_type"] and saved["max_position_embeddings"] == 64
        back = load_target_model(tmp_path / (hf["model_type"] + "_saved"))
        assert back.config == model.config
        for (n1, a), (n2, b) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
            assert n1 == n2
            torch.testing.assert_close(b, a, rtol=0, atol=0, msg=n1)
    tied = load_target_model(write_folder(tmp_path / "tied", {**HF, "tie_word_embeddings": True},
                                          random_weights(HF, tied=True)))  # fmt: skip
    save_target_model(tied, tmp_path / "tied_saved")
    assert json.loads((tmp_path / "tied_saved" / "config.json").read_text())["tie_word_embeddings"] is True
    assert load_target_model(tmp_path / "tied_saved").tied_embeddings
    half = load_target_model(tmp_path / "tied_saved", dtype=torch.bfloat16)
    assert half.embed_tokens.weight.dtype == torch.bfloat16 and half.tied_embeddings


def test_old_checkpoints_rotary_buffers_are_skipped(tmp_path):
    t = random_weights(HF, seed=6)
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(HD // 2)
    check_against_oracle(load_target_model(write_folder(tmp_path / "old", HF, t)), HF, t)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling: llama3 RoPE needs 'low_freq_factor'"),
        ({"rope_scaling": {"type": "longrope", "factor": 2.0}}, "rope_scaling: rope type 'longrope'"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "alpha": 1}}, "rope_parameters"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"model_type": "qwen3", "num_key_value_heads": None}, "num_key_value_heads: missing from the qwen3"),
        ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8}, "sliding_window"),
        ({"model_type": "llama", "sliding_window": 8}, "sliding_window"),
        ({"layer_types": ["full_attention", "linear_attention", "full_attention"]}, "layer_types"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"model_type": "mistral"}, "model_type"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        ({"torch_dtype": "int8"}, "torch_dtype"),
    ],
)
def test_refused_config_keys_name_themselves(tmp_path, change, key):
    hf = {k: v for k, v in {**HF, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=key):
        load_target_model(write_folder(tmp_path / "m", hf, random_weights(HF)))


def test_accepted_config_variants(tmp_path):
    """Keys that do not change the math load: default-typed rope dicts (both spellings),
    Qwen2's unused window, serving-only keys."""
    t = random_weights(HF, seed=8)
    hf = {k: v for k, v in HF.items() if k != "rope_theta"}
    hf |= {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}, "rope_scaling": None,
           "pretraining_tp": 1, "attention_dropout": 0.0, "bos_token_id": 1, "dtype": "float32"}  # fmt: skip
    model = load_target_model(write_folder(tmp_path / "v5", hf, t))
    assert model.config.rope_theta == 500.0 and model.config.extra["bos_token_id"] == 1
    check_against_oracle(model, HF, t)


def test_missing_mis_shaped_and_unexpected_tensors_name_themselves(tmp_path):
    t = random_weights(HF)
    cases = [
        ({k: v for k, v in t.items() if k != "model.layers.1.mlp.up_proj.weight"},
         r"'model.layers.1.mlp.up_proj.weight' is missing"),
        ({k: v for k, v in t.items() if k != "lm_head.weight"}, r"'lm_head.weight' is missing"),
        ({**t, "model.norm.weight": torch.ones(H + 1)}, r"'model.norm.weight' has shape \(33,\)"),
        ({**t, "model.layers.0.self_attn.q_norm.weight": torch.ones(HD)},
         "unexpected tensors in the checkpoint: model.layers.0.self_attn.q_norm.weight"),
        ({**t, "model.layers.0.self_attn.q_proj.bias": torch.ones(NH * HD)},  # a Llama has no q bias
         "unexpected tensors in the checkpoint: model.layers.0.self_attn.q_proj.bias"),
    ]  # fmt: skip
    for i, (tensors, message) in enumerate(cases):
        with pytest.raises(ValueError, match=message):
            load_target_model(write_folder(tmp_path / str(i), HF, tensors))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        load_target_model(write_folder(tmp_path / "n", {k: v for k, v in HF.items() if k != "num_hidden_layers"}, t))
    with pytest.raises(ValueError, match="config.json"):
        load_target_model(tmp_path / "nowhere")


def test_index_json_is_followed(tmp_path):
    t = random_weights(HF, seed=9)
    folder = write_folder(tmp_path / "sharded", HF, t, shards=2)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    # A stray file beside the shards is not read: the index says what the model is.
    write_safetensors(folder / "stray.safetensors", {"model.extra.weight": torch.ones(2)})
    check_against_oracle(load_target_model(folder), HF, t)
    first = sorted(t)[0]  # in shard 1
    index["weight_map"][first] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=f"'{first}' is missing from shard 'model-00002-of-00002.safetensors'"):
        load_target_model(folder)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_matches_transformers(tmp_path, family):
    """Where transformers is importable: its LlamaForCausalLM / Qwen2ForCausalLM read
    the folder save_target_model wrote and give the same logits."""
    from transformers import AutoModelForCausalLM

    hf, t = (HF, random_weights(HF, seed=10)) if family == "llama" else (QWEN2, random_weights(QWEN2, 11, True))
    model = load_target_model(write_folder(tmp_path / "in", hf, t))
    save_target_model(model, tmp_path / "out")
    reference = AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()
    seqs = prompts()
    with torch.no_grad():
        ours = paged_logits(model, seqs)
        for seq, logits in zip(seqs, ours, strict=True):
            theirs = reference(seq[None]).logits[0]
            torch.testing.assert_close(logits, theirs, rtol=1e-4, atol=1e-4)
