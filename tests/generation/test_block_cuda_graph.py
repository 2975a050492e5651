"""On a GPU: with mode="reduce-overhead", one speculative-decoding iteration with a
block drafter (target verify over K + 1 tokens, rejection sampling, the context
write, the block forward and its sampling; DFlash, and DSpark with its Markov op) is
one CUDA graph replay, greedy and sampled; and a whole generate run through the graphs
emits the same tokens as the same compiled iteration run without them."""

import pytest
import torch

from specdraft.generation import SpeculativeDecoder, num_kv_blocks
from specdraft.proposers.block import BlockProposer

from fixtures.block_drafters import block_copy_head
from fixtures.cuda_graphs import iteration_launches, three_request_sampling

pytestmark = pytest.mark.cuda  # CUDA graphs need a CUDA device

PROMPTS = [[3, 1, 4, 1, 5], [9, 2], [40, 41, 42, 43]]
MAX_MODEL_LEN = 64
K, HEAD_BLOCK = 3, 4
KINDS = ["dflash-confidence", "dspark-gated-confidence"]


def block_decoder(build, kind, compile) -> SpeculativeDecoder:
    """A copy head (mostly accepted) on the bigram-following target, both on the GPU,
    drafting probabilistically with its probs."""
    target = build.make_target(num_layers=2, seed=5, logit_scale=3.0, context_weight=0.5)
    head = block_copy_head(kind, target, HEAD_BLOCK, noise=0.2)
    target.to("cuda")
    head.to("cuda")  # the embedding and lm_head it shares moved with the target
    config = build.spec_config("block", K, MAX_MODEL_LEN, draft_sampling="probabilistic", return_probs="probs")
    blocks = num_kv_blocks(len(PROMPTS), MAX_MODEL_LEN, K, build.BLOCK_SIZE)
    proposer = BlockProposer(head, config, head.allocate_kv_caches(blocks, build.BLOCK_SIZE))
    return SpeculativeDecoder(target, proposer, compile=compile)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", KINDS)
def test_block_iteration_is_one_graph_replay(build, kind, sampled):
    torch._dynamo.reset()  # every case compiles SpeculativeDecoder.iteration anew
    decoder = block_decoder(build, kind, {"mode": "reduce-overhead"})
    counts = iteration_launches(decoder, PROMPTS, three_request_sampling(sampled))
    assert counts.get("cudaGraphLaunch", 0) == 1, counts


@pytest.mark.parametrize("kind", KINDS)
def test_graphed_block_generate_equals_compiled_generate(build, kind):
    torch._dynamo.reset()
    graphed = block_decoder(build, kind, {"mode": "reduce-overhead"})
    compiled = block_decoder(build, kind, True)
    run = {"max_new_tokens": 40, "sampling": three_request_sampling(True)}
    want = compiled.generate(PROMPTS, **run)
    assert want.stats.accepted_per_position[-1] > 0  # whole blocks went through the graph
    for _ in range(2):  # the second run replays graphs recorded by the first
        got = graphed.generate(PROMPTS, **run)
        assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
        assert torch.equal(got.stats.accepted_per_position, want.stats.accepted_per_position)
