"""On a GPU: with mode="reduce-overhead", one speculative-decoding iteration (target
verify over K + 1 tokens, rejection sampling, the draft's K steps) is one CUDA graph
replay, greedy and sampled; and a whole generate run through the graphs emits the
same tokens as the same compiled iteration run without them."""

import pytest
import torch

from specdraft.config import SamplingParams
from specdraft.demo import PROMPTS, build_decoders, encode

from fixtures.cuda_graphs import launches

pytestmark = pytest.mark.cuda  # CUDA graphs need a CUDA device

NUM_PROMPTS = 3


def sampling(sampled: bool):
    if not sampled:
        return None
    return SamplingParams(torch.tensor([0.7, 0.0, 1.0]), torch.arange(NUM_PROMPTS))


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", ["plain", "speculative"])
def test_iteration_is_one_graph_replay(kind, sampled):
    torch._dynamo.reset()  # every case compiles SpeculativeDecoder.iteration anew
    plain, spec = build_decoders("cuda", 3, NUM_PROMPTS, {"mode": "reduce-overhead"})
    decoder = plain if kind == "plain" else spec
    prompts, requests = decoder.requests(encode(PROMPTS[:NUM_PROMPTS]), 16, sampling(sampled), None)
    with torch.no_grad():
        state = decoder.prefill(prompts, requests)

        def iteration():
            torch.compiler.cudagraph_mark_step_begin()
            return decoder.compiled["iteration"](state, requests)

        for _ in range(3):  # compile, warm up, record
            iteration()
        counts = launches(iteration)
        assert counts.get("cudaGraphLaunch", 0) == 1, counts


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_graphed_generate_equals_compiled_generate(sampled):
    torch._dynamo.reset()
    _, graphed = build_decoders("cuda", 3, NUM_PROMPTS, {"mode": "reduce-overhead"})
    _, compiled = build_decoders("cuda", 3, NUM_PROMPTS, True)
    prompts = encode(PROMPTS[:NUM_PROMPTS])
    run = {"max_new_tokens": 48, "sampling": sampling(sampled)}
    want = compiled.generate(prompts, **run)
    for _ in range(2):  # the second run replays graphs recorded by the first
        got = graphed.generate(prompts, **run)
        assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
        assert torch.equal(got.stats.accepted_per_position, want.stats.accepted_per_position)
