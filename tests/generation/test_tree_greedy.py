"""Tree decoding (TreeSpeculativeDecoder) is lossless when greedy: on the shipped
demo pair, for the issue's trees (D, topk, N) = (3, 2, 6), (4, 4, 16), (6, 4, 32),
(8, 8, 64), the output equals the target's own greedy decoding by the dense
plain-loop oracle (specs.generate: no KV cache), with requests stopping at an EOS,
at max_new_tokens and at max_model_len inside a tree. After a run, every request's
target KV cache holds what a fresh prefill of its tokens writes (<= 1e-5 fp32),
paths through a 2nd or later sibling included; topk = 1 with N = D + 1 is the chain
decoder token for token, with the same per-depth accept counts (also on 64 prompts x
256 new tokens). The same holds for
trees drafted by the autoregressive speculator (a standalone draft LM)."""

import copy

import pytest
import torch

import specdraft
from specdraft.assets import load_demo_pair
from specdraft.config import SpeculativeConfig
from specdraft.generation import SpeculativeDecoder, TreeSpeculativeDecoder, num_kv_blocks
from specdraft.layout import BatchMetadata
from specdraft.proposers import AutoregressiveSpeculator, DraftLM, EagleProposer, TreeShape

from fixtures.compiled_generate import assert_compiled_runs_equal
from fixtures.matrix import inductor_with_aot_eager_nightly
from specs.generate import greedy_decode

BLOCK_SIZE = 16
MAX_MODEL_LEN = 56
PROMPTS = [list(b"def fibonacci(n):\n    "), list(b"import os\nimport sys\n"), list(b"class Foo:\n    def __init")]
MAX_NEW = [26, 20, 40]  # request 2 reaches max_model_len (25 + 40 > 56) inside a tree
EOS = ord("\n")  # with eos_token_id=EOS, requests stop at their first generated newline


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    return load_demo_pair()


def tree_decoder(target, head, shape: TreeShape, num_reqs: int, max_model_len: int = MAX_MODEL_LEN, **options):
    """A TreeSpeculativeDecoder over the pair, its draft caches sized for N - 1 nodes past a request."""
    config = SpeculativeConfig(method="eagle3", num_speculative_tokens=shape.depth, max_model_len=max_model_len,
                               block_size=BLOCK_SIZE)  # fmt: skip
    blocks = num_kv_blocks(num_reqs, max_model_len, shape.num_verify_tokens - 1, BLOCK_SIZE)
    proposer = EagleProposer(head, config, head.allocate_kv_caches(blocks, BLOCK_SIZE))
    return TreeSpeculativeDecoder(target, proposer, shape, **options)


def cut_at(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture(scope="module")
def expected(pair):
    """The dense oracle's greedy decoding (one dense recompute per token, no cache),
    and the same cut after the first EOS: greedy decoding with an EOS id."""
    target, _ = pair
    plain = [greedy_decode(target, p, n, max_model_len=MAX_MODEL_LEN) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
    return {None: plain, EOS: [cut_at(t, EOS) for t in plain]}


@pytest.mark.parametrize("shape", [(3, 2, 6), (4, 4, 16), (6, 4, 32), (8, 8, 64)], ids=str)
@pytest.mark.parametrize("eos", [None, EOS], ids=["no-eos", "eos"])
def test_greedy_tree_output_is_the_targets(pair, expected, shape, eos):
    target, head = pair
    decoder = tree_decoder(target, head, TreeShape(*shape), len(PROMPTS))
    result = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert [t.tolist() for t in result.tokens] == expected[eos]
    stats = result.stats
    assert stats.accepted_per_position.shape == (shape[0],)
    assert stats.accepted_sibling_rank.shape == (shape[1],)
    # Every accepted node has a rank, and the per-depth counts are what the ranks add up to.
    assert int(stats.accepted_sibling_rank.sum()) == int(stats.accepted_per_position.sum())
    assert float(stats.mean_acceptance_length) > 2.0  # the demo head is a good one: trees accept


def fresh_prefill_kv(target, tokens: list[int]) -> list[torch.Tensor]:
    """Each target layer's K and V [2, n, kv_heads, head_dim] of a prefill of `tokens` in a fresh cache."""
    n = len(tokens)
    blocks = -(-n // BLOCK_SIZE)
    caches = target.allocate_kv_caches(blocks, BLOCK_SIZE)
    meta = BatchMetadata(query_start_loc=torch.tensor([0, n], dtype=torch.int32),
                         seq_lens=torch.tensor([n], dtype=torch.int32),
                         block_table=torch.arange(blocks, dtype=torch.int32)[None],
                         slot_mapping=torch.arange(n), max_query_len=n)  # fmt: skip
    with torch.no_grad():
        target(torch.tensor(tokens, dtype=torch.int32), torch.arange(n), meta, caches)
    return [c.flatten(1, 2)[:, :n] for c in caches]


def test_target_kv_after_commit_is_a_fresh_prefill(pair):
    """After the run, request b's first prompt + generated - 1 slots (the last token
    is never fed) hold a fresh prefill's KV; some accepted node was a 2nd+ sibling."""
    target, head = pair
    shape = TreeShape(4, 4, 16)
    decoder = tree_decoder(target, head, shape, len(PROMPTS))
    result = decoder.generate(PROMPTS, max_new_tokens=[30, 30, 30])
    assert int(result.stats.accepted_sibling_rank[1:].sum()) > 0, "no path went through a later sibling"
    table = torch.arange(len(PROMPTS) * decoder.blocks_per_request).view(len(PROMPTS), -1)
    for b, prompt in enumerate(PROMPTS):
        tokens = prompt + result.tokens[b].tolist()[:-1]
        want = fresh_prefill_kv(target, tokens)
        slots = (table[b][:, None] * BLOCK_SIZE + torch.arange(BLOCK_SIZE)).reshape(-1)[: len(tokens)]
        for layer, cache in enumerate(decoder.target_kv_caches):
            got = cache.flatten(1, 2)[:, slots]
            torch.testing.assert_close(got, want[layer], atol=1e-5, rtol=1e-5)


def test_topk_one_is_the_chain(pair):
    """A (D, 1, D + 1) tree decodes as the chain decoder with K = D: the same tokens
    and the same per-depth accept counts."""
    target, head = pair
    depth = 3
    tree = tree_decoder(target, head, TreeShape(depth, 1, depth + 1), len(PROMPTS))
    config = SpeculativeConfig(method="eagle3", num_speculative_tokens=depth, max_model_len=MAX_MODEL_LEN,
                               block_size=BLOCK_SIZE)  # fmt: skip
    blocks = num_kv_blocks(len(PROMPTS), MAX_MODEL_LEN, depth, BLOCK_SIZE)
    chain = SpeculativeDecoder(target, EagleProposer(head, config, head.allocate_kv_caches(blocks, BLOCK_SIZE)))
    got = tree.generate(PROMPTS, max_new_tokens=MAX_NEW)
    want = chain.generate(PROMPTS, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
    assert got.stats.accepted_per_position.tolist() == want.stats.accepted_per_position.tolist()
    assert got.stats.request_passes.tolist() == want.stats.request_passes.tolist()


# A tree of N nodes goes at most N - 1 deep: (8, 2, 2) drafts 8 steps and keeps one node.
SHALLOW_TREE = TreeShape(8, 2, 2)
NEAR_THE_END = dict(prompt=(PROMPTS[0] * 3)[:55], max_model_len=63, max_new_tokens=8)  # 55 + 8 = 63


def test_a_tree_shallower_than_its_depth_runs_in_checked_mode_near_max_model_len(pair):
    """SHALLOW_TREE with caches of the documented size (N - 1 positions past a
    request) up to max_model_len: checked mode finds every pass inside the request's
    blocks, and the output is the target's greedy decoding."""
    target, head = pair
    run = NEAR_THE_END
    decoder = tree_decoder(target, head, SHALLOW_TREE, 1, max_model_len=run["max_model_len"])
    with specdraft.checked():
        result = decoder.generate([run["prompt"]], max_new_tokens=run["max_new_tokens"])
    want = greedy_decode(target, run["prompt"], run["max_new_tokens"], max_model_len=run["max_model_len"])
    assert result.tokens[0].tolist() == want


def test_a_tree_shallower_than_its_depth_keeps_the_draft_kv_near_max_model_len(pair):
    """The same run unchecked: the draft KV of every committed position (prompt +
    generated - 1) is what a decoder with room to spare (max_model_len 128) holds;
    no draft row past the request's blocks lands on an earlier position's slot."""
    target, head = pair
    run = NEAR_THE_END
    tight = tree_decoder(target, head, SHALLOW_TREE, 1, max_model_len=run["max_model_len"])
    roomy = tree_decoder(target, head, SHALLOW_TREE, 1, max_model_len=128)
    got = tight.generate([run["prompt"]], max_new_tokens=run["max_new_tokens"]).tokens[0].tolist()
    want = roomy.generate([run["prompt"]], max_new_tokens=run["max_new_tokens"]).tokens[0].tolist()
    assert got == want and len(got) == run["max_new_tokens"]
    committed = len(run["prompt"]) + len(got) - 1
    # One request owns blocks 0, 1, ... in order: position p is slot p in both caches.
    for layer, (cache, reference) in enumerate(zip(tight.proposer.kv_caches, roomy.proposer.kv_caches, strict=True)):
        torch.testing.assert_close(cache.flatten(1, 2)[:, :committed], reference.flatten(1, 2)[:, :committed],
                                   atol=1e-5, rtol=1e-5, msg=lambda m, layer=layer: f"draft layer {layer}: {m}")  # fmt: skip


def test_refusals(pair, build):
    target, head = pair
    with pytest.raises(ValueError, match="TreeShape"):
        TreeSpeculativeDecoder(target, None, (3, 2, 6))
    with pytest.raises(ValueError, match="EagleProposer"):
        TreeSpeculativeDecoder(target, None, TreeShape(3, 2, 6))
    # Proposers that draft chains only: an MTP head, a multi-layer MTP proposer.
    small = build.make_target(num_layers=1)
    for kind, method in (("mtp", "'mtp'"), ("multi_layer", "'mtp'")):
        proposer = build.make_proposer(kind, small, 2, max_model_len=32)
        with pytest.raises(
            ValueError, match=f"EAGLE-1 or EAGLE-3 head.*{type(proposer).__name__} with method {method}"
        ):
            TreeSpeculativeDecoder(small, proposer, TreeShape(3, 2, 6))


def test_a_thousand_iterations_compile_once(pair):
    """1,000+ compiled tree iterations (Dynamo with the eager backend: guards and
    recompiles are Dynamo's, whatever the backend) over runs whose acceptance varies
    from pass to pass and from prompt to prompt: one compile, no recompile, no break."""
    from specdraft.demo import PROMPTS as SNIPPETS
    from specdraft.testing import CompileCounts

    target, head = pair
    shape = TreeShape(3, 2, 6)
    torch._dynamo.reset()
    decoder = tree_decoder(target, head, shape, 2, max_model_len=320, compile={"backend": "eager"})
    texts = [list(t.encode()) for t in SNIPPETS]
    iterations, lengths = 0, set()
    with CompileCounts.measure() as counts:
        for run in range(200):
            prompts = [texts[run % len(texts)], texts[(run + 1) % len(texts)][: 8 + run % 40]]
            result = decoder.generate(prompts, max_new_tokens=160)
            iterations += int(result.stats.num_verify_passes)
            lengths.add(round(float(result.stats.mean_acceptance_length), 3))
            if iterations >= 1000:
                break
    assert iterations >= 1000
    assert len(lengths) > 5  # the acceptance did vary
    assert (counts.graph_breaks, counts.compiles) == (0, 1)


@pytest.mark.parametrize("backend", inductor_with_aot_eager_nightly())
def test_tree_iteration_compiles_once(pair, backend):
    """The whole tree iteration (verify -> walk -> KV move -> commit -> propose_tree)
    under torch.compile(fullgraph=True): the eager output, no graph break, one
    compile for every iteration of the run and none for a second run. Inductor too:
    it lowers the tree masks and the in-place KV move differently from eager. Inductor
    compiles with the options `specdraft demo --tree` compiles this pair's CPU
    iteration with (demo.compile_options: C++ without SIMD), what ships on CPU; the
    vectorised C++ took 44% more CPU to build (111 s of the test process against 77 s)."""
    from specdraft.demo import compile_options

    target, head = pair
    shape = TreeShape(3, 2, 6)
    run = {"max_new_tokens": [12, 9, 14]}
    want = tree_decoder(target, head, shape, len(PROMPTS)).generate(PROMPTS, **run)
    torch._dynamo.reset()
    options = compile_options("cpu", True) if backend == "inductor" else {}
    compiled = tree_decoder(target, head, shape, len(PROMPTS), compile={"backend": backend, **options})
    assert_compiled_runs_equal(want, compiled, PROMPTS, run)


# ------------------------------------------------------- the autoregressive speculator


def noisy_lm_speculator(target, shape: TreeShape, num_reqs: int):
    """An AutoregressiveSpeculator whose draft LM is the demo target with noise on its
    MLP weights (0.6 of each weight's spread): it agrees with the target often but
    not always, so paths end early and go through later siblings."""
    lm = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, weight in lm.named_parameters():
            if ".mlp." in name:
                weight.add_(0.6 * weight.std() * torch.randn(weight.shape, generator=gen))
    config = SpeculativeConfig(num_speculative_tokens=shape.depth, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE)
    blocks = num_kv_blocks(num_reqs, MAX_MODEL_LEN, shape.num_verify_tokens - 1, BLOCK_SIZE)
    return AutoregressiveSpeculator(DraftLM(lm), config, lm.allocate_kv_caches(blocks, BLOCK_SIZE))


def test_autoregressive_speculator_trees_are_lossless(pair, expected):
    """Trees drafted by a standalone LM: the target's greedy output (EOS, max_new_tokens
    and max_model_len inside a tree), with later siblings accepted along the way."""
    target, _ = pair
    shape = TreeShape(4, 4, 16)
    decoder = TreeSpeculativeDecoder(target, noisy_lm_speculator(target, shape, len(PROMPTS)), shape)
    for eos in (None, EOS):
        result = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=eos)
        assert [t.tolist() for t in result.tokens] == expected[eos]
    assert int(result.stats.accepted_sibling_rank[1:].sum()) > 0, "no path went through a later sibling"
    assert 1.5 < float(result.stats.mean_acceptance_length) < shape.depth + 1  # some drafts rejected, some not


def test_autoregressive_tree_iteration_compiles_once(pair):
    target, _ = pair
    shape = TreeShape(3, 2, 6)
    run = {"max_new_tokens": [12, 9, 14]}
    speculator = noisy_lm_speculator(target, shape, len(PROMPTS))
    want = TreeSpeculativeDecoder(target, speculator, shape).generate(PROMPTS, **run)
    torch._dynamo.reset()
    compiled = TreeSpeculativeDecoder(target, speculator, shape, compile={"backend": "aot_eager"})
    assert_compiled_runs_equal(want, compiled, PROMPTS, run)


def scale_prompts(count: int) -> list[list[int]]:
    """`count` distinct byte prompts: the demo's Python snippets cut at different lengths."""
    from specdraft.demo import PROMPTS as SNIPPETS

    texts = [list(t.encode()) for t in SNIPPETS]
    return [texts[i % len(texts)][: 6 + (7 * i) % 40] for i in range(count)]


def test_topk_one_is_the_chain_on_64_prompts_of_256_tokens(pair):
    """The issue's scale: 64 prompts x 256 new tokens, one batch, greedy: a (3, 1, 4)
    tree and the K = 3 chain emit the same tokens with the same accept counts."""
    target, head = pair
    depth, prompts, max_len = 3, scale_prompts(64), 320
    tree = tree_decoder(target, head, TreeShape(depth, 1, depth + 1), len(prompts), max_model_len=max_len)
    config = SpeculativeConfig(method="eagle3", num_speculative_tokens=depth, max_model_len=max_len,
                               block_size=BLOCK_SIZE)  # fmt: skip
    blocks = num_kv_blocks(len(prompts), max_len, depth, BLOCK_SIZE)
    chain = SpeculativeDecoder(target, EagleProposer(head, config, head.allocate_kv_caches(blocks, BLOCK_SIZE)))
    got = tree.generate(prompts, max_new_tokens=256)
    want = chain.generate(prompts, max_new_tokens=256)
    assert all(len(t) == 256 for t in want.tokens)
    assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
    assert got.stats.accepted_per_position.tolist() == want.stats.accepted_per_position.tolist()
    assert got.stats.request_passes.tolist() == want.stats.request_passes.tolist()


def test_iteration_graph_commits_every_layer_at_once(pair):
    """What the GPU's launch count rests on, read from the traced iteration: the KV
    commit is one ops.tree_commit_kv call for all the target's layers (8 caches a
    launch; a call per layer was 139 µs of an 8B-shaped iteration), and each draft
    step picks its children with one ops.top_logprobs (a log-softmax and k argmax
    passes were 8 kernels a step): depth calls, the root's included."""
    target, head = pair
    shape = TreeShape(3, 2, 6)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    decoder = tree_decoder(target, head, shape, 1, compile={"backend": record})
    decoder.generate(PROMPTS[:1], max_new_tokens=8)
    assert len(graphs) == 1
    calls = [node for node in graphs[0].graph.nodes if node.op == "call_function"]
    commits = [node for node in calls if node.target is torch.ops.specdraft.tree_commit_kv.default]
    assert len(commits) == 1
    assert len(commits[0].args[0]) == target.config.num_layers
    assert sum(node.target is torch.ops.specdraft.top_logprobs.default for node in calls) == shape.depth
