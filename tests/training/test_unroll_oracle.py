"""The unroll against a slow per-chain reference (specs.unroll.chain_logits: each
chain alone, every step's whole sequence recomputed by the head's own forward from
a fresh KV cache), for both token modes: teacher-forced data tokens, which no
proposer drafts, and the draft's own greedy tokens. Per-step logits close in fp32
for every chain and step the data reaches; `valid` marks exactly those. On the CPU
in every lane: the reference's metadata is built there."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.training import unroll

from fixtures.unroll_batches import KINDS, ML_LAYERS, head_for, make_packed, packed_lengths
from specs.unroll import chain_logits


@functools.cache
def setup(kind, mrope):
    return head_for(kind, mrope)


@pytest.mark.parametrize("tokens", ["data", "draft"])
@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=6)
@given(lengths=packed_lengths(max_len=6), seed=st.integers(0, 2**31 - 1))
def test_unroll_matches_per_chain_reference(kind, mrope, tokens, lengths, seed):
    head, target_hidden, loop = setup(kind, mrope)
    num_steps = ML_LAYERS
    packed = make_packed(lengths, target_hidden=target_hidden, mrope=mrope, seed=seed)
    with torch.no_grad():
        out = unroll(head, *packed.unroll_args(), num_steps=num_steps, tokens=tokens, loop=loop)
        starts = packed.chain_starts()
        for t, start, end in starts:
            want = chain_logits(head, packed, t, start, end, num_steps, tokens=tokens, loop=loop)
            got = out.logits[: want.shape[0], t]
            if kind == "eagle3":
                want = want[:, head.draft_token_target_ids()]
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
            if tokens == "data":
                # The data reaches exactly the steps whose target row t + k + 1 exists.
                assert out.valid[:, t].tolist() == [k < want.shape[0] for k in range(num_steps)]
    # The last row of every sequence starts no chain, and no step of it is valid.
    ends = packed.cu_seqlens[1:].long() - 1
    assert not out.valid[:, ends].any()


# Checkpoint variants the heads implement (specdraft.models.config): the unroll
# builds each step from the head's submodules, so every variant must be mirrored.
VARIANTS = {
    "eagle_input_norm_no_final_norm_fc_bias": ("eagle", {}, {"input_norm": True, "final_norm": False, "fc_bias": True}),
    "eagle_normed_feed": ("eagle", {"hidden_feed": "normed"}, {}),
    "eagle_qk_norm_biases": ("eagle", {"qk_norm": True, "attention_bias": True, "o_proj_bias": True}, {}),
    "eagle3_norm_before_residual_fc_norm": ("eagle3", {"norm_before_residual": True, "fc_norm": True}, {}),
    "eagle3_no_logits_norm_norm_before_fc": ("eagle3", {"logits_norm": False, "norm_before_fc": True}, {}),
    "eagle3_normed_feed": ("eagle3", {"hidden_feed": "normed"}, {}),
    "mtp_normed_feed_own_heads": ("mtp", {"hidden_feed": "normed"}, {"per_layer_lm_head": True}),
    "mtp_no_position_zero_mask": ("mtp", {}, {"mask_position_zero": False}),
    "multi_layer_normed_feed_qk_norm": ("multi_layer", {"hidden_feed": "normed", "qk_norm": True},
                                        {"per_layer_lm_head": True}),
}  # fmt: skip


@functools.cache
def variant(name, mrope):
    kind, overrides, head_kwargs = VARIANTS[name]
    return (kind, *head_for(kind, mrope, "cpu", overrides, head_kwargs))


@pytest.mark.parametrize("tokens", ["data", "draft"])
@pytest.mark.parametrize("name", list(VARIANTS))
@settings(max_examples=3)
@given(lengths=packed_lengths(max_len=5), seed=st.integers(0, 2**31 - 1), mrope=st.booleans())
def test_head_variants_match_per_chain_reference(name, tokens, lengths, seed, mrope):
    kind, head, target_hidden, loop = variant(name, mrope)
    packed = make_packed(lengths, target_hidden=target_hidden, mrope=mrope, seed=seed)
    with torch.no_grad():
        out = unroll(head, *packed.unroll_args(), num_steps=ML_LAYERS, tokens=tokens, loop=loop)
        for t, start, end in packed.chain_starts():
            want = chain_logits(head, packed, t, start, end, ML_LAYERS, tokens=tokens, loop=loop)
            if kind == "eagle3":
                want = want[:, head.draft_token_target_ids()]
            torch.testing.assert_close(out.logits[: want.shape[0], t], want, atol=2e-5, rtol=1e-5)
