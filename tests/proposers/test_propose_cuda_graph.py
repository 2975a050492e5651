"""On a GPU: the bf16 propose loop compiled with mode="reduce-overhead" is one
CUDA graph: after warm-up, each propose call replays exactly one graph, and its
outputs equal the same compiled loop run without graphs."""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.proposers import EagleProposer
from specdraft.testing import fresh_compile
from specdraft.testing.proposers import make_draft_batch

from fixtures.cuda_graphs import launches
from fixtures.draft_heads import VOCAB, make_head

pytestmark = pytest.mark.cuda  # CUDA graphs need a CUDA device


def graph_launches(fn) -> int:
    return launches(fn).get("cudaGraphLaunch", 0)


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
def test_reduce_overhead_is_one_graph_replay_per_call(method, sampling):
    head, target_hidden = make_head(method, mrope=False)
    head = head.to(device="cuda", dtype=torch.bfloat16)
    batch = make_draft_batch([4, 4, 4], vocab_size=VOCAB, target_hidden_size=target_hidden, block_size=4,
                             blocks_per_request=8, temperatures=[0.0, 1.0, 0.7], device="cuda", dtype=torch.bfloat16)  # fmt: skip
    config = SpeculativeConfig(method=method, num_speculative_tokens=3, max_model_len=64, block_size=4,
                               draft_sampling=sampling, return_probs="probs" if sampling == "probabilistic" else None)  # fmt: skip
    plain = EagleProposer(head, config, head.allocate_kv_caches(24, 4, device="cuda"))
    graphed = EagleProposer(head, config, head.allocate_kv_caches(24, 4, device="cuda"))
    # dynamic=False: static shapes, as a captured graph has anyway.
    # fresh_compile resets Dynamo first: every case compiles Proposer.propose for a new
    # proposer, and one worker running several cases would hit the recompile limit.
    compiled = fresh_compile(graphed.propose, mode="reduce-overhead", fullgraph=True, dynamic=False)
    reference = torch.compile(plain.propose, fullgraph=True, dynamic=False)

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*batch.propose_args())

    with torch.no_grad():
        for _ in range(3):  # warm-up: compile, record the graph
            call()
        assert graph_launches(call) == 1
        for _ in range(3):  # the reference's caches go through the same three calls
            want = reference(*batch.propose_args())
        got = call()
    # The same Inductor kernels with and without the graph: identical results. (Against
    # eager, bf16 rounding differs and flips near-tied argmaxes of a random tiny head;
    # eager equality is checked in fp32 by test_eagle_compile.py.)
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    if sampling == "probabilistic":
        torch.testing.assert_close(got.draft_probs, want.draft_probs, rtol=0, atol=0)
