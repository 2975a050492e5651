"""Greedy speculative decoding is lossless: for every proposer generate supports,
K = 1 and 3, prompts of different lengths and requests that stop at different
times (max_new_tokens, an EOS id, max_model_len), the output equals the target's
own greedy decoding computed by the plain-loop oracle (specs.generate: one request,
one token at a time, dense recompute, no KV cache).

Random draft heads are mostly rejected; heads built from the target's own weights
(conftest.copy_head) are mostly accepted, so the accept / bonus paths run too."""

import pytest
import torch

from specdraft.generation import generate, generate_plain

from specs.generate import dense_logits, greedy_decode

RANDOM_KINDS = ("eagle", "eagle3", "mtp", "multi_layer", "autoregressive")
COPY_KINDS = ("eagle", "mtp", "multi_layer", "autoregressive")
PROMPTS = [[3, 1, 4, 1, 5], [9, 2], list(range(10, 28)), [6, 5, 3]]
MAX_NEW = [6, 11, 10, 8]
MAX_MODEL_LEN = 24  # prompt 2 (18 tokens) stops after 6 tokens


def oracle(target, eos):
    return [
        greedy_decode(target, p, n, eos_token_id=eos, max_model_len=MAX_MODEL_LEN)
        for p, n in zip(PROMPTS, MAX_NEW, strict=True)
    ]


@pytest.fixture(scope="module")
def random_target(build):
    target = build.make_target(num_layers=2, seed=1)
    # EOS: a token request 1 emits early, so requests stop at different times.
    eos = greedy_decode(target, PROMPTS[1], MAX_NEW[1], max_model_len=MAX_MODEL_LEN)[3]
    return target, eos, oracle(target, eos)


@pytest.fixture(scope="module")
def copy_target(build):
    target = build.make_target(num_layers=1, seed=2, unit_embeddings=True)
    return target, oracle(target, None)


def test_oracle_matches_the_target_forward(build, random_target):
    """The dense oracle computes what the target computes (one prefill, fresh cache)."""
    from specdraft.layout import BatchMetadata

    target = random_target[0]
    ids = torch.tensor(PROMPTS[2], dtype=torch.int32)
    n = ids.shape[0]
    kv = target.allocate_kv_caches(8, build.BLOCK_SIZE)
    meta = BatchMetadata(
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_table=torch.arange(8, dtype=torch.int32)[None],
        slot_mapping=torch.arange(n),
        max_query_len=n,
    )
    with torch.no_grad():
        hidden, _ = target(ids, torch.arange(n), meta, kv)
        want = target.compute_logits(hidden)
    torch.testing.assert_close(dense_logits(target, PROMPTS[2]), want, rtol=1e-4, atol=1e-4)


def test_plain_equals_oracle(build, random_target):
    target, eos, want = random_target
    got = generate_plain(
        target,
        PROMPTS,
        max_new_tokens=MAX_NEW,
        eos_token_id=eos,
        max_model_len=MAX_MODEL_LEN,
        block_size=build.BLOCK_SIZE,
    )
    assert [t.tolist() for t in got.tokens] == want
    assert got.stats.mean_acceptance_length.item() == 1.0
    assert got.stats.num_verify_passes.item() == max(len(w) for w in want) - 1


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("kind", RANDOM_KINDS)
def test_random_drafts_equal_oracle(build, random_target, kind, k):
    target, eos, want = random_target
    proposer = build.make_proposer(kind, target, k, max_model_len=MAX_MODEL_LEN)
    got = generate(target, PROMPTS, proposer, max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert [t.tolist() for t in got.tokens] == want
    assert any(len(w) < n for w, n in zip(want, MAX_NEW, strict=True))  # the stops differ
    check_stats(got.stats, want, k)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("kind", COPY_KINDS)
def test_accepted_drafts_equal_oracle(build, copy_target, kind, k):
    """Drafts from the target's weights (the autoregressive draft is the target
    itself), slightly perturbed: most drafts are accepted, some passes partly."""
    target, want = copy_target
    proposer = build.make_proposer(kind, target, k, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.1)
    got = generate(target, PROMPTS, proposer, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in got.tokens] == want
    stats = check_stats(got.stats, want, k)
    rate = stats.acceptance_rate_per_position
    assert rate[0].item() >= (0.99 if kind == "autoregressive" else 0.6), rate
    if k > 1 and kind != "autoregressive":
        assert rate[-1].item() < rate[0].item(), rate  # some passes accepted only part of their drafts
    assert stats.mean_acceptance_length.item() >= 1 + 0.5 * k


def check_stats(stats, want, k):
    """Counts agree with the outputs: every running request's pass emits 1 + accepted
    tokens, cut only in its last pass."""
    lens = torch.tensor([len(w) for w in want])
    assert stats.num_generated.tolist() == lens.tolist()
    assert stats.accepted_per_position.shape == (k,)
    # Acceptance is a prefix: draft k+1 accepted only if draft k was.
    acc = stats.accepted_per_position
    assert bool((acc[1:] <= acc[:-1]).all())
    passes = stats.request_passes.sum()
    emitted_bound = passes + acc.sum()  # tokens the passes emitted before any cut
    generated_by_passes = (lens - 1).sum()
    assert generated_by_passes <= emitted_bound <= generated_by_passes + k * len(want)
    assert stats.num_verify_passes.item() == stats.request_passes.max().item()
    torch.testing.assert_close(
        stats.mean_acceptance_length, 1 + acc.sum().double() / passes.double(), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(stats.acceptance_rate_per_position, acc.double() / passes.double())
    assert stats.total_time_s.item() > 0 and stats.tokens_per_s.item() > 0
    assert torch.isnan(stats.verify_time_s)  # not split
    return stats


@pytest.mark.parametrize("k", [1, 3])
def test_parallel_drafting_equals_oracle(build, copy_target, k):
    """EagleProposer with parallel_drafting (all K drafts from one pass)."""
    target, want = copy_target
    proposer = build.make_proposer(
        "eagle", target, k, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.1,
        parallel_drafting=True, parallel_drafting_token_id=7,
    )  # fmt: skip
    got = generate(target, PROMPTS, proposer, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in got.tokens] == want
    assert got.stats.accepted_per_position[0] > 0


def test_time_split_and_progress(build, copy_target, capsys):
    """time_split: verify and draft run as two calls, timed apart; the same tokens.
    progress: a tqdm bar of generated tokens on stderr."""
    target, want = copy_target
    proposer = build.make_proposer("mtp", target, 3, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.1)
    got = generate(target, PROMPTS, proposer, max_new_tokens=MAX_NEW, time_split=True, progress=True)
    assert [t.tolist() for t in got.tokens] == want
    s = got.stats
    assert s.verify_time_s.item() > 0 and s.draft_time_s.item() > 0
    assert s.verify_time_s.item() + s.draft_time_s.item() <= s.decode_time_s.item()
    torch.testing.assert_close(s.total_time_s, s.prefill_time_s + s.decode_time_s)
    total = sum(len(w) for w in want)
    assert f"{total}/{sum(MAX_NEW) - 4}" in capsys.readouterr().err  # request 2's limit: max_model_len


def test_decoder_reused_for_a_larger_batch(build, random_target):
    """A SpeculativeDecoder keeps its target caches between runs and grows them."""
    from specdraft.generation import SpeculativeDecoder

    target, eos, want = random_target
    proposer = build.make_proposer("eagle", target, 2, max_model_len=MAX_MODEL_LEN)
    decoder = SpeculativeDecoder(target, proposer)
    one = decoder.generate(PROMPTS[1:2], max_new_tokens=MAX_NEW[1:2], eos_token_id=eos)
    assert [t.tolist() for t in one.tokens] == want[1:2]
    blocks = decoder.target_kv_caches[0].shape[1]
    every = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert [t.tolist() for t in every.tokens] == want
    assert decoder.target_kv_caches[0].shape[1] == len(PROMPTS) * blocks
