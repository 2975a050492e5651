"""Budgeted verification over draft trees (generation/tree_budget.py) is lossless and,
unlimited, is today's tree iteration:

- the allocation (kept_nodes) against plain Python on Hypothesis trees: each node's
  gain the smallest survival on its path, the op's order over the batch, ancestor
  closure, and the brute-force best closed sum (specs/budget_keep.py); survivals
  that rise down a path, NaN, finished requests and exact ties included;
- packed tree attention against a plain loop over the paged cache (each kept node
  sees the prefix and its kept ancestors; unwritten slots NaN);
- greedy: on the demo pair, trees of two shapes and budgets that cut through them
  (0, 1, 4, 9 nodes per iteration for 3 requests), with an EOS, the output equals
  the target's own greedy decoding (the dense plain-loop oracle), and no iteration
  verifies more nodes than the budget; a budgeted run in checked mode too;
- a budget of B * (N - 1) equals the unbudgeted tree decoder token for token, accept
  count for accept count, sibling rank for sibling rank, greedy and sampled;
- sampled: the first three tokens of 2,000 requests follow the exact joint (chi-square)
  with about half the nodes verified, and a verifier that accepts every draft fails;
- the budgeted tree iteration compiles whole (fullgraph, one compile, none more for
  a second run; aot_eager and Inductor), equal to the eager run."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specdraft.generation.tree_decoder as tree_decoder_module
from specdraft.assets import load_demo_pair
from specdraft.checked_mode import checked
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.generation import TreeSpeculativeDecoder, num_kv_blocks
from specdraft.generation.step_costs import demo_pair_costs
from specdraft.generation.tree_budget import kept_nodes
from specdraft.generation.tree_costs import TreeCosts
from specdraft.models.attention import packed_tree_attention
from specdraft.ops import tree_ancestors
from specdraft.proposers import EagleProposer, TreeShape

from fixtures.budget import check_budget_held, f32
from fixtures.compiled_generate import assert_compiled_runs_equal
from fixtures.matrix import inductor_with_aot_eager_nightly
from fixtures.sampled_groups import NUM_TOKENS, PER_GROUP, sampled_groups
from specs.budget_keep import best_closed_sum, is_closed, kept_in_order
from specs.generate import chi_square_pvalue, greedy_decode

BLOCK_SIZE = 16
MAX_MODEL_LEN = 56
PROMPTS = [list(b"def fibonacci(n):\n    "), list(b"import os\nimport sys\n"), list(b"class Foo:\n    def __init")]
MAX_NEW = [26, 20, 40]  # request 2 reaches max_model_len inside a tree
EOS = ord("\n")
SHAPES = [TreeShape(3, 2, 6), TreeShape(4, 4, 16)]


# ------------------------------------------------------------------ the allocation


@st.composite
def tree_tables(draw):
    """(survival [B][N], parents [B][N], depths [B][N], done [B], budget): DraftTree-
    shaped trees (node 0 the root, parents earlier), survivals not always falling down
    a path (the op must not trust them to), from exact-tie values or any float32, NaN."""
    num_reqs, n = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    values = draw(st.sampled_from([st.sampled_from([0.0, 0.25, 0.5, 1.0, math.nan]), st.floats(0, 1, width=32)]))
    parents, depths, survival = [], [], []
    for _ in range(num_reqs):
        row = [-1] + [draw(st.integers(0, j - 1)) for j in range(1, n)]
        parents.append(row)
        depth = [0]
        for j in range(1, n):
            depth.append(depth[row[j]] + 1)
        depths.append(depth)
        survival.append([1.0] + [f32(draw(values)) for _ in range(1, n)])
    done = [draw(st.booleans()) for _ in range(num_reqs)]
    budget = draw(st.integers(0, num_reqs * n + 1))
    return survival, parents, depths, done, budget


def path_gains(survival, parents, done):
    """Plain Python: node i's gain is the smallest survival (NaN as 0) from the root's
    child down to i; -1 for a finished request; nodes 1 .. N - 1 only."""
    gains = []
    for row, up, finished in zip(survival, parents, done, strict=True):
        out = []
        for i in range(1, len(row)):
            g, j = 1.0, i
            while j > 0:
                g = min(g, 0.0 if math.isnan(row[j]) else row[j])
                j = up[j]
            out.append(-1.0 if finished else g)
        gains.append(out)
    return gains


@given(tree_tables())
def test_kept_nodes_are_the_best_subtrees(table):
    survival, parents, depths, done, budget = table
    kept = kept_nodes(torch.tensor(survival), torch.tensor(parents), torch.tensor(depths), torch.tensor(done),
                      torch.tensor(budget), max(max(d) for d in depths))  # fmt: skip
    assert bool(kept[:, 0].all())  # the root always
    got = {(b, i) for b, i in torch.nonzero(kept[:, 1:]).tolist()}  # positions 0 .. N - 2: nodes 1 .. N - 1
    gains = path_gains(survival, parents, done)
    below_root = [[-1 if p <= 0 else p - 1 for p in row[1:]] for row in parents]  # positions 0 .. N - 2
    assert got == kept_in_order(gains, [row[1:] for row in depths], budget)
    assert is_closed(got, below_root)
    if sum(len(row) for row in gains) <= 10:
        assert math.fsum(gains[b][i] for b, i in got) == best_closed_sum(gains, below_root, budget)


# ------------------------------------------------------------------ packed tree attention


@st.composite
def packed_layouts(draw):
    """Per request: prefix length, a subtree of n_b nodes (parents earlier, then
    padding to N), rows packed one request after another with padding rows after."""
    num_reqs, n = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    lens = [draw(st.integers(0, 9)) for _ in range(num_reqs)]
    sizes = [draw(st.integers(1, n)) for _ in range(num_reqs)]
    parents = [[-1] + [draw(st.integers(0, j - 1)) if j < s else -1 for j in range(1, n)] for s in sizes]
    extra = draw(st.integers(0, 3))
    return lens, sizes, parents, n, extra, draw(st.integers(0, 2**31 - 1))


def ancestors_of(parents, m):
    out = []
    while m >= 0:
        out.append(m)
        m = parents[m]
    return out


@given(packed_layouts())
def test_packed_tree_attention_matches_a_plain_loop(layout):
    lens, sizes, parents, n, extra, seed = layout
    g = torch.Generator().manual_seed(seed)
    heads, kv_heads, dim, block_size, blocks_per_req = 4, 2, 8, 4, 4
    num_reqs = len(lens)
    cache = torch.randn(2, num_reqs * blocks_per_req, block_size, kv_heads, dim, generator=g, dtype=torch.float64)
    block_table = torch.arange(num_reqs * blocks_per_req, dtype=torch.int32).view(num_reqs, -1).flip(1).contiguous()

    def slot(b, pos):
        return int(block_table[b, pos // block_size]) * block_size + pos % block_size

    flat = cache.view(2, -1, kv_heads, dim)
    for b in range(num_reqs):  # unwritten: NaN past the request's keys
        for pos in range(lens[b] + sizes[b], blocks_per_req * block_size):
            flat[:, slot(b, pos)] = math.nan
    num_rows = sum(sizes) + extra
    query = torch.randn(num_rows, heads, dim, generator=g, dtype=torch.float64)
    ends = torch.tensor(sizes).cumsum(0)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), ends]).to(torch.int32)
    anc = tree_ancestors(torch.tensor(parents))
    out = packed_tree_attention(query, cache, qsl, torch.tensor(lens), block_table, blocks_per_req * block_size, anc)
    scale = dim**-0.5
    for b in range(num_reqs):
        for m in range(sizes[b]):
            row = int(qsl[b]) + m
            positions = list(range(lens[b])) + [lens[b] + j for j in ancestors_of(parents[b], m)]
            keys = torch.stack([flat[0, slot(b, p)] for p in positions])  # [L, kv_heads, D]
            values = torch.stack([flat[1, slot(b, p)] for p in positions])
            for h in range(heads):
                kh = h // (heads // kv_heads)
                weights = torch.softmax(keys[:, kh] @ query[row, h] * scale, dim=0)
                torch.testing.assert_close(out[row, h], weights @ values[:, kh], rtol=1e-6, atol=1e-6)
    assert bool((out[int(ends[-1]) :] == 0).all())  # padding rows


# ------------------------------------------------------------------ end to end on the demo pair


@pytest.fixture(scope="module")
def expected():
    """The dense oracle's greedy decoding (on the CPU, where it runs), and the same
    cut after the first EOS."""
    target, _ = load_demo_pair()
    plain = [greedy_decode(target, p, n, max_model_len=MAX_MODEL_LEN) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
    return {None: plain, EOS: [t[: t.index(EOS) + 1] if EOS in t else t for t in plain]}


def tree_decoder(pair, shape: TreeShape, num_reqs: int = len(PROMPTS), **options):
    target, head = pair
    config = SpeculativeConfig(method="eagle3", num_speculative_tokens=shape.depth, max_model_len=MAX_MODEL_LEN,
                               block_size=BLOCK_SIZE)  # fmt: skip
    blocks = num_kv_blocks(num_reqs, MAX_MODEL_LEN, shape.num_verify_tokens - 1, BLOCK_SIZE)
    proposer = EagleProposer(head, config, head.allocate_kv_caches(blocks, BLOCK_SIZE))
    return TreeSpeculativeDecoder(target, proposer, shape, **options)


@pytest.mark.parametrize("budget", [0, 1, 4, 9])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("eos", [None, EOS], ids=["no-eos", "eos"])
def test_greedy_equals_oracle(pair, expected, shape, budget, eos):
    got = tree_decoder(pair, shape, budget=budget).generate(PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert [t.tolist() for t in got.tokens] == expected[eos]
    check_budget_held(got.stats, budget)
    if budget == 0:
        assert int(got.stats.verified_per_request.sum()) == 0
    else:
        assert int(got.stats.accepted_per_request.sum()) > 0


@pytest.mark.parametrize("best", [None, 0, 4], ids=["whole-tree", "plain", "budget-4"])
def test_a_tree_table_runs_its_choice(pair, expected, best):
    """A TreeCosts table whose fastest entry at B = 3 is `best` (the whole tree, plain
    decoding, 4 nodes): the run takes it (decoder.budget; plain decoding runs without
    the proposer), verifies as it says, and emits the target's own greedy output; a
    table of another shape is refused."""
    shape = SHAPES[0]
    rows = {None: (2e-3, 2.0), 0: (1e-3, 1.0), 4: (2e-3, 1.5)}
    rows[best] = (1e-4, rows[best][1])
    decoder = tree_decoder(pair, shape, budget=TreeCosts(shape=shape, rows={3: rows}))
    got = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)
    assert decoder.budget == (None if best == 0 else best)
    assert (decoder.proposer is None) == (best == 0)
    assert [t.tolist() for t in got.tokens] == expected[None]
    verified = int(got.stats.verified_per_request.sum())
    if best is None:
        assert int(got.stats.iteration_verified.sum(1).max()) == len(PROMPTS) * (shape.num_verify_tokens - 1)
    else:
        check_budget_held(got.stats, best)
        assert (verified == 0) == (best == 0)
    with pytest.raises(ValueError, match="measured with the tree"):
        tree_decoder(pair, shape, budget=TreeCosts(shape=SHAPES[1], rows={3: rows}))


def test_a_plain_run_then_a_tree_run_on_one_decoder(pair, expected):
    """A table choosing plain decoding at B = 3 and the whole tree at B = 1: the plain
    run reads no draft at all (the proposer's forward is never called, no aux layers),
    and the next run at B = 1 drafts and verifies the tree again; both emit the
    target's own greedy output."""
    shape = SHAPES[0]
    rows = {3: {None: (1.0, 2.0), 0: (1e-3, 1.0)}, 1: {None: (1e-3, 2.0), 0: (1.0, 1.0)}}
    decoder = tree_decoder(pair, shape, budget=TreeCosts(shape=shape, rows=rows))
    calls = []
    seen_aux = []
    hooks = [decoder.full_proposer.model.register_forward_hook(lambda *_: calls.append(1)),
             decoder.target.register_forward_pre_hook(lambda _m, _a, kw: seen_aux.append(kw.get("aux_layers")),
                                                      with_kwargs=True)]  # fmt: skip
    try:
        plain = decoder.generate(PROMPTS, max_new_tokens=MAX_NEW)
        assert not calls and set(seen_aux) == {None}
        assert [t.tolist() for t in plain.tokens] == expected[None]
        assert int(plain.stats.verified_per_request.sum()) == 0
        tree = decoder.generate(PROMPTS[:1], max_new_tokens=MAX_NEW[:1])
    finally:
        for hook in hooks:
            hook.remove()
    assert calls and decoder.proposer is decoder.full_proposer and decoder.budget is None
    assert [t.tolist() for t in tree.tokens] == expected[None][:1]
    assert int(tree.stats.accepted_per_request.sum()) > 0


def test_checked_mode_runs_the_budgeted_tree(pair, expected):
    """Every op's value contracts hold on the packed subtrees (padding nodes included)."""
    with checked():
        got = tree_decoder(pair, SHAPES[1], budget=5).generate(PROMPTS, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in got.tokens] == expected[None]


SAMPLING = SamplingParams(torch.tensor([0.0, 0.8, 1.2]), torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("sampling", [None, SAMPLING], ids=["greedy", "sampled"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unlimited_budget_is_the_tree_iteration(pair, shape, sampling):
    run = {"max_new_tokens": MAX_NEW, "sampling": sampling}
    want = tree_decoder(pair, shape).generate(PROMPTS, **run)
    got = tree_decoder(pair, shape, budget=len(PROMPTS) * (shape.num_verify_tokens - 1)).generate(PROMPTS, **run)
    assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
    for field in ("accepted_per_position", "accepted_sibling_rank", "request_passes", "accepted_per_request"):
        assert torch.equal(getattr(got.stats, field), getattr(want.stats, field)), field
    assert torch.equal(got.stats.verified_per_request, (shape.num_verify_tokens - 1) * want.stats.request_passes)


def test_a_tight_budget_verifies_the_likeliest_nodes(pair):
    """Two nodes per iteration for three requests: the nodes verified are accepted far
    more often than the whole tree's."""
    full = tree_decoder(pair, SHAPES[1]).generate(PROMPTS, max_new_tokens=MAX_NEW).stats
    tight = tree_decoder(pair, SHAPES[1], budget=2).generate(PROMPTS, max_new_tokens=MAX_NEW).stats
    rate = lambda s: float(s.accepted_per_request.sum() / s.verified_per_request.sum())  # noqa: E731
    assert rate(tight) > 2 * rate(full)


# ------------------------------------------------------------------ sampled


@pytest.fixture(scope="module")
def sampled_setup(build):
    return sampled_groups(build, num_layers=1, unit_embeddings=True)  # a copied head needs one layer


def sampled_pvalues(build, setup, shape: TreeShape, budget):
    target, joints, prompts, sampling = setup
    proposer = build.make_proposer("eagle", target, shape.num_verify_tokens - 1, max_model_len=16, copy=True,
                                   noise=0.5, max_reqs=len(prompts))  # fmt: skip
    result = TreeSpeculativeDecoder(target, proposer, shape, budget=budget).generate(
        prompts, max_new_tokens=NUM_TOKENS, sampling=sampling
    )
    samples = torch.stack(result.tokens)
    groups = [samples[g * PER_GROUP : (g + 1) * PER_GROUP] for g in range(len(joints))]
    return result, [chi_square_pvalue(s, j) for s, j in zip(groups, joints, strict=True)]


def test_sampled_equals_target_distribution(build, sampled_setup):
    shape = TreeShape(2, 4, 8)
    budget = len(sampled_setup[2]) * (shape.num_verify_tokens - 1) // 2
    result, p = sampled_pvalues(build, sampled_setup, shape, budget)
    assert min(p) > 1e-3, p
    stats = result.stats
    check_budget_held(stats, budget)
    verified = int(stats.verified_per_request.sum())
    assert 0 < verified < (shape.num_verify_tokens - 1) * int(stats.request_passes.sum())  # the budget cut
    assert int(stats.accepted_per_request.sum()) > 0.05 * int(stats.request_passes.sum())
    assert int(stats.accepted_sibling_rank[1:].sum()) > 0  # not only first children


def test_accepting_every_draft_is_caught(build, sampled_setup, monkeypatch):
    real = tree_decoder_module.tree_verify

    def accept_all(tokens, parents, logits, *args, **kwargs):
        forced = logits.clone()
        forced.scatter_(2, tokens.long().clamp(min=0).roll(-1, 1)[..., None], 1e4)
        return real(tokens, parents, forced, *args, **kwargs)

    monkeypatch.setattr(tree_decoder_module, "tree_verify", accept_all)
    shape = TreeShape(2, 2, 4)
    _, p = sampled_pvalues(build, sampled_setup, shape, len(sampled_setup[2]) * 3 // 2)
    assert min(p) < 1e-6, p


# ------------------------------------------------------------------ compile, bad input


@pytest.mark.parametrize("backend", inductor_with_aot_eager_nightly())
def test_budgeted_tree_iteration_compiles(pair, backend):
    """fullgraph, one compile for the run and none for a second, equal to the eager
    run; greedy and sampled rows in one batch. Inductor with the options `specdraft
    demo` compiles this pair's CPU iteration with (C++ without SIMD): it lowers the
    packing, the packed tree mask and the padded walk on its own."""
    from specdraft.demo import compile_options

    run = {"max_new_tokens": MAX_NEW, "sampling": SAMPLING}
    want = tree_decoder(pair, SHAPES[1], budget=7).generate(PROMPTS, **run)
    torch._dynamo.reset()
    options = compile_options("cpu", True) if backend == "inductor" else {}
    compiled = tree_decoder(pair, SHAPES[1], budget=7, compile={"backend": backend, **options})
    assert_compiled_runs_equal(want, compiled, PROMPTS, run)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"budget": -1}, "budget: an int >= 0"),
        ({"budget": True}, "budget: an int >= 0"),
        ({"budget": 2.0}, "budget: an int >= 0"),
        ({"budget": "table"}, "budget: a StepCosts table chooses among chain lengths"),
        ({"budget": 4, "calibration": 0.5}, "calibration: calibrates per-position estimates"),
    ],
)
def test_bad_budget(pair, options, match):
    if options["budget"] == "table":
        options = {"budget": demo_pair_costs()}
    with pytest.raises(ValueError, match=match):
        tree_decoder(pair, SHAPES[0], **options)
