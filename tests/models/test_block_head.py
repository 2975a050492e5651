"""Block drafters (DFlash, DSpark) against an independent oracle of DeepSpec's
inference (tests/models/block_oracle.py): a ragged batch of running sequences, several
blocks each with random acceptance, the context's keys and values in the paged cache
across blocks. Block logits, Markov-corrected logits, greedy drafts and confidence
logits agree at <= 1e-5 (fp32 against float64)."""

from __future__ import annotations

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.layout import BatchMetadata
from specdraft.models.config import DraftModelConfig
from specdraft.models.heads.block import BlockConfig, BlockDraftHead
from specdraft.proposers.block import BlockProposer
from tests.models.block_oracle import OracleDrafter

VOCAB, BLOCK, CACHE_BLOCK = 97, 5, 4


def make_head(qk_norm: bool, markov: str | None, confidence: bool, with_markov: bool, seed: int = 0):
    torch.manual_seed(seed)
    cfg = DraftModelConfig(hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, vocab_size=VOCAB,
                           num_layers=2, qk_norm=qk_norm, rope_theta=500.0, rms_norm_eps=1e-6)  # fmt: skip
    block = BlockConfig(block_size=BLOCK, mask_token_id=VOCAB - 1, target_layer_ids=(-1, 1, 2), num_target_layers=4,
                        markov_rank=8 if markov else 0, markov_head_type=markov, confidence_head=confidence,
                        confidence_with_markov=with_markov)  # fmt: skip
    head = BlockDraftHead(cfg, block)
    with torch.no_grad():  # norms away from 1 so that a missing norm shows
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
        head.markov_head is not None and head.markov_head.markov_w2.weight.mul_(4)
    return head


def window_metadata(starts, lens, table_width):
    """The batch of windows: request b's rows at positions starts[b] .. starts[b] + lens[b] - 1."""
    b = len(starts)
    table = torch.arange(b * table_width, dtype=torch.int32).view(b, table_width)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
    owner = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    slots = table[owner, positions // CACHE_BLOCK].long() * CACHE_BLOCK + positions % CACHE_BLOCK
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([s + n for s, n in zip(starts, lens, strict=True)], dtype=torch.int32)
    return positions, BatchMetadata(qsl, seq_lens, table, slots, max_query_len=max(lens))


VARIANTS = [
    pytest.param(False, None, False, False, id="dflash-llama"),
    pytest.param(True, None, False, False, id="dflash-qwen3"),
    pytest.param(True, None, True, False, id="dflash-qwen3-confidence"),
    pytest.param(True, "vanilla", True, True, id="dspark-qwen3-vanilla-confidence-markov"),
    pytest.param(False, "vanilla", False, False, id="dspark-llama-vanilla"),
    pytest.param(True, "gated", True, False, id="dspark-qwen3-gated-confidence"),
    pytest.param(True, "gated", False, False, id="dspark-qwen3-gated"),
    pytest.param(True, "rnn", True, True, id="dspark-qwen3-rnn-confidence-markov"),
    pytest.param(False, "rnn", False, False, id="dspark-llama-rnn"),
]


def check_block(out, b, oracle, hidden, newest):
    """Request b's block of the proposer's output `out` (return_probs "logits", greedy
    drafts) against the oracle's: Markov-corrected logits, greedy drafts, confidence."""
    _, corrected, drafts, conf = oracle.draft(hidden, newest)
    torch.testing.assert_close(out.draft_probs[b].double(), corrected, rtol=1e-5, atol=1e-5)
    assert out.draft_tokens[b].tolist() == drafts.tolist(), b
    if conf is None:
        assert out.confidence_logits is None
    else:
        torch.testing.assert_close(out.confidence_logits[b].double(), conf, rtol=1e-5, atol=1e-5)


def check_running_sequences(head, make_oracle, num_blocks: int = 4):
    """Two requests (prompts of 7 and 3 tokens) run block after block through
    BlockProposer.propose, each verify accepting a random number of drafts; every
    block must equal make_oracle(head)'s (its own dense cache per request)."""
    gen = torch.Generator().manual_seed(1)
    prompts, total, table_width = [7, 3], 40, 16
    tokens = [torch.randint(0, VOCAB - 1, (total,), generator=gen) for _ in prompts]
    features = [torch.randn(total, head.hidden_width, generator=gen) for _ in prompts]
    config = SpeculativeConfig(method="block", num_speculative_tokens=BLOCK, max_model_len=60, block_size=CACHE_BLOCK,
                               return_probs="logits")  # fmt: skip
    proposer = BlockProposer(head, config, head.allocate_kv_caches(len(prompts) * table_width, CACHE_BLOCK))
    oracles = [make_oracle(head) for _ in prompts]

    # The prefill: every prompt row is context; the first generated token opens the block.
    starts, lens = [0] * len(prompts), prompts
    positions, meta = window_metadata(starts, lens, table_width)
    hidden = torch.cat([f[:n] for f, n in zip(features, lens, strict=True)])
    newest = torch.stack([t[n] for t, n in zip(tokens, prompts, strict=True)])
    out = proposer.propose(torch.zeros_like(positions), positions, hidden, newest, meta)
    context_end = list(prompts)
    for _ in range(num_blocks):
        for b, oracle in enumerate(oracles):
            lo, end = starts[b], context_end[b]
            h = oracle.block_step(features[b][lo:end], torch.arange(lo, end), tokens[b][end], end)
            check_block(out, b, oracle, h, tokens[b][end])
        # Verify: the window is [newest, K drafts]; request b accepts accepted[b] drafts.
        accepted = torch.randint(0, BLOCK + 1, (len(prompts),), generator=gen).tolist()
        starts = list(context_end)
        lens = [BLOCK + 1] * len(prompts)
        positions, meta = window_metadata(starts, lens, table_width)
        hidden = torch.cat([f[s : s + n] for f, s, n in zip(features, starts, lens, strict=True)])
        context_end = [s + a + 1 for s, a in zip(starts, accepted, strict=True)]
        newest = torch.stack([t[e] for t, e in zip(tokens, context_end, strict=True)])
        rejected = torch.tensor([BLOCK - a for a in accepted])
        sample_at = torch.tensor([i * (BLOCK + 1) + a for i, a in enumerate(accepted)])
        out = proposer.propose(torch.zeros_like(positions), positions, hidden, newest, meta,
                               token_indices_to_sample=sample_at, num_rejected_tokens=rejected)  # fmt: skip


@pytest.mark.parametrize("qk_norm,markov,confidence,with_markov", VARIANTS)
def test_block_drafts_match_the_oracle_over_running_sequences(qk_norm, markov, confidence, with_markov):
    check_running_sequences(make_head(qk_norm, markov, confidence, with_markov), OracleDrafter)
