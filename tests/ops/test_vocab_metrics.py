"""ops.vocab_metrics against the plain-Python oracle of specs.vocab_metrics (explicit
softmax, min and sum per row in float64).

`kernel` tests run in every lane (CPU reference, TRITON_INTERPRET=1 kernel, GPU);
the `interpreter` test compares the interpreted kernel with the reference directly,
by error ratio: the kernel's error against the float64 oracle may not exceed a few
times the fp32 reference's own.
"""

import importlib
import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import VocabMetrics, vocab_metrics
from specdraft.ops.vocab_metrics.op import BLOCK_V
from specdraft.ops.vocab_metrics.reference import vocab_metrics_reference

import specs.vocab_metrics as spec

FLOATS = ("draft_lse", "target_lse", "accept", "cross_entropy", "kl")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TEMPERATURES = (0.0, -1.0, 0.3, 1.0, 2.5)


def make_case(seed, rows, vocab, draft_vocab, *, dtype=torch.float32, temperatures=(1.0,), use_map=True,
              neg_inf=0.0, out_of_range=False, probs=False, spread=3.0):  # fmt: skip
    """(draft [rows, Vd], target [rows, V], temperature [rows], d2t or None)."""
    g = torch.Generator().manual_seed(seed)
    draft = torch.randn(rows, draft_vocab, generator=g) * spread
    target = torch.randn(rows, vocab, generator=g) * spread
    if neg_inf:  # masked vocabulary entries, sometimes whole rows
        draft[torch.rand(draft.shape, generator=g) < neg_inf] = -math.inf
        target[torch.rand(target.shape, generator=g) < neg_inf] = -math.inf
    if probs:
        target = torch.softmax(target, -1).nan_to_num(0.0)  # an all -inf row: all zeros
    d2t = None
    if use_map:
        ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values  # increasing, as EAGLE-3's maps
        if out_of_range:
            ids[-1] = vocab + 3  # an id outside the target vocabulary: no mass, never read
        d2t = ids - torch.arange(draft_vocab)
    temps = torch.tensor([temperatures[i % len(temperatures)] for i in range(rows)], dtype=torch.float32)
    return draft.to(dtype), target.to(dtype), temps, d2t


def oracle(draft, target, temps, d2t, probs=False) -> list[dict]:
    d2t_list = None if d2t is None else d2t.tolist()
    return [
        spec.row_metrics(draft[n].double().tolist(), target[n].double().tolist(), float(temps[n]), d2t_list, probs)
        for n in range(draft.shape[0])
    ]


def float_error(got: torch.Tensor, want: list[float]) -> float:
    """Max |got - want| with infinities required to match exactly."""
    got64 = got.double().cpu()
    want64 = torch.tensor(want, dtype=torch.float64)
    infinite = torch.isinf(want64)
    assert not torch.isnan(got64).any()
    assert torch.equal(got64[infinite], want64[infinite]) and not torch.isinf(got64[~infinite]).any()
    return (got64[~infinite] - want64[~infinite]).abs().max().item() if (~infinite).any() else 0.0


def magnitude(want: list[float]) -> float:
    return max([1.0] + [abs(v) for v in want if not math.isinf(v)])


def tolerance(name: str, want: list[float]) -> float:
    """fp32 arithmetic over the vocabulary: a few ulps of the largest finite magnitude."""
    return (3e-6 if name == "accept" else 1e-5) * magnitude(want)


def check(out, draft, target, temps, d2t, probs, divergence):
    want = oracle(draft.cpu(), target.cpu(), temps.cpu(), None if d2t is None else d2t.cpu(), probs)
    assert out.draft_token.dtype == torch.int32 and out.target_token.dtype == torch.int32
    assert out.draft_token.cpu().tolist() == [w["draft_token"] for w in want]
    assert out.target_token.cpu().tolist() == [w["target_token"] for w in want]
    for name in FLOATS:
        got = getattr(out, name)
        if name in ("cross_entropy", "kl") and not divergence:
            assert got.shape == (0,)
            continue
        values = [w[name] for w in want]
        assert got.shape == (draft.shape[0],) and got.dtype == torch.float32
        if values:
            assert float_error(got, values) <= tolerance(name, values), name


@st.composite
def cases(draw):
    vocab = draw(st.integers(1, 70))
    use_map = draw(st.booleans())
    return dict(
        seed=draw(st.integers(0, 2**16)),
        rows=draw(st.integers(0, 5)),
        vocab=vocab,
        draft_vocab=draw(st.integers(1, vocab)) if use_map else vocab,
        use_map=use_map,
        dtype=draw(st.sampled_from(DTYPES)),
        temperatures=tuple(draw(st.lists(st.sampled_from(TEMPERATURES), min_size=1, max_size=4))),
        neg_inf=draw(st.sampled_from([0.0, 0.0, 0.3, 0.9])),
        out_of_range=use_map and draw(st.booleans()),
        probs=draw(st.booleans()),
    )


@pytest.mark.kernel
@given(case=cases(), divergence=st.booleans())
@example(case=dict(seed=1, rows=4, vocab=3 * BLOCK_V + 5, draft_vocab=2 * BLOCK_V + 1, use_map=True,
                   dtype=torch.bfloat16, temperatures=(0.7, 0.0), neg_inf=0.1, out_of_range=True, probs=False),
         divergence=True)  # fmt: skip
def test_matches_the_oracle(device, case, divergence):
    draft, target, temps, d2t = make_case(**case)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    out = vocab_metrics(to(draft), to(target), to(temps), d2t=to(d2t), target_is_probs=case["probs"],
                        divergence=divergence)  # fmt: skip
    check(out, draft, target, temps, d2t, case["probs"], divergence)


@pytest.mark.kernel
@pytest.mark.parametrize("use_map", [False, True])
def test_many_tiles_match_the_oracle(device, use_map):
    """Vocabularies of several tiles (the GPU's, or the interpreter's small ones): pass 2
    walks them back to front."""
    vocab = 2 * BLOCK_V + 77
    draft, target, temps, d2t = make_case(3, 3, vocab, vocab - BLOCK_V // 2 if use_map else vocab, dtype=torch.bfloat16,
                                          temperatures=(1.0, 0.0, 0.6), use_map=use_map, neg_inf=0.05)  # fmt: skip
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    out = vocab_metrics(to(draft), to(target), to(temps), d2t=to(d2t), divergence=True)
    check(out, draft, target, temps, d2t, False, True)


@pytest.mark.kernel
def test_greedy_is_the_argmax_match_with_the_lowest_index_on_ties(device):
    vocab = 3 * BLOCK_V + 2
    draft = torch.zeros(3, vocab)
    target = torch.zeros(3, vocab)
    draft[0, [5, BLOCK_V + 1, vocab - 1]] = 4.0  # ties in three tiles: the first wins
    target[0, [5, 2 * BLOCK_V]] = 2.0
    draft[1, [vocab - 2, vocab - 1]] = 1.0  # ties in the last tile
    target[1, [vocab - 1, 0]] = 1.0
    draft[2] = -math.inf  # nothing finite: index 0, as torch.argmax
    target[2, 0] = -math.inf
    temps = torch.zeros(3)
    out = vocab_metrics(draft.to(device), target.to(device), temps.to(device))
    assert out.draft_token.cpu().tolist() == [5, vocab - 2, 0]
    assert out.target_token.cpu().tolist() == [5, 0, 1]
    assert out.accept.cpu().tolist() == [1.0, 0.0, 0.0]
    # Through a map: draft ids tie, the lowest draft id wins, and its target id is reported.
    d2t = torch.zeros(vocab, dtype=torch.int64)
    d2t[0], d2t[vocab - 2] = vocab - 2, -(vocab - 2)  # swap ids 0 and vocab - 2 (a map need not be monotone)
    out = vocab_metrics(draft.to(device), target.to(device), temps.to(device), d2t=d2t.to(device))
    assert out.draft_token.cpu().tolist() == [5, 0, vocab - 2]
    assert out.accept.cpu().tolist() == [1.0, 1.0, 0.0]


@pytest.mark.kernel
def test_target_mass_outside_the_draft_vocabulary_never_accepts(device):
    vocab = 40
    draft_ids = torch.arange(1, vocab, 2)  # odd target ids only
    d2t = draft_ids - torch.arange(draft_ids.shape[0])
    target = torch.full((2, vocab), -20.0)
    target[0, 0] = 20.0  # nearly all mass on an even id
    target[1, 7] = 20.0  # nearly all mass on an odd id, draft id 3
    draft = torch.zeros(2, draft_ids.shape[0])
    draft[:, 3] = 20.0
    temps = torch.ones(2)
    out = vocab_metrics(draft.to(device), target.to(device), temps.to(device), d2t=d2t.to(device), divergence=True)
    accept = out.accept.cpu()
    assert accept[0] < 1e-6 and accept[1] > 0.99
    check(out, draft, target, temps, d2t, False, True)


@pytest.mark.kernel
def test_empty_rows_and_masked_vocabulary(device):
    """-inf logits: an all -inf row has no mass (lse -inf, no acceptance); target mass
    where the draft has none makes the cross-entropy and KL infinite."""
    vocab = BLOCK_V + 9
    draft = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    target = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1))
    draft[0] = -math.inf
    target[1] = -math.inf
    draft[2, : vocab // 2] = -math.inf
    target[2, vocab // 2 :] = -math.inf  # disjoint supports: no acceptance, infinite divergence
    draft[3, ::2] = -math.inf
    target[3, ::2] = -math.inf  # same support: finite
    temps = torch.tensor([1.0, 0.5, 1.0, 2.0])
    out = vocab_metrics(draft.to(device), target.to(device), temps.to(device), divergence=True)
    assert out.draft_lse[0].item() == -math.inf and out.target_lse[1].item() == -math.inf
    assert out.accept[:3].cpu().tolist() == [0.0, 0.0, 0.0]
    assert out.cross_entropy[2].item() == math.inf and out.kl[2].item() == math.inf
    assert math.isfinite(out.cross_entropy[3].item()) and math.isfinite(out.kl[3].item())
    check(out, draft, target, temps, None, False, True)


@pytest.mark.kernel
def test_strided_rows_and_temperature_forms(device):
    draft, target, temps, d2t = make_case(5, 4, 37, 20, dtype=torch.bfloat16)
    draft, target, d2t = draft.to(device), target.to(device), d2t.to(device)
    wide = torch.full((4, 50), float("nan"), dtype=target.dtype, device=device)
    wide[:, :37] = target
    packed = vocab_metrics(draft, target, 0.7, d2t=d2t, divergence=True)
    for temperature in (torch.tensor(0.7, device=device), torch.full((8,), 0.7, device=device)[::2]):
        strided = vocab_metrics(draft, wide[:, :37], temperature, d2t=d2t, divergence=True)
        for a, b in zip(packed, strided, strict=True):
            assert torch.equal(a, b)


def test_the_eager_reference_in_chunks_equals_one_chunk(monkeypatch):
    draft, target, temps, d2t = make_case(9, 11, 30, 18, temperatures=(0.0, 0.8, 1.3), neg_inf=0.2)
    whole = vocab_metrics_reference(draft, target, temps, d2t, False, True)
    module = importlib.import_module("specdraft.ops.vocab_metrics.reference")
    monkeypatch.setattr(module, "REFERENCE_CHUNK_ELEMENTS", 64)  # 2 rows per chunk
    chunked = vocab_metrics_reference(draft, target, temps, d2t, False, True)
    for a, b in zip(whole, chunked, strict=True):
        assert torch.equal(a, b)


@pytest.mark.interpreter
@pytest.mark.parametrize("use_map", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreted_kernel_against_the_reference(use_map, dtype):
    """Error ratio: kernel error <= 4 x reference error + a floor, against the oracle."""
    for seed, vocab in ((0, 1), (1, BLOCK_V), (2, BLOCK_V + 1), (3, 5 * BLOCK_V + 3)):
        draft_vocab = max(1, vocab - 7) if use_map else vocab
        draft, target, temps, d2t = make_case(seed, 5, vocab, draft_vocab, dtype=dtype, temperatures=TEMPERATURES,
                                              use_map=use_map, neg_inf=0.1)  # fmt: skip
        kernel = vocab_metrics(draft, target, temps, d2t=d2t, divergence=True)
        reference = VocabMetrics(*vocab_metrics_reference(draft, target, temps, d2t, False, True))
        assert torch.equal(kernel.draft_token, reference.draft_token)
        assert torch.equal(kernel.target_token, reference.target_token)
        want = oracle(draft, target, temps, d2t)
        for name in FLOATS:
            values = [w[name] for w in want]
            kernel_error = float_error(getattr(kernel, name), values)
            reference_error = float_error(getattr(reference, name), values)
            assert kernel_error <= 4 * reference_error + 1e-6 * magnitude(values), name


def test_opcheck(device):
    draft, target, temps, d2t = make_case(2, 3, 29, 13, temperatures=(0.0, 1.0))
    args = [t.to(device) for t in (draft, target, temps, d2t)]
    for map_arg in (args[3], None):
        for divergence in (False, True):
            target_arg = args[1][:, :13] if map_arg is None else args[1]
            torch.library.opcheck(
                torch.ops.specdraft.vocab_metrics, (args[0], target_arg, args[2], map_arg, False, divergence)
            )


def test_bad_input_names_the_argument():
    draft, target, temps, d2t = make_case(0, 2, 10, 6)
    bad = [
        ("draft_logits", dict(draft_logits=draft.long())),
        ("target", dict(target=target[:1])),
        ("target", dict(target=target.t().contiguous().t())),  # column-major rows
        ("d2t", dict(d2t=None)),  # Vd != V needs a map
        ("d2t", dict(d2t=d2t[:3])),
        ("d2t", dict(d2t=d2t.float())),
        ("temperature", dict(temperature=True)),
        ("temperature", dict(temperature=torch.ones(3))),
        ("temperature", dict(temperature=torch.ones(2, dtype=torch.float64))),
        ("divergence", dict(divergence=1)),
        ("target_is_probs", dict(target_is_probs="no")),
    ]
    base = dict(draft_logits=draft, target=target, temperature=temps, d2t=d2t)
    for name, change in bad:
        kwargs = {**base, **change}
        with pytest.raises(ValueError, match=name):
            vocab_metrics(kwargs.pop("draft_logits"), kwargs.pop("target"), **kwargs)
