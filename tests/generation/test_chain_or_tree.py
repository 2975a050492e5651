"""ChainOrTree (generation/chain_or_tree.py): per run, the chain decoder under its
StepCosts or the tree decoder under its TreeCosts, whichever table predicts more
tokens per second at the batch size. Predictions against hand-computed ones (B +
B * (a0 + a0 a1 + a0 a1 a2) tokens in the chain's seconds; the tree's measured
tokens per request x B), the pick and its switch margin, both decoders on one
shared target cache and proposer emitting the target's own greedy output, and the
checks on what it is given."""

import pytest

from specdraft.assets import load_demo_pair
from specdraft.config import SpeculativeConfig
from specdraft.generation import ChainOrTree, SpeculativeDecoder, TreeSpeculativeDecoder, num_kv_blocks
from specdraft.generation.step_costs import PLAIN, Choice, StepCosts
from specdraft.generation.tree_costs import TreeCosts
from specdraft.proposers import EagleProposer, TreeShape

from specs.generate import greedy_decode

BLOCK_SIZE = 16
MAX_MODEL_LEN = 56
PROMPTS = [list(b"def fibonacci(n):\n    "), list(b"import os\nimport sys\n"), list(b"class Foo:\n    def __init")]
MAX_NEW = [26, 20, 40]
SHAPE = TreeShape(3, 2, 6)
RATES = (0.8, 0.7, 0.6)
# B = 3: the chain's fixed K = 3 predicts 3 * 2.696 / 2e-3 = 4,044 tokens/s, the
# tree's whole tree 3 * 2.5 / 3e-3 = 2,500. B = 1: the chain 2.696 / 2e-3 = 1,348,
# the tree 2.5 / 1e-3 = 2,500.
CHAIN_COSTS = StepCosts(seconds={3: {PLAIN: 1e-2, Choice(3, 9): 2e-3}, 1: {PLAIN: 1e-2, Choice(3, 3): 2e-3}},
                        rates=RATES)  # fmt: skip
TREE_COSTS = TreeCosts(
    shape=SHAPE, rows={3: {None: (3e-3, 2.5), 0: (1e-2, 1.0)}, 1: {None: (1e-3, 2.5), 0: (1e-2, 1.0)}}
)


@pytest.fixture(scope="module")
def expected():
    target, _ = load_demo_pair()
    return [greedy_decode(target, p, n, max_model_len=MAX_MODEL_LEN) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]


def decoders(pair, chain_costs=CHAIN_COSTS, tree_costs=TREE_COSTS, share=True):
    """A chain and a tree decoder over one proposer (K = the tree's depth), its draft
    caches and (share) one target cache sized for the tree."""
    target, head = pair
    config = SpeculativeConfig(method="eagle3", num_speculative_tokens=SHAPE.depth, max_model_len=MAX_MODEL_LEN,
                               block_size=BLOCK_SIZE, return_draft_confidence=True)  # fmt: skip
    blocks = num_kv_blocks(len(PROMPTS), MAX_MODEL_LEN, SHAPE.num_verify_tokens - 1, BLOCK_SIZE)
    proposer = EagleProposer(head, config, head.allocate_kv_caches(blocks, BLOCK_SIZE))
    caches = {"target_kv_caches": target.allocate_kv_caches(blocks, BLOCK_SIZE)} if share else {}
    chain = SpeculativeDecoder(target, proposer, budget=chain_costs, **caches)
    tree = TreeSpeculativeDecoder(target, proposer, SHAPE, budget=tree_costs, **caches)
    return chain, tree


def test_predictions_are_the_tables_best_rates(pair):
    auto = ChainOrTree(*decoders(pair))
    chain_tokens = 1 + RATES[0] + RATES[0] * RATES[1] + RATES[0] * RATES[1] * RATES[2]
    for num_reqs, tree_seconds in ((3, 3e-3), (1, 1e-3)):
        got = auto.predicted(num_reqs)
        assert got["chain"] == pytest.approx(num_reqs * chain_tokens / 2e-3)
        assert got["tree"] == pytest.approx(num_reqs * 2.5 / tree_seconds)


def test_each_run_takes_the_faster_decoder_and_is_lossless(pair, expected):
    """B = 3: the chain (its fixed K = 3); B = 1: the whole tree; back at B = 3 the
    chain again, all on one target cache, each output the target's greedy one."""
    auto = ChainOrTree(*decoders(pair))
    for prompts, want in ((3, "chain"), (1, "tree"), (3, "chain")):
        got = auto.generate(PROMPTS[:prompts], max_new_tokens=MAX_NEW[:prompts])
        assert auto.chosen == want and auto.last is auto.decoders[want]
        assert [t.tolist() for t in got.tokens] == expected[:prompts]
        assert int(got.stats.accepted_per_request.sum()) > 0  # drafts were verified and accepted
    assert auto.decoders["tree"].budget is None and auto.decoders["chain"].k == 3


def test_a_pick_is_kept_unless_the_other_is_predicted_faster_by_the_margin(pair):
    chain, tree = decoders(pair, share=False)
    auto = ChainOrTree(chain, tree)
    assert auto.choose(1) == "tree"  # 1,348 against 2,500
    # Every draft accepted: the chain predicts 4 tokens in 2 ms, 2,000 tokens/s, still
    # slower. Then a tree 3% slower than the chain: kept; 11% slower: the chain.
    chain.acceptance_rates = (1.0, 1.0, 1.0)
    assert auto.predicted(1)["chain"] == pytest.approx(4 / 2e-3)
    assert auto.choose(1) == "tree"
    tree_rows = {1: {None: (1e-3, 1.94), 0: (1e-2, 1.0)}, 3: TREE_COSTS.rows[3]}
    auto.decoders["tree"].budget_policy = TreeCosts(shape=SHAPE, rows=tree_rows)  # 1,940 against 2,000
    assert auto.choose(1) == "tree"
    tree_rows[1] = {None: (1e-3, 1.8), 0: (1e-2, 1.0)}  # 1,800: the chain is 11% faster
    auto.decoders["tree"].budget_policy = TreeCosts(shape=SHAPE, rows=tree_rows)
    assert auto.choose(1) == "chain"


def test_what_it_refuses(pair):
    chain, tree = decoders(pair, share=False)
    target, head = pair
    with pytest.raises(ValueError, match="chain: a SpeculativeDecoder"):
        ChainOrTree(tree, tree)
    with pytest.raises(ValueError, match="chain: a decoder built with budget=StepCosts"):
        ChainOrTree(SpeculativeDecoder(target, chain.full_proposer, budget=6), tree)
    with pytest.raises(ValueError, match="tree: a TreeSpeculativeDecoder"):
        ChainOrTree(chain, chain)
    with pytest.raises(ValueError, match="tree: a decoder built with budget=TreeCosts"):
        ChainOrTree(chain, TreeSpeculativeDecoder(target, chain.full_proposer, SHAPE))
    other, _ = load_demo_pair(device=next(target.parameters()).device)
    with pytest.raises(ValueError, match="tree: its target is not the chain's"):
        ChainOrTree(chain, TreeSpeculativeDecoder(other, chain.full_proposer, SHAPE, budget=TREE_COSTS))
