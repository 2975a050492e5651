"""On a GPU: with mode="reduce-overhead", one tree-decoding iteration (the target
over N tree nodes, the walk, the KV move, the commit, propose_tree) is one CUDA
graph replay, greedy and sampled, with and without a budget of nodes (the packed
subtrees of generation/tree_budget.py); a graphed generate run is lossless against
plain greedy decoding and equals the eager tree decoder when sampled."""

import pytest
import torch

from specdraft.demo import PROMPTS, build_decoders, encode
from specdraft.generation import TreeSpeculativeDecoder
from specdraft.proposers import TreeShape

from fixtures.cuda_graphs import iteration_launches, three_request_sampling

pytestmark = pytest.mark.cuda  # CUDA graphs need a CUDA device

NUM_PROMPTS = 3
TREE = TreeShape(4, 4, 16)


@pytest.mark.parametrize("budget", [None, 7], ids=["all-nodes", "budget-7"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_tree_iteration_is_one_graph_replay(sampled, budget):
    torch._dynamo.reset()
    _, tree = build_decoders("cuda", 3, NUM_PROMPTS, {"mode": "reduce-overhead"}, tree=TREE, budget=budget)
    counts = iteration_launches(tree, encode(PROMPTS[:NUM_PROMPTS]), three_request_sampling(sampled))
    assert counts.get("cudaGraphLaunch", 0) == 1, counts


@pytest.mark.parametrize("budget", [None, 7], ids=["all-nodes", "budget-7"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_graphed_tree_generate(sampled, budget):
    torch._dynamo.reset()
    plain, graphed = build_decoders("cuda", 3, NUM_PROMPTS, {"mode": "reduce-overhead"}, tree=TREE, budget=budget)
    prompts = encode(PROMPTS[:NUM_PROMPTS])
    run = {"max_new_tokens": 48, "sampling": three_request_sampling(sampled)}
    eager = TreeSpeculativeDecoder(graphed.target, graphed.proposer, TREE, budget=budget)
    want = (plain if not sampled else eager).generate(prompts, **run)
    for _ in range(2):  # the second run replays graphs recorded by the first
        got = graphed.generate(prompts, **run)
        assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
