"""A draft tree's budget chosen per run from measured iterations
(generation/tree_costs.py): the choice against a plain loop over the table, the
table's checks and JSON form, the shipped demo pair table, and a TreeSpeculativeDecoder
driven by a table (the whole tree, plain decoding or a node budget, each the target's
own greedy output)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdraft.generation.tree_costs import TreeCosts, demo_pair_tree_costs
from specdraft.proposers import TreeShape

SHAPE = (3, 2, 6)  # 5 nodes a request


def plain_loop_choice(rows, num_reqs, nodes):
    """The spec: the smallest measured batch size >= num_reqs (the largest beyond
    them), each budget scaled to num_reqs (to the whole tree at num_reqs * nodes or more; a
    scaled budget of 0 from one above it dropped), the best tokens per second kept per
    scaled budget; the best of those, the whole tree first and plain decoding second
    on ties."""
    measured = min((b for b in rows if b >= num_reqs), default=max(rows))
    best = {}
    for budget, (seconds, tokens) in rows[measured].items():
        if budget in (None, 0):
            scaled = budget
        else:
            scaled = round(budget * num_reqs / measured)
            if scaled == 0:
                continue
            if scaled >= num_reqs * nodes:
                scaled = None
        best[scaled] = max(best.get(scaled, 0.0), tokens / seconds)
    top = max(best.values())
    for preferred in (None, 0):
        if preferred in best and best[preferred] == top:
            return preferred
    return next(b for b, rate in best.items() if rate == top)


@st.composite
def tables(draw):
    batches = draw(st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=1, max_size=3, unique=True))
    value = st.tuples(st.sampled_from([1.0, 2.0, 3.0]), st.sampled_from([1.0, 1.5, 2.0, 3.0]))
    rows = {}
    for batch in batches:
        budgets = draw(st.lists(st.one_of(st.none(), st.integers(1, batch * 5)), max_size=3, unique=True))
        rows[batch] = {b: draw(value) for b in [0, *budgets]}  # plain decoding in every row
    return rows


@given(rows=tables(), num_reqs=st.integers(1, 20))
def test_choice_is_the_plain_loops(rows, num_reqs):
    costs = TreeCosts(shape=SHAPE, rows=rows)
    assert costs.choose(num_reqs) == plain_loop_choice(rows, num_reqs, nodes=5)


def test_table_checks_and_json():
    costs = TreeCosts(shape=TreeShape(3, 2, 6), rows={4: {None: (2e-3, 2.5), 0: (1e-3, 1.0), 8: (1.5e-3, 2.0)}},
                      device="d", pair="p")  # fmt: skip
    assert costs.shape == SHAPE
    again = TreeCosts.from_json(costs.to_json())
    assert again.rows == costs.rows and again.shape == SHAPE and (again.device, again.pair) == ("d", "p")
    bad = [
        (dict(shape=(3, 2)), "shape"),
        (dict(rows={}), "rows"),
        (dict(rows={4: {0: (1.0, 1.0), 21: (1.0, 1.0)}}), r"\[0, 20\]"),  # more nodes than 4 requests have
        (dict(rows={4: {0: (1.0, 1.0), -1: (1.0, 1.0)}}), "budget"),
        (dict(rows={4: {0: (1.0, 1.0), None: (0.0, 1.0)}}), "seconds > 0"),
        (dict(rows={4: {0: (1.0, 1.0), None: (1.0, 0.5)}}), "tokens per request >= 1"),
        # No plain decoding: a run at B = 1 would scale the budget 1 to nothing, no choice left.
        (dict(rows={2: {1: (1.0, 1.0)}}), r"rows\[2\]: needs plain decoding's entry"),
    ]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            TreeCosts(**{"shape": SHAPE, "rows": {4: {None: (1.0, 2.0), 0: (1.0, 1.0)}}, **change})
    with pytest.raises(ValueError, match="num_reqs"):
        costs.choose(0)


def test_shipped_demo_pair_table_loads():
    costs = demo_pair_tree_costs()
    assert costs.shape == (4, 4, 16) and costs.device
    assert all(None in row and 0 in row for row in costs.rows.values())
