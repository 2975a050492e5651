"""The generate iteration with a block drafter compiles whole and stays compiled:
SpeculativeDecoder(compile=...) with a DFlash and a DSpark copy head (mostly but not
always accepted, conftest.block_copy_head), a batch of greedy and sampled rows with
probabilistic drafts, equals the eager run, compiles once without a graph break, and
then runs 1,000 more iterations (runs of new prompts, lengths, temperatures and
seeds, requests finishing at different times) with no recompile and no graph break,
the acceptance varying from none to the whole block.

Backend "aot_eager" (Dynamo's fullgraph trace plus AOT functionalization), as
test_compile.py: about 20 ms an iteration on one CPU thread."""

import pytest
import torch

from specdraft.config import SamplingParams
from specdraft.generation import SpeculativeDecoder
from specdraft.testing import CompileCounts

from fixtures.compiled_generate import assert_compiled_runs_equal

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [3], [7, 7]]
MAX_NEW = [20, 9, 14, 30]
MAX_MODEL_LEN = 48
PROBABILISTIC = {"draft_sampling": "probabilistic", "return_probs": "probs"}
ITERATIONS = 1000


@pytest.fixture(scope="module")
def target(build):
    return build.make_target(num_layers=2, seed=5, logit_scale=3.0, context_weight=0.5)


def sampling(run: int) -> SamplingParams:
    """Rows 0 and 3 greedy, rows 1 and 2 sampled, at temperatures and seeds of the run."""
    temperature = torch.tensor([0.0, 0.6, 1.0, 0.0]) + 0.01 * run * torch.tensor([0.0, 1.0, 1.0, 0.0])
    return SamplingParams(temperature, torch.arange(4) + 10 * run)


@pytest.mark.parametrize("kind,k,head_block", [("dflash-confidence", 3, 4), ("dspark-rnn-confidence", 4, 4)])
def test_block_iteration_compiles_once_for_1000_iterations(build, target, kind, k, head_block):
    def decoder(compile):
        proposer = build.make_proposer(kind, target, k, max_model_len=MAX_MODEL_LEN, copy=True, noise=0.2,
                                       head_block_size=head_block, **PROBABILISTIC)  # fmt: skip
        return SpeculativeDecoder(target, proposer, compile=compile)

    run = {"max_new_tokens": MAX_NEW, "sampling": sampling(0)}
    want = decoder(False).generate(PROMPTS, **run)
    torch._dynamo.reset()
    compiled = decoder({"backend": "aot_eager"})
    assert_compiled_runs_equal(want, compiled, PROMPTS, run)

    gen = torch.Generator().manual_seed(0)
    iterations, accepted, passes = 0, torch.zeros(k, dtype=torch.int64), 0
    with CompileCounts.measure() as counts:
        for i in range(1, 10 * ITERATIONS):
            lens = torch.randint(1, 10, (len(PROMPTS),), generator=gen).tolist()
            prompts = [torch.randint(0, build.VOCAB, (n,), generator=gen).tolist() for n in lens]
            max_new = torch.randint(1, MAX_MODEL_LEN, (len(PROMPTS),), generator=gen).tolist()
            stats = compiled.generate(prompts, max_new_tokens=max_new, sampling=sampling(i)).stats
            iterations += int(stats.num_verify_passes)
            accepted += stats.accepted_per_position
            passes += int(stats.request_passes.sum())
            if iterations >= ITERATIONS:
                break
    assert iterations >= ITERATIONS
    assert (counts.graph_breaks, counts.compiles) == (0, 0)
    # Passes that accepted no draft, some, and the whole block.
    assert 0 < accepted[-1] < accepted[0] < passes, (accepted, passes)
