"""Train what you serve: with draft-fed tokens, the unroll's step-k greedy draft at
row t is the k-th token the serving proposer drafts for the request whose window is
t's sequence up to t (next token: the data token t + 1). Oracle: the proposers
themselves (EagleProposer for EAGLE-1 / EAGLE-3 / MTP, MultiLayerEagleProposer for
the multi-layer head), run on a batch with one request per chain start, paged KV
cache and all; their per-step logits (return_probs="logits") are compared too.
Same weights, fp32: the tokens must be equal, exactly."""

import functools

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from specdraft.config import SpeculativeConfig
from specdraft.training import unroll

from fixtures.unroll_batches import (
    KINDS,
    ML_LAYERS,
    head_for,
    make_packed,
    make_proposer,
    packed_lengths,
    proposer_inputs,
)

BLOCK_SIZE = 4
METHOD = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "multi_layer": "mtp"}


@functools.cache
def setup(kind, mrope, device):
    head, target_hidden, loop = head_for(kind, mrope, device)
    num_steps = ML_LAYERS if kind == "multi_layer" else 4
    config = SpeculativeConfig(
        method=METHOD[kind], num_speculative_tokens=num_steps, max_model_len=256, block_size=BLOCK_SIZE,
        return_probs="logits",
    )  # fmt: skip
    return head, target_hidden, loop, config


@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
@pytest.mark.parametrize("kind", KINDS)
@given(lengths=packed_lengths(), seed=st.integers(0, 2**31 - 1))
def test_draft_chains_equal_propose(kind, mrope, device, lengths, seed):
    assume(max(lengths) >= 2)  # some chain has its next data token
    head, target_hidden, loop, config = setup(kind, mrope, device)
    num_steps = config.num_speculative_tokens
    packed = make_packed(lengths, target_hidden=target_hidden, mrope=mrope, seed=seed, device=device)
    starts = packed.chain_starts()
    args, num_blocks = proposer_inputs(packed, starts, block_size=BLOCK_SIZE, num_steps=num_steps)
    proposer = make_proposer(head, kind, config, num_blocks, len(starts))
    with torch.no_grad():
        served = proposer.propose(*args)
        out = unroll(head, *packed.unroll_args(), num_steps=num_steps, tokens="draft", loop=loop)
    rows = torch.tensor([t for t, _, _ in starts], device=device)
    assert torch.equal(out.draft_tokens[:, rows].T, served.draft_tokens.long())
    served_logits = served.draft_probs  # [B, K, V]: greedy rows store the logits
    if kind == "eagle3":
        served_logits = served_logits[..., head.draft_token_target_ids()]
    torch.testing.assert_close(out.logits[:, rows].transpose(0, 1), served_logits, atol=2e-5, rtol=1e-5)
