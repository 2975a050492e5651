"""budget_keep against plain-Python oracles (specs/budget_keep.py) on Hypothesis-drawn
survival tables, chains and random trees, exact ties, zero and negative-zero values,
finished requests and rooms marked negative or NaN: the kept set is the first
min(budget, #eligible) in the op's order, its total value is the brute-force best over
every parent-closed set of that size, and it is closed itself. Then larger batches
against the order oracle, the interpreted kernel against the reference (in and out of
registers), bad input and checked mode.

`kernel` tests run in every lane (CPU reference, TRITON_INTERPRET=1 kernel, GPU);
`interpreter` tests compare the interpreted kernel with the reference directly."""

import math
from unittest import mock

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import specdraft
from specdraft.ops import budget_keep
from specdraft.ops.budget import budget_keep_reference, check_budget_keep_values
from specdraft.ops.budget import op as budget_op

import specs.budget_keep as spec
from fixtures.budget import BudgetCase, RandomBatch, budget_cases, random_batches
from fixtures.lanes import INTERPRETER

LARGE_SHAPES = [(1, 7), (8, 7), (64, 7), (256, 7), (256, 8), (16, 64), (256, 64)]
if not INTERPRETER:
    LARGE_SHAPES += [(300, 64)]  # past one register tile on the GPU (16384 positions)
# The interpreter runs the kernel in NumPy, a few milliseconds a tile (its passes loop
# over the tiles): its own comparison takes batches over at most 8 tiles.
INTERPRETER_SHAPES = [(1, 7), (3, 5), (2, 64), (40, 7), (64, 7), (256, 8), (16, 64), (256, 64)]


def kept_set(keep: torch.Tensor) -> set[tuple[int, int]]:
    return {(b, i) for b, row in enumerate(keep.cpu().tolist()) for i, k in enumerate(row) if k}


def run(case: BudgetCase, device, **dtypes):
    keep, counts = budget_keep(*case.op_args(device, **dtypes))
    assert keep.dtype == torch.bool and keep.shape == case.shape
    assert counts.dtype == torch.int32 and counts.shape == (case.shape[0],)
    assert counts.cpu().tolist() == keep.sum(1).cpu().tolist()
    return kept_set(keep)


CHAIN_TIES = BudgetCase([[1.0, 0.5, 0.5, 0.0], [0.5, 0.5, 0.0, -0.0], [-1.0] * 4],
                        [[-1, 0, 1, 2]] * 3, [[0, 1, 2, 3]] * 3, 5)  # fmt: skip
TREE_TIES = BudgetCase([[0.5, 0.5, 0.5, 0.25, 0.5], [0.5, math.nan, math.nan, math.nan, math.nan]],
                       [[-1, -1, 0, 1, 2], [-1, 0, 1, 2, 3]], [[0, 0, 1, 1, 2], [0, 1, 2, 3, 4]], 4)  # fmt: skip


@pytest.mark.kernel
@given(case=budget_cases())
@example(case=CHAIN_TIES)
@example(case=TREE_TIES)
def test_keeps_the_first_in_order_and_the_best_closed_set(device, case):
    kept = run(case, device)
    assert kept == spec.kept_in_order(case.values, case.depths, case.budget)
    assert len(kept) == spec.kept_count(case.values, case.budget)
    assert spec.is_closed(kept, case.parents)
    best = spec.best_closed_sum(case.values, case.parents, case.budget)
    assert math.isclose(math.fsum(case.values[b][i] for b, i in kept), best, rel_tol=1e-6)


@pytest.mark.kernel
def test_the_tie_rule_on_the_examples(device):
    """CHAIN_TIES at budget 5: 1.0, then the four 0.5s by depth, then b (request 1's
    depth-0 0.5 before request 0's depth-1 one); zeros, -0.0 among them, only past
    them. TREE_TIES at budget 4: the 0.5s by depth, request 0's two roots before
    request 1's root by b, then depth 1; the NaN row's rest never."""
    assert run(CHAIN_TIES, device) == {(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)}
    assert run(TREE_TIES, device) == {(0, 0), (0, 1), (1, 0), (0, 2)}
    wide = BudgetCase(CHAIN_TIES.values, CHAIN_TIES.parents, CHAIN_TIES.depths, 7)
    assert run(wide, device) == {(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3)}


@pytest.mark.kernel
@pytest.mark.parametrize("depth_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("budget_dtype", [torch.int32, torch.int64])
def test_index_dtypes(device, depth_dtype, budget_dtype):
    assert run(CHAIN_TIES, device, depth_dtype=depth_dtype, budget_dtype=budget_dtype) == spec.kept_in_order(
        CHAIN_TIES.values, CHAIN_TIES.depths, CHAIN_TIES.budget
    )


@pytest.mark.kernel
@settings(max_examples=max(1, settings().max_examples // 3))
@given(case=budget_cases(max_requests=3, max_positions=5))
def test_an_unlimited_budget_keeps_every_eligible_position(device, case):
    """Today's fixed K / N: every position with a value >= 0, zeros included."""
    unlimited = BudgetCase(case.values, case.parents, case.depths, 2**62)
    assert run(unlimited, device) == set(spec.eligible_positions(case.values))


@pytest.mark.kernel
@settings(max_examples=max(1, settings().max_examples // 2))
@given(batch=random_batches(LARGE_SHAPES))
@example(batch=RandomBatch(256, 8, 5, "palette", "outside", 618))
@example(batch=RandomBatch(16, 64, 1, "chains", "chain", 300))
def test_large_batches_match_the_order_oracle(device, batch):
    """With the GPU's register tile in every lane (the interpreter's own test varies it)."""
    values, depths, budget = batch.op_args(device)
    with mock.patch.object(budget_op, "MAX_TILE", budget_op.GPU_MAX_TILE):
        keep, counts = budget_keep(values, depths, budget)
    clamped = depths.clamp(0, batch.num_pos).cpu().tolist()  # the documented clamp
    assert kept_set(keep) == spec.kept_in_order(values.cpu().tolist(), clamped, batch.budget)
    assert torch.equal(counts, keep.sum(1, dtype=torch.int32))


@pytest.mark.kernel
def test_empty_batch(device):
    keep, counts = budget_keep(torch.zeros(0, 5, device=device), torch.zeros(0, 5, dtype=torch.int64, device=device),
                               torch.tensor(3, device=device))  # fmt: skip
    assert keep.shape == (0, 5) and counts.shape == (0,)


@pytest.mark.kernel
def test_the_budget_is_read_on_the_device_each_call(device):
    """One budget tensor, changed in place between calls: each call keeps what its
    value says."""
    values = torch.tensor([[0.9, 0.8, 0.1], [0.7, 0.2, 0.0]], device=device)
    depths = torch.arange(3, device=device).expand(2, 3).contiguous()
    budget = torch.tensor(0, device=device)
    for value, counts in ((0, [0, 0]), (1, [1, 0]), (3, [2, 1]), (5, [3, 2]), (6, [3, 3]), (-4, [0, 0])):
        budget.fill_(value)
        assert budget_keep(values, depths, budget).counts.cpu().tolist() == counts


# ---------------------------------------------------------- interpreter lane only


@pytest.mark.interpreter
@settings(max_examples=max(1, settings().max_examples // 2))
@given(batch=random_batches(INTERPRETER_SHAPES), max_tile=st.sampled_from([16, 256, 16384]),
       depth_dtype=st.sampled_from([torch.int32, torch.int64]))  # fmt: skip
@example(batch=RandomBatch(256, 8, 5, "palette", "any", 618), max_tile=256, depth_dtype=torch.int32)
@example(batch=RandomBatch(40, 7, 2, "chains", "outside", 100), max_tile=16, depth_dtype=torch.int64)
def test_interpreted_kernel_equals_the_reference(batch, max_tile, depth_dtype):
    """Bit for bit, with the batch in one register tile or over several."""
    max_tile = max(max_tile, batch.num_reqs * batch.num_pos // 8)
    args = batch.op_args("cpu", depth_dtype)
    with mock.patch.object(budget_op, "MAX_TILE", max_tile):
        keep, counts = budget_keep(*args)
    ref_keep, ref_counts = budget_keep_reference(*args)
    assert torch.equal(keep, ref_keep)
    assert torch.equal(counts, ref_counts)


# ------------------------------------------------------------------ bad inputs

B, N = 3, 4


def _good():
    return {"values": torch.rand(B, N), "depths": torch.zeros(B, N, dtype=torch.int64), "budget": torch.tensor(5)}


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"values": torch.rand(B * N)}, "values"),
        ({"values": torch.rand(B, N, 1)}, "values"),
        ({"values": torch.rand(B, 0)}, "values"),
        ({"values": torch.rand(B, N, dtype=torch.float64)}, "values"),
        ({"values": torch.rand(B, N).to(torch.bfloat16)}, "values"),
        ({"values": torch.rand(N, B).T}, "values"),
        ({"values": [[0.5] * N] * B}, "values"),
        ({"depths": torch.zeros(B, N)}, "depths"),
        ({"depths": torch.zeros(B, N + 1, dtype=torch.int64)}, "depths"),
        ({"depths": torch.zeros(B + 1, N, dtype=torch.int64)}, "depths"),
        ({"depths": torch.zeros(N, B, dtype=torch.int64).T}, "depths"),
        ({"depths": torch.zeros(B, N, dtype=torch.int16)}, "depths"),
        ({"budget": torch.tensor([5])}, "budget"),
        ({"budget": torch.tensor(5.0)}, "budget"),
        ({"budget": torch.tensor(True)}, "budget"),
        ({"budget": 5}, "budget"),
        ({"budget": torch.tensor(5, device="meta")}, "budget"),
        ({"depths": torch.zeros(B, N, dtype=torch.int64, device="meta")}, "depths"),
    ],
)
def test_bad_input_names_the_argument(change, argument):
    args = _good() | change
    with pytest.raises(ValueError, match=f"^{argument}"):
        budget_keep(**args)


def test_the_size_limit_is_the_tie_keys_range():
    """B * N * (N + 1) < 2**31 passes; past it the tie keys would not fit int32."""
    num_pos = 2048
    largest = (2**31 - 1) // (num_pos * (num_pos + 1))
    with mock.patch.object(budget_op, "MAX_TILE", 2**20):  # the interpreter: one tile, NumPy-fast
        keep, _ = budget_keep(torch.zeros(largest, num_pos), torch.zeros(largest, num_pos, dtype=torch.int32),
                              torch.tensor(3))  # fmt: skip
    assert int(keep.sum()) == 3
    with pytest.raises(ValueError, match=r"^values: B \* N \* \(N \+ 1\) must be below 2\*\*31"):
        budget_keep(torch.zeros(largest + 1, num_pos), torch.zeros(largest + 1, num_pos, dtype=torch.int32),
                    torch.tensor(3))  # fmt: skip


def test_good_input_passes_the_checks():
    keep, counts = budget_keep(**_good())
    assert keep.shape == (B, N) and counts.tolist() == keep.sum(1).tolist()


def test_value_checker():
    check_budget_keep_values(torch.tensor([[0, 1, N]]), N)
    for bad in ([[-1, 0, 0]], [[0, N + 1, 0]]):
        with pytest.raises(ValueError, match="^depths"):
            check_budget_keep_values(torch.tensor(bad), N)


@given(depth=st.sampled_from([-(2**40), -1, N + 1, 2**40]), position=st.integers(0, N - 1))
def test_checked_mode_refuses_a_depth_outside_and_the_unchecked_op_clamps_it(depth, position):
    args = _good()
    args["depths"] = torch.arange(N).expand(B, N).contiguous()
    args["depths"][1, position] = depth
    with specdraft.checked(), pytest.raises(ValueError, match="^depths"):
        budget_keep(**args)
    clamped = args | {"depths": args["depths"].clamp(0, N)}
    for got, want in zip(budget_keep(**args), budget_keep(**clamped), strict=True):
        assert torch.equal(got, want)
