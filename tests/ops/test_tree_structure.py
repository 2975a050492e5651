"""ops.tree_expand, ops.tree_select, ops.tree_ancestors, ops.tree_positions and
ops.tree_commit_kv against plain-Python oracles written from their definitions (add
the parent's score, sort by score then index, walk the parent pointers, root + depth
capped at max_model_len - 1, move slot after slot), in every lane (`kernel`: the CPU reference, the
TRITON_INTERPRET=1 kernels, CUDA). Random pools have exact ties (scores from a coarse
grid, log-probability 0 included, so children tie their parents)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft import checked
from specdraft.ops import tree_ancestors, tree_commit_kv, tree_expand, tree_positions, tree_select

from fixtures.lanes import INTERPRETER

GRID = [0.0, -0.5, -1.0, -2.0]
EXAMPLES = 25 if INTERPRETER else 100  # the interpreter runs every lane in NumPy


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(data=st.data(), batch=st.integers(1, 3), width=st.integers(1, 8), fanout=st.integers(1, 8))
def test_expand_scores_children_and_keeps_the_best(device, data, batch, width, fanout):
    values = st.one_of(st.sampled_from(GRID), st.just(math.nan)) if data.draw(st.booleans()) else st.sampled_from(GRID)
    frontier = [[data.draw(st.sampled_from(GRID)) for _ in range(width)] for _ in range(batch)]
    children = [[[data.draw(values) for _ in range(fanout)] for _ in range(width)] for _ in range(batch)]
    k = data.draw(st.integers(1, width * fanout))
    scores, best = tree_expand(torch.tensor(frontier).to(device), torch.tensor(children).to(device), k)
    for b in range(batch):
        want = [frontier[b][f] + children[b][f][c] for f in range(width) for c in range(fanout)]
        assert scores[b].tolist() == pytest.approx(want, nan_ok=True, abs=0)
        key = [-math.inf if math.isnan(v) else v for v in want]
        assert best[b].tolist() == sorted(range(len(key)), key=lambda j: (-key[j], j))[:k]


@st.composite
def pools(draw):
    """(tokens, scores, parents, depths, roots, N) of B pools laid out as a build lays
    them out: a parent always earlier, its child's score its own plus a log-probability
    <= 0, its child one deeper."""
    batch = draw(st.integers(1, 3))
    size = draw(st.integers(1, 40))
    roots_children = draw(st.integers(1, size))
    rows = []
    for _ in range(batch):
        parents, scores, depths = [], [], []
        for k in range(size):
            parent = -1 if k < roots_children else draw(st.integers(0, k - 1))
            step = draw(st.sampled_from(GRID))
            parents.append(parent)
            scores.append(step if parent < 0 else scores[parent] + step)
            depths.append(1 if parent < 0 else depths[parent] + 1)
        rows.append((parents, scores, depths))
    tokens = draw(st.lists(st.integers(0, 999), min_size=batch * size, max_size=batch * size))
    roots = draw(st.lists(st.integers(0, 999), min_size=batch, max_size=batch))
    n = draw(st.integers(2, size + 1))
    return (
        torch.tensor(tokens).view(batch, size),
        torch.tensor([r[1] for r in rows], dtype=torch.float32),
        torch.tensor([r[0] for r in rows]),
        torch.tensor([r[2] for r in rows]),
        torch.tensor(roots),
        n,
    )


def select_oracle(tokens, scores, parents, depths, root, n):
    """The root plus the n - 1 best nodes by (score, lower index), in pool order."""
    order = sorted(range(len(scores)), key=lambda k: (-scores[k], k))
    kept = sorted(order[: n - 1])
    where = {k: t + 1 for t, k in enumerate(kept)}
    return (
        [root] + [tokens[k] for k in kept],
        [-1] + [where.get(parents[k], 0) if parents[k] >= 0 else 0 for k in kept],
        [0] + [depths[k] for k in kept],
        [0.0] + [scores[k] for k in kept],
    )


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(case=pools())
def test_select_keeps_the_best_nodes_in_pool_order(device, case):
    tokens, scores, parents, depths, roots, n = case
    got = tree_select(*(t.to(device) for t in (tokens, scores, parents, depths, roots)), n)
    for b in range(tokens.shape[0]):
        want = select_oracle(tokens[b].tolist(), scores[b].tolist(), parents[b].tolist(), depths[b].tolist(),
                             int(roots[b]), n)  # fmt: skip
        assert got.tokens[b].tolist() == want[0]
        assert got.parents[b].tolist() == want[1]
        assert got.depths[b].tolist() == want[2]
        assert got.scores[b].tolist() == pytest.approx(want[3], abs=0)
        assert all(p < i for i, p in enumerate(want[1]))  # closed under parents: every parent kept, earlier


@pytest.mark.kernel
def test_select_ranks_nan_last(device):
    scores = torch.tensor([[-1.0, math.nan, -0.5, -2.0]])
    got = tree_select(torch.tensor([[10, 11, 12, 13]]).to(device), scores.to(device),
                      torch.full((1, 4), -1).to(device), torch.ones(1, 4, dtype=torch.long).to(device),
                      torch.tensor([7]).to(device), 4)  # fmt: skip
    assert got.tokens.tolist() == [[7, 10, 12, 13]]


def ancestors_oracle(parents):
    n = len(parents)
    mask = [[False] * n for _ in range(n)]
    for i in range(n):
        node, steps = i, 0
        while 0 <= node < n and steps <= n:
            mask[i][node] = True
            node, steps = parents[node], steps + 1
    return mask


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(data=st.data(), batch=st.integers(1, 3), n=st.integers(1, 40))
def test_ancestors_walk_the_parents(device, data, batch, n):
    # Trees (parent < node), plus a few pointers outside [0, n), which end a path.
    rows = [[-1] + [data.draw(st.one_of(st.integers(0, i - 1), st.sampled_from([-1, n, n + 5])))
                    for i in range(1, n)] for _ in range(batch)]  # fmt: skip
    got = tree_ancestors(torch.tensor(rows).to(device))
    assert got.dtype == torch.bool and got.shape == (batch, n, n)
    for b in range(batch):
        assert got[b].tolist() == ancestors_oracle(rows[b])


def commit_oracle(cache, src, dst):
    """Every move reads the cache as it was: slot after slot copied out of the
    original into a [2, S, H, D] copy."""
    before = cache.view(2, -1, cache.shape[-2], cache.shape[-1])
    flat = before.clone()
    last = flat.shape[1] - 1
    for b in range(len(src)):
        for d in range(len(src[b])):
            s, t = min(max(src[b][d], 0), last), min(max(dst[b][d], 0), last)
            flat[:, t] = before[:, s]
    return flat.view(cache.shape)


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(data=st.data(), batch=st.integers(1, 4), n=st.integers(1, 64), mrope=st.booleans(),
       max_model_len=st.integers(1, 80))  # fmt: skip
def test_positions_are_root_plus_depth_below_max_model_len(device, data, batch, n, mrope, max_model_len):
    rows = 3 if mrope else 1
    roots = [[data.draw(st.integers(0, 90)) for _ in range(batch)] for _ in range(rows)]
    depths = [[data.draw(st.integers(0, 8)) for _ in range(n)] for _ in range(batch)]
    root_tensor = torch.tensor(roots if mrope else roots[0], dtype=torch.int32).to(device)
    got = tree_positions(root_tensor, torch.tensor(depths).to(device), max_model_len)
    want = [[[min(roots[r][b] + d, max_model_len - 1) for d in depths[b]] for b in range(batch)] for r in range(rows)]
    assert got.dtype == torch.int64
    assert got.tolist() == (want if mrope else want[0])


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_commit_reads_every_slot_before_writing(device, dtype):
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(2, 6, 4, 3, 5, generator=g).to(dtype)  # 24 slots, 3 heads of 5
    # Request 0: depth 1 writes slot 4, which depth 2 reads (slot 5 gets slot 4 as it
    # was), and depth 3 writes slot 8, which depth 0 reads (as a tree's path can);
    # request 1 moves onto itself (padding) and has real moves; request 2 reaches past
    # the cache.
    src = [[8, 9, 4, 6], [12, 13, 21, 15], [30, 2, -3, 1]]
    dst = [[3, 4, 5, 8], [12, 14, 22, 15], [16, 17, 18, 19]]
    want = commit_oracle(cache, src, dst)
    got = cache.to(device)
    tree_commit_kv(got, torch.tensor(src).to(device), torch.tensor(dst).to(device))
    assert torch.equal(got.cpu(), want)


@pytest.mark.kernel
@pytest.mark.parametrize("layers", [3, 8, 9, 32])
def test_commit_moves_every_cache_alike(device, layers):
    """A list of caches (a target's layers) moved in one call: more than the 8 caches
    one launch takes, too."""
    g = torch.Generator().manual_seed(layers)
    caches = [torch.randn(2, 3, 4, 2, 64, generator=g) for _ in range(layers)]  # 12 slots, 2 heads of 64
    src, dst = [[5, 9, 2], [1, 0, 11]], [[2, 3, 4], [6, 7, 8]]
    want = [commit_oracle(cache, src, dst) for cache in caches]
    got = [cache.to(device) for cache in caches]
    tree_commit_kv(got, torch.tensor(src).to(device), torch.tensor(dst).to(device))
    for layer, (g_cache, w_cache) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g_cache.cpu(), w_cache), layer


def test_commit_refuses_slots_outside_the_cache_in_checked_mode(device):
    cache = torch.zeros(2, 2, 4, 1, 2, device=device)
    with checked(), pytest.raises(ValueError, match=r"^src_slots\[0, 0\] = 8 is outside \[0, 8\)$"):
        tree_commit_kv(cache, torch.tensor([[8]], device=device), torch.tensor([[0]], device=device))


def test_bad_input_names_the_argument(device):
    tokens = torch.zeros(2, 5, dtype=torch.long, device=device)
    scores = torch.zeros(2, 5, device=device)
    roots = torch.zeros(2, dtype=torch.long, device=device)
    with pytest.raises(ValueError, match="^num_verify_tokens"):
        tree_select(tokens, scores, tokens, tokens, roots, 7)
    with pytest.raises(ValueError, match="^scores"):
        tree_select(tokens, scores.long(), tokens, tokens, roots, 3)
    with pytest.raises(ValueError, match="^k must"):
        tree_expand(scores, scores.view(2, 5, 1), 6)
    with pytest.raises(ValueError, match="^parents"):
        tree_ancestors(torch.zeros(2, 3, device=device))
    with pytest.raises(ValueError, match="^root_positions"):
        tree_positions(roots[:1], tokens, 8)
    with pytest.raises(ValueError, match="^max_model_len"):
        tree_positions(roots, tokens, 0)
    with pytest.raises(ValueError, match="^dst_slots"):
        tree_commit_kv(torch.zeros(2, 2, 4, 1, 2, device=device), tokens, tokens[:, :3])
    with pytest.raises(ValueError, match="^cache must"):
        tree_commit_kv([], tokens, tokens)
    with pytest.raises(ValueError, match=r"^cache\[1\]"):
        tree_commit_kv([torch.zeros(2, 2, 4, 1, 2, device=device), torch.zeros(2, 3, 4, 1, 2, device=device)],
                       tokens, tokens)  # fmt: skip


def test_opcheck(device):
    tokens = torch.tensor([[3, 4, 5, 6]], device=device)
    scores = torch.tensor([[-0.5, -1.0, -0.5, -2.0]], device=device)
    parents = torch.tensor([[-1, -1, 0, 1]], device=device)
    depths = torch.tensor([[1, 1, 2, 2]], device=device)
    roots = torch.tensor([9], device=device)
    torch.library.opcheck(torch.ops.specdraft.tree_select, (tokens, scores, parents, depths, roots, 3))
    torch.library.opcheck(torch.ops.specdraft.tree_expand, (scores[:, :2], scores.view(1, 2, 2), 3))
    torch.library.opcheck(torch.ops.specdraft.tree_ancestors, (torch.tensor([[-1, 0, 0, 2]], device=device),))
    depths_2 = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 3]], device=device)
    torch.library.opcheck(torch.ops.specdraft.tree_positions, (torch.tensor([5, 9], device=device), depths_2, 11))
    mrope_roots = torch.tensor([[5, 9], [6, 3], [7, 1]], device=device)
    torch.library.opcheck(torch.ops.specdraft.tree_positions, (mrope_roots, depths_2, 11))
    cache = torch.randn(2, 2, 4, 1, 2, device=device)
    moves = (torch.tensor([[1, 5]], device=device), torch.tensor([[0, 2]], device=device))
    torch.library.opcheck(torch.ops.specdraft.tree_commit_kv, ([cache, cache + 1], *moves))
