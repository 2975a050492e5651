"""opcheck for tree_verify (greedy and sampled requests, full and truncated depth),
and tree_verify under torch.compile(fullgraph=True): compiled once, it equals eager
on several trees of one shape with no graph break and no recompile."""

import torch

from specdraft.ops import tree_verify
from specdraft.testing import CompileCounts, fresh_compile

from fixtures.tree_batches import TreeBatch

NUM_NODES, VOCAB, NUM_REQS = 9, 37, 6  # distinct sizes (duck sizing)


def batch_of(data_seed: int, shape: str = "random") -> TreeBatch:
    return TreeBatch(
        num_nodes=NUM_NODES,
        vocab=VOCAB,
        temperature=[0.0 if b % 3 == 0 else 0.5 + 0.25 * (b % 4) for b in range(NUM_REQS)],
        seeds=[1000 + 17 * b + data_seed for b in range(NUM_REQS)],
        positions=[3 * b for b in range(NUM_REQS)],
        max_depth=None,
        shape=shape,
        broken=False,
        data_seed=data_seed,
    )


def test_opcheck(device):
    for data_seed, shape in ((0, "random"), (1, "chain")):
        t = batch_of(data_seed, shape).tensors(device)
        for max_depth in (NUM_NODES - 1, 2, 0):
            torch.library.opcheck(torch.ops.specdraft.tree_verify, (*t.values(), max_depth, 3))


def verify(tree_tokens, parents, target_logits, temperature, seeds, positions):
    return tree_verify(tree_tokens, parents, target_logits, temperature, seeds, positions, max_depth=4, salt=1)


def test_fullgraph_equals_eager_without_recompiles(device):
    compiled = fresh_compile(verify, fullgraph=True)
    with CompileCounts.measure() as counts:
        for data_seed in range(4):
            t = batch_of(data_seed, "chain" if data_seed == 3 else "random").tensors(device)
            want, got = verify(*t.values()), compiled(*t.values())
            assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True)), data_seed
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"recompiled: {counts.compiles} graphs for one shape"
