"""torch.compile(fullgraph=True) of a block proposer's propose (DFlash, DSpark of each
Markov kind, with and without the confidence head): no graph break, one compile for
a run of batches of the same shapes and different values (tokens, hidden states,
positions, block tables, rejected counts, temperatures, seeds), and every call equal
to eager (drafts, draft probs, confidence logits, the context written to the cache),
on the plain, padded and unpadded paths, K = block_size and K < block_size.

The graph a GPU gets is checked on the CPU too: the ATen graph AOT autograd hands
the compiler holds no host sync and no data-dependent shape (a CUDA graph could not
capture either).

The matrix compiles with backend="aot_eager" (Dynamo's fullgraph trace plus AOT
functionalization of every custom op: all but Inductor's codegen); one DFlash and
one DSpark case compile with Inductor."""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.models import DraftModelConfig, TinyTargetModel
from specdraft.proposers.block import BlockProposer
from specdraft.testing import CompileCounts, fresh_compile
from specdraft.testing.proposers import make_draft_batch

from fixtures.block_drafters import block_head

VOCAB, HIDDEN, CACHE_BLOCK, BLOCKS_PER_REQUEST = 64, 32, 4, 8
QUERY_LENS = [5, 2, 7, 3]


def make_proposers(kind, k, head_block, sampling, device, count=2):
    """`count` BlockProposers of one random head (on a 3-layer target's config: it
    reads the embeddings and layers 0 and 1), each with caches of its own."""
    torch.manual_seed(0)
    target = TinyTargetModel(DraftModelConfig(hidden_size=HIDDEN, intermediate_size=48, num_heads=4, num_kv_heads=2,
                                              vocab_size=VOCAB, num_layers=3))  # fmt: skip
    head = block_head(kind, target, head_block, mask_token_id=VOCAB - 1, markov_rank=8).to(device)
    config = SpeculativeConfig(method="block", num_speculative_tokens=k, max_model_len=256, block_size=CACHE_BLOCK,
                               draft_sampling=sampling,
                               return_probs="probs" if sampling == "probabilistic" else None)  # fmt: skip
    num_blocks = len(QUERY_LENS) * BLOCKS_PER_REQUEST
    return [BlockProposer(head, config, head.allocate_kv_caches(num_blocks, CACHE_BLOCK)) for _ in range(count)]


def batches(head, device, count=4):
    """Batches of one shape: the same window lengths, everything else different."""
    out = []
    for i in range(count):
        gen = torch.Generator().manual_seed(100 + i)
        starts = torch.randint(0, 12, (len(QUERY_LENS),), generator=gen).tolist()
        temperatures = (torch.rand(len(QUERY_LENS), generator=gen) * 1.5).tolist()
        temperatures[i % len(QUERY_LENS)] = 0.0  # a greedy row, a different one each batch
        batch = make_draft_batch(QUERY_LENS, vocab_size=VOCAB, target_hidden_size=head.hidden_width,
                                 block_size=CACHE_BLOCK, blocks_per_request=BLOCKS_PER_REQUEST, start_positions=starts,
                                 temperatures=temperatures, seed=i, device=device)  # fmt: skip
        rejected = torch.tensor([(b + i) % n for b, n in enumerate(QUERY_LENS)], dtype=torch.int32, device=device)
        out.append((batch, rejected))
    return out


def call(proposer, path, batch, rejected):
    args = batch.propose_args()
    if path == "plain":
        return proposer.propose(*args)
    if path == "padded":
        sample_at = batch.metadata.query_start_loc[1:] - 1 - rejected
        return proposer.propose(*args, token_indices_to_sample=sample_at, num_rejected_tokens=rejected)
    return proposer.propose_unpadded(*args[:4], rejected, batch.metadata, num_kept_tokens=sum(QUERY_LENS),
                                     sampling=batch.sampling)  # fmt: skip


def assert_same(got, want, eager, compiled):
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    for name in ("draft_probs", "confidence_logits"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(compiled.kv_caches, eager.kv_caches, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def run_both(kind, k, head_block, sampling, path, device, backend):
    eager, compiled = make_proposers(kind, k, head_block, sampling, device)
    runs = batches(eager.model, device)
    fn = fresh_compile(lambda b, r: call(compiled, path, b, r), fullgraph=True, backend=backend, dynamic=False)
    with torch.no_grad(), CompileCounts.measure() as counts:
        for batch, rejected in runs:
            assert_same(fn(batch, rejected), call(eager, path, batch, rejected), eager, compiled)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"{counts.compiles} compiles for {len(runs)} batches of one shape"


CASES = [
    # kind, K, head block, draft sampling, path
    ("dflash", 2, 4, "greedy", "plain"),
    ("dflash", 2, 4, "probabilistic", "plain"),
    ("dflash", 3, 3, "greedy", "padded"),
    ("dflash", 2, 4, "probabilistic", "padded"),
    ("dflash", 3, 3, "probabilistic", "unpadded"),
    ("dflash-confidence", 2, 4, "greedy", "unpadded"),
    ("dspark-vanilla", 3, 3, "probabilistic", "padded"),
    ("dspark-vanilla-confidence", 2, 4, "greedy", "plain"),
    ("dspark-gated", 2, 4, "greedy", "padded"),
    ("dspark-gated-confidence", 3, 3, "probabilistic", "unpadded"),
    ("dspark-rnn", 3, 3, "greedy", "unpadded"),
    ("dspark-rnn-confidence", 2, 4, "probabilistic", "padded"),
]


@pytest.mark.parametrize("kind,k,head_block,sampling,path", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_fullgraph_aot_eager(device, kind, k, head_block, sampling, path):
    run_both(kind, k, head_block, sampling, path, device, backend="aot_eager")


@pytest.mark.parametrize("kind", ["dflash-confidence", "dspark-gated-confidence"])
def test_fullgraph_inductor(device, kind):
    run_both(kind, 2, 3, "probabilistic", "padded", device, backend="inductor")


# ------------------------------------------------------------ the graph a GPU gets

HOST_SYNCS = {"nonzero", "_local_scalar_dense", "item", "tolist", "masked_select", "nonzero_static"}


def aten_graphs(fn):
    """The forward ATen graphs AOT autograd hands the compiler for fn()."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fresh_compile(fn, backend=aot_autograd(fw_compiler=record), fullgraph=True, dynamic=False)()
    return graphs


@pytest.mark.parametrize("kind", ["dflash-confidence", "dspark-rnn-confidence"])
def test_graph_has_no_host_sync_or_data_dependent_shape(device, kind):
    (proposer,) = make_proposers(kind, 2, 4, "probabilistic", device, count=1)
    batch, rejected = batches(proposer.model, device, count=1)[0]
    with torch.no_grad():
        graphs = aten_graphs(lambda: call(proposer, "padded", batch, rejected))
    assert len(graphs) == 1
    for node in graphs[0].graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        assert name not in HOST_SYNCS, node.format_node()
        value = node.meta.get("val")
        for v in value if isinstance(value, (tuple, list)) else [value]:
            if isinstance(v, torch.Tensor):
                assert all(isinstance(s, int) for s in v.shape), node.format_node()  # no data-dependent size
