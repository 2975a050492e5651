"""The compile suites' pairwise matrices (tests/fixtures/matrix.py) against brute
force: every pair of values of two factors appears in some chosen case, each case is
one of the product's, and the CI list is shorter than the product."""

import itertools

import pytest

from fixtures.matrix import FULL_MATRIX, pairwise

SHAPES = [
    [
        ["eagle", "eagle3", "mtp"],
        ["greedy", "probabilistic"],
        [False, True],
        ["plain", "padded", "unpadded", "parallel"],
    ],
    [["multi_layer", "multi_group"], ["greedy", "probabilistic"], [False, True], ["padded", "unpadded"]],
    [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11], [12]],
]


@pytest.mark.parametrize("factors", SHAPES, ids=["eagle", "multi", "five"])
def test_every_pair_of_values_is_covered(factors):
    cases = pairwise(*factors)
    product = list(itertools.product(*factors))
    assert all(case in product for case in cases) and len(set(cases)) == len(cases)
    for (i, a), (j, b) in itertools.combinations(enumerate(factors), 2):
        for x, y in itertools.product(a, b):
            assert any(case[i] == x and case[j] == y for case in cases), (i, x, j, y)
    if FULL_MATRIX:
        assert cases == product
    else:
        assert len(cases) <= len(product) // 2
