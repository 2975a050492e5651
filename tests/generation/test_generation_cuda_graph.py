"""On a GPU: with the demo's CUDA options (demo.compile_options: what
mode="reduce-overhead" sets, and loop reordering off), one speculative-decoding
iteration (target verify over K + 1 tokens, rejection sampling, the draft's K steps)
is one CUDA graph replay, greedy and sampled; and a whole generate run through the
graphs, under those options or mode="reduce-overhead" itself, emits the same tokens
as the same compiled iteration run without them."""

import pytest
import torch

from specdraft.demo import PROMPTS, build_decoders, compile_options, encode

from fixtures.cuda_graphs import iteration_launches, three_request_sampling

pytestmark = pytest.mark.cuda  # CUDA graphs need a CUDA device

NUM_PROMPTS = 3


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", ["plain", "speculative"])
def test_iteration_is_one_graph_replay(kind, sampled):
    torch._dynamo.reset()  # every case compiles SpeculativeDecoder.iteration anew
    plain, spec = build_decoders("cuda", 3, NUM_PROMPTS, compile_options("cuda", True))
    decoder = plain if kind == "plain" else spec
    counts = iteration_launches(decoder, encode(PROMPTS[:NUM_PROMPTS]), three_request_sampling(sampled))
    assert counts.get("cudaGraphLaunch", 0) == 1, counts


@pytest.mark.parametrize("options", ["demo", "reduce-overhead"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_graphed_generate_equals_compiled_generate(sampled, options):
    torch._dynamo.reset()
    graph_options = compile_options("cuda", True) if options == "demo" else {"mode": options}
    _, graphed = build_decoders("cuda", 3, NUM_PROMPTS, graph_options)
    _, compiled = build_decoders("cuda", 3, NUM_PROMPTS, True)
    prompts = encode(PROMPTS[:NUM_PROMPTS])
    run = {"max_new_tokens": 48, "sampling": three_request_sampling(sampled)}
    want = compiled.generate(prompts, **run)
    for _ in range(2):  # the second run replays graphs recorded by the first
        got = graphed.generate(prompts, **run)
        assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
        assert torch.equal(got.stats.accepted_per_position, want.stats.accepted_per_position)
