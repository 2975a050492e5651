"""draft_sample against a plain-Python spec, plus deterministic statistical tests
of the Gumbel sampler (its noise: test_noise.py).

`kernel` tests run in every lane (CPU reference, TRITON_INTERPRET=1 kernel, GPU);
`interpreter` tests compare the interpreted kernel with the reference directly.
Statistical tests use fixed seeds and chi-square thresholds at p = 1e-6, so they
pass or fail deterministically; the interpreter lane draws fewer samples.
"""

import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import draft_sample
from specdraft.ops.backend import TRITON_INTERPRET
from specdraft.ops.sampling.draft import draft_sample_reference, draft_sample_store_reference
from specdraft.ops.sampling.tiles import CHUNK_V
from specdraft.testing import SamplingBatch, check_draft_sample_values, sampling_batches

import specs.sampling as spec

DRAWS = 400 if TRITON_INTERPRET else 20_000

EDGE_BATCH = SamplingBatch(
    vocab=CHUNK_V * 2 + 3,  # three vocab chunks: the cross-program combine
    num_spec=2,
    temperature=[0.0, 1.0, 0.3, 2.5],
    seeds=[0, -1, 2**40 + 7, 2**63 - 1],
    positions=[0, 2**33 + 5, 7, 2**62],
    num_draft=[2, 1, 0, 2],
    data_seed=11,
)


def spec_tokens(batch: SamplingBatch, logits: torch.Tensor, salt: int) -> list[int]:
    rows = logits.float().cpu().tolist()
    return [
        spec.draft_sample(rows[b], batch.temperature[b], batch.seeds[b], batch.positions[b], salt)
        for b in range(batch.num_reqs)
    ]


# ---------------------------------------------------------------- spec: tokens


@pytest.mark.kernel
@given(
    batch=sampling_batches(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    salt=st.sampled_from([0, 1, 12345]),
)
@example(batch=EDGE_BATCH, dtype=torch.bfloat16, salt=3)
def test_tokens_match_spec(device, batch, dtype, salt):
    t = batch.tensors(device, logits_dtype=dtype)
    tokens = draft_sample(t["logits"], t["temperature"], t["seeds"], t["positions"], salt=salt)
    assert tokens.dtype == torch.int32 and tokens.shape == (batch.num_reqs,)
    assert tokens.cpu().tolist() == spec_tokens(batch, t["logits"], salt)


@pytest.mark.kernel
@given(
    batch=sampling_batches(min_requests=1),
    write=st.sampled_from(["probs", "logits"]),
    num_steps=st.integers(1, 3),
    data=st.data(),
)
@example(batch=EDGE_BATCH, write="probs", num_steps=2, data=None)
def test_buffer_write_matches_spec(device, batch, write, num_steps, data):
    step = 1 if data is None else data.draw(st.integers(0, num_steps - 1))
    t = batch.tensors(device)
    out = torch.full((batch.num_reqs, num_steps, batch.vocab), float("nan"), device=device)
    step_t = torch.tensor(step, device=device)
    tokens = draft_sample(
        t["logits"], t["temperature"], t["seeds"], t["positions"], salt=5, probs_out=out, step=step_t, write=write
    )
    assert tokens.cpu().tolist() == spec_tokens(batch, t["logits"], 5)
    rows = t["logits"].cpu().tolist()
    for b in range(batch.num_reqs):
        temp = batch.temperature[b] if batch.temperature[b] > 0 else 1.0
        scaled = [x / temp for x in rows[b]]
        want = spec.softmax(rows[b], temp) if write == "probs" else scaled
        got = out[b, step].cpu()
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), rtol=2e-5, atol=1e-7)
    others = [s for s in range(num_steps) if s != step]
    assert torch.isnan(out[:, others]).all(), "only probs_out[:, step] may be written"


@pytest.mark.kernel
def test_step_outside_the_buffer_writes_nothing(device):
    t = EDGE_BATCH.tensors(device)
    out = torch.full((EDGE_BATCH.num_reqs, 2, EDGE_BATCH.vocab), float("nan"), device=device)
    for step in (2, -1):
        draft_sample(t["logits"], t["temperature"], t["seeds"], t["positions"], probs_out=out,
                     step=torch.tensor(step, device=device))  # fmt: skip
    assert torch.isnan(out).all()


@pytest.mark.kernel
def test_greedy_takes_the_first_of_tied_maxima(device):
    vocab = CHUNK_V * 3 + 1
    logits = torch.zeros(3, vocab)
    logits[0, [5, CHUNK_V + 1, vocab - 1]] = 4.0  # ties in three vocab chunks
    logits[1, [vocab - 1, vocab - 2]] = 1.0  # ties at the end of the last chunk
    logits[2] = float("-inf")  # nothing finite: token 0, as torch.argmax
    logits[2, [CHUNK_V, CHUNK_V + 3]] = -1e30
    zero = torch.zeros(3, dtype=torch.int64)
    tokens = draft_sample(logits.to(device), torch.zeros(3, device=device), zero.to(device), zero.to(device))
    assert tokens.cpu().tolist() == [5, vocab - 2, CHUNK_V]
    logits[2] = float("-inf")
    tokens = draft_sample(logits.to(device), torch.zeros(3, device=device), zero.to(device), zero.to(device))
    assert tokens.cpu().tolist()[2] == 0


@pytest.mark.kernel
def test_same_seed_and_position_give_the_same_token_in_any_batch(device):
    """The noise depends on (seed, position, token) only: not on the row, the
    batch size or the other requests."""
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0)).repeat(6, 1).to(device)
    temps = torch.ones(6, device=device)
    seeds = torch.tensor([3, 9, 3, 3, 9, 4], device=device)
    positions = torch.tensor([1, 1, 1, 2, 1, 1], device=device)
    tokens = draft_sample(logits, temps, seeds, positions).cpu().tolist()
    alone = draft_sample(logits[:1], temps[:1], seeds[:1], positions[:1]).cpu().tolist()
    assert tokens[0] == tokens[2] == alone[0] and tokens[1] == tokens[4]


# ------------------------------------------------------------- statistical tests


@pytest.mark.kernel
@pytest.mark.parametrize("vary", ["seed", "position"])
def test_gumbel_frequencies_match_softmax(device, vary):
    """Each request draws once: draws over many seeds (or many positions of one
    seed) follow softmax(logits / T); chi-square, 7 degrees of freedom."""
    logits = torch.tensor([1.0, -0.5, 0.3, 2.0, 0.0, -1.0, 1.5, 0.8])
    temperature = 0.7
    n = DRAWS
    index = torch.arange(n, dtype=torch.int64)
    seeds = index if vary == "seed" else torch.full((n,), 1234, dtype=torch.int64)
    positions = torch.full((n,), 77, dtype=torch.int64) if vary == "seed" else index * 3 + 5
    tokens = draft_sample(
        logits.expand(n, 8).contiguous().to(device),
        torch.full((n,), temperature, device=device),
        seeds.to(device),
        positions.to(device),
    )
    counts = torch.bincount(tokens.cpu().long(), minlength=8).tolist()
    probs = spec.softmax(logits.tolist(), temperature)
    assert spec.chi_square(counts, probs) < spec.chi2_threshold(7), counts


@pytest.mark.kernel
def test_salts_give_independent_draws(device):
    """Two salts at the same (seed, position): the pair of draws is independent,
    i.e. the joint frequencies factorise (chi-square of independence, 1 dof on a
    two-token vocabulary with p = 1/2)."""
    n = DRAWS
    logits = torch.zeros(n, 2, device=device)
    temps = torch.ones(n, device=device)
    seeds = torch.arange(n, device=device)
    positions = torch.zeros(n, dtype=torch.int64, device=device)
    a = draft_sample(logits, temps, seeds, positions, salt=0).cpu()
    b = draft_sample(logits, temps, seeds, positions, salt=1).cpu()
    joint = torch.bincount((2 * a + b).long(), minlength=4).tolist()
    assert spec.chi_square(joint, [0.25] * 4) < spec.chi2_threshold(3), joint


# ---------------------------------------------------------- interpreter lane only


@pytest.mark.interpreter
@given(batch=sampling_batches(max_vocab=200), write=st.sampled_from([None, "probs", "logits"]))
def test_interpreted_kernel_equals_reference(batch, write):
    t = batch.tensors("cpu", logits_dtype=torch.bfloat16)
    args = (t["logits"], t["temperature"], t["seeds"], t["positions"])
    if write is None:
        assert torch.equal(draft_sample(*args, salt=9), draft_sample_reference(*args, 9))
        return
    out = torch.full((batch.num_reqs, 2, batch.vocab), float("nan"))
    ref_out = out.clone()
    step = torch.tensor(1)
    tokens = draft_sample(*args, salt=9, probs_out=out, step=step, write=write)
    ref_tokens = draft_sample_store_reference(*args, ref_out, step, 9, write == "probs")
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-7, equal_nan=True)


# ------------------------------------------------------------------ bad inputs


def _good():
    return {
        "logits": torch.randn(3, 10),
        "temperature": torch.ones(3),
        "seeds": torch.arange(3),
        "positions": torch.zeros(3, dtype=torch.int64),
    }


@pytest.mark.parametrize(
    "change, kwargs, argument",
    [
        ({"logits": torch.randn(3, 10, 1)}, {}, "logits"),
        ({"logits": torch.randint(0, 5, (3, 10))}, {}, "logits"),
        ({"logits": torch.randn(3, 0)}, {}, "logits"),
        ({"logits": torch.randn(10, 3).T}, {}, "logits"),
        ({"temperature": torch.ones(3, dtype=torch.float64)}, {}, "temperature"),
        ({"temperature": torch.ones(4)}, {}, "temperature"),
        ({"seeds": torch.ones(3)}, {}, "seeds"),
        ({"positions": torch.zeros(2, dtype=torch.int64)}, {}, "positions"),
        ({}, {"salt": -1}, "salt"),
        ({}, {"salt": 2**31}, "salt"),
        ({}, {"probs_out": torch.zeros(3, 2, 11), "step": torch.tensor(0)}, "probs_out"),
        ({}, {"probs_out": torch.zeros(3, 0, 10), "step": torch.tensor(0)}, "probs_out"),
        ({}, {"probs_out": torch.zeros(3, 2, 10, dtype=torch.bfloat16), "step": torch.tensor(0)}, "probs_out"),
        ({}, {"probs_out": torch.zeros(3, 2, 10)}, "step"),
        ({}, {"probs_out": torch.zeros(3, 2, 10), "step": torch.tensor([0])}, "step"),
        ({}, {"probs_out": torch.zeros(3, 2, 10), "step": torch.tensor(0.0)}, "step"),
        ({}, {"step": torch.tensor(0)}, "step"),
        ({}, {"probs_out": torch.zeros(3, 2, 10), "step": torch.tensor(0), "write": "both"}, "write"),
    ],
)
def test_bad_input_names_the_argument(change, kwargs, argument):
    args = {**_good(), **change}
    with pytest.raises(ValueError, match=argument):
        draft_sample(args["logits"], args["temperature"], args["seeds"], args["positions"], **kwargs)


def test_value_checker():
    check_draft_sample_values(torch.tensor([0.0, 0.5]), torch.zeros(2, 3, 4), torch.tensor(2))
    for temps in ([-0.1, 1.0], [math.nan, 1.0], [math.inf, 0.0]):
        with pytest.raises(ValueError, match="temperature"):
            check_draft_sample_values(torch.tensor(temps))
    with pytest.raises(ValueError, match="step"):
        check_draft_sample_values(torch.ones(2), torch.zeros(2, 3, 4), torch.tensor(3))
