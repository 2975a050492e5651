"""Bad input raises a ValueError naming the argument, before anything runs."""

import pytest
import torch

from specdraft.config import SamplingParams
from specdraft.generation import generate, generate_plain
from specdraft.models import TinyTargetModel

MAX_MODEL_LEN = 16
PROMPTS = [[1, 2, 3], [4, 5]]


@pytest.fixture(scope="module")
def target(build):
    return build.make_target(num_layers=2, seed=0)


def plain(target, prompts=PROMPTS, **kwargs):
    kwargs.setdefault("max_model_len", MAX_MODEL_LEN)
    return generate_plain(target, prompts, block_size=4, **kwargs)


@pytest.mark.parametrize(
    ("prompts", "kwargs", "match"),
    [
        ([], {}, r"^prompts must be a non-empty list"),
        (torch.tensor([[1, 2]]), {}, r"^prompts must be a non-empty list"),
        ([[1], []], {}, r"^prompts\[1\] is empty"),
        ([[1], list(range(MAX_MODEL_LEN))], {}, r"^prompts\[1\] has 16 tokens; max_model_len 16"),
        ([[1, 64]], {}, r"^prompts\[0\] holds token ids outside \[0, vocab_size = 64\)"),
        ([[-1]], {}, r"^prompts\[0\] holds token ids outside"),
        ([[1.0, 2.0]], {}, r"^prompts\[0\] must be a 1-D sequence of int"),
        ([[[1, 2]]], {}, r"^prompts\[0\] must be a 1-D sequence of int"),
        (PROMPTS, {"max_new_tokens": 0}, r"^max_new_tokens must be >= 1"),
        (PROMPTS, {"max_new_tokens": [3]}, r"^max_new_tokens must be one value or 2 values"),
        (PROMPTS, {"max_new_tokens": 2.5}, r"^max_new_tokens must hold ints"),
        (PROMPTS, {"eos_token_id": 64}, r"^eos_token_id 64 is not in \[0, vocab_size = 64\)"),
        (PROMPTS, {"eos_token_id": [1, 2, 3]}, r"^eos_token_id must be one value or 2 values"),
        (PROMPTS, {"sampling": "greedy"}, r"^sampling must be a SamplingParams"),
        (
            PROMPTS,
            {"sampling": SamplingParams(torch.zeros(3), torch.zeros(3, dtype=torch.int64))},
            r"^sampling\.temperature must be a \[2\] tensor",
        ),
        (
            PROMPTS,
            {"sampling": SamplingParams(torch.tensor([0.5, -1.0]), torch.zeros(2, dtype=torch.int64))},
            r"^sampling\.temperature must be finite and >= 0",
        ),
        (
            PROMPTS,
            {"sampling": SamplingParams(torch.tensor([0.5, float("nan")]), torch.zeros(2, dtype=torch.int64))},
            r"^sampling\.temperature must be finite and >= 0",
        ),
        (
            PROMPTS,
            {"sampling": SamplingParams(torch.zeros(2), torch.zeros(2))},
            r"^sampling\.seeds must be a \[2\] int",
        ),
        (PROMPTS, {"max_model_len": None}, r"^max_model_len: required for plain decoding"),
        (PROMPTS, {"max_model_len": 0}, r"^max_model_len must be a positive int"),
    ],
)
def test_plain_bad_input(target, prompts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plain(target, prompts, **kwargs)


def test_target_without_the_model_interface():
    with pytest.raises(ValueError, match=r"^target must have a config with an int vocab_size"):
        generate_plain(torch.nn.Linear(2, 2), PROMPTS, max_model_len=MAX_MODEL_LEN)


def test_mrope_target(build):
    config = build.model_config(num_layers=1, mrope_section=(2, 1, 1))
    with pytest.raises(ValueError, match=r"^target: M-RoPE targets are not supported"):
        generate_plain(TinyTargetModel(config), PROMPTS, max_model_len=MAX_MODEL_LEN)


def test_draft_vocab_differs(build, target):
    other = build.make_target(num_layers=1, vocab=32)
    proposer = build.make_proposer("eagle", other, 2, max_model_len=MAX_MODEL_LEN)
    with pytest.raises(ValueError, match=r"^proposer: the draft's vocab_size \(32\) differs from the target's \(64\)"):
        generate(target, PROMPTS, proposer)


def test_hidden_size_differs(build, target):
    proposer = build.make_proposer("eagle", target, 2, max_model_len=MAX_MODEL_LEN)
    wide = TinyTargetModel(build.model_config(hidden=48, num_layers=1))
    with pytest.raises(ValueError, match=r"^proposer: the head's hidden_size \(32\) differs from the target's \(48\)"):
        generate(wide, PROMPTS, proposer)


@pytest.mark.parametrize(
    ("aux_layers", "match"),
    [
        ((0, 1), r"^aux_layers: the head reads 96 features \(3 x target_hidden_size: EAGLE-3 fuses three aux layers"),
        ((0, 1, 2), r"^aux_layers: layer 2 is not an int in \[0, 2\)"),
    ],
)
def test_eagle3_aux_layers(build, target, aux_layers, match):
    proposer = build.make_proposer("eagle3", target, 2, max_model_len=MAX_MODEL_LEN)
    with pytest.raises(ValueError, match=match):
        generate(target, PROMPTS, proposer, aux_layers=aux_layers)


def test_max_model_len_differs_from_config(build, target):
    proposer = build.make_proposer("eagle", target, 2, max_model_len=MAX_MODEL_LEN)
    with pytest.raises(ValueError, match=r"^max_model_len: 32 differs from the proposer's config\.max_model_len 16"):
        generate(target, PROMPTS, proposer, max_model_len=32)


def test_draft_caches_too_small(build, target):
    proposer = build.make_proposer("eagle", target, 2, max_model_len=MAX_MODEL_LEN, max_reqs=1)
    with pytest.raises(ValueError, match=r"^proposer\.kv_caches\[0\] holds 5 blocks; this batch needs 10"):
        generate(target, PROMPTS, proposer)


def test_more_prompts_than_the_shift_cache_rows(build, target):
    proposer = build.make_proposer("multi_layer", target, 2, max_model_len=MAX_MODEL_LEN, max_reqs=1)
    proposer.kv_caches = [c.new_zeros((c.shape[0], 10, *c.shape[2:])) for c in proposer.kv_caches]
    with pytest.raises(ValueError, match=r"^prompts: 2 prompts, more than the proposer's max_num_reqs 1"):
        generate(target, PROMPTS, proposer)


def test_probabilistic_drafts_need_their_probs(build, target):
    proposer = build.make_proposer(
        "eagle", target, 2, max_model_len=MAX_MODEL_LEN, draft_sampling="probabilistic", return_probs="logits"
    )
    sampling = SamplingParams(torch.tensor([0.0, 1.0]), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(
        ValueError, match=r"^proposer\.config: probabilistic drafts at temperature > 0 need return_probs"
    ):
        generate(target, PROMPTS, proposer, sampling=sampling)
    greedy = SamplingParams(torch.zeros(2), torch.zeros(2, dtype=torch.int64))
    generate(target, PROMPTS, proposer, sampling=greedy, max_new_tokens=2)  # fine at temperature 0


def test_k_at_least_one(build):
    with pytest.raises(ValueError, match=r"^num_speculative_tokens must be a positive int"):
        build.spec_config("eagle", 0, MAX_MODEL_LEN)


def test_target_caches_too_small(build, target):
    from specdraft.generation import SpeculativeDecoder

    caches = target.allocate_kv_caches(3, 4)
    decoder = SpeculativeDecoder(target, None, max_model_len=MAX_MODEL_LEN, block_size=4, target_kv_caches=caches)
    with pytest.raises(ValueError, match=r"^target_kv_caches hold 3 blocks; this batch needs 8"):
        decoder.generate(PROMPTS)
    with pytest.raises(ValueError, match=r"^target_kv_caches must hold one cache per target layer"):
        SpeculativeDecoder(target, None, max_model_len=MAX_MODEL_LEN, target_kv_caches=caches[:1])
