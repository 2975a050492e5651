"""On a GPU: with mode="reduce-overhead", one budgeted iteration (the allocation, the
packed target verify, rejection sampling of each request's kept drafts, the draft
pass over the packed windows) is one CUDA graph replay, greedy and sampled, for a
chain (the demo pair's EAGLE-3) and a block drafter (DSpark's confidence head as survival); and a
whole generate run through the graphs emits what the same compiled iteration emits
without them."""

import pytest
import torch

from specdraft.demo import build_decoders
from specdraft.generation import SpeculativeDecoder, num_kv_blocks
from specdraft.proposers.block import BlockProposer

from fixtures.block_drafters import block_copy_head
from fixtures.cuda_graphs import iteration_launches, three_request_sampling

pytestmark = pytest.mark.cuda  # CUDA graphs need a CUDA device

PROMPTS = [[3, 1, 4, 1, 5], [9, 2], [40, 41, 42, 43]]
MAX_MODEL_LEN = 64
K = 3
BUDGET = 4  # of 3 * K = 9 drafts
PROBABILISTIC = {"draft_sampling": "probabilistic", "return_probs": "probs", "return_draft_confidence": True}


def budget_decoder(build, kind, compile) -> SpeculativeDecoder:
    if kind == "eagle":  # the shipped demo pair's EAGLE-3 head
        _, decoder = build_decoders("cuda", K, len(PROMPTS), compile, budget=BUDGET)
        return decoder
    target = build.make_target(num_layers=2, seed=5, logit_scale=3.0, context_weight=0.5)
    head = block_copy_head(kind, target, K, noise=0.2)
    target.to("cuda")
    head.to("cuda")
    config = build.spec_config("block", K, MAX_MODEL_LEN, **PROBABILISTIC)
    blocks = num_kv_blocks(len(PROMPTS), MAX_MODEL_LEN, K, build.BLOCK_SIZE)
    proposer = BlockProposer(head, config, head.allocate_kv_caches(blocks, build.BLOCK_SIZE))
    return SpeculativeDecoder(target, proposer, compile=compile, budget=BUDGET)


KINDS = ["eagle", "dspark-gated-confidence"]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", KINDS)
def test_budgeted_iteration_is_one_graph_replay(build, kind, sampled):
    torch._dynamo.reset()
    decoder = budget_decoder(build, kind, {"mode": "reduce-overhead"})
    counts = iteration_launches(decoder, PROMPTS, three_request_sampling(sampled))
    assert counts.get("cudaGraphLaunch", 0) == 1, counts


@pytest.mark.parametrize("kind", KINDS)
def test_graphed_budgeted_generate_equals_compiled_generate(build, kind):
    torch._dynamo.reset()
    graphed = budget_decoder(build, kind, {"mode": "reduce-overhead"})
    compiled = budget_decoder(build, kind, True)
    run = {"max_new_tokens": 40, "sampling": three_request_sampling(True)}
    want = compiled.generate(PROMPTS, **run)
    assert int(want.stats.iteration_verified.sum(1).max()) <= BUDGET
    for _ in range(2):
        got = graphed.generate(PROMPTS, **run)
        assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
        assert torch.equal(got.stats.verified_per_request, want.stats.verified_per_request)
