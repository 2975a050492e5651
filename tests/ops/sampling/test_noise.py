"""The counter-based noise (ops/sampling/noise.py) against the hash on Python ints:
the raw bits and the uniforms, in every lane, and the interpreted kernel against
the torch twin bit for bit; the exponential / Gumbel transform against the
continuous laws over every value the 32 bits can take (the far tail included), and
the Triton transform against its torch twin."""

import functools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdraft.ops import noise_uniform
from specdraft.ops.backend import tl, triton
from specdraft.ops.sampling.noise import (
    TAIL_BITS,
    exponential2,
    exponential2_torch,
    gumbel2_torch,
    log2_exponential2,
    noise_bits_reference,
    tail_split_torch,
    uniform_torch,
)

import specs.sampling as spec

# ----------------------------------------------------------------------- the hash


@pytest.mark.kernel
@given(
    seeds=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4),
    position=st.integers(0, 2**63 - 1),
    vocab=st.integers(1, 80),
    salt=st.integers(0, 2**31 - 1),
    stream=st.sampled_from([0, 1, 2]),
)
def test_noise_matches_python_hash(device, seeds, position, vocab, salt, stream):
    s = torch.tensor(seeds, dtype=torch.int64, device=device)
    p = torch.full_like(s, position)
    got = torch.ops.specdraft.noise_bits(s, p, vocab, salt, stream).cpu().tolist()
    want = [[spec.bits(spec.row_key(seed, position, salt, stream), i) for i in range(vocab)] for seed in seeds]
    assert got == want
    u = noise_uniform(s, p, vocab, salt=salt, stream=stream).cpu().tolist()
    assert u == [[spec.uniform(w) for w in row] for row in want]  # exact: 23 bits + 0.5 fit fp32
    assert all(0 < v < 1 for row in u for v in row)


def test_uniform_extremes_stay_inside_the_open_interval():
    top, bottom = spec.uniform(0xFFFFFFFF), spec.uniform(0)
    t = torch.tensor([0xFFFFFFFF, 0], dtype=torch.int64)
    assert uniform_torch(t).tolist() == [top, bottom]
    assert top < 1 and bottom > 0 and torch.isfinite(gumbel2_torch(t)).all()


# ------------------------------------------------- the exponential and Gumbel transform

LN2 = math.log(2)
NUM_TAIL = 2**32 - TAIL_BITS  # tail lanes: one 2**-32 atom each
NUM_ORDINARY = TAIL_BITS >> 9  # ordinary lanes: one u value per 512 bit patterns, a 2**-23 atom


@functools.cache
def all_exponentials() -> tuple[torch.Tensor, torch.Tensor]:
    """E = -log U (float64, from the fp32 E2) for every tail bit pattern and for
    every distinct u of the ordinary lanes: together the whole law of the noise."""
    tail = torch.arange(TAIL_BITS, 2**32, dtype=torch.int64)
    ordinary = torch.arange(NUM_ORDINARY, dtype=torch.int64) << 9
    return exponential2_torch(tail).double() * LN2, exponential2_torch(ordinary).double() * LN2


def test_tail_split_is_exact_and_matches_the_spec():
    bits = [0, 1, 511, 512, TAIL_BITS - 1, TAIL_BITS, TAIL_BITS + 1, 2**32 - 2, 2**32 - 1, 0xDEADBEEF]
    tail, f = tail_split_torch(torch.tensor(bits))
    for b, is_tail, value in zip(bits, tail.tolist(), f.tolist(), strict=True):
        v = spec.tail_complement(b)
        assert is_tail == (v is not None)
        assert value == (spec.uniform(b) if v is None else v * 2**9)  # exact: 23 bits + 0.5 fit fp32
    assert spec.tail_complement(2**32 - 1) == 2**-33 and spec.tail_complement(TAIL_BITS) < 2**-9


def test_noise_maximum_is_the_last_tail_atom():
    """The largest Gumbel noise is -log(-log1p(-2**-33)) = 22.87 nats (the 23-bit
    uniform alone stopped at 16.64), at bits 0xFFFFFFFF, and the transform is
    monotone: more bits, more noise."""
    tail, ordinary = all_exponentials()
    g_max = -math.log(tail[-1].item())
    assert g_max == pytest.approx(-math.log(-math.log1p(-(2**-33))), abs=1e-6)
    assert g_max > 22.8
    assert torch.all(tail[1:] < tail[:-1]) and torch.all(ordinary[1:] < ordinary[:-1])
    assert tail[0] < ordinary[-1], "the tail lanes continue the ordinary lanes' order"
    assert math.isfinite(-math.log(ordinary[0].item()))  # the other end: E = 24 ln 2, noise -2.8


@pytest.mark.parametrize("x", [0.0, 2.0, 5.0, 6.5, 8.0, 10.0, 12.0, 14.0, 16.0, 16.6, 17.0, 18.0, 19.0, 20.0, 21.0])
def test_gumbel_tail_follows_the_continuous_law(x):
    """P(G > x) over all 2**32 bit patterns against the Gumbel law 1 - exp(-e**-x),
    within one atom of the grid that resolves x (2**-23 where only the ordinary
    lanes reach, 2**-32 in the tail lanes) plus fp32 rounding of E."""
    tail, ordinary = all_exponentials()
    threshold = math.exp(-x)  # G > x  <=>  E < e**-x
    got = (tail < threshold).sum().item() * 2.0**-32 + (ordinary < threshold).sum().item() * 2.0**-23
    want = -math.expm1(-math.exp(-x))
    atom = 2.0**-32 if threshold < ordinary.min().item() else 2.0**-23
    assert abs(got - want) <= 2 * atom + 1e-6 * want, (got, want)


def test_exponential_law_at_the_small_end():
    """P(E < t) = 1 - e**-t = t (1 - t / 2 ...) for t from 2**-32 to 2**-10: the races'
    winners need E this small (relative error within one 2**-32 atom)."""
    tail, _ = all_exponentials()
    for k in range(10, 33):
        t = 2.0**-k
        got = (tail < t).sum().item() * 2.0**-32
        assert abs(got + math.expm1(-t)) <= 2.0**-32 + 1e-6 * t, (k, got)


# ---------------------------------------------------------- interpreter lane only


@pytest.mark.interpreter
def test_interpreted_noise_bits_equal_reference():
    seeds = torch.tensor([0, -1, 2**62 + 3, 17])
    positions = torch.tensor([5, 2**40, 0, 2**63 - 1])
    for stream in (0, 1, 2):
        got = torch.ops.specdraft.noise_bits(seeds, positions, 100, 77, stream)
        assert torch.equal(got, noise_bits_reference(seeds, positions, 100, 77, stream))


# ------------------------------------------------ the Triton transform vs its torch twin

TRANSFORM_BITS = [0, 1, 511, 512, 2**31, TAIL_BITS - 512, TAIL_BITS - 1, TAIL_BITS, TAIL_BITS + 1]
TRANSFORM_BITS += [2**32 - 2**k for k in range(1, 23)] + [2**32 - 1, 0x12345678, 0xDEADBEEF]


@triton.jit
def _transform_kernel(bits_ptr, exp_ptr, log_ptr, n, FAST: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.arange(0, BLOCK)
    bits = tl.load(bits_ptr + idx, mask=idx < n, other=0).to(tl.uint32)
    tl.store(exp_ptr + idx, exponential2(bits, FAST), mask=idx < n)
    tl.store(log_ptr + idx, log2_exponential2(bits, FAST), mask=idx < n)


def _check_transform(device: str, fast: bool, rtol: float, atol: float):
    bits = torch.tensor(TRANSFORM_BITS, dtype=torch.int64, device=device)
    exp = torch.empty(len(TRANSFORM_BITS), device=device)
    log = torch.empty_like(exp)
    _transform_kernel[(1,)](bits, exp, log, len(TRANSFORM_BITS), FAST=fast, BLOCK=64)
    want = exponential2_torch(bits.cpu())
    torch.testing.assert_close(exp.cpu(), want, rtol=rtol, atol=0)
    torch.testing.assert_close(log.cpu(), -gumbel2_torch(bits.cpu()), rtol=0, atol=atol)


@pytest.mark.interpreter
def test_interpreted_transform_equals_torch_twin():
    _check_transform("cpu", fast=False, rtol=1e-6, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("fast", [False, True])
def test_cuda_transform_equals_torch_twin(fast):
    # FAST: lg2.approx's error is absolute (~2**-22), i.e. relative ~1e-4 at E2 = 2**-9
    # (the ordinary lanes' smallest); the tail lanes use no log for E2.
    # Its log2 of E2 then carries the same relative error as an absolute one (~2e-4).
    _check_transform("cuda", fast=fast, rtol=2e-4 if fast else 1e-6, atol=3e-4 if fast else 1e-5)
