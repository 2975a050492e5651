"""On a GPU: with mode="reduce-overhead", one tree-decoding iteration (the target
over N tree nodes, the walk, the KV move, the commit, propose_tree) is one CUDA
graph replay, greedy and sampled; a graphed generate run is lossless against plain
greedy decoding and equals the eager tree decoder when sampled."""

import pytest
import torch

from specdraft.config import SamplingParams
from specdraft.demo import PROMPTS, build_decoders, encode
from specdraft.generation import TreeSpeculativeDecoder
from specdraft.proposers import TreeShape

from fixtures.cuda_graphs import launches

pytestmark = pytest.mark.cuda  # CUDA graphs need a CUDA device

NUM_PROMPTS = 3
TREE = TreeShape(4, 4, 16)


def sampling(sampled: bool):
    if not sampled:
        return None
    return SamplingParams(torch.tensor([0.7, 0.0, 1.0]), torch.arange(NUM_PROMPTS))


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_tree_iteration_is_one_graph_replay(sampled):
    torch._dynamo.reset()
    _, tree = build_decoders("cuda", 3, NUM_PROMPTS, {"mode": "reduce-overhead"}, tree=TREE)
    prompts, requests = tree.requests(encode(PROMPTS[:NUM_PROMPTS]), 16, sampling(sampled), None)
    with torch.no_grad():
        state = tree.prefill(prompts, requests)

        def iteration():
            torch.compiler.cudagraph_mark_step_begin()
            return tree.compiled["iteration"](state, requests)

        for _ in range(3):  # compile, warm up, record
            iteration()
        counts = launches(iteration)
        assert counts.get("cudaGraphLaunch", 0) == 1, counts


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_graphed_tree_generate(sampled):
    torch._dynamo.reset()
    plain, graphed = build_decoders("cuda", 3, NUM_PROMPTS, {"mode": "reduce-overhead"}, tree=TREE)
    prompts = encode(PROMPTS[:NUM_PROMPTS])
    run = {"max_new_tokens": 48, "sampling": sampling(sampled)}
    want = (plain if not sampled else TreeSpeculativeDecoder(graphed.target, graphed.proposer, TREE)).generate(
        prompts, **run
    )
    for _ in range(2):  # the second run replays graphs recorded by the first
        got = graphed.generate(prompts, **run)
        assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
