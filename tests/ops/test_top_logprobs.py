"""ops.top_logprobs against a plain-Python oracle written from its definition (sort
the row by logit, highest first, ties to the lower index, NaN as -inf; a
log-probability is the logit minus the row's log-sum-exp, in float64 here), in every
lane (`kernel`: the CPU reference, the TRITON_INTERPRET=1 kernel, CUDA). Rows come
from a coarse grid so they tie, with NaN and -inf among them; the wide rows span
several of the kernel's row blocks, with the best entries and their ties planted in
different blocks."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.ops import top_logprobs

from fixtures.lanes import INTERPRETER

GRID = [0.0, -0.5, -1.0, 2.0, -3.0]
EXAMPLES = 25 if INTERPRETER else 100


def oracle(row: list[float], k: int) -> tuple[list[int], list[float]]:
    key = [-math.inf if math.isnan(v) else v for v in row]
    order = sorted(range(len(row)), key=lambda j: (-key[j], j))[:k]
    if any(math.isnan(v) for v in row):
        return order, [math.nan] * k
    top = max(row)
    if top == -math.inf:
        return order, [math.nan] * k  # log_softmax of a row of -inf: NaN
    log_norm = top + math.log(math.fsum(math.exp(v - top) for v in row))
    return order, [row[j] - log_norm for j in order]


def assert_matches(logits: torch.Tensor, k: int, ids: torch.Tensor, logprobs: torch.Tensor) -> None:
    for r, row in enumerate(logits.double().tolist()):
        want_ids, want_lp = oracle(row, k)
        assert ids[r].tolist() == want_ids, r
        assert logprobs[r].tolist() == pytest.approx(want_lp, rel=1e-5, abs=1e-5, nan_ok=True), r


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(data=st.data(), rows=st.integers(1, 4), vocab=st.integers(1, 300))
def test_top_entries_and_their_logprobs(device, data, rows, vocab):
    k = data.draw(st.integers(1, min(8, vocab)))
    values = st.sampled_from(GRID)
    if data.draw(st.booleans()):
        values = st.one_of(values, st.sampled_from([math.nan, -math.inf]))
    logits = torch.tensor([[data.draw(values) for _ in range(vocab)] for _ in range(rows)])
    ids, logprobs = top_logprobs(logits.to(device), k)
    assert ids.dtype == torch.int64 and logprobs.dtype == torch.float32
    assert_matches(logits, k, ids.cpu(), logprobs.cpu())


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_wide_rows_across_blocks(device, dtype, k):
    """32000 entries (the 8B head's draft vocabulary): eight blocks of the kernel. Row 0
    ties its best value in blocks 0, 3 and 7 (the lowest index wins); row 1 has its
    best entries in the last, partial block; row 2 in block 0 only; row 3 is random."""
    g = torch.Generator().manual_seed(k)
    vocab = 32000
    logits = torch.randn(4, vocab, generator=g) * 0.5
    logits[0, [31000, 13000, 20]] = 9.0
    logits[0, [12999, 5]] = 8.0
    logits[1, 31990:] = torch.arange(10, dtype=torch.float32) + 4.0
    logits[2, 100:108] = 7.0
    logits[3] = torch.randn(vocab, generator=g) * 3.0
    logits = logits.to(dtype)
    ids, logprobs = top_logprobs(logits.to(device), k)
    assert_matches(logits, k, ids.cpu(), logprobs.cpu())


@pytest.mark.kernel
def test_rows_of_a_wider_tensor(device):
    """Rows with a stride above their length (a view of the first V columns)."""
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(3, 5000, generator=g)
    ids, logprobs = top_logprobs(wide.to(device)[:, :4500], 5)
    assert_matches(wide[:, :4500], 5, ids.cpu(), logprobs.cpu())


def test_no_rows(device):
    ids, logprobs = top_logprobs(torch.zeros(0, 7, device=device), 3)
    assert ids.shape == (0, 3) and logprobs.shape == (0, 3)


def test_bad_input_names_the_argument(device):
    logits = torch.zeros(2, 5, device=device)
    with pytest.raises(ValueError, match="^k must"):
        top_logprobs(logits, 0)
    with pytest.raises(ValueError, match="^k must"):
        top_logprobs(logits, 6)
    with pytest.raises(ValueError, match="^k must"):
        top_logprobs(torch.zeros(2, 20, device=device), 9)
    with pytest.raises(ValueError, match="^logits"):
        top_logprobs(logits.long(), 2)
    with pytest.raises(ValueError, match="^logits"):
        top_logprobs(logits[0], 2)
    with pytest.raises(ValueError, match="^logits"):
        top_logprobs(logits.t(), 1)


def test_opcheck(device):
    logits = torch.tensor([[0.5, -1.0, 2.0, 2.0, 0.0], [1.0, 1.0, -3.0, 0.25, 4.0]], device=device)
    torch.library.opcheck(torch.ops.specdraft.top_logprobs, (logits, 3))
