"""rejection_sample against a plain-Python spec (greedy and random paths, the
spec using the same hash on Python ints), and deterministic statistical tests:
the output follows the target distribution, and the acceptance rate is
sum(min(p, q)). Lanes and markers as in test_draft.py."""

import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import rejection_sample
from specdraft.ops.backend import TRITON_INTERPRET
from specdraft.ops.sampling.rejection import rejection_sample_reference
from specdraft.ops.sampling.tiles import CHUNK_V
from specdraft.testing import SamplingBatch, check_rejection_sample_values, sampling_batches

import specs.sampling as spec
from fixtures.sampling_inputs import rejection_inputs

DRAWS = 300 if TRITON_INTERPRET else 20_000

EDGE_BATCH = SamplingBatch(
    vocab=CHUNK_V * 2 + 5,  # three vocab chunks
    num_spec=3,
    temperature=[0.0, 0.0, 1.0, 0.5, 2.0, 0.0, 1.0],
    seeds=[1, 2, -3, 2**40, 5, 6, 2**63 - 1],
    positions=[0, 10, 2**33, 4, 0, 9, 2**62],
    num_draft=[3, 2, 3, 1, 0, 0, 3],
    data_seed=4,
)


def run(t, with_probs, salt=0):
    return rejection_sample(
        t["draft_tokens"],
        t["num_draft_tokens"],
        t["draft_probs"] if with_probs else None,
        t["target_logits"],
        t["temperature"],
        t["seeds"],
        t["positions"],
        salt=salt,
    )


def spec_outputs(batch: SamplingBatch, t, with_probs, salt):
    drafts = t["draft_tokens"].cpu().tolist()
    target = t["target_logits"].float().cpu().tolist()
    probs = t["draft_probs"].cpu().tolist() if with_probs else [None] * batch.num_reqs
    tokens, counts = [], []
    for b in range(batch.num_reqs):
        out, count = spec.rejection_sample(
            drafts[b], batch.num_draft[b], probs[b], target[b], batch.temperature[b],
            batch.seeds[b], batch.positions[b], salt,
        )  # fmt: skip
        tokens.append(out)
        counts.append(count)
    return tokens, counts


# --------------------------------------------------------------------- spec tests


@pytest.mark.kernel
@given(
    batch=sampling_batches(),
    with_probs=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    salt=st.sampled_from([0, 7]),
)
@example(batch=EDGE_BATCH, with_probs=True, dtype=torch.float32, index_dtype=torch.int64, salt=0)
@example(batch=EDGE_BATCH, with_probs=False, dtype=torch.bfloat16, index_dtype=torch.int32, salt=3)
def test_matches_spec(device, batch, with_probs, dtype, index_dtype, salt):
    t = batch.tensors(device, logits_dtype=dtype, index_dtype=index_dtype)
    tokens, counts = run(t, with_probs, salt)
    assert tokens.dtype == counts.dtype == torch.int32
    assert tokens.shape == (batch.num_reqs, batch.num_spec + 1) and counts.shape == (batch.num_reqs,)
    want_tokens, want_counts = spec_outputs(batch, t, with_probs, salt)
    assert counts.cpu().tolist() == want_counts
    assert tokens.cpu().tolist() == want_tokens


@pytest.mark.kernel
@pytest.mark.parametrize("nan_at_top", [False, True])
def test_greedy_chain_accepts_exactly_the_matching_prefix(device, nan_at_top):
    """Stated directly: drafts equal to the target argmax are accepted up to the
    first mismatch, which emits the target argmax; all matched emits the bonus.
    nan_at_top: NaN at each row's two largest places, which rank as -inf (the
    kernels' argmax never takes a NaN key, ops/common/scan.py; torch.argmax takes
    NaN for the max, which the CPU reference once followed)."""
    vocab, num_spec = 40, 3
    target = torch.randn(4, num_spec + 1, vocab, generator=torch.Generator().manual_seed(1))
    if nan_at_top:
        target.scatter_(2, target.argsort(-1, descending=True)[..., :2], math.nan)
    best = torch.where(torch.isnan(target), -math.inf, target).argmax(-1)
    drafts = best[:, :num_spec].clone()
    drafts[1, 1] = (best[1, 1] + 1) % vocab  # mismatch at 1
    drafts[2, 0] = (best[2, 0] + 1) % vocab  # mismatch at 0
    drafts[3, 2] = -1  # only two drafts
    n = torch.tensor([3, 3, 3, 2])
    zero = torch.zeros(4, dtype=torch.int64)
    tokens, counts = rejection_sample(
        drafts.to(device), n.to(device), None, target.to(device), torch.zeros(4, device=device),
        zero.to(device), zero.to(device),
    )  # fmt: skip
    b = best.tolist()
    assert counts.cpu().tolist() == [3, 1, 0, 2]
    assert tokens.cpu().tolist() == [
        b[0],
        [b[1][0], b[1][1], -1, -1],
        [b[2][0], -1, -1, -1],
        [b[3][0], b[3][1], b[3][2], -1],
    ]


@pytest.mark.kernel
def test_invalid_draft_ids_are_rejected(device):
    target = torch.zeros(2, 2, 6)
    target[:, 0, 2] = 50.0  # p(2) ~ 1: token 2 would be accepted
    tokens, counts = rejection_sample(
        torch.tensor([[-1], [6]], device=device), torch.tensor([1, 1], device=device), None,
        target.to(device), torch.ones(2, device=device), torch.arange(2, device=device),
        torch.zeros(2, dtype=torch.int64, device=device),
    )  # fmt: skip
    assert counts.cpu().tolist() == [0, 0]
    assert tokens.cpu().tolist() == [[2, -1], [2, -1]]


# ------------------------------------------------------------- statistical tests


def _distribution_case(n, num_spec, temperature, device, with_probs):
    gen = torch.Generator().manual_seed(2024)
    vocab = 8
    target = torch.randn(num_spec + 1, vocab, generator=gen)
    draft_logits = torch.randn(num_spec, vocab, generator=gen)
    q = torch.softmax(draft_logits, -1)
    if with_probs:  # drafts drawn from q, independently per request and step
        drafts = torch.stack([torch.multinomial(q[j], n, replacement=True, generator=gen) for j in range(num_spec)], 1)
    else:  # a fixed draft token: q is its one-hot
        drafts = torch.full((n, num_spec), 3, dtype=torch.int64)
    tensors = {
        "draft_tokens": drafts.to(device),
        "num_draft_tokens": torch.full((n,), num_spec, device=device),
        "draft_probs": q.expand(n, num_spec, vocab).contiguous().to(device) if with_probs else None,
        "target_logits": target.expand(n, num_spec + 1, vocab).contiguous().to(device),
        "temperature": torch.full((n,), temperature, device=device),
        "seeds": torch.arange(n, device=device) * 7919 + 1,
        "positions": torch.full((n,), 100, dtype=torch.int64, device=device),
    }
    p = [spec.softmax(row, temperature) for row in target.tolist()]
    return tensors, p, q.tolist()


@pytest.mark.kernel
@pytest.mark.parametrize("with_probs", [True, False])
def test_output_follows_the_target_distribution(device, with_probs):
    """Whatever the drafts, token 0 of the output follows p_0, and token 1 given
    that draft 0 was accepted follows p_1 (chi-square, 7 dof, p = 1e-6)."""
    n = DRAWS
    t, p, _ = _distribution_case(n, 2, 0.8, device, with_probs)
    tokens, counts = run(t, with_probs)
    tokens, counts = tokens.cpu(), counts.cpu()
    first = torch.bincount(tokens[:, 0].long(), minlength=8).tolist()
    assert spec.chi_square(first, p[0]) < spec.chi2_threshold(7), first
    second = torch.bincount(tokens[counts >= 1, 1].long(), minlength=8).tolist()
    if sum(second) >= 200:  # enough draws for the chi-square approximation
        assert spec.chi_square(second, p[1]) < spec.chi2_threshold(7), second


@pytest.mark.kernel
def test_acceptance_rate_is_sum_of_min_p_q(device):
    """P(accept draft 0) = sum_i min(p_i, q_i); the count of acceptances is
    binomial, so its z-score stays below the two-sided p = 1e-6 bound."""
    n = DRAWS
    t, p, q = _distribution_case(n, 1, 1.3, device, True)
    _, counts = run(t, True)
    rate = sum(min(a, b) for a, b in zip(p[0], q[0], strict=True))
    accepted = int((counts.cpu() == 1).sum())
    z = (accepted - n * rate) / math.sqrt(n * rate * (1 - rate))
    assert abs(z) < spec.normal_threshold(), (accepted, n * rate)


# ---------------------------------------------------------- interpreter lane only


@pytest.mark.interpreter
@given(batch=sampling_batches(max_vocab=200), with_probs=st.booleans())
@example(batch=EDGE_BATCH, with_probs=True)
def test_interpreted_kernel_equals_reference(batch, with_probs):
    t = batch.tensors("cpu", logits_dtype=torch.bfloat16)
    got = run(t, with_probs, salt=2)
    want = rejection_sample_reference(
        t["draft_tokens"], t["num_draft_tokens"], t["draft_probs"] if with_probs else None, t["target_logits"],
        t["temperature"], t["seeds"], t["positions"], 2,
    )  # fmt: skip
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize(
    "change, argument",
    [
        (
            {
                "draft_tokens": torch.zeros(2, 0, dtype=torch.int64),
                "target_logits": torch.zeros(2, 1, 10),
                "draft_probs": None,
            },
            "draft_tokens",
        ),  # fmt: skip
        ({"draft_tokens": torch.zeros(2, 3)}, "draft_tokens"),
        ({"draft_tokens": torch.zeros(6, dtype=torch.int64)}, "draft_tokens"),
        ({"num_draft_tokens": torch.full((3,), 3)}, "num_draft_tokens"),
        ({"num_draft_tokens": torch.full((2,), 3.0)}, "num_draft_tokens"),
        ({"target_logits": torch.zeros(2, 3, 10)}, "target_logits"),
        ({"target_logits": torch.zeros(2, 4, 10, dtype=torch.int32)}, "target_logits"),
        ({"draft_probs": torch.zeros(2, 3, 11)}, "draft_probs"),
        ({"draft_probs": torch.zeros(2, 4, 10)}, "draft_probs"),
        ({"draft_probs": torch.zeros(2, 3, 10, dtype=torch.int64)}, "draft_probs"),
        ({"temperature": torch.ones(2, dtype=torch.float16)}, "temperature"),
        ({"temperature": torch.ones(3)}, "temperature"),
        ({"seeds": torch.arange(3)}, "seeds"),
        ({"positions": torch.zeros(2)}, "positions"),
        ({"target_logits": torch.zeros(2, 10, 4).transpose(1, 2)}, "target_logits"),
    ],
)
def test_bad_input_names_the_argument(change, argument):
    args = {**rejection_inputs(), **change}
    with pytest.raises(ValueError, match=argument):
        rejection_sample(*args.values())


def test_bad_salt_names_the_argument():
    with pytest.raises(ValueError, match="salt"):
        rejection_sample(*rejection_inputs().values(), salt=-3)


def test_value_checker():
    good = rejection_inputs()
    check_rejection_sample_values(good["draft_tokens"], good["num_draft_tokens"], good["temperature"], 10,
                                  good["draft_probs"])  # fmt: skip
    cases = [
        ({"num_draft_tokens": torch.tensor([4, 0])}, "num_draft_tokens"),
        ({"draft_tokens": torch.tensor([[0, 10, 0], [0, 0, 0]])}, "draft_tokens"),
        (
            {"draft_tokens": torch.tensor([[0, 1, 2], [0, 0, 5]]), "num_draft_tokens": torch.tensor([3, 2])},
            "draft_tokens",
        ),  # fmt: skip
        ({"temperature": torch.tensor([1.0, -1.0])}, "temperature"),
        ({"draft_probs": torch.full((2, 3, 10), -0.1)}, "draft_probs"),
    ]
    for change, argument in cases:
        args = {**good, **change}
        with pytest.raises(ValueError, match=argument):
            check_rejection_sample_values(args["draft_tokens"], args["num_draft_tokens"], args["temperature"], 10,
                                          args["draft_probs"])  # fmt: skip
