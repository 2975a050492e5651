"""The iteration compiles whole: torch.compile(fullgraph=True) of
SpeculativeDecoder.iteration (and of its two halves with time_split) equals the
eager run, with no graph break and one compile per function for the whole run,
reused by a second run (no recompile: every iteration has the same shapes).

The suite compiles with backend="aot_eager" (Dynamo's fullgraph trace plus AOT
functionalization: all but Inductor's codegen) to stay within CI time on 2 cores.
Inductor itself (about 1-2 minutes per compile there) runs with
SPECDRAFT_GENERATE_INDUCTOR=1."""

import os

import pytest
import torch

from specdraft.config import SamplingParams
from specdraft.generation import SpeculativeDecoder

from fixtures.compiled_generate import assert_compiled_runs_equal

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [3]]
MAX_NEW = [9, 4, 7]
MAX_MODEL_LEN = 32
PROBABILISTIC = {"draft_sampling": "probabilistic", "return_probs": "probs"}
SAMPLING = SamplingParams(torch.tensor([0.0, 0.8, 1.2]), torch.tensor([1, 2, 3]))


@pytest.fixture(scope="module")
def target(build):
    return build.make_target(num_layers=2, seed=4)


def decoder(build, target, kind, compile):
    if kind == "plain":
        return SpeculativeDecoder(
            target, None, max_model_len=MAX_MODEL_LEN, block_size=build.BLOCK_SIZE, compile=compile
        )
    proposer = build.make_proposer(kind, target, 2, max_model_len=MAX_MODEL_LEN, **PROBABILISTIC)
    return SpeculativeDecoder(target, proposer, compile=compile)


def compare(build, target, kind, backend, sampling, time_split=False, want_compiles=1):
    run = {"max_new_tokens": MAX_NEW, "sampling": sampling, "time_split": time_split}
    want = decoder(build, target, kind, False).generate(PROMPTS, **run)
    torch._dynamo.reset()
    compiled = decoder(build, target, kind, {"backend": backend})
    assert_compiled_runs_equal(want, compiled, PROMPTS, run, want_compiles)


def test_plain_iteration_compiles(build, target):
    compare(build, target, "plain", "aot_eager", SAMPLING)


def test_eagle3_iteration_compiles(build, target):
    """Greedy and sampled rows in one batch, probabilistic drafts with their probs."""
    compare(build, target, "eagle3", "aot_eager", SAMPLING)


def test_split_iteration_compiles(build, target):
    """time_split: verify and draft are two compiled functions, one compile each."""
    compare(build, target, "mtp", "aot_eager", None, time_split=True, want_compiles=2)


@pytest.mark.skipif(
    os.environ.get("SPECDRAFT_GENERATE_INDUCTOR") != "1", reason="slow: set SPECDRAFT_GENERATE_INDUCTOR=1"
)
@pytest.mark.parametrize("kind", ["plain", "eagle"])
def test_inductor(build, target, kind):
    compare(build, target, kind, "inductor", SAMPLING)
