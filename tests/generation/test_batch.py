"""The same seed gives the same tokens for a request in any batch (CPU): a
request's target and draft noise are keyed by its own seed and each token's
position, and nothing it computes reads another row. One request alone, then in a
batch of mixed prompt lengths, temperatures (greedy rows included) and limits, at
another row; for plain decoding and several proposers."""

import pytest
import torch

from specdraft.config import SamplingParams
from specdraft.generation import generate, generate_plain

MAX_MODEL_LEN = 32
PROBABILISTIC = {"draft_sampling": "probabilistic", "return_probs": "probs"}

ALONE = ([4, 2, 7], 0.9, 12345, 12)  # prompt, temperature, seed, max_new_tokens
OTHERS = [([1] * 9, 0.0, 7, 5), ([3, 3], 1.3, 99, 9), ([5, 8, 13, 21, 34], 0.5, 2**40 + 1, 3)]


def batch(position: int):
    rows = list(OTHERS)
    rows.insert(position, ALONE)
    prompts = [r[0] for r in rows]
    sampling = SamplingParams(
        temperature=torch.tensor([r[1] for r in rows], dtype=torch.float32),
        seeds=torch.tensor([r[2] for r in rows], dtype=torch.int64),
    )
    return prompts, sampling, [r[3] for r in rows]


@pytest.fixture(scope="module")
def target(build):
    return build.make_target(num_layers=2, seed=4, logit_scale=2.0)


def outputs(build, target, kind, k, config, position, num_rows):
    if num_rows == 1:
        prompts, max_new = [ALONE[0]], [ALONE[3]]
        sampling = SamplingParams(torch.tensor([ALONE[1]]), torch.tensor([ALONE[2]]))
    else:
        prompts, sampling, max_new = batch(position)
    if kind == "plain":
        result = generate_plain(
            target, prompts, max_new_tokens=max_new, sampling=sampling, max_model_len=MAX_MODEL_LEN,
            block_size=build.BLOCK_SIZE,
        )  # fmt: skip
    else:
        proposer = build.make_proposer(kind, target, k, max_model_len=MAX_MODEL_LEN, **config)
        result = generate(target, prompts, proposer, max_new_tokens=max_new, sampling=sampling)
    return result.tokens[position if num_rows > 1 else 0].tolist()


@pytest.mark.parametrize(
    ("kind", "k", "config"),
    [("plain", 0, {}), ("eagle", 3, PROBABILISTIC), ("multi_layer", 2, PROBABILISTIC), ("autoregressive", 2, {})],
    ids=["plain", "eagle", "multi_layer", "autoregressive"],
)
def test_same_seed_same_tokens_in_any_batch(build, target, kind, k, config):
    alone = outputs(build, target, kind, k, config, 0, 1)
    assert len(alone) == 12
    for position in (0, 2):
        assert outputs(build, target, kind, k, config, position, 4) == alone
