"""Budgeted verification's compile contract over 1,000+ iterations: the demo pair's
budgeted chain iteration and its budgeted tree iteration, compiled fullgraph (Dynamo
with the eager backend: guards and recompiles are Dynamo's, whatever the backend),
over runs whose prompts, lengths, temperatures and seeds change and whose kept drafts
move from pass to pass: one compile, no recompile, no graph break. Each batch mixes a
greedy and a sampled request (a greedy-only batch is a host-side fact that selects
another graph, by design)."""

import pytest
import torch

from specdraft.config import SamplingParams
from specdraft.demo import PROMPTS, build_decoders, encode
from specdraft.proposers import TreeShape
from specdraft.testing import CompileCounts

ITERATIONS = 1000
BATCH = 2


def mixed_sampling(run: int) -> SamplingParams:
    """Request 0 greedy, request 1 sampled at a temperature and seed of the run."""
    return SamplingParams(torch.tensor([0.0, 0.5 + 0.05 * (run % 10)]), torch.tensor([run, 1000 + run]))


@pytest.mark.parametrize(
    ("tree", "budget"),
    [(None, 3), (TreeShape(4, 4, 16), 12)],  # 3 of 2 x 3 drafts; 12 of 2 x 15 tree nodes
    ids=["chain", "tree"],
)
def test_budgeted_iteration_compiles_once_over_a_thousand_iterations(device, tree, budget):
    torch._dynamo.reset()
    _, decoder = build_decoders(device, 3, BATCH, {"backend": "eager"}, tree=tree, budget=budget)
    texts = encode(PROMPTS)
    iterations, splits, lengths = 0, set(), set()
    with CompileCounts.measure() as counts:
        for run in range(400):
            prompts = [texts[run % len(texts)], texts[(run + 1) % len(texts)][: 8 + run % 40]]
            max_new = [24 + run % 50, 60 + (run * 7) % 90]
            result = decoder.generate(prompts, max_new_tokens=max_new, sampling=mixed_sampling(run))
            stats = result.stats
            iterations += int(stats.num_verify_passes)
            splits.update(tuple(row) for row in stats.iteration_verified.tolist())  # drafts verified per request
            lengths.add(round(float(stats.mean_acceptance_length), 3))
            if iterations >= ITERATIONS:
                break
    assert iterations >= ITERATIONS
    # The budget held every iteration and was shared between the requests differently.
    assert max(sum(split) for split in splits) <= budget and len(splits) > 2, splits
    assert len(lengths) > 5  # the acceptance did vary
    assert (counts.graph_breaks, counts.compiles) == (0, 1)
