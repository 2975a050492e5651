"""Greedy speculative decoding with a block drafter (DFlash, DSpark of each Markov
kind, with and without the confidence head) is lossless: generate's output equals
the target's own greedy decoding (specs.generate.greedy_decode: one request, one
token at a time, dense recompute) for a ragged batch whose requests stop at
different times, with K = block_size and K < block_size.

Random block heads are mostly rejected. Copy heads (conftest.block_copy_head) on a
target that mostly follows a bigram map are mostly accepted, so whole blocks are
accepted and the cuts inside a block run: an EOS that is an accepted draft with more
accepted tokens after it, max_new_tokens and max_model_len reached mid-block. A
recorder of every commit checks that those cuts did happen in each case."""

import pytest
import torch

import specdraft.generation.decoder as decoder_module
from specdraft.generation import SpeculativeDecoder, generate

from fixtures.block_drafters import BLOCK_KINDS
from specs.generate import greedy_decode

PROMPTS = [[3, 1, 4, 1, 5], [9, 2], list(range(10, 28)), [6, 5, 3], [40, 41], list(range(30, 46))]
MAX_NEW = [9, 13, 10, 12, 11, 12]
MAX_MODEL_LEN = 24  # prompts 2 and 5 (18, 16 tokens) stop after 6 and 8 tokens: max_model_len's limit
BY_MAX_MODEL_LEN = [len(p) + n > MAX_MODEL_LEN for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
# (K, the head's block_size): the whole block verified, and a prefix of it.
BLOCKS = [pytest.param(3, 3, id="k3-block3"), pytest.param(2, 4, id="k2-block4")]
COPY_BLOCKS = [pytest.param(4, 4, id="k4-block4"), pytest.param(3, 5, id="k3-block5")]


def oracle(target, eos):
    eos = eos if isinstance(eos, list) else [eos] * len(PROMPTS)
    return [
        greedy_decode(target, p, n, eos_token_id=e, max_model_len=MAX_MODEL_LEN)
        for p, n, e in zip(PROMPTS, MAX_NEW, eos, strict=True)
    ]


@pytest.fixture(scope="module")
def random_target(build):
    target = build.make_target(num_layers=2, seed=1)
    # EOS: a token request 1 emits early, so requests stop at different times.
    eos = greedy_decode(target, PROMPTS[1], MAX_NEW[1], max_model_len=MAX_MODEL_LEN)[3]
    return target, eos, oracle(target, eos)


@pytest.fixture(scope="module")
def bigram_target(build):
    """A target that mostly emits build.bigram_map of its last token (sharp logits,
    its layers at half weight); requests 1 and 4 stop at their EOS, the map's fixed
    point 1 they reach after 33, 50."""
    target = build.make_target(num_layers=2, seed=5, logit_scale=3.0, context_weight=0.5)
    eos = [None, 1, None, None, 1, None]
    want = oracle(target, eos)
    assert want[1] == [33, 50, 1] and want[4] == [24, 46, 2, 33, 50, 1], want
    return target, eos, want


class CommitRecorder:
    """Wraps the decoder's commit: for every verify pass, which requests had an EOS
    among their accepted drafts with more tokens emitted after it, and which were cut
    at their limit with tokens of the pass left over."""

    def __init__(self, commit):
        self.commit = commit
        self.eos_inside_block: set[int] = set()
        self.limit_inside_block: set[int] = set()

    def __call__(self, state, tokens, counts, requests):
        active = ~state.done
        emitted = counts.long() + 1
        j = torch.arange(tokens.shape[1])
        is_eos = (tokens.long() == requests.eos_token_ids[:, None]) & (j < emitted[:, None])
        first_eos = torch.where(is_eos, j, tokens.shape[1]).amin(dim=1)
        room = requests.limits - state.num_generated
        for b in range(tokens.shape[0]):
            if not active[b]:
                continue
            if first_eos[b] < emitted[b] - 1:
                self.eos_inside_block.add(b)
            if room[b] < min(emitted[b], first_eos[b] + 1):
                self.limit_inside_block.add(b)
        return self.commit(state, tokens, counts, requests)


@pytest.fixture
def recorder(monkeypatch):
    rec = CommitRecorder(decoder_module.commit)
    monkeypatch.setattr(decoder_module, "commit", rec)
    return rec


def check_counts(stats, want, k):
    """The stats agree with the outputs; acceptance is a prefix (draft j + 1 accepted
    only with draft j)."""
    assert stats.num_generated.tolist() == [len(w) for w in want]
    acc = stats.accepted_per_position
    assert acc.shape == (k,)
    assert bool((acc[1:] <= acc[:-1]).all()), acc
    return stats


@pytest.mark.parametrize("k,head_block", BLOCKS)
@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_random_block_drafts_equal_oracle(build, random_target, kind, k, head_block):
    target, eos, want = random_target
    proposer = build.make_proposer(kind, target, k, max_model_len=MAX_MODEL_LEN, head_block_size=head_block)
    got = generate(target, PROMPTS, proposer, max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert [t.tolist() for t in got.tokens] == want
    assert any(len(w) < n for w, n in zip(want, MAX_NEW, strict=True))  # the stops differ
    check_counts(got.stats, want, k)


@pytest.mark.parametrize("k,head_block", COPY_BLOCKS)
@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_accepted_block_drafts_equal_oracle(build, bigram_target, recorder, kind, k, head_block):
    """Mostly accepted blocks (DFlash: the first draft, and whole blocks on the fixed
    point its mask rows predict; DSpark: every draft its Markov head follows the
    map with), cut inside a block by EOS, max_new_tokens and max_model_len."""
    target, eos, want = bigram_target
    proposer = build.make_proposer(kind, target, k, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.2,
                                   head_block_size=head_block)  # fmt: skip
    got = generate(target, PROMPTS, proposer, max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert [t.tolist() for t in got.tokens] == want
    stats = check_counts(got.stats, want, k)
    rate = stats.acceptance_rate_per_position
    assert rate[0].item() >= 0.6, rate
    assert stats.accepted_per_position[-1].item() >= 1, stats.accepted_per_position  # whole blocks accepted
    if kind.startswith("dspark"):
        assert stats.mean_acceptance_length.item() >= 1 + 0.7 * k, stats.mean_acceptance_length
    assert recorder.eos_inside_block and recorder.eos_inside_block <= {1, 4}, recorder.eos_inside_block
    cut = recorder.limit_inside_block
    assert any(BY_MAX_MODEL_LEN[b] for b in cut) and not all(BY_MAX_MODEL_LEN[b] for b in cut), cut


def test_decoder_reads_the_heads_target_layers(build, bigram_target):
    """SpeculativeDecoder feeds a block head the aux layers its target_layer_ids name
    (DeepSpec's -1 and 0 of a 2-layer target: the streams entering layers 0 and 1),
    and a decoder reused for a second, smaller batch (the draft's context cache
    holding the first run's keys; verify and draft as two calls, time_split) is
    lossless again."""
    target, eos, want = bigram_target
    proposer = build.make_proposer("dflash", target, 3, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.2)
    decoder = SpeculativeDecoder(target, proposer)
    assert proposer.model.block.target_layer_ids == (-1, 0)
    assert decoder.aux_layers == (0, 1)
    for rows, time_split in ((range(len(PROMPTS)), False), ([3, 1], True)):
        got = decoder.generate([PROMPTS[b] for b in rows], max_new_tokens=[MAX_NEW[b] for b in rows],
                               eos_token_id=[eos[b] for b in rows], time_split=time_split)  # fmt: skip
        assert [t.tolist() for t in got.tokens] == [want[b] for b in rows]
