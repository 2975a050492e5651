"""The EAGLE-2 tree build (specdraft.proposers.tree_build) against a plain-Python
reference written from the algorithm (tests/specs/draft_tree.py): tokens, parents,
depths, scores and ancestor masks, on random score sets with exact ties (log-
probabilities from a coarse grid, 0 included, so children tie their parents and
siblings tie each other). Plus: the kept tree is closed under parents, topk = 1 is
the chain, the shape refuses impossible combinations, and the build compiles with
fullgraph=True into one graph for every batch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.proposers.tree_build import TreeShape, expand_frontier, expand_root, select_tree
from specdraft.testing import CompileCounts, fresh_compile

from specs.draft_tree import build_tree

# Cheap enough for 200 score sets in CI; the nightly profile's 1000 when larger.
EXAMPLES = max(200, settings.default.max_examples)
GRID = [0.0, -0.25, -0.5, -1.0, -1.5, -2.0, -3.0]  # coarse: ties everywhere


@st.composite
def tree_cases(draw):
    depth = draw(st.integers(1, 5))
    topk = draw(st.integers(1, 4))
    pool = topk + (depth - 1) * topk**2
    n = draw(st.integers(2, min(pool + 1, 32)))
    batch = draw(st.integers(1, 3))
    fine = draw(st.booleans())  # random floats instead of the grid: ties only by accident
    value = st.floats(-6.0, 0.0, width=32) if fine else st.sampled_from(GRID)
    steps = []
    for step in range(depth):
        shape = (batch, topk) if step == 0 else (batch, topk, topk)
        count = batch * topk * (1 if step == 0 else topk)
        logprobs = draw(st.lists(value, min_size=count, max_size=count))
        tokens = draw(st.lists(st.integers(0, 99), min_size=count, max_size=count))
        steps.append((torch.tensor(tokens).view(shape), torch.tensor(logprobs, dtype=torch.float32).view(shape)))
    roots = torch.tensor(draw(st.lists(st.integers(0, 99), min_size=batch, max_size=batch)))
    return TreeShape(depth, topk, n), steps, roots


def build(shape: TreeShape, steps, roots):
    pool, frontier = expand_root(*steps[0])
    for tokens, logprobs in steps[1:]:
        pool, frontier = expand_frontier(pool, frontier, tokens, logprobs)
    return select_tree(pool, roots, shape.num_verify_tokens)


def reference_steps(steps, b):
    """Request b's steps in the reference's form."""
    out = [list(zip(steps[0][0][b].tolist(), steps[0][1][b].tolist(), strict=True))]
    for tokens, logprobs in steps[1:]:
        out.append([list(zip(t, lp, strict=True)) for t, lp in zip(tokens[b].tolist(), logprobs[b].tolist(),
                                                                     strict=True)])  # fmt: skip
    return out


@settings(max_examples=EXAMPLES)
@given(case=tree_cases())
def test_build_equals_the_reference(case):
    shape, steps, roots = case
    tree = build(shape, steps, roots)
    for b in range(roots.shape[0]):
        tokens, parents, depths, scores, ancestors = build_tree(
            int(roots[b]), reference_steps(steps, b), shape.topk, shape.num_verify_tokens
        )
        assert tree.tokens[b].tolist() == tokens
        assert tree.parents[b].tolist() == parents
        assert tree.depths[b].tolist() == depths
        assert tree.scores[b].tolist() == pytest.approx(scores, abs=0)
        assert tree.ancestors[b].tolist() == ancestors


@settings(max_examples=EXAMPLES // 2)
@given(case=tree_cases())
def test_kept_tree_is_closed_under_parents(case):
    """No orphan: every node's parent is kept and comes before it, one depth up, and a
    node's score never exceeds its parent's."""
    shape, steps, roots = case
    tree = build(shape, steps, roots)
    for b in range(roots.shape[0]):
        parents, depths, scores = tree.parents[b].tolist(), tree.depths[b].tolist(), tree.scores[b].tolist()
        assert parents[0] == -1 and depths[0] == 0
        for i in range(1, len(parents)):
            assert 0 <= parents[i] < i
            assert depths[parents[i]] == depths[i] - 1
            assert scores[i] <= scores[parents[i]]


def test_topk_one_is_the_chain():
    """topk = 1, N = D + 1: the tree is the chain of each step's top child."""
    shape = TreeShape(depth=4, topk=1, num_verify_tokens=5)
    tokens = [torch.tensor([[7]]), *[torch.tensor([[[t]]]) for t in (3, 9, 4)]]
    steps = [(t, torch.full(t.shape, -0.5)) for t in tokens]
    tree = build(shape, steps, torch.tensor([1]))
    assert tree.tokens.tolist() == [[1, 7, 3, 9, 4]]
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 3]]
    assert tree.ancestors[0].equal(torch.ones(5, 5, dtype=torch.bool).tril())


@pytest.mark.parametrize(
    ("fields", "argument"),
    [
        ((0, 2, 3), "depth"),
        ((9, 2, 3), "depth"),
        ((3, 0, 3), "topk"),
        ((3, 9, 3), "topk"),
        ((3, 2, 1), "num_verify_tokens"),
        ((3, 2, 65), "num_verify_tokens"),
        ((3, 1, 5), "num_verify_tokens"),  # a chain of 3 drafts cannot fill 4 nodes
        ((2, 2, 8), "num_verify_tokens"),  # 2 + 4 = 6 drafted nodes, 7 asked for
    ],
)
def test_impossible_shapes_are_refused(fields, argument):
    with pytest.raises(ValueError, match=f"^{argument}"):
        TreeShape(*fields)


def test_build_compiles_once_for_every_batch(device):
    shape = TreeShape(depth=3, topk=2, num_verify_tokens=6)

    def run(steps, roots):
        return build(shape, steps, roots)

    compiled = fresh_compile(run, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        for batch, seed in ((3, 0), (5, 1), (2, 2)):
            gen = torch.Generator().manual_seed(seed)
            steps = []
            for step in range(shape.depth):
                size = (batch, 2) if step == 0 else (batch, 2, 2)
                logprobs = -torch.rand(size, generator=gen).to(device)
                steps.append((torch.randint(0, 50, size, generator=gen).to(device), logprobs))
            roots = torch.randint(0, 50, (batch,), generator=gen).to(device)
            for got, want in zip(compiled(steps, roots), run(steps, roots), strict=True):
                assert torch.equal(got, want)
    assert counts.graph_breaks == 0 and counts.compiles == 1 and counts.restarts == 0
