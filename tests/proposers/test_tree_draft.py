"""EagleProposer.propose_tree: exact draft attention. Every fed node's draft
log-probabilities equal drafting its root-to-node path as a chain, each path
recomputed from scratch by the slow per-request oracle (no KV reuse, no batching);
every expanded node's children are the topk of the oracle's distribution, with the
path's summed log-probability as score; topk = 1 drafts the chain proposer's greedy
tokens; MTP heads are refused."""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.proposers import EagleProposer, TreeShape
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB, make_head
from fixtures.traced_calls import traced_calls
from specs.draft_tree import path_of, top_ids
from specs.proposer import oracle_path_logprobs

BLOCK_SIZE = 4
QUERY_LENS = [5, 1, 9, 3]


def build(method, mrope=False, seed=0, k=3):
    head, target_hidden = make_head(method, mrope, seed)
    batch = make_draft_batch(QUERY_LENS, vocab_size=VOCAB, target_hidden_size=target_hidden, block_size=BLOCK_SIZE,
                             blocks_per_request=6, mrope=mrope, seed=seed)  # fmt: skip
    config = SpeculativeConfig(method=method, num_speculative_tokens=k, max_model_len=256, block_size=BLOCK_SIZE)
    kv = head.allocate_kv_caches(len(QUERY_LENS) * 6, BLOCK_SIZE)
    return head, batch, EagleProposer(head, config, kv)


def to_target(head, draft_id: int) -> int:
    d2t = getattr(head, "d2t", None)
    return (
        draft_id
        if d2t is None or head.config.draft_vocab_size == head.config.vocab_size
        else draft_id + int(d2t[draft_id])
    )


@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("topk", [2, 4])
@torch.no_grad()  # the oracle runs the head outside propose's no_grad
def test_every_node_drafts_as_its_chain(method, mrope, topk):
    head, batch, proposer = build(method, mrope)
    shape = TreeShape(depth=4, topk=topk, num_verify_tokens=10)
    out = proposer.propose_tree(*batch.propose_args()[:5], shape, return_logprobs=True)
    pool = out.pool
    assert out.tree.tokens.shape == (len(QUERY_LENS), 10)
    assert out.tree.tokens[:, 0].tolist() == batch.next_token_ids.tolist()
    for b in range(len(QUERY_LENS)):
        root = oracle_path_logprobs(head, batch, b, [])[0]
        torch.testing.assert_close(out.root_logprobs[b], root, atol=1e-4, rtol=1e-4)
        expanded = [(-1, root)]  # (pool index of the expanded node, its oracle log-probabilities)
        for step in range(shape.depth - 1):
            for lane in range(topk):
                index = int(out.frontier_index[b, step, lane])
                path = path_of(pool, b, index)
                assert len(path) == step + 1
                want = oracle_path_logprobs(head, batch, b, path)
                torch.testing.assert_close(out.frontier_logprobs[b, step, lane], want[-1], atol=1e-4, rtol=1e-4)
                expanded.append((index, want[-1]))
        # Every expanded node's children: the oracle's topk, scored by the path's summed log-probability.
        for index, logprobs in expanded:
            children = [j for j in range(pool.tokens.shape[1]) if int(pool.parents[b, j]) == index]
            if index >= 0:  # a frontier node's children are the topk block right after it was fed
                assert len(children) == topk
            assert [int(pool.tokens[b, j]) for j in children] == [to_target(head, i) for i in top_ids(logprobs, topk)]
            parent_score = 0.0 if index < 0 else float(pool.scores[b, index])
            for j, i in zip(children, top_ids(logprobs, topk), strict=True):
                assert float(pool.scores[b, j]) == pytest.approx(parent_score + float(logprobs[i]), abs=1e-4)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_topk_one_is_the_chain(method):
    head, batch, proposer = build(method, k=5)
    chain = proposer.propose(*batch.propose_args()[:5]).draft_tokens
    tree = proposer.propose_tree(*batch.propose_args()[:5], TreeShape(depth=5, topk=1, num_verify_tokens=6)).tree
    assert tree.tokens[:, 1:].tolist() == chain.tolist()
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 3, 4]] * len(QUERY_LENS)
    assert tree.depths.tolist() == [list(range(6))] * len(QUERY_LENS)


def test_mtp_heads_are_refused():
    _, batch, proposer = build("mtp")
    with pytest.raises(ValueError, match="EAGLE-1 or EAGLE-3"):
        proposer.propose_tree(*batch.propose_args()[:5], TreeShape(depth=2, topk=2, num_verify_tokens=3))


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_drafts_trees_is_what_propose_tree_accepts(method):
    """EAGLE-1 and EAGLE-3 heads draft trees, MTP heads chains only: drafts_trees
    says so, and propose_tree drafts for exactly the proposers it calls True."""
    _, batch, proposer = build(method)
    assert proposer.drafts_trees is (method != "mtp")
    args = (*batch.propose_args()[:5], TreeShape(depth=2, topk=2, num_verify_tokens=3))
    if method == "mtp":
        with pytest.raises(ValueError, match="chains only"):
            proposer.propose_tree(*args)
    else:
        assert proposer.propose_tree(*args).tree.tokens.shape == (len(QUERY_LENS), 3)


def test_shape_must_be_a_tree_shape():
    _, batch, proposer = build("eagle")
    with pytest.raises(ValueError, match="TreeShape"):
        proposer.propose_tree(*batch.propose_args()[:5], (2, 2, 3))


def test_one_fullgraph_compile_for_new_values():
    """propose_tree under torch.compile(fullgraph=True): equal to eager, and a second
    batch with other values (same shapes) reuses the graph."""
    head, batch, proposer = build("eagle3")
    _, other, _ = build("eagle3", seed=1)
    shape = TreeShape(depth=3, topk=2, num_verify_tokens=5)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(proposer.propose_tree, fullgraph=True)
    for data in (batch, other):
        got = compiled(*data.propose_args()[:5], shape).tree
        want = proposer.propose_tree(*data.propose_args()[:5], shape).tree
        for name in ("tokens", "parents", "depths", "ancestors"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        torch.testing.assert_close(got.scores, want.scores, atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]


def test_no_sort_in_the_compiled_tree():
    """The traced propose_tree holds no sort, argsort or topk: torch 2.11's Inductor
    lowered a CUDA sort of the 68-node pool (depth 5, topk 4) to a kernel that indexed
    out of bounds, which no CPU run shows; this structural check is what CI can see."""
    _, batch, proposer = build("eagle3")
    calls, _ = traced_calls(
        proposer.propose_tree, *batch.propose_args()[:5], TreeShape(depth=5, topk=4, num_verify_tokens=16)
    )
    names = set(calls)
    assert names and not {n for n in names if any(word in n for word in ("sort", "topk"))}, names
