"""opcheck for budget_keep (int32 / int64 depths and budgets, a batch in one register
tile and one over two on the GPU); the fake impl's shapes; a function around it compiled fullgraph=True
equals eager with no graph break, and one compile serves every budget value (the
budget is a device tensor, never a guard)."""

import torch

from specdraft.ops import budget_keep
from specdraft.testing import CompileCounts, fresh_compile

from fixtures.budget import RandomBatch

BATCHES = [
    RandomBatch(5, 7, 0, "palette", "any", 12),
    RandomBatch(8, 7, 1, "chains", "chain", 20),
    RandomBatch(300, 64, 2, "uniform", "any", 9000),  # two register tiles on the GPU
]


def test_opcheck(device):
    for index, batch in enumerate(BATCHES):
        depth_dtype = (torch.int64, torch.int32)[index % 2]
        values, depths, budget = batch.op_args(device, depth_dtype)
        for budget_dtype in (torch.int64, torch.int32):
            torch.library.opcheck(torch.ops.specdraft.budget_keep, (values, depths, budget.to(budget_dtype)))


def test_fake_impl_gives_the_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        for num_reqs, num_pos in ((0, 3), (1, 1), (256, 7), (300, 64)):
            keep, counts = budget_keep(torch.empty(num_reqs, num_pos), torch.empty(num_reqs, num_pos, dtype=torch.int32),
                                       torch.empty((), dtype=torch.int64))  # fmt: skip
            assert keep.shape == (num_reqs, num_pos) and keep.dtype == torch.bool
            assert counts.shape == (num_reqs,) and counts.dtype == torch.int32


def verified_per_request(values, depths, budget):
    """What a decoder does with the allocation: the kept mask as padding, the counts
    as per-request verify lengths, and the total."""
    keep, counts = budget_keep(values, depths, budget)
    return torch.where(keep, values, 0.0), counts, counts.sum()


def test_fullgraph_equals_eager_and_budgets_never_recompile(device):
    compiled = fresh_compile(verified_per_request, fullgraph=True)
    values, depths, _ = BATCHES[1].op_args(device)
    with CompileCounts.measure() as counts:
        for value in (0, 1, 7, 20, 56, 2**40, -3):
            budget = torch.tensor(value, device=device)
            eager, got = verified_per_request(values, depths, budget), compiled(values, depths, budget)
            for want, have in zip(eager, got, strict=True):
                assert torch.equal(have, want)
            assert int(got[2]) == min(max(value, 0), int((values >= 0).sum()))
    assert counts.graph_breaks == 0
    assert counts.compiles == 1
