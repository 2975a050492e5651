"""Block drafters on DeepSpec's Gemma4 backbone (Gemma4BlockDraftHead) against an
independent float64 oracle (tests/models/block_gemma4_oracle.py) over running
sequences: a ragged batch, several blocks each with random acceptance, the context's
keys and values in the paged cache across blocks, as tests/models/test_block_head.py
does for the Llama / Qwen3 backbone.

Every head runs through BlockProposer.propose: block logits (DSpark: Markov-corrected,
by the fused op ops.markov_block_sample), greedy drafts and confidence logits."""

from __future__ import annotations

import pytest
import torch

from specdraft.models.config import DraftModelConfig
from specdraft.models.heads.block import BlockConfig
from specdraft.models.heads.block_gemma4 import Gemma4BlockDraftHead, Gemma4Settings
from tests.models.block_gemma4_oracle import Gemma4OracleDrafter
from tests.models.test_block_head import BLOCK, VOCAB, check_running_sequences


def make_gemma_head(gemma: Gemma4Settings, markov=None, confidence=False, with_markov=False, bias=False, seed=0):
    torch.manual_seed(seed)
    cfg = DraftModelConfig(hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=16,
                           vocab_size=VOCAB, num_layers=2, qk_norm=True, rope_theta=500.0, rms_norm_eps=1e-6,
                           attention_bias=bias, o_proj_bias=bias)  # fmt: skip
    block = BlockConfig(block_size=BLOCK, mask_token_id=VOCAB - 1, target_layer_ids=(-1, 1, 2), num_target_layers=4,
                        markov_rank=8 if markov else 0, markov_head_type=markov, confidence_head=confidence,
                        confidence_with_markov=with_markov)  # fmt: skip
    head = Gemma4BlockDraftHead(cfg, block, gemma)
    with torch.no_grad():  # norms, scalars and biases away from their defaults so that a missing one shows
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
        for layer in head.layers:
            layer.layer_scalar.fill_(0.5 + torch.rand(()).item())
        head.lm_head.weight.mul_(3)  # logits of a few units: the soft cap at 2 bends them
        head.markov_head is not None and head.markov_head.markov_w2.weight.mul_(4)
    return head


GEMMA = Gemma4Settings(partial_rotary_factor=0.25, attention_k_eq_v=True, final_logit_softcapping=2.0)
GEMMA_V = Gemma4Settings(partial_rotary_factor=0.5, rope_factor=2.0, attention_k_eq_v=False)
VARIANTS = [
    pytest.param(GEMMA, None, False, False, False, id="dflash-k_eq_v-softcap"),
    pytest.param(GEMMA_V, None, False, False, True, id="dflash-v_proj-bias-rope_factor"),
    pytest.param(GEMMA, "vanilla", True, True, False, id="dspark-vanilla-conf_markov"),
    pytest.param(GEMMA, "gated", True, False, False, id="dspark-gated-conf"),
    pytest.param(GEMMA_V, "rnn", False, False, False, id="dspark-rnn"),
]


@pytest.mark.parametrize("gemma,markov,confidence,with_markov,bias", VARIANTS)
def test_gemma4_block_drafts_match_the_oracle_over_running_sequences(gemma, markov, confidence, with_markov, bias):
    head = make_gemma_head(gemma, markov, confidence, with_markov, bias)
    assert head.attention_scale == 1.0
    check_running_sequences(head, Gemma4OracleDrafter)


def test_gemma4_settings_refuse_bad_values():
    for kwargs, word in [
        ({"partial_rotary_factor": 0.0}, "partial_rotary_factor"),
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
        ({"rope_factor": 0}, "rope_factor"),
        ({"attention_k_eq_v": 1}, "attention_k_eq_v"),
        ({"final_logit_softcapping": -1.0}, "final_logit_softcapping"),
    ]:
        with pytest.raises(ValueError, match=word):
            Gemma4Settings(**kwargs)
