"""tree_verify against the plain-Python spec (specs/tree_verify.py) on random trees,
greedy and sampled, exact equality of every output; stated cases by hand; a chain
equals rejection_sample; bad inputs and checked mode. Lanes as in test_draft.py:
`kernel` tests run in every lane, `interpreter` ones compare the interpreted kernel
with the reference. Statistics: test_tree_verify_lossless.py; opcheck and compile:
test_tree_verify_compile.py."""

from dataclasses import replace

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specdraft import checked
from specdraft.ops import rejection_sample, tree_verify
from specdraft.ops.backend import TRITON_INTERPRET
from specdraft.ops.sampling.tiles import CHUNK_V
from specdraft.ops.sampling.tree_verify import tree_verify_reference

import specs.tree_verify as spec
from fixtures.lanes import INTERPRETER
from fixtures.sampling_inputs import tree_verify_inputs
from fixtures.tree_batches import TreeBatch, tree_batches

# The interpreter emulates every lane of a kernel in NumPy: half the profile's examples there.
EXAMPLES = settings.default.max_examples // 2 if INTERPRETER else settings.default.max_examples

EDGE_BATCH = TreeBatch(
    num_nodes=10, vocab=2 * CHUNK_V + 3, temperature=[0.0, 1.0, 0.3, 2.0, 1.0], seeds=[0, -1, 2**40, 7, 2**63 - 1],
    positions=[0, 2**33, 5, 9, 2**40], max_depth=None, shape="random", broken=True, data_seed=3,
)  # fmt: skip

# Many sampled requests, small vocabularies, siblings holding most of the mass: after a
# rejection the next sibling's acceptance r / R is far from r. (Fewer in the
# interpreter, which runs every program in Python.)
COPIES = 3 if TRITON_INTERPRET else 12
STAR_BATCH = TreeBatch(
    num_nodes=8, vocab=5, temperature=[1.0, 2.0, 0.5, 1.0] * COPIES, seeds=list(range(4 * COPIES)),
    positions=[3] * 4 * COPIES, max_depth=None, shape="star", broken=False, data_seed=8,
)  # fmt: skip
DEEP_BATCH = TreeBatch(
    num_nodes=12, vocab=4, temperature=[1.0, 2.0, 0.5, 1.0] * COPIES, seeds=list(range(100, 100 + 4 * COPIES)),
    positions=[0] * 4 * COPIES, max_depth=None, shape="random", broken=False, data_seed=9,
)  # fmt: skip


def run(t, max_depth=None, salt=0):
    return tree_verify(
        t["tree_tokens"], t["parents"], t["target_logits"], t["temperature"], t["seeds"], t["positions"],
        max_depth=max_depth, salt=salt,
    )  # fmt: skip


def spec_outputs(batch: TreeBatch, t, salt=0):
    depth = batch.num_nodes - 1 if batch.max_depth is None else batch.max_depth
    rows = zip(t["tree_tokens"].tolist(), t["parents"].tolist(), t["target_logits"].float().cpu().tolist(), strict=True)
    out = [
        spec.tree_verify(tokens, parents, logits, batch.temperature[b], batch.seeds[b], batch.positions[b], salt, depth)
        for b, (tokens, parents, logits) in enumerate(rows)
    ]
    return [[row[i] for row in out] for i in range(4)]  # nodes, tokens, counts, ranks


# --------------------------------------------------------------------- spec tests


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(
    batch=tree_batches(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    salt=st.sampled_from([0, 5]),
    row_pad=st.sampled_from([0, 0, 3]),
)
@example(batch=EDGE_BATCH, dtype=torch.float32, index_dtype=torch.int64, salt=0, row_pad=0)
@example(batch=EDGE_BATCH, dtype=torch.bfloat16, index_dtype=torch.int32, salt=2, row_pad=5)
@example(batch=STAR_BATCH, dtype=torch.float32, index_dtype=torch.int64, salt=0, row_pad=0)
@example(batch=DEEP_BATCH, dtype=torch.float32, index_dtype=torch.int64, salt=0, row_pad=0)
def test_matches_spec(device, batch, dtype, index_dtype, salt, row_pad):
    t = batch.tensors(device, dtype, index_dtype, row_pad)
    got = run(t, batch.max_depth, salt)
    depth = batch.num_nodes - 1 if batch.max_depth is None else batch.max_depth
    b = len(batch.temperature)
    assert [tuple(x.shape) for x in got] == [(b, depth + 1), (b, depth + 1), (b,), (b, depth)]
    assert all(x.dtype == torch.int32 for x in got)
    assert [x.cpu().tolist() for x in got] == spec_outputs(batch, t, salt)


def by_hand_tree():
    """Root -> nodes 1, 2, 3 (tokens 5, 7, 7); node 2 -> node 4 (token 1); node 3 ->
    node 5 (token 2). Target argmax: root 7, node 2 -> 1, node 4 -> 3."""
    tokens = torch.tensor([[9, 5, 7, 7, 1, 2]])
    parents = torch.tensor([[-1, 0, 0, 0, 2, 3]])
    logits = torch.zeros(1, 6, 8)
    for node, best in ((0, 7), (1, 0), (2, 1), (3, 2), (4, 3), (5, 4)):
        logits[0, node, best] = 5.0
    return tokens, parents, logits


@pytest.mark.kernel
def test_greedy_by_hand(device):
    """The first matching child descends (node 2, not its duplicate 3), then node 4;
    node 4 is a leaf, so its argmax 3 is the bonus token."""
    tokens, parents, logits = by_hand_tree()
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    args = (tokens.to(device), parents.to(device), logits.to(device), torch.zeros(1, device=device), zero, zero)
    out = tree_verify(*args)
    assert out.nodes.tolist() == [[0, 2, 4, -1, -1, -1]]
    assert out.tokens.tolist() == [[7, 1, 3, -1, -1, -1]]
    assert out.counts.tolist() == [2] and out.ranks.tolist() == [[1, 0, -1, -1, -1]]
    shallow = tree_verify(*args, max_depth=1)  # node 4 is too deep: node 2's argmax is emitted
    assert shallow.nodes.tolist() == [[0, 2]] and shallow.tokens.tolist() == [[7, 1]]
    assert shallow.counts.tolist() == [1] and shallow.ranks.tolist() == [[1]]


@pytest.mark.kernel
def test_sampled_never_accepts_zero_probability_or_a_rejected_duplicate(device):
    """Root children: token 0 with p = 0, token 1, token 1 again, token 2. Over many
    seeds, rank 0 (p = 0) and rank 2 (a duplicate of a rejected token: r = 0 by then)
    are never accepted, and a rejected 1 is never emitted at the root."""
    n = 64 if TRITON_INTERPRET else 2000
    logits = torch.tensor([float("-inf"), 0.0, 0.0, 0.0]).expand(n, 5, 4).contiguous()
    tokens = torch.tensor([3, 0, 1, 1, 2]).expand(n, 5).contiguous()
    parents = torch.tensor([-1, 0, 0, 0, 0]).expand(n, 5).contiguous()
    out = tree_verify(
        tokens.to(device), parents.to(device), logits.to(device), torch.ones(n, device=device),
        torch.arange(n, device=device), torch.zeros(n, dtype=torch.int64, device=device),
    )  # fmt: skip
    ranks, counts, emitted = out.ranks[:, 0].cpu(), out.counts.cpu(), out.tokens[:, 0].cpu()
    assert set(ranks[counts == 1].tolist()) <= {1, 3}
    assert not ((counts == 0) & ((emitted == 1) | (emitted == 2))).any()  # both rejected: only 3 is left
    assert (counts == 1).any() and (counts == 0).any()


@pytest.mark.kernel
@given(batch=tree_batches(max_requests=3, max_nodes=6, max_vocab=CHUNK_V + 5), salt=st.sampled_from([0, 3]))
def test_a_chain_is_rejection_sampling(device, batch, salt):
    """Every node's parent the one before: the tokens and counts of rejection_sample
    without draft_probs (the same noise, the same residual), every rank 0."""
    batch = replace(batch, shape="chain", broken=False, max_depth=None)
    t = batch.tensors(device)
    got = run(t, salt=salt)
    k = batch.num_nodes - 1
    if k == 0:
        return  # rejection_sample needs K >= 1
    drafts = t["tree_tokens"][:, 1:].contiguous()
    tokens, counts = rejection_sample(
        drafts, torch.full_like(drafts[:, 0], k), None, t["target_logits"], t["temperature"], t["seeds"],
        t["positions"], salt=salt,
    )  # fmt: skip
    assert torch.equal(got.tokens, tokens) and torch.equal(got.counts, counts)
    steps = torch.arange(k, device=device)
    assert torch.equal(got.ranks, torch.where(steps < counts[:, None], 0, -1).int())


@pytest.mark.kernel
def test_empty_batch(device):
    out = tree_verify(
        torch.zeros(0, 4, dtype=torch.int64, device=device), torch.zeros(0, 4, dtype=torch.int64, device=device),
        torch.zeros(0, 4, 9, device=device), torch.zeros(0, device=device),
        torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(0, dtype=torch.int64, device=device),
    )  # fmt: skip
    assert [tuple(x.shape) for x in out] == [(0, 4), (0, 4), (0,), (0, 3)]


# ---------------------------------------------------------- interpreter lane only


@pytest.mark.interpreter
@given(batch=tree_batches(), salt=st.sampled_from([0, 4]))
@example(batch=EDGE_BATCH, salt=1)
@example(batch=STAR_BATCH, salt=0)
def test_interpreted_kernel_equals_reference(batch, salt):
    t = batch.tensors("cpu", logits_dtype=torch.bfloat16)
    depth = batch.num_nodes - 1 if batch.max_depth is None else batch.max_depth
    got = run(t, batch.max_depth, salt)
    want = tree_verify_reference(*t.values(), depth, salt)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


# ------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"tree_tokens": torch.zeros(2, 3)}, "tree_tokens"),
        ({"tree_tokens": torch.zeros(6, dtype=torch.int64)}, "tree_tokens"),
        ({"tree_tokens": torch.zeros(2, 0, dtype=torch.int64)}, "tree_tokens"),
        ({"parents": torch.zeros(2, 4, dtype=torch.int64)}, "parents"),
        ({"parents": torch.zeros(2, 3)}, "parents"),
        ({"parents": torch.zeros(3, 2, dtype=torch.int64).t()}, "parents"),
        ({"target_logits": torch.zeros(2, 4, 10)}, "target_logits"),
        ({"target_logits": torch.zeros(2, 3, 10, dtype=torch.int32)}, "target_logits"),
        ({"target_logits": torch.zeros(2, 10, 3).transpose(1, 2)}, "target_logits"),
        ({"temperature": torch.ones(2, dtype=torch.float16)}, "temperature"),
        ({"seeds": torch.arange(3)}, "seeds"),
        ({"positions": torch.zeros(2)}, "positions"),
    ],
)
def test_bad_input_names_the_argument(change, argument):
    with pytest.raises(ValueError, match=argument):
        tree_verify(*{**tree_verify_inputs(), **change}.values())


@pytest.mark.parametrize("options, argument", [({"max_depth": 3}, "max_depth"), ({"max_depth": -1}, "max_depth"),
                                               ({"max_depth": 1.0}, "max_depth"), ({"salt": -2}, "salt")])  # fmt: skip
def test_bad_option_names_the_argument(options, argument):
    with pytest.raises(ValueError, match=argument):
        tree_verify(*tree_verify_inputs().values(), **options)


@pytest.mark.parametrize(
    "change, options, message",
    [
        ({"parents": torch.tensor([[0, 0, 0], [-1, 0, 1]])}, {}, r"parents\[0, 0\] = 0 must be -1"),
        ({"parents": torch.tensor([[-1, 0, 2], [-1, 0, 1]])}, {}, r"parents\[0, 2\] = 2 is not an earlier node"),
        ({"parents": torch.tensor([[-1, 0, 0], [-1, -2, 1]])}, {}, r"parents\[1, 1\] = -2 is not an earlier node"),
        ({"parents": torch.tensor([[-1, 0, 0], [-1, -1, 0]])}, {}, r"parents\[1, 2\] = 0 follows a padding node"),
        ({"tree_tokens": torch.tensor([[0, 3, 10], [0, 0, 0]])}, {}, r"tree_tokens\[0, 2\] = 10 is outside"),
        ({"temperature": torch.tensor([1.0, -1.0])}, {}, r"temperature\[1\] = -1.0"),
        ({}, {"max_depth": 1}, "max_depth = 1 is below the depth 2 of node 2 of request 1"),
    ],
)
def test_checked_mode_names_the_value(change, options, message):
    args = {**tree_verify_inputs(), **change}
    with checked(), pytest.raises(ValueError, match=message):
        tree_verify(*args.values(), **options)
    with checked():
        tree_verify(*tree_verify_inputs().values(), max_depth=2)  # the good inputs pass
