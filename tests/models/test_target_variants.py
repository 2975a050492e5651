"""The tiny target model with scaled RoPE (both config spellings), Llama's
attention_bias (q / k / v and o_proj biases) and Qwen3's q/k-norm attention, against
transformers' LlamaForCausalLM / Qwen3ForCausalLM on the same weights: requests run
one at a time there, packed through the paged cache here, at large position offsets.
(Loading such targets from a folder is specdraft.models.target_loading's part.)"""

import pytest
import torch

from specdraft.models import DraftModelConfig, TinyTargetModel

from fixtures.hf_oracle import eager, packed_batch, randomise

transformers = pytest.importorskip(
    "transformers", minversion="5", reason="transformers >= 5 is the oracle (a test-only dependency: the test extra)"
)
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

V = 53
HF = {"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
      "num_hidden_layers": 2, "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "max_position_embeddings": 16384, "hidden_act": "silu", "tie_word_embeddings": False}  # fmt: skip
LENS, OFFSETS = [6, 2, 5], [0, 12000, 4000]

VARIANTS = {
    "llama3_rope_parameters": {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 1024,
                                                   "rope_theta": 500000.0}},
    "yarn_rope_scaling": {"rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 1024}},
    "linear_rope_scaling": {"rope_scaling": {"rope_type": "linear", "factor": 3.0}},
    "llama_attention_bias": {"attention_bias": True},
    "qwen3_qk_norm": {"model_type": "qwen3"},
    "qwen3_qk_norm_yarn_bias": {"model_type": "qwen3", "attention_bias": True,
                                "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 2048}},
}  # fmt: skip


def transformers_model(hf: dict):
    keys = {k: v for k, v in hf.items() if k != "model_type"}
    if hf.get("model_type") == "qwen3":
        return Qwen3ForCausalLM(eager(Qwen3Config(**keys))).eval()
    return LlamaForCausalLM(eager(LlamaConfig(**keys))).eval()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_target_variant_matches_transformers(name):
    hf = {**HF, **VARIANTS[name]}
    if "rope_parameters" in hf:  # transformers 5 keeps rope_theta in there only
        del hf["rope_theta"]
    config = DraftModelConfig.from_hf_config(hf)
    model = randomise(TinyTargetModel(config).eval())
    oracle = transformers_model(hf)
    state = {(k if k.startswith("lm_head.") else "model." + k): v for k, v in model.state_dict().items()}
    oracle.load_state_dict(state, strict=True)  # every transformers weight has its specdraft twin

    inp = packed_batch(LENS, OFFSETS, V, {})
    caches = model.allocate_kv_caches(inp["num_blocks"], 4)
    with torch.no_grad():
        hidden, _ = model(inp["ids"], inp["positions"], inp["md"], caches)
        got = model.compute_logits(hidden)
        for r in inp["requests"]:
            want = oracle(input_ids=inp["ids"][r][None].long(), position_ids=inp["positions"][r][None]).logits[0]
            torch.testing.assert_close(got[r], want, rtol=1e-5, atol=1e-5 * max(1.0, want.abs().max().item()))


def test_qwen3_and_llama_attention_bias_are_read_as_transformers_builds_them():
    qwen3 = DraftModelConfig.from_hf_config({**HF, "model_type": "qwen3"})
    assert qwen3.qk_norm and not qwen3.attention_bias and not qwen3.o_proj_bias
    llama = DraftModelConfig.from_hf_config({**HF, "attention_bias": True})
    assert llama.attention_bias and llama.o_proj_bias and not llama.qk_norm
    # Qwen2 attention: q / k / v biases, never o_proj's (what the target loader asks for).
    qwen2 = DraftModelConfig.from_hf_config({**HF, "model_type": "qwen2", "attention_bias": True})
    assert qwen2.attention_bias and not qwen2.o_proj_bias
