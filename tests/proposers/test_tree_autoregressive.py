"""AutoregressiveSpeculator.propose_tree: exact draft attention for a standalone
draft LM. Every fed node's log-probabilities equal the LM run over its request's
kept window, the root and the root-to-node path as one sequence, recomputed from a
fresh cache by the oracle written here (no KV reuse, no batching, no tree buffers);
every expanded node's children are the topk of that distribution, scored by the
path's summed log-probability. 1-D and M-RoPE positions, with and without rejected
window tokens; topk = 1 drafts the speculator's greedy chain; LMs without layers
are refused; one fullgraph compile serves new values."""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.models import TinyTargetModel
from specdraft.proposers import AutoregressiveSpeculator, DraftLM, TreeShape
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB, draft_config
from specs.draft_tree import path_of, top_ids
from specs.proposer import run_sequence

BLOCK_SIZE = 4
QUERY_LENS = [5, 1, 9, 3]
REJECTED = [2, 0, 3, 1]


def build(mrope: bool, seed: int = 0, k: int = 3):
    torch.manual_seed(seed)
    lm = TinyTargetModel(draft_config(mrope, num_layers=2)).eval()
    batch = make_draft_batch(QUERY_LENS, vocab_size=VOCAB, target_hidden_size=8, block_size=BLOCK_SIZE,
                             blocks_per_request=6, mrope=mrope, seed=seed)  # fmt: skip
    config = SpeculativeConfig(num_speculative_tokens=k, max_model_len=256, block_size=BLOCK_SIZE)
    kv = lm.allocate_kv_caches(len(QUERY_LENS) * 6, BLOCK_SIZE)
    for cache in kv:  # garbage wherever the window pass writes nothing: a stray read shows
        cache.copy_(torch.randn(cache.shape, generator=torch.Generator().manual_seed(7)))
    return lm, batch, AutoregressiveSpeculator(DraftLM(lm), config, kv)


def window_args(batch, rejected):
    args = (batch.target_token_ids, batch.target_positions, None, batch.next_token_ids, batch.metadata)
    return args, (None if rejected is None else torch.tensor(rejected, dtype=torch.int32))


def oracle_logprobs(lm, batch, b: int, path: list[int], rejected) -> torch.Tensor:
    """Log-probabilities after request b's kept window, its next token (the root) and
    `path`, from one dense pass over that whole sequence in a fresh cache."""
    start, stop = batch.metadata.query_start_loc.tolist()[b : b + 2]
    stop -= rejected[b] if rejected else 0
    ids = batch.target_token_ids[start:stop].tolist() + [int(batch.next_token_ids[b])] + path
    positions = batch.target_positions[..., start:stop]
    steps = torch.arange(1, len(path) + 2)
    positions = torch.cat([positions, positions[..., -1:] + (steps if positions.dim() == 1 else steps[None])], dim=-1)
    h, _ = run_sequence(DraftLM(lm), torch.tensor(ids, dtype=torch.int32), positions, None, spec_step_idx=0)
    return torch.log_softmax(lm.compute_logits(h[-1:]).float(), dim=-1)[0]


@pytest.mark.parametrize("rejected", [None, REJECTED], ids=["all-kept", "rejected"])
@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
@pytest.mark.parametrize("topk", [2, 4])
@torch.no_grad()
def test_every_node_drafts_as_its_chain(topk, mrope, rejected):
    lm, batch, spec = build(mrope)
    shape = TreeShape(depth=4, topk=topk, num_verify_tokens=10)
    args, nrej = window_args(batch, rejected)
    out = spec.propose_tree(*args, shape, num_rejected_tokens=nrej, return_logprobs=True)
    pool = out.pool
    assert out.tree.tokens[:, 0].tolist() == batch.next_token_ids.tolist()
    for b in range(len(QUERY_LENS)):
        root = oracle_logprobs(lm, batch, b, [], rejected)
        torch.testing.assert_close(out.root_logprobs[b], root, atol=1e-4, rtol=1e-4)
        expanded = [(-1, root)]
        for step in range(shape.depth - 1):
            for lane in range(topk):
                index = int(out.frontier_index[b, step, lane])
                path = path_of(pool, b, index)
                assert len(path) == step + 1
                want = oracle_logprobs(lm, batch, b, path, rejected)
                torch.testing.assert_close(out.frontier_logprobs[b, step, lane], want, atol=1e-4, rtol=1e-4)
                expanded.append((index, want))
        for index, logprobs in expanded:
            children = [j for j in range(pool.tokens.shape[1]) if int(pool.parents[b, j]) == index]
            assert [int(pool.tokens[b, j]) for j in children] == top_ids(logprobs, topk)
            parent_score = 0.0 if index < 0 else float(pool.scores[b, index])
            for j, i in zip(children, top_ids(logprobs, topk), strict=True):
                assert float(pool.scores[b, j]) == pytest.approx(parent_score + float(logprobs[i]), abs=1e-4)


@pytest.mark.parametrize("rejected", [None, REJECTED], ids=["all-kept", "rejected"])
def test_topk_one_is_the_greedy_chain(rejected):
    _, batch, spec = build(False, k=4)
    args, nrej = window_args(batch, rejected)
    chain = spec.propose(*args, num_rejected_tokens=nrej).draft_tokens
    tree = spec.propose_tree(*args, TreeShape(4, 1, 5), num_rejected_tokens=nrej).tree
    assert tree.tokens[:, 1:].tolist() == chain.tolist()
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 3]] * len(QUERY_LENS)


def test_refusals_name_the_argument():
    _, batch, spec = build(False)
    args, _ = window_args(batch, None)
    with pytest.raises(ValueError, match="^shape must be a TreeShape"):
        spec.propose_tree(*args, (2, 2, 3))

    class Opaque(torch.nn.Module):  # an LM that only offers forward: no layers to feed one by one
        def __init__(self, lm):
            super().__init__()
            self.config = lm.config
            self.inner = lm

        @property
        def num_kv_layers(self):
            return self.inner.num_kv_layers

    opaque = AutoregressiveSpeculator(DraftLM(Opaque(spec.model.model)), spec.config, spec.kv_caches)
    with pytest.raises(ValueError, match="^model: draft trees .* embed_tokens, layers, norm"):
        opaque.propose_tree(*args, TreeShape(2, 2, 3))


def test_one_fullgraph_compile_for_new_values():
    _, batch, spec = build(True)
    _, other, _ = build(True, seed=1)
    shape = TreeShape(depth=3, topk=2, num_verify_tokens=5)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(spec.propose_tree, fullgraph=True, backend="aot_eager")
    for data in (batch, other):
        args, _ = window_args(data, None)
        got, want = compiled(*args, shape).tree, spec.propose_tree(*args, shape).tree
        for name in ("tokens", "parents", "depths", "ancestors"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
