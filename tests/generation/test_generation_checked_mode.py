"""generate in checked mode: its host-side inputs are checked in both modes
(test_generation_bad_input.py); checked mode adds the value checks of every proposer and op call
inside the (eager) iterations. They must never refuse what generate builds itself:
the output is the same in both modes, with requests that finish early (discarded
from drafting) and one that reaches max_model_len."""

import pytest
import torch

import specdraft
from specdraft.config import SamplingParams
from specdraft.generation import generate

MAX_MODEL_LEN = 16
PROMPTS = [[1, 2, 3], list(range(1, 13)), [5]]


@pytest.fixture(scope="module")
def target(build):
    return build.make_target(num_layers=1, seed=0)


@pytest.mark.parametrize(
    ("kind", "sampled"),
    [
        ("eagle", False),
        ("eagle3", True),
        ("mtp", False),
        ("multi_layer", True),
        ("autoregressive", True),
        ("dflash", True),
        ("dspark-gated-confidence", False),
    ],
)
def test_generate_gives_the_same_tokens_in_both_modes(build, target, kind, sampled):
    k = 2
    overrides = (
        {"draft_sampling": "probabilistic", "return_probs": "probs"} if sampled and kind != "multi_layer" else {}
    )
    sampling = SamplingParams(torch.tensor([0.0, 0.8, 1.2]), torch.tensor([1, 2, 3])) if sampled else None
    outputs = []
    for checked in (False, True):
        proposer = build.make_proposer(kind, target, k, max_model_len=MAX_MODEL_LEN, **overrides)
        with specdraft.checked(checked):
            result = generate(target, PROMPTS, proposer, max_new_tokens=[2, 8, 6], sampling=sampling,
                              eos_token_id=None)  # fmt: skip
        outputs.append([t.tolist() for t in result.tokens])
    assert outputs[0] == outputs[1]
    assert [len(t) for t in outputs[0]] == [2, 4, 6]  # request 1 stops at max_model_len
