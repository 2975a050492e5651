"""The samplers with a logit cut per row (issue 40: top-k / top-p / min-p become one
cut per row, ops.truncation_cut): draft_sample, rejection_sample and tree_verify
against the plain-Python samplers of specs/ with the same cuts (exact equality of
every token; the stored draft probabilities against the truncated softmax), the
interpreted kernels against the torch references, the documented edges (a cut of
-inf changes no bit, greedy rows ignore the cut), opcheck, a fullgraph compile, bad
inputs and checked mode. The cuts are arbitrary values of the rows (-inf, the max,
anything between), not only truncation_cut's. The statistical law: test_truncated_
sampling_lossless.py."""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specdraft import checked
from specdraft.ops import draft_sample, rejection_sample, tree_verify, truncation_cut
from specdraft.ops.sampling.draft import draft_sample_reference, draft_sample_store_reference
from specdraft.ops.sampling.rejection import rejection_sample_reference
from specdraft.ops.sampling.tiles import CHUNK_V
from specdraft.ops.sampling.tree_verify import tree_verify_reference
from specdraft.testing import CompileCounts, SamplingBatch, fresh_compile, sampling_batches

import specs.sampling as spec
import specs.tree_verify as tree_spec
from fixtures.lanes import INTERPRETER
from fixtures.sampling_inputs import rejection_inputs, tree_verify_inputs
from fixtures.tree_batches import TreeBatch, tree_batches

INF = math.inf
# The interpreter emulates every lane of a kernel in NumPy: half the profile's examples there.
EXAMPLES = settings.default.max_examples // 2 if INTERPRETER else settings.default.max_examples
DRAWS = 60 if INTERPRETER else 400  # requests of the stated-rule tests

EDGE_BATCH = SamplingBatch(
    vocab=CHUNK_V * 2 + 5,  # three vocab chunks
    num_spec=3,
    temperature=[0.0, 1.0, 0.5, 2.0, 1.0, 0.0, 1.5],
    seeds=[1, 2, -3, 2**40, 5, 6, 2**63 - 1],
    positions=[0, 10, 2**33, 4, 0, 9, 2**62],
    num_draft=[3, 2, 3, 1, 0, 3, 3],
    data_seed=4,
)
TREE_EDGE = TreeBatch(
    num_nodes=10, vocab=2 * CHUNK_V + 3, temperature=[0.0, 1.0, 0.3, 2.0, 1.0], seeds=[0, -1, 2**40, 7, 2**63 - 1],
    positions=[0, 2**33, 5, 9, 2**40], max_depth=None, shape="random", broken=True, data_seed=3,
)  # fmt: skip


def random_cuts(logits: torch.Tensor, data_seed: int) -> torch.Tensor:
    """One cut per row of logits [..., V] (fp32, on the logits' device): -inf (keep
    all), the row's max (its ties alone) or a random finite value of the row, a third
    each; -inf for a row without a finite value."""
    x = logits.float().cpu()
    flat = x.reshape(-1, x.shape[-1])
    gen = torch.Generator().manual_seed(data_seed + 1)
    finite = torch.isfinite(flat)
    ranked = torch.where(finite, flat, -INF).sort(-1, descending=True).values
    num_finite = finite.sum(-1)
    kind = torch.randint(0, 3, (flat.shape[0],), generator=gen)
    pick = (torch.rand(flat.shape[0], generator=gen) * num_finite.clamp(min=1)).long().clamp(max=flat.shape[1] - 1)
    value = ranked.gather(1, pick[:, None])[:, 0]
    cut = torch.where(kind == 0, -INF, torch.where(kind == 1, ranked[:, 0], value))
    cut = torch.where(num_finite > 0, cut, -INF)
    return cut.reshape(x.shape[:-1]).contiguous().to(logits.device)


def truncated_softmax(row: list[float], temperature: float, cut: float) -> list[float]:
    return spec.softmax(spec.truncate(row, cut), temperature)


# --------------------------------------------------------------- draft_sample, spec


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(
    batch=sampling_batches(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    salt=st.sampled_from([0, 7]),
    write=st.sampled_from([None, "probs", "logits"]),
)
@example(batch=EDGE_BATCH, dtype=torch.bfloat16, salt=3, write="probs")
@example(batch=EDGE_BATCH, dtype=torch.float32, salt=0, write="logits")
def test_draft_matches_spec(device, batch, dtype, salt, write):
    t = batch.tensors(device, logits_dtype=dtype)
    cut = random_cuts(t["logits"], batch.data_seed)
    args = (t["logits"], t["temperature"], t["seeds"], t["positions"])
    out = torch.full((batch.num_reqs, 2, batch.vocab), math.nan, device=device)
    store = {} if write is None else {"probs_out": out, "step": torch.tensor(1, device=device), "write": write}
    tokens = draft_sample(*args, salt=salt, logit_cut=cut, **store)
    rows, cuts = t["logits"].float().cpu().tolist(), cut.cpu().tolist()
    want = [
        spec.draft_sample(rows[b], batch.temperature[b], batch.seeds[b], batch.positions[b], salt, cuts[b])
        for b in range(batch.num_reqs)
    ]
    assert tokens.cpu().tolist() == want
    if write is None:
        return
    for b in range(batch.num_reqs):
        sampled = batch.temperature[b] > 0
        temp, row_cut = (batch.temperature[b], cuts[b]) if sampled else (1.0, -INF)
        if write == "probs":
            expected = truncated_softmax(rows[b], temp, row_cut)
        else:
            expected = [x / temp for x in spec.truncate(rows[b], row_cut)]
        torch.testing.assert_close(out[b, 1].cpu(), torch.tensor(expected, dtype=torch.float32), rtol=2e-5, atol=1e-7)
    assert torch.isnan(out[:, 0]).all()


@pytest.mark.kernel
def test_draft_never_samples_below_the_cut(device):
    """Stated directly: many draws of one row, cut at its third largest value,
    land on the three largest only, each of them at least once."""
    n = DRAWS
    row = torch.tensor([0.5, 2.0, -1.0, 1.5, 0.0, 1.0, 1.9, -0.3])
    cut = torch.full((n,), 1.5)
    tokens = draft_sample(
        row.expand(n, 8).contiguous().to(device), torch.full((n,), 2.0, device=device),
        torch.arange(n, device=device), torch.zeros(n, dtype=torch.int64, device=device), logit_cut=cut.to(device),
    )  # fmt: skip
    assert set(tokens.cpu().tolist()) == {1, 3, 6}


@pytest.mark.kernel
def test_draft_truncation_only_masks(device):
    """The same noise with and without a cut: wherever the untruncated draw lands on
    a kept token, the truncated draw is that token."""
    n = DRAWS
    logits = torch.randn(n, 50, generator=torch.Generator().manual_seed(5)).to(device)
    temp = torch.full((n,), 1.5, device=device)
    seeds, positions = torch.arange(n, device=device), torch.full((n,), 3, device=device)
    cut = logits.sort(-1, descending=True).values[:, 9].contiguous()  # the ten largest kept
    free = draft_sample(logits, temp, seeds, positions)
    truncated = draft_sample(logits, temp, seeds, positions, logit_cut=cut)
    kept = logits.gather(1, free.long()[:, None])[:, 0] >= cut
    assert 0 < int(kept.sum()) < n
    assert torch.equal(truncated[kept], free[kept])
    assert bool((logits.gather(1, truncated.long()[:, None])[:, 0] >= cut).all())


# ----------------------------------------------------------- rejection_sample, spec


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(
    batch=sampling_batches(),
    with_probs=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    salt=st.sampled_from([0, 7]),
)
@example(batch=EDGE_BATCH, with_probs=True, dtype=torch.float32, salt=0)
@example(batch=EDGE_BATCH, with_probs=False, dtype=torch.bfloat16, salt=3)
def test_rejection_matches_spec(device, batch, with_probs, dtype, salt):
    t = batch.tensors(device, logits_dtype=dtype)
    cut = random_cuts(t["target_logits"], batch.data_seed)
    probs = t["draft_probs"] if with_probs else None
    tokens, counts = rejection_sample(
        t["draft_tokens"], t["num_draft_tokens"], probs, t["target_logits"], t["temperature"], t["seeds"],
        t["positions"], salt=salt, logit_cut=cut,
    )  # fmt: skip
    drafts, target = t["draft_tokens"].cpu().tolist(), t["target_logits"].float().cpu().tolist()
    q = probs.cpu().tolist() if with_probs else [None] * batch.num_reqs
    cuts = cut.cpu().tolist()
    want = [
        spec.rejection_sample(
            drafts[b],
            batch.num_draft[b],
            q[b],
            target[b],
            batch.temperature[b],
            batch.seeds[b],
            batch.positions[b],
            salt,
            cuts[b],
        )  # fmt: skip
        for b in range(batch.num_reqs)
    ]
    assert counts.cpu().tolist() == [c for _, c in want]
    assert tokens.cpu().tolist() == [out for out, _ in want]


@pytest.mark.kernel
def test_rejection_rejects_drafts_below_the_cut(device):
    """A draft with most of the target's mass, below its row's cut: always rejected,
    and the emitted token is one the cut keeps."""
    n = DRAWS
    target = torch.zeros(n, 2, 6)
    target[:, 0, 2] = 5.0  # p(2) ~ 0.97 untruncated
    target[:, 0, 4] = 1.0
    target[:, 0, 5] = 1.0
    cut = torch.tensor([1.0, -INF]).expand(n, 2).contiguous()  # row 0 keeps 2, 4 and 5
    drafts = torch.full((n, 1), 2)
    tokens, counts = rejection_sample(
        drafts.to(device), torch.ones(n, dtype=torch.int64, device=device), None, target.to(device),
        torch.ones(n, device=device), torch.arange(n, device=device), torch.zeros(n, dtype=torch.int64, device=device),
        logit_cut=cut.to(device),
    )  # fmt: skip
    assert counts.cpu().sum() > 0  # token 2 is kept: accepted now and then
    target[:, 0, 2] = 0.5  # now below the cut
    tokens, counts = rejection_sample(
        drafts.to(device), torch.ones(n, dtype=torch.int64, device=device), None, target.to(device),
        torch.ones(n, device=device), torch.arange(n, device=device), torch.zeros(n, dtype=torch.int64, device=device),
        logit_cut=cut.to(device),
    )  # fmt: skip
    assert counts.cpu().tolist() == [0] * n
    assert set(tokens[:, 0].cpu().tolist()) == {4, 5}


# ----------------------------------------------------------------- tree_verify, spec


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(
    batch=tree_batches(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    salt=st.sampled_from([0, 5]),
    row_pad=st.sampled_from([0, 3]),
)
@example(batch=TREE_EDGE, dtype=torch.bfloat16, salt=2, row_pad=5)
def test_tree_matches_spec(device, batch, dtype, salt, row_pad):
    t = batch.tensors(device, dtype, row_pad=row_pad)
    cut = random_cuts(t["target_logits"], batch.data_seed)
    depth = batch.num_nodes - 1 if batch.max_depth is None else batch.max_depth
    got = tree_verify(*t.values(), max_depth=batch.max_depth, salt=salt, logit_cut=cut)
    rows = zip(t["tree_tokens"].tolist(), t["parents"].tolist(), t["target_logits"].float().cpu().tolist(),
               cut.cpu().tolist(), strict=True)  # fmt: skip
    want = [
        tree_spec.tree_verify(
            tokens, parents, logits, batch.temperature[b], batch.seeds[b], batch.positions[b], salt, depth, cuts
        )  # fmt: skip
        for b, (tokens, parents, logits, cuts) in enumerate(rows)
    ]
    assert [x.cpu().tolist() for x in got] == [[row[i] for row in want] for i in range(4)]


# ------------------------------------------------------------------ documented edges


def _all_three(device, cut_of):
    """(draft tokens, draft probs, draft logits / T, rejection outputs, tree outputs) on
    EDGE_BATCH / TREE_EDGE with cuts cut_of(shape) (None: no cut)."""
    t = EDGE_BATCH.tensors(device, logits_dtype=torch.bfloat16)
    args = (t["logits"], t["temperature"], t["seeds"], t["positions"])
    stores = []
    for write in ("probs", "logits"):
        out = torch.zeros(EDGE_BATCH.num_reqs, 1, EDGE_BATCH.vocab, device=device)
        tokens = draft_sample(*args, salt=1, probs_out=out, step=torch.tensor(0, device=device), write=write,
                              logit_cut=cut_of(t["logits"]))  # fmt: skip
        stores += [tokens, out]
    chain = rejection_sample(
        t["draft_tokens"], t["num_draft_tokens"], t["draft_probs"], t["target_logits"], t["temperature"], t["seeds"],
        t["positions"], salt=2, logit_cut=cut_of(t["target_logits"]),
    )  # fmt: skip
    tt = TREE_EDGE.tensors(device, torch.bfloat16)
    tree = tree_verify(*tt.values(), salt=3, logit_cut=cut_of(tt["target_logits"]))
    return [*stores, *chain, *tree]


@pytest.mark.kernel
def test_a_minus_inf_cut_changes_no_bit(device):
    without = _all_three(device, lambda logits: None)
    with_cut = _all_three(device, lambda logits: torch.full(logits.shape[:-1], -INF, device=device))
    assert all(torch.equal(a, b) for a, b in zip(without, with_cut, strict=True))


@pytest.mark.kernel
def test_greedy_rows_ignore_the_cut(device):
    """Every request greedy: any cut, even one above every logit, changes nothing."""
    greedy = SamplingBatch(**{**EDGE_BATCH.__dict__, "temperature": [0.0] * EDGE_BATCH.num_reqs})
    t = greedy.tensors(device)
    above = torch.full(t["logits"].shape[:1], 1e9, device=device)
    out, out_cut = (torch.zeros(greedy.num_reqs, 1, greedy.vocab, device=device) for _ in range(2))
    step = torch.tensor(0, device=device)
    args = (t["logits"], t["temperature"], t["seeds"], t["positions"])
    assert torch.equal(draft_sample(*args, probs_out=out, step=step),
                       draft_sample(*args, probs_out=out_cut, step=step, logit_cut=above))  # fmt: skip
    assert torch.equal(out, out_cut)
    chain = (t["draft_tokens"], t["num_draft_tokens"], None, t["target_logits"], *args[1:])
    above = torch.full(t["target_logits"].shape[:2], 1e9, device=device)
    for a, b in zip(rejection_sample(*chain), rejection_sample(*chain, logit_cut=above), strict=True):
        assert torch.equal(a, b)


# ------------------------------------------------------------- interpreter lane only


@pytest.mark.interpreter
@given(
    batch=sampling_batches(max_vocab=200), write=st.sampled_from([None, "probs", "logits"]), with_probs=st.booleans()
)
@example(batch=EDGE_BATCH, write="probs", with_probs=True)
def test_interpreted_kernels_equal_references(batch, write, with_probs):
    t = batch.tensors("cpu", logits_dtype=torch.bfloat16)
    cut = random_cuts(t["logits"], batch.data_seed)
    args = (t["logits"], t["temperature"], t["seeds"], t["positions"])
    if write is None:
        assert torch.equal(draft_sample(*args, salt=9, logit_cut=cut), draft_sample_reference(*args, 9, cut))
    else:
        out = torch.full((batch.num_reqs, 2, batch.vocab), math.nan)
        ref_out = out.clone()
        step = torch.tensor(1)
        tokens = draft_sample(*args, salt=9, probs_out=out, step=step, write=write, logit_cut=cut)
        ref_tokens = draft_sample_store_reference(*args, ref_out, step, 9, write == "probs", cut)
        assert torch.equal(tokens, ref_tokens)
        torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-7, equal_nan=True)
    target_cut = random_cuts(t["target_logits"], batch.data_seed + 7)
    chain = (t["draft_tokens"], t["num_draft_tokens"], t["draft_probs"] if with_probs else None, t["target_logits"],
             *args[1:])  # fmt: skip
    got = rejection_sample(*chain, salt=2, logit_cut=target_cut)
    want = rejection_sample_reference(*chain, 2, target_cut)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.interpreter
@given(batch=tree_batches(), salt=st.sampled_from([0, 4]))
@example(batch=TREE_EDGE, salt=1)
def test_interpreted_tree_kernel_equals_reference(batch, salt):
    t = batch.tensors("cpu", logits_dtype=torch.bfloat16)
    cut = random_cuts(t["target_logits"], batch.data_seed)
    depth = batch.num_nodes - 1 if batch.max_depth is None else batch.max_depth
    got = tree_verify(*t.values(), max_depth=batch.max_depth, salt=salt, logit_cut=cut)
    want = tree_verify_reference(*t.values(), depth, salt, cut)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


# ---------------------------------------------------------------- opcheck and compile


def test_opcheck_with_cuts(device):
    t = EDGE_BATCH.tensors(device)
    req = (t["temperature"], t["seeds"], t["positions"])
    cut = random_cuts(t["logits"], 1)
    target_cut = random_cuts(t["target_logits"], 2)
    torch.library.opcheck(torch.ops.specdraft.draft_sample, (t["logits"], *req, 0, cut))
    probs = torch.zeros(EDGE_BATCH.num_reqs, 2, EDGE_BATCH.vocab, device=device)
    for write_probs in (True, False):
        torch.library.opcheck(
            torch.ops.specdraft.draft_sample_store,
            (t["logits"], *req, probs.clone(), torch.tensor(1, device=device), 3, write_probs, cut),
        )
    for draft_probs in (t["draft_probs"], None):
        torch.library.opcheck(
            torch.ops.specdraft.rejection_sample,
            (t["draft_tokens"], t["num_draft_tokens"], draft_probs, t["target_logits"], *req, 4, target_cut),
        )
    tt = TREE_EDGE.tensors(device)
    tree_cut = random_cuts(tt["target_logits"], 3)
    torch.library.opcheck(torch.ops.specdraft.tree_verify, (*tt.values(), 4, 3, tree_cut))


NUM_SPEC, VOCAB = 3, 37


def truncated_step(logits, target_logits, temperature, top_k, top_p, min_p, seeds, positions, probs, step):
    """One draft step inside the truncation, then verification against the truncated
    target: truncation_cut feeding both samplers."""
    cut = truncation_cut(logits, temperature, top_k, top_p, min_p)
    drafts = [
        draft_sample(
            logits + 0.5 * j, temperature, seeds, positions + j, salt=1, probs_out=probs, step=step[j], logit_cut=cut
        )  # fmt: skip
        for j in range(NUM_SPEC)
    ]
    rows = target_logits.shape[0] * target_logits.shape[1]
    per_row = [p.repeat_interleave(NUM_SPEC + 1) for p in (temperature, top_k, top_p, min_p)]
    target_cut = truncation_cut(target_logits.reshape(rows, -1), *per_row).view(-1, NUM_SPEC + 1)
    num_draft = torch.full_like(seeds, NUM_SPEC)
    return rejection_sample(torch.stack(drafts, 1), num_draft, probs, target_logits, temperature, seeds, positions,
                            salt=2, logit_cut=target_cut)  # fmt: skip


def test_fullgraph_compile_with_cuts_equals_eager(device):
    """No graph break, and new parameter values reuse the graph."""
    batch = SamplingBatch(vocab=VOCAB, num_spec=NUM_SPEC, temperature=[0.0, 0.5, 1.0, 1.5, 2.0],
                          seeds=[3, 5, 7, 9, 11], positions=[0, 4, 8, 12, 16], num_draft=[3] * 5, data_seed=1)  # fmt: skip
    t = batch.tensors(device)
    steps = [torch.tensor(j, device=device) for j in range(NUM_SPEC)]
    compiled = fresh_compile(truncated_step, fullgraph=True)
    with CompileCounts.measure() as counts:
        for top_k, top_p, min_p in ((5, 0.9, 0.0), (1, 1.0, 0.2), (0, 0.5, 0.05)):
            params = (
                torch.full((5,), top_k, dtype=torch.int32, device=device),
                torch.full((5,), top_p, device=device),
                torch.full((5,), min_p, device=device),
            )
            run_args = (t["logits"], t["target_logits"], t["temperature"], *params, t["seeds"], t["positions"])
            eager_probs, compiled_probs = (torch.zeros(5, NUM_SPEC, VOCAB, device=device) for _ in range(2))
            want = truncated_step(*run_args, eager_probs, steps)
            got = compiled(*run_args, compiled_probs, steps)
            assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
            torch.testing.assert_close(compiled_probs, eager_probs, rtol=1e-5, atol=1e-7)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1


# ----------------------------------------------------------------- bad inputs, checked


def _draft(cut, **options):
    return draft_sample(torch.zeros(2, 10), torch.ones(2), torch.arange(2), torch.zeros(2, dtype=torch.int64),
                        logit_cut=cut, **options)  # fmt: skip


BAD_CUTS = {
    "draft": [torch.zeros(3), torch.zeros(2, 1), torch.zeros(2, dtype=torch.float64), torch.zeros(4)[::2]],
    "chain": [torch.zeros(2, 3), torch.zeros(8), torch.zeros(2, 4, dtype=torch.bfloat16), torch.zeros(4, 2).t()],
    "tree": [torch.zeros(2, 4), torch.zeros(6), torch.zeros(2, 3, dtype=torch.int32), torch.zeros(3, 2).t()],
}


@pytest.mark.parametrize("op, index", [(op, i) for op, cuts in BAD_CUTS.items() for i in range(len(cuts))])
def test_bad_cut_names_the_argument(op, index):
    cut = BAD_CUTS[op][index]
    with pytest.raises(ValueError, match="logit_cut"):
        if op == "draft":
            _draft(cut)
        elif op == "chain":
            rejection_sample(*rejection_inputs().values(), logit_cut=cut)
        else:
            tree_verify(*tree_verify_inputs().values(), logit_cut=cut)


@pytest.mark.parametrize(
    "value, message", [(math.nan, r"logit_cut\[1\] = nan is NaN"), (0.5, r"logit_cut\[1\] = 0.5 is above its row")]
)
def test_checked_mode_refuses_a_cut_that_keeps_nothing(value, message):
    """All-zero logits: any cut above 0 keeps nothing in a sampled row."""
    with checked(), pytest.raises(ValueError, match=message):
        _draft(torch.tensor([0.0, value]))
    chain_cut = torch.zeros(2, 4)
    chain_cut[1, 2] = value
    with checked(), pytest.raises(ValueError, match=message.replace(r"\[1\]", r"\[1, 2\]")):
        rejection_sample(*rejection_inputs().values(), logit_cut=chain_cut)
    tree_cut = torch.zeros(2, 3)
    tree_cut[1, 2] = value
    with checked(), pytest.raises(ValueError, match=message.replace(r"\[1\]", r"\[1, 2\]")):
        tree_verify(*tree_verify_inputs().values(), logit_cut=tree_cut)


def test_checked_mode_accepts_the_edges():
    """-inf, the max itself, truncation_cut's cuts, and any cut on a greedy row."""
    with checked():
        _draft(torch.tensor([-INF, 0.0]))
        draft_sample(torch.zeros(2, 10), torch.tensor([0.0, 1.0]), torch.arange(2), torch.zeros(2, dtype=torch.int64),
                     logit_cut=torch.tensor([5.0, 0.0]))  # fmt: skip
        chain = rejection_inputs()
        chain["target_logits"] = torch.randn(2, 4, 10, generator=torch.Generator().manual_seed(0))
        rows = chain["target_logits"].view(8, 10)
        cut = truncation_cut(rows, torch.ones(8), torch.full((8,), 3, dtype=torch.int32), torch.full((8,), 0.9),
                             torch.full((8,), 0.1)).view(2, 4)  # fmt: skip
        chain["draft_tokens"] = chain["target_logits"][:, :3].argmax(-1)  # drafts with probability > 0
        rejection_sample(*chain.values(), logit_cut=cut)
        tree_verify(*tree_verify_inputs().values(), logit_cut=torch.zeros(2, 3))
