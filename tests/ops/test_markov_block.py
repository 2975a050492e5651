"""markov_block_sample against a plain-Python oracle of DSpark's Markov head
(specs/markov_block.py: float64, one request and one step at a time, from the head's
unsplit modules), on Hypothesis-drawn blocks: every kind, greedy and sampled requests
mixed, exact ties; then the first-index rule across tiles and programs, the
interpreted kernels against the reference, bad input and checked mode.

`kernel` tests run in every lane (CPU reference, TRITON_INTERPRET=1 kernels, GPU);
`interpreter` tests compare the interpreted kernels with the reference directly."""

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import specdraft
from specdraft.ops import markov_block_sample
from specdraft.ops.markov_block import check_markov_block_sample_values, markov_block_sample_reference
from specdraft.ops.markov_block.op import tiles

import specs.markov_block as spec
from fixtures.lanes import INTERPRETER
from fixtures.markov_block import TIE_LOGIT, MarkovCase, markov_cases

# The interpreter runs every program in NumPy: small blocks there (still several tiles
# and programs: 4 rows a tile, 8 a program) and half the profile's examples.
MAX_VOCAB, MAX_REQUESTS, MAX_STEPS = (64, 3, 6) if INTERPRETER else (300, 4, 8)
EXAMPLES = settings().max_examples // 2 if INTERPRETER else settings().max_examples


def wide_case(kind: str, rank: int = 40) -> MarkovCase:
    """A vocabulary over three programs of the bias kernel in this lane, sampled and
    greedy requests, tied rows in two tiles of the first program (odd steps walk its
    tiles back to front) and in the second and last programs."""
    _, rows_per_tile, rows_per_program, _ = tiles(rank)
    vocab = 2 * rows_per_program + 3
    tied = (1, rows_per_tile + 1, rows_per_program + 2, vocab - 1)
    return MarkovCase(kind, vocab, rank, 5, 3, [0.0, 0.7], [5, -9], [11, 2**40], [vocab - 1, 3], data_seed=17,
                      zero_rows=tied, tie_logit=TIE_LOGIT)  # fmt: skip


def run_both(case: MarkovCase, device):
    args, kwargs = case.op_args(device)
    tokens, corrected = markov_block_sample(*args, **kwargs)
    want_tokens, want_corrected = spec.markov_block_sample(
        case.kind, case.weights(), case.first_prev, case.temperature, case.seeds, case.positions, case.salt
    )
    return tokens, corrected, want_tokens, want_corrected


@pytest.mark.kernel
@settings(max_examples=EXAMPLES)
@given(case=markov_cases(max_requests=MAX_REQUESTS, max_vocab=MAX_VOCAB, max_steps=MAX_STEPS))
@example(case=wide_case("vanilla"))
@example(case=wide_case("gated"))
@example(case=wide_case("rnn"))
def test_matches_the_plain_python_oracle(device, case):
    tokens, corrected, want_tokens, want_corrected = run_both(case, device)
    assert tokens.dtype == torch.int32 and tokens.shape == (case.num_reqs, case.num_steps)
    assert corrected.dtype == torch.float32 and corrected.shape == (case.num_reqs, case.num_steps, case.vocab)
    assert tokens.cpu().tolist() == want_tokens
    torch.testing.assert_close(corrected.cpu().double(), want_corrected, rtol=1e-5, atol=1e-5)


@pytest.mark.kernel
@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_greedy_takes_the_first_of_tied_maxima_across_programs(device, kind):
    """Tied rows (W2 row 0, the same leading base logit) in two tiles of the first
    program and in the second and last programs of the bias kernel: every greedy step
    picks the first of them, whichever way it walks the tiles, and a sampled step one
    of them."""
    case = wide_case(kind)
    tokens, _, want_tokens, _ = run_both(case, device)
    assert tokens.cpu().tolist() == want_tokens
    assert want_tokens[0] == [1] * case.num_steps
    assert set(want_tokens[1]) <= set(case.zero_rows)


@pytest.mark.kernel
def test_each_request_is_independent_of_the_batch(device):
    """Two requests with the same inputs sample the same block, and a request alone
    samples what it samples in a batch: no state (the rnn's included) crosses rows."""
    case = MarkovCase("rnn", 50, 6, 3, 5, [0.0, 0.0, 0.9], [1, 1, 4], [0, 0, 7], [3, 3, 8], data_seed=3)
    args, kwargs = case.op_args(device)
    args[0][1] = args[0][0]
    kwargs["hidden_part"][1] = kwargs["hidden_part"][0]
    tokens, corrected = markov_block_sample(*args, **kwargs)
    # Tokens exactly; logits to rounding: a CPU GEMM may sum a row's products in an
    # order that depends on where the row falls in its tiles (4.8e-7 apart on an AMD
    # EPYC without AVX-512), while state crossing rows moves them by O(1).
    assert torch.equal(tokens[0], tokens[1])
    torch.testing.assert_close(corrected[0], corrected[1], rtol=1e-6, atol=1e-6)
    alone_args = [a[2:] if i in (0, 1, 4, 5, 6) else a for i, a in enumerate(args)]
    alone_tokens, alone_corrected = markov_block_sample(
        *alone_args, **kwargs | {"hidden_part": kwargs["hidden_part"][2:]}
    )
    assert torch.equal(alone_tokens[0], tokens[2])
    torch.testing.assert_close(alone_corrected[0], corrected[2], rtol=1e-6, atol=1e-6)


@pytest.mark.kernel
def test_empty_batch(device):
    case = MarkovCase("gated", 9, 4, 2, 3, [0.0], [0], [0], [0], data_seed=0)
    args, kwargs = case.op_args(device)
    args = tuple(a[:0] if i in (0, 1, 4, 5, 6) else a for i, a in enumerate(args))
    kwargs["hidden_part"] = kwargs["hidden_part"][:0]
    tokens, corrected = markov_block_sample(*args, **kwargs)
    assert tokens.shape == (0, 3) and corrected.shape == (0, 3, 9)


# ---------------------------------------------------------- interpreter lane only


@pytest.mark.interpreter
@settings(max_examples=EXAMPLES)
@given(case=markov_cases(max_vocab=MAX_VOCAB, max_requests=3, max_steps=5))
def test_interpreted_kernels_equal_the_reference(case):
    args, kwargs = case.op_args("cpu")
    tokens, corrected = markov_block_sample(*args, **kwargs)
    kind, salt = kwargs.pop("kind"), kwargs.pop("salt")
    ref_tokens, ref_corrected = markov_block_sample_reference(
        *args, kind, kwargs.get("hidden_part"), kwargs.get("latent_weight"), salt
    )
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(corrected, ref_corrected, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ bad inputs

B, S, V, R, H = 2, 3, 11, 4, 5


def _good(kind="vanilla"):
    args = {
        "base_logits": torch.randn(B, S, V),
        "first_prev_tokens": torch.zeros(B, dtype=torch.int64),
        "markov_w1": torch.randn(V, R),
        "markov_w2": torch.randn(V, R),
        "temperature": torch.ones(B),
        "seeds": torch.arange(B),
        "positions": torch.zeros(B, dtype=torch.int64),
        "kind": kind,
    }
    if kind == "gated":
        args |= {"hidden_part": torch.randn(B, S, R), "latent_weight": torch.randn(R, H + R)[:, H:]}
    if kind == "rnn":
        args |= {"hidden_part": torch.randn(B, S, 3 * R), "latent_weight": torch.randn(3 * R, 2 * R + H)[:, : 2 * R]}
    return args


@pytest.mark.parametrize(
    "kind, change, argument",
    [
        ("vanilla", {"base_logits": torch.randn(B, V)}, "base_logits"),
        ("vanilla", {"base_logits": torch.randn(B, 0, V)}, "base_logits"),
        ("vanilla", {"base_logits": torch.randn(B, S, 0)}, "base_logits"),
        ("vanilla", {"base_logits": torch.randint(0, 5, (B, S, V))}, "base_logits"),
        ("vanilla", {"base_logits": torch.randn(B, V, S).transpose(1, 2)}, "base_logits"),
        ("vanilla", {"first_prev_tokens": torch.zeros(B)}, "first_prev_tokens"),
        ("vanilla", {"first_prev_tokens": torch.zeros(B + 1, dtype=torch.int64)}, "first_prev_tokens"),
        ("vanilla", {"markov_w1": torch.randn(V + 1, R)}, "markov_w1"),
        ("vanilla", {"markov_w1": torch.randn(V, 0)}, "markov_w1"),
        ("vanilla", {"markov_w1": torch.randn(V, 2049)}, "markov_w1"),
        ("vanilla", {"markov_w1": torch.randn(V, R, dtype=torch.float64)}, "markov_w1"),
        ("vanilla", {"markov_w1": torch.randn(R, V).T}, "markov_w1"),
        ("vanilla", {"markov_w2": torch.randn(V, R + 1)}, "markov_w2"),
        ("vanilla", {"markov_w2": torch.randn(V - 1, R)}, "markov_w2"),
        ("vanilla", {"markov_w2": torch.randint(0, 3, (V, R))}, "markov_w2"),
        ("vanilla", {"temperature": torch.ones(B, dtype=torch.float64)}, "temperature"),
        ("vanilla", {"temperature": torch.ones(B + 1)}, "temperature"),
        ("vanilla", {"seeds": torch.ones(B)}, "seeds"),
        ("vanilla", {"positions": torch.zeros(B - 1, dtype=torch.int64)}, "positions"),
        ("vanilla", {"kind": "lstm"}, "kind"),
        ("vanilla", {"hidden_part": torch.randn(B, S, R)}, "hidden_part"),
        ("vanilla", {"latent_weight": torch.randn(R, R)}, "latent_weight"),
        ("vanilla", {"salt": -1}, "salt"),
        ("vanilla", {"salt": 2**31}, "salt"),
        ("gated", {"hidden_part": None}, "hidden_part"),
        ("gated", {"latent_weight": None}, "latent_weight"),
        ("gated", {"hidden_part": torch.randn(B, S, 3 * R)}, "hidden_part"),
        ("gated", {"hidden_part": torch.randn(B, S + 1, R)}, "hidden_part"),
        ("gated", {"hidden_part": torch.randn(B, S, R).to(torch.int64)}, "hidden_part"),
        ("gated", {"latent_weight": torch.randn(R, R + 1)}, "latent_weight"),
        ("gated", {"latent_weight": torch.randn(R, R).T}, "latent_weight"),
        ("rnn", {"hidden_part": None}, "hidden_part"),
        ("rnn", {"hidden_part": torch.randn(B, S, R)}, "hidden_part"),
        ("rnn", {"latent_weight": torch.randn(R, R)}, "latent_weight"),
        ("rnn", {"latent_weight": torch.randn(3 * R, 2 * R + H)}, "latent_weight"),
        ("rnn", {"latent_weight": None}, "latent_weight"),
    ],
)
def test_bad_input_names_the_argument(kind, change, argument):
    args = _good(kind) | change
    with pytest.raises(ValueError, match=argument):
        markov_block_sample(**args)


def test_good_input_passes_the_checks():
    for kind in ("vanilla", "gated", "rnn"):
        tokens, corrected = markov_block_sample(**_good(kind))
        assert tokens.shape == (B, S) and corrected.shape == (B, S, V)


def test_value_checker():
    good = (torch.tensor([0, V - 1]), V, torch.tensor([0.0, 0.5]), torch.tensor([0, 3]))
    check_markov_block_sample_values(*good)
    for first in ([-1, 0], [0, V]):
        with pytest.raises(ValueError, match="first_prev_tokens"):
            check_markov_block_sample_values(torch.tensor(first), *good[1:])
    with pytest.raises(ValueError, match="temperature"):
        check_markov_block_sample_values(good[0], V, torch.tensor([-0.5, 1.0]), good[3])
    with pytest.raises(ValueError, match="positions"):
        check_markov_block_sample_values(*good[:3], torch.tensor([0, -2]))


@given(first=st.sampled_from([-(2**40), -1, V, 2**40]))
def test_checked_mode_refuses_an_out_of_range_first_token_and_the_unchecked_op_clamps_it(first):
    args = _good("rnn") | {"first_prev_tokens": torch.tensor([first, 0])}
    with specdraft.checked(), pytest.raises(ValueError, match="^first_prev_tokens"):
        markov_block_sample(**args)
    clamped = args | {"first_prev_tokens": torch.tensor([0 if first < 0 else V - 1, 0])}
    for got, want in zip(markov_block_sample(**args), markov_block_sample(**clamped), strict=True):
        assert torch.equal(got, want)
