"""Row-strided logits: draft_sample and rejection_sample read rows of a wider buffer
(or a transposed [K + 1, B, V] one) exactly as they read the same values packed,
in every lane (the kernels take the row strides)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdraft.ops import draft_sample, rejection_sample
from specdraft.testing import sampling_batches

from fixtures.lanes import INTERPRETER

# The interpreter emulates every lane of a kernel in NumPy: vocabularies up to 100
# there (still several of its 16-wide blocks per row, the strides read in every
# block), up to 300 elsewhere.
MAX_VOCAB = 100 if INTERPRETER else 300


def padded(t: torch.Tensor, extra: int) -> torch.Tensor:
    """The same values, each row followed by `extra` unused NaNs."""
    wide = torch.full((*t.shape[:-1], t.shape[-1] + extra), float("nan"), dtype=t.dtype, device=t.device)
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


@pytest.mark.kernel
@given(batch=sampling_batches(min_requests=1, max_vocab=MAX_VOCAB), extra=st.integers(1, 9), write=st.booleans())
def test_draft_sample_reads_strided_rows(device, batch, extra, write):
    t = batch.tensors(device, logits_dtype=torch.bfloat16)
    args = (t["temperature"], t["seeds"], t["positions"])
    strided = padded(t["logits"], extra)
    assert strided.stride(0) == batch.vocab + extra
    out = {}
    for name, logits in (("packed", t["logits"]), ("strided", strided)):
        probs = torch.zeros(batch.num_reqs, 2, batch.vocab, device=device) if write else None
        step = torch.tensor(1, device=device) if write else None
        out[name] = (draft_sample(logits, *args, salt=3, probs_out=probs, step=step), probs)
    assert torch.equal(out["strided"][0], out["packed"][0])
    if write:  # the stored softmax: same reductions, but a differently specialised kernel on CUDA
        torch.testing.assert_close(out["strided"][1], out["packed"][1], rtol=1e-6, atol=1e-7)


@pytest.mark.kernel
@given(batch=sampling_batches(min_requests=1, max_vocab=MAX_VOCAB), extra=st.integers(1, 9), layout=st.booleans())
def test_rejection_sample_reads_strided_target_rows(device, batch, extra, layout):
    t = batch.tensors(device, logits_dtype=torch.bfloat16)
    target = t["target_logits"]
    # Rows of a wider buffer, or [K + 1, B, V] transposed to [B, K + 1, V].
    strided = padded(target, extra) if layout else target.transpose(0, 1).contiguous().transpose(0, 1)
    rest = (t["temperature"], t["seeds"], t["positions"])
    for probs in (t["draft_probs"], None):
        want = rejection_sample(t["draft_tokens"], t["num_draft_tokens"], probs, target, *rest, salt=2)
        got = rejection_sample(t["draft_tokens"], t["num_draft_tokens"], probs, strided, *rest, salt=2)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
